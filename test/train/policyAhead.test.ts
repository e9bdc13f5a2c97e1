// GpuPolicy.generate (src/train/policy.ts) on ahead decoding (src/model/generate.ts decodeSteps):
// one sampling dispatch per step with per-row seeds, ids fed back on the GPU, the CPU one step
// behind. Checked against the policy's former loop, kept here as the reference: every row copied
// out and sampled alone (seed = its prompt's, step = its token index, row 0), ids read back each
// step and fed as a list. Same text, token ids, log-prob bits, truncated flags and onDelta calls in
// the same order, with decodeAhead on and off, for greedy and sampled decoding, sequences stopping
// at different steps and the max-token cut; the step past a stop stays inside the planned pages.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import type { ChatPrompt } from '../../src/game/prompts.ts';
import type { Generation, GenerateOptions } from '../../src/game/round.ts';
import { loadQwen3WithTokenizer } from '../../src/model/load.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';
import { TextStreamer, type Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { GpuPolicy, planPages } from '../../src/train/policy.ts';

const V_TINY = 8192; // the sampler's full 256-thread workgroup at a twentieth of the real vocabulary's work
let gpu: Gpu, tmp: string, model: Qwen3Model, tokenizer: Qwen3Tokenizer;
beforeAll(async () => {
  gpu = await createGpu();
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-policy-ahead-'));
  await writeTinyCheckpoint(tmp, {
    vocab: V_TINY,
    layers: 2,
    hidden: 32,
    heads: 4,
    kvHeads: 2,
    headDim: 16,
    intermediate: 64,
    seed: 5,
  });
  const loaded = await loadQwen3WithTokenizer(gpu, nodeFolderSource(tmp));
  model = loaded.model;
  tokenizer = loaded.tokenizer!;
});
afterAll(async () => {
  gpu?.destroy();
  await rm(tmp, { recursive: true, force: true });
});

const prompt = (text: string): ChatPrompt => ({
  messages: [],
  prefill: '',
  text,
  tokenIds: tokenizer.encode(text).filter((id) => id < V_TINY),
  kvShare: null,
});
const PROMPTS = () =>
  [
    'The agency spent two billion on the new system.',
    'Audits found gaps in the records of three regions and the plan ends in 2030.',
    'Summarize the report.',
    'Find the spy: the player whose summary misses part of the report, then give one reason.',
  ].map(prompt);

/** The tokenizer with other stop ids (the tiny model never samples the real ones). */
const withStops = (stopIds: number[]): Qwen3Tokenizer =>
  Object.create(tokenizer, { stopIds: { value: stopIds } }) as Qwen3Tokenizer;

interface Run {
  out: Generation[];
  deltas: [number, string][];
}

async function viaPolicy(prompts: ChatPrompt[], opts: GenerateOptions, stops: number[], ahead: boolean): Promise<Run> {
  const deltas: [number, string][] = [];
  const policy = new GpuPolicy(model, withStops(stops), { onDelta: (i, t) => deltas.push([i, t]) });
  policy.decodeAhead = ahead;
  const out = await policy.generate(prompts, opts);
  const kv = policy.kvUsage!;
  expect(kv.endPages).toBeLessThanOrEqual(kv.pages);
  expect(kv.pages).toBe(planPages(prompts, opts.maxTokens - 1));
  return { out, deltas };
}

/** The policy's former decode loop: one-row sample dispatches, a read and a CPU round trip per step. */
async function reference(prompts: ChatPrompt[], opts: GenerateOptions, stops: number[]): Promise<Run> {
  const V = model.cfg.vocabSize;
  const B = prompts.length;
  const stop = new Set(stops);
  const deltas: [number, string][] = [];
  const cache = model.createCache(B, Math.max(...prompts.map((p) => p.tokenIds.length)) + opts.maxTokens);
  const out: Generation[] = prompts.map(() => ({ text: '', tokenIds: [], logprobs: [], truncated: false }));
  const streamers = prompts.map(() => new TextStreamer(tokenizer, { skipSpecial: true }));
  const row = gpu.createBuffer(V * 4, 'refRow'),
    one = gpu.createBuffer(4, 'refOne'),
    oneLp = gpu.createBuffer(4, 'refOneLp');
  const emit = (b: number, t: string) => {
    out[b].text += t;
    deltas.push([b, t]);
  };
  let logits = model.forward(
    {
      ids: prompts.flatMap((p) => p.tokenIds),
      slots: prompts.flatMap((p, b) => p.tokenIds.map(() => b)),
      positions: prompts.flatMap((p) => p.tokenIds.map((_, t) => t)),
      logitRows: prompts.map((_, b) => prompts.slice(0, b + 1).reduce((n, p) => n + p.tokenIds.length, 0) - 1),
    },
    cache,
  );
  let active = prompts.map((_, b) => b);
  for (let step = 0; active.length > 0; step++) {
    const picked: [number, number][] = [];
    for (const [i, b] of active.entries()) {
      gpu.copy(logits, i * V * 4, row, 0, V * 4);
      K.sample(gpu, one, row, 1, V, opts, opts.seeds[b] >>> 0, step, oneLp);
      picked.push([(await gpu.readU32(one))[0], (await gpu.readF32(oneLp))[0]]);
    }
    gpu.releaseBuffer(logits);
    const still: number[] = [];
    active.forEach((b, i) => {
      const [id, lp] = picked[i];
      out[b].tokenIds.push(id);
      out[b].logprobs.push(lp);
      if (stop.has(id)) return;
      const delta = streamers[b].push(id);
      if (delta) emit(b, delta);
      if (out[b].tokenIds.length >= opts.maxTokens) {
        out[b].truncated = true;
        return;
      }
      still.push(b);
    });
    for (const b of active) {
      const rest = still.includes(b) ? '' : streamers[b].flush();
      if (rest) emit(b, rest);
    }
    active = still;
    if (active.length === 0) break;
    logits = model.forward(
      {
        ids: active.map((b) => out[b].tokenIds.at(-1)!),
        slots: active,
        positions: active.map((b) => prompts[b].tokenIds.length + out[b].tokenIds.length - 1),
        logitRows: active.map((_, i) => i),
      },
      cache,
    );
  }
  for (const b of [row, one, oneLp]) gpu.releaseBuffer(b);
  cache.destroy();
  return { out, deltas };
}

/** For every prompt but the last: a token it first produces at step 1 + 2b of a free run. */
function staggeredStops(free: Generation[]): number[] {
  const stops = new Set<number>();
  free.slice(0, -1).forEach((g, b) => {
    const s = g.tokenIds.findIndex((id, t) => t >= 1 + 2 * b && !g.tokenIds.slice(0, t).includes(id));
    if (s >= 0) stops.add(g.tokenIds[s]);
  });
  return [...stops];
}

describe('GpuPolicy.generate, ahead decoding', () => {
  const base = { maxTokens: 9, seeds: [101, 202, 303, 404] };
  for (const [name, sampling] of [
    ['greedy', { temperature: 0, topK: 0, topP: 1 }],
    ['temperature 1', { temperature: 1, topK: 0, topP: 1 }],
    ['temperature 0.7, top-k 40, top-p 0.9', { temperature: 0.7, topK: 40, topP: 0.9 }],
  ] as const) {
    it(`${name}: the former per-row loop's text, ids, log-prob bits, truncation and deltas, ahead and not`, async () => {
      const prompts = PROMPTS();
      const opts = { ...base, ...sampling };
      const free = await reference(prompts, opts, []);
      const stops = staggeredStops(free.out);
      const want = await reference(prompts, opts, stops);
      const ended = want.out.map((g) => (g.truncated ? `cut@${g.tokenIds.length}` : `stop@${g.tokenIds.length}`));
      console.log(`${name}: stop ids ${stops}: ${ended.join(' ')}`);
      // Stops at different steps (greedy on the random model repeats itself: fewer new tokens to stop
      // on), and the last prompt meets the cut.
      expect(new Set(ended.filter((e) => e.startsWith('stop'))).size).toBeGreaterThanOrEqual(
        sampling.temperature > 0 ? 3 : 2,
      );
      expect(ended[3]).toBe(`cut@${base.maxTokens}`);
      if (sampling.temperature > 0) expect(want.out.some((g) => g.logprobs.some((lp) => lp < 0))).toBe(true);
      expect(want.deltas.length).toBeGreaterThan(prompts.length); // text streams out as it is sampled
      for (const ahead of [true, false]) {
        const got = await viaPolicy(prompts, opts, stops, ahead);
        expect(got.out).toEqual(want.out); // numbers compared with Object.is: the log-prob bits
        expect(got.deltas).toEqual(want.deltas);
      }
    });
  }
});
