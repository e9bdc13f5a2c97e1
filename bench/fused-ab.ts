// `npx tsx bench/fused-ab.ts [--reps 3] [--steps 4] [--shapes tiny,4b-layer] [--layers 1] [--ctx 0] [--weights bf16|q4]
//   [--ops] [--compare fusions|normFold|loraFold|loraAFold|siluFold|gemvSplitK|gemvWideLanes] [--kernels name=value,...]`
// The decode fusions side by side on this machine's adapter: Qwen3Model.forward with the fused
// q/k/v and gate/up GEMVs (K.matmulGroup) and q/k norm + RoPE + KV write in one kernel
// (K.qkNormRopeKv), against the kernels they replace (K.fusions.enabled = false), runs alternated
// A B A B so that drift in the machine's load hits both. `--compare normFold`: the fusions on both
// sides, the RMSNorms folded into the group GEMVs (tuning.normFold 'auto') against 'off'; the fold
// runs where those GEMVs are gemv_lanes (GPUs; on a CPU adapter add `--kernels matmul=lanes`).
// `--compare loraFold`: the o_proj and down_proj LoRA B products in their GEMVs' stores
// (tuning.loraFold 'auto') against their own dispatches ('off'). `--compare loraAFold`: the q/k/v
// and gate/up LoRA A products begun in the previous layer's down_proj GEMV and in o_proj's
// (tuning.loraAFold 'auto'; q/k/v's from the second layer on: --layers 2 with '4b-layer'), and
// o_proj's and down_proj's A products split over K ('4b-layer') added up in their projection's
// GEMV, and o_proj's begun in the split decode attention's combine (--ctx 512), against their own
// dispatches and reduces ('off'). `--compare siluFold`: the
// SwiGLU activation formed inside down_proj's GEMVs (tuning.siluFold 'auto') against silu_mul's
// own dispatch ('off'). `--compare gemvSplitK`: the
// GEMV split over K where its columns make few workgroups (tuning.gemvSplitK 'auto': the o_proj and
// down_proj LoRA A products, N = r) against one workgroup walking the row ('off').
// `--compare gemvWideLanes`: up to 64 lanes a column where the GEMV's columns make few workgroups
// and it does not split (tuning.gemvWideLanes 'auto': the q/k/v and gate/up LoRA A products with
// their folded norm) against the 16 lanes of their row length alone ('off').
// `--kernels` sets kernel switches for both sides (the CLI's --kernels text). LoRA (r 16) on
// every projection, as a SpyRL policy decodes. Per shape and batch B (1 and 4): dispatches per
// decode step and the median seconds per step (forward + logits read), then the ratio unfused /
// fused (> 1: the fused path is faster). Shapes: 'tiny' (hidden 64, 2 layers, the real
// 151,936-token vocabulary) and '4b-layer' (one Qwen3-4B layer: hidden 2560, 32/8 heads of 128,
// MLP 9728, random weights, vocabulary 1024 so the layer dominates; --layers N stacks N of them,
// so that a step's fixed cost, its submit and read, weighs less: on the H100 of 2026-12-06 a
// one-layer step took 1.3-2 ms either way, and no fold's effect showed). A benchmark, not a test:
// nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { parseArgs } from 'node:util';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import { loadQwen3 } from '../src/model/load.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import type { Qwen3Model } from '../src/model/qwen3.ts';
import { memorySource } from '../src/model/sources.ts';
import { makeTinyCheckpoint, type TinyCheckpointOptions } from '../src/model/tinyModel.ts';
import * as K from '../src/ops/index.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '3' },
    steps: { type: 'string', default: '4' },
    shapes: { type: 'string', default: 'tiny,4b-layer' },
    ops: { type: 'boolean', default: false },
    weights: { type: 'string', default: 'bf16' },
    compare: { type: 'string', default: 'fusions' },
    kernels: { type: 'string', default: '' },
    layers: { type: 'string', default: '1' },
    ctx: { type: 'string', default: '0' },
  },
});
const COMPARES = ['fusions', 'normFold', 'loraFold', 'loraAFold', 'siluFold', 'gemvSplitK', 'gemvWideLanes'];
if (!COMPARES.includes(values.compare)) {
  throw new Error(`--compare must be one of ${COMPARES.join(', ')} (got "${values.compare}")`);
}
const baseTuning = K.parseTuning(values.kernels);
/** Side A (on: the fusions, the folded norms or the folded LoRA B products) or side B. */
function setSide(on: boolean): void {
  K.resetTuning(baseTuning);
  if (values.compare === 'fusions') K.fusions.enabled = on;
  else if (values.compare === 'normFold') K.tuning.normFold = on ? 'auto' : 'off';
  else if (values.compare === 'loraFold') K.tuning.loraFold = on ? 'auto' : 'off';
  else if (values.compare === 'loraAFold') K.tuning.loraAFold = on ? 'auto' : 'off';
  else if (values.compare === 'siluFold') K.tuning.siluFold = on ? 'auto' : 'off';
  else if (values.compare === 'gemvSplitK') K.tuning.gemvSplitK = on ? 'auto' : 'off';
  else K.tuning.gemvWideLanes = on ? 'auto' : 'off';
}
const SHAPES: Record<string, TinyCheckpointOptions> = {
  tiny: { layers: 2, hidden: 64, heads: 4, kvHeads: 2, headDim: 16, intermediate: 128 },
  '4b-layer': { layers: 1, hidden: 2560, heads: 32, kvHeads: 8, headDim: 128, intermediate: 9728, vocab: 1024 },
};
const reps = Number(values.reps),
  steps = Number(values.steps);
const PROMPT = 8;

/** One run: prefill B prompts, then `steps` decode steps; seconds and dispatches of each step. */
async function decodeRun(gpu: Gpu, model: Qwen3Model, B: number): Promise<Run> {
  const V = model.cfg.vocabSize;
  // --ctx: the cache's positions a sequence (the prompt stays PROMPT tokens): a decode attention
  // over a cache of 256 or more splits over the keys and combines (attention_combine).
  const cache = model.createCache(B, Math.max(PROMPT + steps + 1, Number(values.ctx)));
  const rows = Array.from({ length: B }, (_, b) => b);
  const pre = model.forward(
    {
      ids: rows.flatMap((b) => Array.from({ length: PROMPT }, (_, t) => (b * 977 + t * 31) % V)),
      slots: rows.flatMap((b) => Array(PROMPT).fill(b)),
      positions: rows.flatMap(() => Array.from({ length: PROMPT }, (_, t) => t)),
      logitRows: rows.map((b) => b * PROMPT + PROMPT - 1),
    },
    cache,
  );
  await gpu.readF32(pre, B * V);
  gpu.releaseBuffer(pre);
  const seconds: number[] = [],
    cpu: number[] = [];
  let dispatches = 0;
  for (let s = 0; s < steps; s++) {
    const t0 = performance.now();
    const c0 = process.cpuUsage();
    const d0 = gpu.dispatchCount;
    const out = model.forward(
      {
        ids: rows.map((b) => (b * 13 + s * 7) % V),
        slots: rows,
        positions: rows.map(() => PROMPT + s),
        logitRows: rows,
      },
      cache,
    );
    dispatches = gpu.dispatchCount - d0;
    await gpu.readF32(out, B * V);
    seconds.push((performance.now() - t0) / 1000);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1e6);
    gpu.releaseBuffer(out);
  }
  cache.destroy();
  return { seconds, cpu, dispatches };
}

/** Wall seconds and process CPU seconds (every SwiftShader thread) of each step. */
interface Run {
  seconds: number[];
  cpu: number[];
  dispatches: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/**
 * --ops: K.matmulGroup against one K.matmul per weight alone, at Qwen3-4B q/k/v (4096, 1024, 1024
 * x 2560) and gate/up (2 x 9728 x 2560) and at the tiny model's q/k/v (64, 32, 32 x 64), bf16, B 1
 * and 4: `iters` calls per timed run (one sync at the end), runs alternated.
 */
async function benchOps(gpu: Gpu): Promise<void> {
  const cases: [string, number[], number, number][] = [
    ['4b qkv', [4096, 1024, 1024], 2560, 5],
    ['4b gate/up', [9728, 9728], 2560, 2],
    ['tiny qkv', [64, 32, 32], 64, 200],
  ];
  for (const [name, Ns, Kd, iters] of cases) {
    const ws = Ns.map((N, i) => {
      const b = gpu.createBuffer(N * Kd * 2, `w${i}`);
      gpu.write(
        b,
        new Uint16Array(N * Kd).map((_, j) => 0x3c00 + ((j * 7 + i) % 128)),
      ); // bf16 ~ 0.0078..0.01
      return b;
    });
    for (const B of [1, 4]) {
      const x = gpu.createBuffer(B * Kd * 4, 'x');
      gpu.write(x, new Float32Array(B * Kd).fill(0.5));
      const outs = Ns.map((N) => gpu.createBuffer(B * N * 4, 'out'));
      const time = async (on: boolean) => {
        K.fusions.enabled = on;
        const t0 = performance.now(),
          c0 = process.cpuUsage();
        for (let i = 0; i < iters; i++) K.matmulGroup(gpu, outs, x, ws, B, Ns, Kd);
        await gpu.sync();
        const c = process.cpuUsage(c0);
        return { wall: (performance.now() - t0) / 1000 / iters, cpu: (c.user + c.system) / 1e6 / iters };
      };
      await time(true);
      await time(false);
      const fused: { wall: number; cpu: number }[] = [],
        unfused: { wall: number; cpu: number }[] = [];
      for (let r = 0; r < reps; r++) {
        fused.push(await time(true));
        unfused.push(await time(false));
      }
      K.fusions.enabled = true;
      const m = (xs: { wall: number; cpu: number }[], k: 'wall' | 'cpu') => median(xs.map((x) => x[k]));
      const ms = (v: number) => (1000 * v).toFixed(3);
      console.log(
        `${name} B=${B}: ms/call wall unfused ${ms(m(unfused, 'wall'))} fused ${ms(m(fused, 'wall'))} ` +
          `(${(m(unfused, 'wall') / m(fused, 'wall')).toFixed(3)}); CPU unfused ${ms(m(unfused, 'cpu'))} fused ` +
          `${ms(m(fused, 'cpu'))} (${(m(unfused, 'cpu') / m(fused, 'cpu')).toFixed(3)})`,
      );
      console.log(
        `  wall unfused [${unfused.map((x) => ms(x.wall)).join(' ')}] fused [${fused.map((x) => ms(x.wall)).join(' ')}]`,
      );
      for (const b of [x, ...outs]) gpu.releaseBuffer(b);
    }
    for (const b of ws) gpu.releaseBuffer(b);
  }
}

const gpu = await createGpu();
try {
  if (values.ops) {
    await benchOps(gpu);
    process.exit(0);
  }
  K.resetTuning(baseTuning);
  console.log(
    `${adapterName(gpu)}, weights ${values.weights}, ${reps} reps x ${steps} decode steps, alternated; ` +
      {
        fusions: 'fused = K.fusions on, unfused = off',
        normFold: "fused = tuning.normFold 'auto' (norms folded), unfused = 'off'",
        loraFold: "fused = tuning.loraFold 'auto' (LoRA B products in the GEMV stores), unfused = 'off'",
        loraAFold:
          "fused = tuning.loraAFold 'auto' (the q/k/v and gate/up LoRA A products begun in down_proj's and o_proj's GEMVs), unfused = 'off'",
        gemvSplitK: "fused = tuning.gemvSplitK 'auto' (GEMVs of few columns split over K), unfused = 'off'",
        siluFold: "fused = tuning.siluFold 'auto' (the SwiGLU formed in down_proj's GEMVs), unfused = 'off'",
        gemvWideLanes: "fused = tuning.gemvWideLanes 'auto' (up to 64 lanes a column), unfused = 'off'",
      }[values.compare] +
      (values.kernels ? `; --kernels ${values.kernels}` : ''),
  );
  for (const shape of values.shapes.split(',')) {
    const layers = shape === '4b-layer' ? Number(values.layers) : (SHAPES[shape]!.layers ?? 1);
    if (!Number.isInteger(layers) || layers < 1)
      throw new Error(`--layers must be a positive integer (got "${values.layers}")`);
    const { files } = makeTinyCheckpoint({ ...SHAPES[shape], layers, seed: 1 });
    const { model } = await loadQwen3(gpu, memorySource(shape, files), {
      weights: values.weights === 'q4' ? 'q4' : 'bf16',
    });
    const lora = loraConfig({ r: 16, alpha: 32 });
    const adapter = new LoraAdapter(gpu, model.cfg, lora);
    adapter.setWeights(initLora(model.cfg, lora, 1));
    model.lora = adapter;
    for (const B of [1, 4]) {
      const runs: Record<'fused' | 'unfused', Run> = {
        fused: { seconds: [], cpu: [], dispatches: 0 },
        unfused: { seconds: [], cpu: [], dispatches: 0 },
      };
      for (const on of [true, false]) {
        setSide(on);
        await decodeRun(gpu, model, B); // warm-up: pipelines, pool
      }
      for (let r = 0; r < reps; r++) {
        for (const on of [true, false]) {
          setSide(on);
          const res = await decodeRun(gpu, model, B);
          const rec = runs[on ? 'fused' : 'unfused'];
          rec.seconds.push(...res.seconds);
          rec.cpu.push(...res.cpu);
          rec.dispatches = res.dispatches;
        }
      }
      K.fusions.enabled = true;
      K.resetTuning(baseTuning);
      const [f, u] = [median(runs.fused.seconds), median(runs.unfused.seconds)];
      const [fc, uc] = [median(runs.fused.cpu), median(runs.unfused.cpu)];
      console.log(
        `${shape} B=${B}: dispatches/step ${runs.unfused.dispatches} -> ${runs.fused.dispatches}; ` +
          `wall s/step unfused ${u.toFixed(4)} fused ${f.toFixed(4)} (unfused / fused ${(u / f).toFixed(3)}); ` +
          `CPU s/step unfused ${uc.toFixed(4)} fused ${fc.toFixed(4)} (${(uc / fc).toFixed(3)})`,
      );
      const raw = (xs: number[]) => xs.map((s) => s.toFixed(4)).join(' ');
      console.log(`  wall unfused [${raw(runs.unfused.seconds)}]\n  wall fused   [${raw(runs.fused.seconds)}]`);
      console.log(`  CPU unfused  [${raw(runs.unfused.cpu)}]\n  CPU fused    [${raw(runs.fused.cpu)}]`);
    }
    adapter.destroy();
  }
} finally {
  gpu.destroy();
}
