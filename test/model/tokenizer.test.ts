import { beforeAll, describe, expect, it } from 'vitest';
import { ModelLoadError } from '../../src/model/errors.ts';
import { memorySource } from '../../src/model/sources.ts';
import { loadTokenizer, TextStreamer, type Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { qwen3TokenizerFiles } from '../../src/model/tinyModel.node.ts';

let files: Map<string, Uint8Array | string>;
let tok: Qwen3Tokenizer;

beforeAll(async () => {
  const { tokenizerJson, tokenizerConfig } = await qwen3TokenizerFiles();
  files = new Map<string, Uint8Array | string>([
    ['tokenizer.json', tokenizerJson],
    ['tokenizer_config.json', tokenizerConfig],
  ]);
  tok = await loadTokenizer(memorySource('qwen3', files));
});

const CHAT = '<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n';

describe('Qwen3 tokenizer', () => {
  it('encodes special tokens written in the text to their ids', () => {
    const ids = tok.encode(CHAT);
    expect(ids.slice(0, 7)).toEqual([151644, 872, 198, 9707, 11, 1879, 0]);
    expect(ids.slice(-5)).toEqual([151645, 198, 151644, 77091, 198]);
    expect(tok.encode('Hello')).toEqual([9707]); // nothing added
  });

  it('decodes, with or without special tokens', () => {
    const ids = tok.encode(CHAT);
    expect(tok.decode(ids)).toBe(CHAT);
    expect(tok.decode(ids, { skipSpecial: true })).toBe('user\nHello, world!\nassistant\n');
  });

  it('round-trips unicode', () => {
    const text = 'naïve café — 東京 🚀';
    expect(tok.decode(tok.encode(text))).toBe(text);
  });

  it('renders the chat template', () => {
    expect(tok.applyChatTemplate([{ role: 'user', content: 'Hello, world!' }], { addGenerationPrompt: true })).toBe(
      CHAT,
    );
    expect(tok.applyChatTemplate([{ role: 'user', content: 'Hi' }], { enableThinking: false })).toBe(
      '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n',
    );
    expect(
      tok.applyChatTemplate(
        [
          { role: 'system', content: 'Be brief.' },
          { role: 'user', content: 'Hi' },
          { role: 'assistant', content: 'Hello!' },
        ],
        { addGenerationPrompt: false },
      ),
    ).toBe(
      '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n',
    );
  });

  it('streams text without splitting multi-byte characters', () => {
    const text = 'naïve café — 東京 🚀 done';
    const ids = tok.encode(text);
    const streamer = tok.createStreamer();
    const pieces = ids.map((id) => streamer.push(id));
    pieces.push(streamer.flush());
    expect(pieces.join('')).toBe(text);
    expect(pieces.some((p) => p.includes('\uFFFD'))).toBe(false);
    expect(pieces.filter((p) => p === '').length).toBeGreaterThan(0); // the emoji's bytes span several tokens
  });

  it('flushes a truncated character at the end', () => {
    const ids = tok.encode(' 🚀');
    expect(ids.length).toBeGreaterThan(1);
    const streamer = new TextStreamer(tok);
    expect(streamer.push(ids.slice(0, -1))).toBe('');
    expect(streamer.flush()).toContain('\uFFFD');
  });

  it('defaults stop ids to <|im_end|> (from tokenizer_config) when no generation config', () => {
    expect(tok.stopIds).toEqual([151645]);
    expect(tok.vocabSize).toBe(151669);
    expect(tok.tokenToId('<|endoftext|>')).toBe(151643);
  });

  it('takes stop ids from generation_config.json and config.json', async () => {
    const withConfigs = new Map(files);
    withConfigs.set('generation_config.json', JSON.stringify({ eos_token_id: [151645, 151643] }));
    withConfigs.set('config.json', JSON.stringify({ eos_token_id: 7 }));
    const t = await loadTokenizer(memorySource('qwen3', withConfigs));
    expect([...t.stopIds].sort((a, b) => a - b)).toEqual([7, 151643, 151645]);
  });

  it('falls back to <|im_end|> and <|endoftext|> when nothing names an eos', async () => {
    const config = JSON.parse(new TextDecoder().decode(files.get('tokenizer_config.json') as Uint8Array)) as Record<
      string,
      unknown
    >;
    delete config['eos_token'];
    const t = await loadTokenizer(
      memorySource('qwen3', new Map([...files, ['tokenizer_config.json', JSON.stringify(config)]])),
    );
    expect(t.stopIds).toEqual([151645, 151643]);
  });

  it('names the missing or broken file', async () => {
    await expect(loadTokenizer(memorySource('x', new Map([['tokenizer_config.json', '{}']])))).rejects.toThrow(
      /^tokenizer\.json: not found/,
    );
    const broken = new Map(files);
    broken.set('tokenizer_config.json', '{oops');
    const e = await loadTokenizer(memorySource('x', broken)).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ModelLoadError);
    expect((e as ModelLoadError).file).toBe('tokenizer_config.json');
  });
});
