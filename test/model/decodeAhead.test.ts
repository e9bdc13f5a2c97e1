// Ahead decoding (src/model/generate.ts decodeSteps): one sampling dispatch per step with per-row
// RNG inputs, the sampled ids feeding the next step's embedding on the GPU, the CPU reading one
// step behind. Checked against a straightforward reference loop (read every step's ids, feed them
// back as a list, sample with the old K.sample over a (B, V) buffer where sequence b sits at row b)
// and against `ahead: false`: the same ids, the same log-prob bits, the same steps, for greedy and
// sampled decoding, B = 1 and 4, stops at different steps and the max-token cut. Submits and
// readbacks per step are counted.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { generate, GREEDY, type GeneratedToken, type SamplingOptions } from '../../src/model/generate.ts';
import { loadQwen3 } from '../../src/model/load.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import { KV_PAGE_SIZE, kvPages, type KVCache } from '../../src/model/kvCache.ts';

let gpu: Gpu, tmp: string, model: Qwen3Model;
beforeAll(async () => {
  gpu = await createGpu();
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-ahead-'));
  // V = 8192: the sampler's full 256-thread workgroup (as at 151,936) at a twentieth of the bisection work.
  await writeTinyCheckpoint(tmp, {
    vocab: 8192,
    layers: 2,
    hidden: 32,
    heads: 4,
    kvHeads: 2,
    headDim: 8,
    intermediate: 64,
    seed: 7,
  });
  model = (await loadQwen3(gpu, nodeFolderSource(tmp))).model;
});
afterAll(async () => {
  gpu?.destroy();
  await rm(tmp, { recursive: true, force: true });
});

const PROMPTS = [
  [9707, 11, 1879, 0, 358],
  [151644, 872, 198, 40, 1075, 279, 3364, 13],
  [17, 18, 19],
  [2610, 525, 264, 10950, 17847, 13, 220, 16, 17, 18, 19, 20],
].map((p) => p.map((id) => id % 8192));
const SAMPLED: SamplingOptions = { temperature: 0.9, topK: 50, topP: 0.9, seed: 11 };

type Steps = { seq: number; id: number; logprob: number; reason?: string }[][];

async function run(
  prompts: number[][],
  o: SamplingOptions & { maxNewTokens: number; stopIds: number[]; ahead: boolean; cache?: KVCache },
): Promise<Steps> {
  const steps: Steps = [];
  for await (const step of generate(model, prompts, o))
    steps.push(step.map((t: GeneratedToken) => ({ seq: t.seq, id: t.id, logprob: t.logprob, reason: t.reason })));
  return steps;
}

/** The synchronous loop as it was: read each step's ids, feed them back as a list. */
async function reference(
  prompts: number[][],
  o: SamplingOptions & { maxNewTokens: number; stopIds: number[] },
): Promise<Steps> {
  const V = model.cfg.vocabSize;
  const B = prompts.length;
  const cache = model.createCache(B, Math.max(...prompts.map((p) => p.length)) + o.maxNewTokens);
  const rows = gpu.createBuffer(B * V * 4, 'refRows'); // sequence b at row b: hash(seed, step, b)
  const ids = gpu.createBuffer(B * 4, 'refIds'),
    lp = gpu.createBuffer(B * 4, 'refLogp');
  const steps: Steps = [];
  const len = prompts.map((p) => p.length);
  let active = prompts.map((_, b) => b);
  let logits = model.forward(
    {
      ids: prompts.flat(),
      slots: prompts.flatMap((p, b) => p.map(() => b)),
      positions: prompts.flatMap((p) => p.map((_, t) => t)),
      logitRows: prompts.map((_, b) => prompts.slice(0, b + 1).reduce((n, p) => n + p.length, 0) - 1),
    },
    cache,
  );
  for (let step = 0; active.length > 0; step++) {
    active.forEach((b, i) => gpu.copy(logits, i * V * 4, rows, b * V * 4, V * 4));
    K.sample(gpu, ids, rows, B, V, o, o.seed, step, lp);
    const got = await gpu.readU32(ids);
    const lps = await gpu.readF32(lp);
    gpu.releaseBuffer(logits);
    const out: Steps[number] = [];
    const still: number[] = [];
    for (const b of active) {
      len[b]++;
      const reason = o.stopIds.includes(got[b])
        ? 'stop'
        : len[b] - prompts[b].length >= o.maxNewTokens
          ? 'length'
          : undefined;
      out.push({ seq: b, id: got[b], logprob: lps[b], reason });
      if (!reason) still.push(b);
    }
    steps.push(out);
    active = still;
    if (active.length === 0) break;
    logits = model.forward(
      {
        ids: active.map((b) => got[b]),
        slots: active,
        positions: active.map((b) => len[b] - 1),
        logitRows: active.map((_, i) => i),
      },
      cache,
    );
  }
  for (const b of [rows, ids, lp]) gpu.releaseBuffer(b);
  cache.destroy();
  return steps;
}

/**
 * Stop ids that end sequences at different steps: for seq b, its first token from step 1 + 2b on
 * that it has not produced before, in a free run; for every sequence but the last of a batch (it
 * runs into the max-token cut).
 */
function staggeredStops(free: Steps, B: number): number[] {
  const stops = new Set<number>();
  for (let b = 0; b < Math.max(1, B - 1); b++) {
    const ids = free.map((s) => s.find((t) => t.seq === b)!.id);
    const step = ids.findIndex((id, s) => s >= 1 + 2 * b && !ids.slice(0, s).includes(id));
    if (step >= 0) stops.add(ids[step]);
  }
  return [...stops];
}

/** Step at which each sequence ended, and why. */
const endings = (steps: Steps) =>
  steps.flatMap((s, i) => s.filter((t) => t.reason).map((t) => `${t.seq}:${i}:${t.reason}`)).sort();

describe('ahead decoding equals the synchronous reference', () => {
  for (const [name, sampling] of [
    ['greedy', GREEDY],
    ['temperature/top-k/top-p', SAMPLED],
  ] as const) {
    for (const B of [1, 4]) {
      it(`${name}, B = ${B}: same ids, log-prob bits and steps, with stops at different steps and the max-token cut`, async () => {
        const prompts = PROMPTS.slice(0, B);
        const base = { ...sampling, maxNewTokens: 9 };
        const free = await reference(prompts, { ...base, stopIds: [] });
        expect(endings(free)).toEqual(prompts.map((_, b) => `${b}:8:length`));
        const stopIds = staggeredStops(free, B);
        for (const stops of [[], stopIds]) {
          const want = await reference(prompts, { ...base, stopIds: stops });
          const ahead = await run(prompts, { ...base, stopIds: stops, ahead: true });
          const sync = await run(prompts, { ...base, stopIds: stops, ahead: false });
          expect(ahead).toEqual(want); // toEqual on numbers: Object.is, so the log-prob bits match
          expect(sync).toEqual(want);
        }
        const stopped = await reference(prompts, { ...base, stopIds });
        // The stops really happen, at different steps when B = 4, and some sequence meets the cut.
        console.log(`${name}, B = ${B}, stop ids ${stopIds}: ${endings(stopped).join(' ')}`);
        const stopSteps = endings(stopped).filter((e) => e.endsWith(':stop'));
        expect(stopSteps.length).toBeGreaterThanOrEqual(B === 1 ? 1 : 3);
        if (B === 4) {
          expect(new Set(stopSteps.map((e) => e.split(':')[1])).size).toBeGreaterThanOrEqual(3);
          expect(endings(stopped).some((e) => e.endsWith(':length'))).toBe(true);
        }
        if (sampling.temperature > 0) expect(free.flat().some((t) => t.logprob < 0)).toBe(true); // real draws
      });
    }
  }

  it('one submit and one readback per steady decode step, the next step submitted before a step is read', async () => {
    const realRead = gpu.read.bind(gpu);
    let reads = 0;
    gpu.read = (...args: Parameters<Gpu['read']>) => {
      reads++;
      return realRead(...args);
    };
    try {
      for (const ahead of [true, false]) {
        const perStep: { submits: number; reads: number; readsAtYield: number }[] = [];
        let s0 = gpu.submitCount,
          r0 = reads;
        for await (const step of generate(model, PROMPTS, { ...SAMPLED, maxNewTokens: 8, stopIds: [], ahead })) {
          expect(step).toHaveLength(4);
          perStep.push({ submits: gpu.submitCount - s0, reads: reads - r0, readsAtYield: reads });
          s0 = gpu.submitCount;
          r0 = reads;
        }
        console.log(`ahead ${ahead}: per step ${JSON.stringify(perStep)}`);
        expect(perStep).toHaveLength(8);
        const first = perStep[0].readsAtYield - perStep[0].reads; // reads before generate started
        perStep.forEach((s, n) => {
          // When step n is handed out, ahead has already submitted (and started reading) step n + 1.
          const started = ahead && n < 7 ? n + 2 : n + 1;
          expect(s.readsAtYield - first).toBe(started);
        });
        // Every step after the first: the forward and the sampling of a step go out in one command
        // buffer with its read (the first meets new buffer sizes; the pool submits before it makes them).
        for (const s of perStep.slice(1, 7)) expect(s).toMatchObject({ submits: 1, reads: 1 });
        // The last step: ahead has nothing left to submit (the max-token cut is known in advance).
        expect(perStep[7]).toMatchObject(ahead ? { submits: 0, reads: 0 } : { submits: 1, reads: 1 });
      }
    } finally {
      gpu.read = realRead;
    }
  });

  it('the step past a stop may open a new KV page: it fits the pages planned for maxNewTokens - 1 fed tokens', async () => {
    // Prompt of P - 1 tokens: the token of step 1, fed back only by the step past a stop there, sits
    // at position P, the first of the second page; the plan holds kvPages(P - 1 + 3 - 1) = 2 pages.
    const prompt = Array.from({ length: KV_PAGE_SIZE - 1 }, (_, t) => (t * 131 + 7) % 8192);
    // The first seed whose draws at steps 0 and 1 differ (else the stop would come at step 0).
    let o = { ...SAMPLED, maxNewTokens: 3 },
      first = 0,
      second = 0;
    for (let seed = 1; first === second && seed < 20; seed++) {
      o = { ...o, seed };
      [first, second] = (await reference([prompt], { ...o, stopIds: [] })).map((s) => s[0].id);
    }
    expect(second).not.toBe(first);
    const want = await reference([prompt], { ...o, stopIds: [second] });
    expect(endings(want)).toEqual(['0:1:stop']);
    const pages = kvPages(prompt.length + o.maxNewTokens - 1);
    expect(pages).toBe(2);
    for (const ahead of [true, false]) {
      const cache = model.createCache(1, prompt.length + o.maxNewTokens, { pages });
      const got = await run([prompt], { ...o, stopIds: [second], ahead, cache });
      expect(got).toEqual(want);
      // Ahead wrote the dropped step's K/V at position P - 1 + 1 = P: the second page, inside the plan.
      expect(cache.pagesInUse).toBe(ahead ? 2 : 1);
      cache.destroy();
    }
  });

  it('a consumer that stops early leaves nothing in flight and the GPU usable', async () => {
    const live = gpu.memory.live;
    for await (const step of generate(model, PROMPTS, { ...SAMPLED, maxNewTokens: 8, stopIds: [], ahead: true })) {
      expect(step).toHaveLength(4);
      break;
    }
    expect(gpu.memory.live).toBe(live);
    const again = await run(PROMPTS.slice(0, 1), { ...GREEDY, maxNewTokens: 3, stopIds: [], ahead: true });
    expect(again).toEqual(await reference(PROMPTS.slice(0, 1), { ...GREEDY, maxNewTokens: 3, stopIds: [] }));
  });
});
