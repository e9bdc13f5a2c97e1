// Issue 9: tokenizer files are bounded (size caps, a chat_template length cap) and every
// tokenizer call is announced to the page's watchdog, which stops a runaway worker and names the file.
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { ModelLoadError } from '../../src/model/errors.ts';
import { memorySource } from '../../src/model/sources.ts';
import {
  CHAT_TEMPLATE_MAX_CHARS,
  loadTokenizer,
  Qwen3Tokenizer,
  setTokenizerWatch,
  TOKENIZER_JSON_MAX_CHARS,
} from '../../src/model/tokenizer.ts';
import { qwen3TokenizerFiles } from '../../src/model/tinyModel.node.ts';
import {
  TOKENIZER_WATCHDOG_MS,
  WATCH_MESSAGE,
  watchWorker,
  workerWatch,
  type WatchMessage,
} from '../../src/worker/tokenizerWatch.ts';

let tokenizerJson: string;
let tokenizerConfig: string;
beforeAll(async () => {
  const files = await qwen3TokenizerFiles();
  tokenizerJson = new TextDecoder().decode(files.tokenizerJson);
  tokenizerConfig = new TextDecoder().decode(files.tokenizerConfig);
});
afterEach(() => {
  setTokenizerWatch(null);
  vi.useRealTimers();
});

describe('tokenizer file caps', () => {
  it('refuses a chat_template over 64 KB, naming the file and the cap', async () => {
    const cfg = JSON.parse(tokenizerConfig) as Record<string, unknown>;
    const big = JSON.stringify({
      ...cfg,
      chat_template: `{# ${'x'.repeat(CHAT_TEMPLATE_MAX_CHARS)} #}` + String(cfg['chat_template']),
    });
    const src = memorySource(
      't',
      new Map([
        ['tokenizer.json', tokenizerJson],
        ['tokenizer_config.json', big],
      ]),
    );
    const err = await loadTokenizer(src).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ModelLoadError);
    expect((err as ModelLoadError).message).toMatch(
      /^tokenizer_config\.json: chat_template is \d+ characters; the cap is 65536 \(64 KB\)$/,
    );
  });

  it('refuses a tokenizer.json over its size cap before parsing it', async () => {
    const src = {
      exists: async () => true,
      readText: async (f: string) =>
        f === 'tokenizer.json' ? ' '.repeat(TOKENIZER_JSON_MAX_CHARS + 1) : tokenizerConfig,
    };
    await expect(loadTokenizer(src)).rejects.toThrow('tokenizer.json: is 64.0 MB; the cap is 64 MB');
  });
});

describe('tokenizer watchdog', () => {
  it('the tokenizer announces each call and the file in charge, nested calls included', async () => {
    const tok = new Qwen3Tokenizer({
      tokenizerJson: JSON.parse(tokenizerJson),
      tokenizerConfig: JSON.parse(tokenizerConfig),
    });
    const log: string[] = [];
    setTokenizerWatch(workerWatch((m) => log.push(`${m.phase}:${m.file}`)));
    tok.encodeChat([{ role: 'user', content: 'Hello' }], { enableThinking: false }, 'Player ');
    expect(log.length).toBeGreaterThan(2);
    expect(log).toContain('begin:tokenizer_config.json (chat_template)');
    expect(log).toContain('begin:tokenizer.json');
    expect(log.at(-1)).toBe('end:'); // every call closed: the watchdog's timer is off between calls
    log.length = 0;
    new Qwen3Tokenizer({ tokenizerJson: JSON.parse(tokenizerJson), tokenizerConfig: JSON.parse(tokenizerConfig) });
    expect(log).toEqual(['begin:tokenizer.json', 'end:', 'begin:tokenizer_config.json (chat_template)', 'end:']);
  });

  function fakeWorker() {
    const listeners: ((e: MessageEvent) => void)[] = [];
    return {
      terminated: 0,
      addEventListener(_t: 'message', l: (e: MessageEvent) => void) {
        listeners.push(l);
      },
      terminate() {
        this.terminated++;
      },
      post(m: WatchMessage | { id: string }) {
        for (const l of listeners) l({ data: m } as MessageEvent);
      },
    };
  }

  it('stops the worker when one call runs over 30 s and names the file; calls that end in time are left alone', () => {
    vi.useFakeTimers();
    const w = fakeWorker();
    const stops: string[] = [];
    watchWorker(w, (m) => stops.push(m));
    expect(TOKENIZER_WATCHDOG_MS).toBe(30_000);
    w.post({ type: WATCH_MESSAGE, phase: 'begin', file: 'tokenizer.json' });
    vi.advanceTimersByTime(29_000);
    w.post({ type: WATCH_MESSAGE, phase: 'end', file: '' });
    w.post({ id: 'a comlink reply' }); // other traffic is not the watchdog's business
    vi.advanceTimersByTime(120_000); // a long GPU round between tokenizer calls is fine
    expect(w.terminated).toBe(0);
    w.post({ type: WATCH_MESSAGE, phase: 'begin', file: 'tokenizer_config.json (chat_template)' });
    vi.advanceTimersByTime(29_999);
    expect(w.terminated).toBe(0);
    vi.advanceTimersByTime(1);
    expect(w.terminated).toBe(1);
    expect(stops).toHaveLength(1);
    expect(stops[0]).toMatch(/^tokenizer_config\.json \(chat_template\): a tokenizer call ran over 30 s/);
    w.post({ type: WATCH_MESSAGE, phase: 'begin', file: 'tokenizer.json' });
    vi.advanceTimersByTime(60_000);
    expect(w.terminated).toBe(1); // once
  });

  it('a real runaway pre-tokenizer regex is announced before it blocks (what the page watchdog needs)', () => {
    const json = JSON.parse(tokenizerJson) as { pre_tokenizer: { pretokenizers: { pattern?: { Regex: string } }[] } };
    json.pre_tokenizer.pretokenizers[0]!.pattern = { Regex: '(a|aa)+$' }; // exponential backtracking on "aaa…ab"
    const tok = new Qwen3Tokenizer({ tokenizerJson: json, tokenizerConfig: JSON.parse(tokenizerConfig) });
    const log: string[] = [];
    setTokenizerWatch(workerWatch((m) => log.push(`${m.phase}:${m.file}`)));
    const t0 = performance.now();
    tok.encodeText(`${'a'.repeat(24)}b`);
    expect(performance.now() - t0).toBeGreaterThan(20); // it does run away (and grows ×1.6 per extra "a")
    expect(log[0]).toBe('begin:tokenizer.json');
  });
});
