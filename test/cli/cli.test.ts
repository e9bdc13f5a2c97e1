// The `spyrl` command as a user runs it: real processes, real files, PyTorch fixtures.
import { cp, mkdtemp, readFile, rm, stat, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spyrl, type SpyrlResult } from '../helpers/spyrl.ts';

const GOLDEN = join(import.meta.dirname, '../fixtures/golden');

/** One line, our prefix, no stack trace. */
function expectOneErrorLine(r: SpyrlResult, ...mustContain: string[]): void {
  expect(r.code).not.toBe(0);
  const lines = r.stderr.split('\n');
  expect(lines, r.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^spyrl: error: /);
  expect(r.stderr).not.toMatch(/\n\s+at /);
  for (const s of mustContain) expect(lines[0]).toContain(s);
}

let tmp: string;
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-cli-'));
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe('spyrl logits / generate against PyTorch', () => {
  it.each(['tied', 'untied-sharded'])(
    'logits --tokens on %s match the PyTorch logits within 1e-3 x max|ref|',
    async (variant) => {
      const dir = join(GOLDEN, variant);
      const exp = JSON.parse(await readFile(join(dir, 'expected.json'), 'utf8')) as {
        tokens: number[];
        shape: [number, number];
        max_abs_logit: number;
      };
      const out = join(tmp, `${variant}.f32`);
      const r = await spyrl('logits', '--model', dir, '--tokens', exp.tokens.join(','), '--out', out);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toEqual({ tokens: exp.tokens, shape: exp.shape });
      const got = new Float32Array((await readFile(out)).buffer.slice(0));
      const ref = new Float32Array((await readFile(join(dir, 'logits.f32'))).buffer.slice(0));
      expect(got.length).toBe(ref.length);
      let err = 0;
      for (let i = 0; i < ref.length; i++) err = Math.max(err, Math.abs(got[i] - ref[i]));
      expect(err).toBeLessThanOrEqual(1e-3 * exp.max_abs_logit);
    },
  );

  it('generate --temperature 0 reproduces the 16 greedy PyTorch tokens', async () => {
    const dir = join(GOLDEN, 'untied-sharded');
    const g = JSON.parse(await readFile(join(dir, 'greedy.json'), 'utf8')) as { prompt: number[]; tokens: number[] };
    const r = await spyrl(
      'generate',
      '--model',
      dir,
      '--prompt-tokens',
      g.prompt.join(','),
      '--temperature',
      '0',
      '--max-new-tokens',
      '16',
      '--print-tokens',
    );
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ prompt: g.prompt, tokens: g.tokens });
  });
});

describe('spyrl tiny-model, and text in and out with the real tokenizer', () => {
  let model: string;
  beforeAll(async () => {
    model = join(tmp, 'tiny');
    const r = await spyrl(
      'tiny-model',
      '--out',
      model,
      '--layers',
      '1',
      '--hidden',
      '32',
      '--heads',
      '2',
      '--kv-heads',
      '1',
      '--intermediate',
      '64',
      '--shards',
      '2',
      '--tied',
      'false',
    );
    expect(r.code, r.stderr).toBe(0);
  });

  it('writes a sharded Hugging Face layout with the real tokenizer', async () => {
    const index = JSON.parse(await readFile(join(model, 'model.safetensors.index.json'), 'utf8'));
    expect(new Set(Object.values(index.weight_map))).toEqual(
      new Set(['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']),
    );
    expect(index.weight_map['lm_head.weight']).toBeDefined();
    const cfg = JSON.parse(await readFile(join(model, 'config.json'), 'utf8'));
    expect(cfg).toMatchObject({
      model_type: 'qwen3',
      vocab_size: 151936,
      hidden_size: 32,
      num_hidden_layers: 1,
      tie_word_embeddings: false,
    });
    expect((await stat(join(model, 'tokenizer.json'))).size).toBeGreaterThan(1e6);
  });

  it('logits --text tokenizes with the Qwen3 tokenizer and writes [T, V] f32', async () => {
    const out = join(tmp, 'text.f32');
    const r = await spyrl('logits', '--model', model, '--text', 'Hello, world!', '--out', out);
    expect(r.code, r.stderr).toBe(0);
    const res = JSON.parse(r.stdout);
    expect(res.tokens).toEqual([9707, 11, 1879, 0]);
    expect(res.shape).toEqual([4, 151936]);
    expect((await stat(out)).size).toBe(4 * 151936 * 4);
  });

  it('generate --chat streams text and reports its speed', async () => {
    const r = await spyrl(
      'generate',
      '--model',
      model,
      '--prompt',
      'Hi',
      '--chat',
      '--max-new-tokens',
      '3',
      '--seed',
      '1',
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/\d+ prompt tokens, [1-3] generated/);
  });
});

describe('bad input: one clear line, non-zero exit, nothing written', () => {
  const out = () => join(tmp, 'never.f32');

  async function brokenCopy(name: string, variant = 'tied'): Promise<string> {
    const dir = join(tmp, name);
    await cp(join(GOLDEN, variant), dir, { recursive: true });
    return dir;
  }

  it('missing folder', async () => {
    const r = await spyrl('logits', '--model', join(tmp, 'nope'), '--tokens', '1,2', '--out', out());
    expectOneErrorLine(r, 'nope', 'not found');
    await expect(stat(out())).rejects.toThrow();
  });

  it('unsupported model_type', async () => {
    const dir = await brokenCopy('llama');
    const cfg = JSON.parse(await readFile(join(dir, 'config.json'), 'utf8'));
    await writeFile(join(dir, 'config.json'), JSON.stringify({ ...cfg, model_type: 'llama' }));
    expectOneErrorLine(
      await spyrl('logits', '--model', dir, '--tokens', '1,2', '--out', out()),
      'config.json',
      'llama',
    );
    await expect(stat(out())).rejects.toThrow();
  });

  it('truncated safetensors', async () => {
    const dir = await brokenCopy('truncated');
    const f = join(dir, 'model.safetensors');
    await truncate(f, (await stat(f)).size - 1000);
    expectOneErrorLine(await spyrl('logits', '--model', dir, '--tokens', '1,2', '--out', out()), 'model.safetensors');
    await expect(stat(out())).rejects.toThrow();
  });

  it('corrupt safetensors header', async () => {
    const dir = await brokenCopy('corrupt');
    const f = join(dir, 'model.safetensors');
    const bytes = await readFile(f);
    bytes.fill(0x7b, 8, 40); // garbage inside the JSON header
    await writeFile(f, bytes);
    expectOneErrorLine(await spyrl('logits', '--model', dir, '--tokens', '1,2', '--out', out()), 'model.safetensors');
  });

  it('missing shard', async () => {
    const dir = await brokenCopy('noshard', 'untied-sharded');
    await rm(join(dir, 'model-00002-of-00002.safetensors'));
    expectOneErrorLine(
      await spyrl('logits', '--model', dir, '--tokens', '1,2', '--out', out()),
      'model-00002-of-00002.safetensors',
    );
    await expect(stat(out())).rejects.toThrow();
  });

  it('token id out of range', async () => {
    const r = await spyrl('logits', '--model', join(GOLDEN, 'tied'), '--tokens', '1,2048', '--out', out());
    expectOneErrorLine(r, '2048', 'out of range');
    await expect(stat(out())).rejects.toThrow();
  });

  it('unknown flag and unknown command', async () => {
    expectOneErrorLine(await spyrl('logits', '--modle', 'x'), '--modle');
    expectOneErrorLine(await spyrl('frobnicate'), 'frobnicate');
  });
});
