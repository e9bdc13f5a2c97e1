// Decode tok/s of generate (src/model/generate.ts) at B = 1 and 4 on the bench's tiny shapes
// (bench/e2e.ts TINY: hidden 64, 2 layers, the real 151,936-token vocabulary), side by side:
//   old   the loop before ahead decoding: sample, read the ids, feed them back as a list;
//   sync  decodeSteps with ahead: false (one sampling dispatch with per-row RNG, ids read every step);
//   ahead decodeSteps (the default): step n + 1 encoded and submitted from the ids on the GPU before
//         step n is read.
// Runs alternate (old, sync, ahead, old, ...) so load drifts hit all three alike.
// Usage: npx tsx bench/decodeAhead.node.ts [reps=3] [newTokens=32] [temperature=0]
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createGpu } from '../src/gpu/index.ts';
import * as K from '../src/ops/index.ts';
import { generate, type SamplingOptions } from '../src/model/generate.ts';
import { loadQwen3 } from '../src/model/load.ts';
import type { Qwen3Model } from '../src/model/qwen3.ts';
import { nodeFolderSource } from '../src/model/sources.node.ts';
import { writeTinyCheckpoint } from '../src/model/tinyModel.node.ts';

const [reps = 3, newTokens = 32, temperature = 0] = process.argv.slice(2).map(Number);
const sampling: SamplingOptions = { temperature, topK: 0, topP: 1, seed: 1 };

/** The decode loop as it was before ahead decoding (greedy/sampled ids identical while no sequence stops). */
async function oldLoop(model: Qwen3Model, prompts: number[][]): Promise<number> {
  const { gpu, cfg } = model;
  const B = prompts.length;
  const cache = model.createCache(B, Math.max(...prompts.map((p) => p.length)) + newTokens);
  const sampled = gpu.createBuffer(B * 4, 'sampledIds');
  let logits = model.forward(
    {
      ids: prompts.flat(),
      slots: prompts.flatMap((p, b) => p.map(() => b)),
      positions: prompts.flatMap((p) => p.map((_, t) => t)),
      logitRows: prompts.map((p, b) => (b + 1) * p.length - 1),
    },
    cache,
  );
  let tokens = 0;
  for (let step = 0; ; step++) {
    K.sample(gpu, sampled, logits, B, cfg.vocabSize, sampling, sampling.seed, step);
    const next = new Uint32Array(await gpu.read(sampled, B * 4));
    gpu.releaseBuffer(logits);
    tokens += B;
    if (step + 1 >= newTokens) break;
    logits = model.forward(
      {
        ids: Array.from(next),
        slots: prompts.map((_, b) => b),
        positions: prompts.map((p) => p.length + step),
        logitRows: prompts.map((_, b) => b),
      },
      cache,
    );
  }
  gpu.releaseBuffer(sampled);
  cache.destroy();
  return tokens;
}

async function newLoop(model: Qwen3Model, prompts: number[][], ahead: boolean): Promise<number> {
  let tokens = 0;
  for await (const step of generate(model, prompts, { ...sampling, maxNewTokens: newTokens, stopIds: [], ahead }))
    tokens += step.length;
  return tokens;
}

const gpu = await createGpu();
const dir = await mkdtemp(join(tmpdir(), 'spyrl-bench-ahead-'));
try {
  await writeTinyCheckpoint(dir, {
    layers: 2,
    hidden: 64,
    heads: 4,
    kvHeads: 2,
    headDim: 16,
    intermediate: 128,
    seed: 1,
  });
  const model = (await loadQwen3(gpu, nodeFolderSource(dir))).model;
  const paths: Record<string, (m: Qwen3Model, p: number[][]) => Promise<number>> = {
    old: oldLoop,
    sync: (m, p) => newLoop(m, p, false),
    ahead: (m, p) => newLoop(m, p, true),
  };
  const rows: Record<string, string | number>[] = [];
  for (const B of [1, 4]) {
    const prompts = Array.from({ length: B }, (_, b) =>
      Array.from({ length: 16 }, (_, t) => (b * 977 + t * 7919) % 151936),
    );
    for (const run of Object.values(paths)) await run(model, prompts); // warm pipelines and pools
    const tps: Record<string, number[]> = { old: [], sync: [], ahead: [] };
    for (let r = 0; r < reps; r++) {
      for (const [name, run] of Object.entries(paths)) {
        const t0 = performance.now();
        const n = await run(model, prompts);
        tps[name].push(n / ((performance.now() - t0) / 1000));
      }
    }
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    rows.push({
      B,
      'old tok/s': tps.old.map((x) => x.toFixed(1)).join(' '),
      'sync tok/s': tps.sync.map((x) => x.toFixed(1)).join(' '),
      'ahead tok/s': tps.ahead.map((x) => x.toFixed(1)).join(' '),
      'ahead/old (median)': (median(tps.ahead) / median(tps.old)).toFixed(2),
      'sync/old (median)': (median(tps.sync) / median(tps.old)).toFixed(2),
    });
  }
  console.log(JSON.stringify({ adapter: gpu.info, newTokens, temperature, reps, rows }));
  console.table(rows);
} finally {
  gpu.destroy();
  await rm(dir, { recursive: true, force: true });
}
