// Training-pass memory (src/train/trainingPass.ts, trainingPassBytes.ts): the MLP in token chunks,
// the LM head in chunks of target rows that span runs, reduced-precision checkpoints, and the
// byte formula against the live bytes of real passes. Models: the golden fixtures (tiny).
//
// Tolerances, with u the unit roundoff of the checkpoint format (f16 2^-11, bf16 2^-8):
// - MLP chunks (f32 checkpoints): only the order in which the chunks' LoRA gradients are summed
//   changes: per tensor 1e-5 x max|g| (measured 2.2e-7); log-probs 1e-5 absolute (measured 0).
// - Reduced checkpoints vs the PyTorch f32 fixtures: each layer input is rounded once (relative
//   error <= u per element), which moves activations, and so gradients, by a few u relative. Per
//   tensor 10u x max|g_ref| + 1e-6 (measured 2.2u and 2.4u with f16, 3.3u and 5.1u with bf16),
//   loss 0.5u relative (measured <= 6.3e-6 = 0.013u f16, <= 1.5e-4 = 0.04u bf16).
// - Finite differences of the pass's own forward along the normalised gradient, step 1e-2: the
//   rounded forward is piecewise constant, so its central difference carries rounding noise on
//   top of the O(step^2) truncation (2e-4 with f32). Tolerance 10u + 1e-3 relative (measured
//   <= 1.1e-3 f16, <= 2.7e-3 bf16; up to 1.4e-2 with bf16 along other directions tried); a
//   wrong checkpoint or layer in the backward is off by far more.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import type { Qwen3Config } from '../../src/model/config.ts';
import { f16BitsToF32, f32ToF16Bits } from '../../src/model/q4.ts';
import { bf16BytesToF32, openSafetensorsModel } from '../../src/model/safetensors.ts';
import { memorySource } from '../../src/model/sources.ts';
import { colsScratchBytes } from '../../src/ops/colsSplit.ts';
import {
  TrainingPass,
  trainingPassBytes,
  type CheckpointDtype,
  type TrainingPassOptions,
} from '../../src/train/trainingPass.ts';
import { crossEntropyLoss } from '../../src/train/pgLoss.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { loadLoraGolden } from '../helpers/loraGolden.ts';
import { bf16ToF32, f32ToBf16 } from '../helpers/reference.ts';

const ROOT = join(import.meta.dirname, '../..');
const UNIT = { f16: 2 ** -11, bf16: 2 ** -8 };
const roundTo = { f16: (x: number) => f16BitsToF32(f32ToF16Bits(x)), bf16: (x: number) => bf16ToF32(f32ToBf16(x)) };

let gpu: Gpu;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

type Grads = Map<string, Float32Array>;

async function setup(variant: string) {
  const s = await loadLoraGolden(gpu, variant);
  const ids = s.ref.tokens;
  return { ...s, ids, targets: [...ids.slice(1), -1] };
}
type Setup = Awaited<ReturnType<typeof setup>>;

async function readF32Tensors(file: string): Promise<Grads> {
  const bytes = new Uint8Array(await readFile(file));
  const st = await openSafetensorsModel(memorySource('grads', new Map([['model.safetensors', bytes]])));
  const out: Grads = new Map();
  for (const name of st.tensors.keys()) {
    const b = await st.readTensor(name);
    out.set(name, new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)));
  }
  return out;
}

/** Forward + backward of the mean cross-entropy (or of given dlogp); returns logp, loss and the LoRA gradients. */
async function gradients(
  s: Setup,
  opts: TrainingPassOptions,
  ids = s.ids,
  targets = s.targets,
  dlogpOf?: (M: number) => number[],
) {
  s.adapter.zeroGrad();
  const pass = new TrainingPass(s.model, s.adapter, ids, targets, null, opts);
  const logp = await pass.forward();
  const ce = crossEntropyLoss(logp);
  pass.backward(dlogpOf ? dlogpOf(logp.length) : ce.dlogp);
  pass.release();
  return { logp, loss: ce.loss, grads: await s.adapter.getTensors('grads') };
}

async function lossOf(s: Setup, opts: TrainingPassOptions): Promise<number> {
  const pass = new TrainingPass(s.model, s.adapter, s.ids, s.targets, null, opts);
  try {
    return crossEntropyLoss(await pass.forward()).loss;
  } finally {
    pass.release();
  }
}

/** Worst per-tensor max|a - b| / max|b|, and whether every tensor is within rel x max|b| + abs. */
function compareGrads(a: Grads, b: Grads, rel: number, abs: number): { worst: number; bad: string[] } {
  let worst = 0;
  const bad: string[] = [];
  for (const [key, want] of b) {
    const got = a.get(key)!;
    let maxRef = 0,
      err = 0;
    for (let i = 0; i < want.length; i++) {
      maxRef = Math.max(maxRef, Math.abs(want[i]));
      err = Math.max(err, Math.abs(got[i] - want[i]));
    }
    if (err > rel * maxRef + abs) bad.push(`${key}: ${err} > ${rel} x ${maxRef} + ${abs}`);
    worst = Math.max(worst, err / (maxRef || 1));
  }
  return { worst, bad };
}

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
};

describe.each(['tied-all', 'untied-rslora'])('MLP in token chunks: %s', (variant) => {
  it('gives the same log-probs and gradients, and still matches PyTorch, with 5-token chunks', async () => {
    const s = await setup(variant);
    expect(s.ids.length).toBeGreaterThan(10); // several chunks, the last one partial
    const whole = await gradients(s, {});
    const chunked = await gradients(s, { mlpChunk: 5 });
    expect(maxAbsDiff(chunked.logp, whole.logp)).toBeLessThanOrEqual(1e-5);
    const vsWhole = compareGrads(chunked.grads, whole.grads, 1e-5, 0);
    expect(vsWhole.bad).toEqual([]);
    const vsTorch = compareGrads(chunked.grads, await readF32Tensors(join(s.dir, 'grads.safetensors')), 1e-3, 1e-6);
    expect(vsTorch.bad).toEqual([]);
    console.log(
      `${variant} mlpChunk 5: vs one chunk ${vsWhole.worst.toExponential(2)}, vs PyTorch ${vsTorch.worst.toExponential(2)} x max|g|`,
    );
    s.adapter.destroy();
  });
});

describe.each(['tied-all', 'untied-rslora'])('reduced-precision checkpoints: %s', (variant) => {
  it.each(['f16', 'bf16'] as const)(
    "%s: loss and gradients within a few roundoffs of PyTorch f32, and of the pass's own finite differences",
    async (dtype) => {
      const s = await setup(variant);
      const u = UNIT[dtype];
      const r = await gradients(s, { checkpoints: dtype });
      const lossErr = Math.abs(r.loss - s.ref.loss) / s.ref.loss;
      expect(lossErr).toBeLessThanOrEqual(0.5 * u);
      const vsTorch = compareGrads(r.grads, await readF32Tensors(join(s.dir, 'grads.safetensors')), 10 * u, 1e-6);
      expect(vsTorch.bad).toEqual([]);

      // Central difference of the pass's own loss along d = g / |g|: it must equal g . d = |g|.
      const norm = Math.sqrt([...r.grads.values()].reduce((n, g) => n + g.reduce((m, x) => m + x * x, 0), 0));
      const step = 1e-2;
      const shifted = (sign: number) =>
        new Map([...s.tensors].map(([k, w]) => [k, w.map((x, i) => x + (sign * step * r.grads.get(k)![i]) / norm)]));
      s.adapter.setWeights(shifted(1));
      const up = await lossOf(s, { checkpoints: dtype });
      s.adapter.setWeights(shifted(-1));
      const down = await lossOf(s, { checkpoints: dtype });
      s.adapter.setWeights(s.tensors);
      const fdErr = Math.abs((up - down) / (2 * step) - norm) / norm;
      expect(fdErr).toBeLessThanOrEqual(10 * u + 1e-3);
      console.log(
        `${variant} ${dtype}: loss ${lossErr.toExponential(2)} rel; gradients vs PyTorch ${vsTorch.worst.toExponential(2)} x max|g| (${(vsTorch.worst / u).toFixed(1)}u); finite difference ${fdErr.toExponential(2)}`,
      );
      s.adapter.destroy();
    },
  );
});

describe('the forward continues from the rounded checkpoint', () => {
  it.each(['f16', 'bf16'] as const)(
    '%s: checkpoints hold representable values and the log-probs are the head of the rounded final residual',
    async (dtype) => {
      const s = await setup('tied-all');
      const { cfg } = s;
      const C = cfg.hiddenSize,
        V = cfg.vocabSize,
        T = s.ids.length;
      const pass = new TrainingPass(s.model, s.adapter, s.ids, s.targets, null, { checkpoints: dtype });
      const logp = await pass.forward();
      const xs: Float32Array[] = [];
      for (let l = 0; l <= cfg.numLayers; l++) xs.push(await pass.readCheckpoint(l));
      pass.release();
      for (const [l, x] of xs.entries()) {
        const bad = x.findIndex((v) => roundTo[dtype](v) !== v);
        expect(bad, `checkpoint ${l} element ${bad} = ${x[bad]} is not a ${dtype} value`).toBe(-1);
      }
      // CPU head (f64) of the rounded final residual: final norm, tied LM head, log-softmax.
      const st = await openSafetensorsModel(nodeFolderSource(join(ROOT, s.ref.model_dir)));
      const W = bf16BytesToF32(await st.readTensor('model.embed_tokens.weight')); // (V, C)
      const w = bf16BytesToF32(await st.readTensor('model.norm.weight')); // (C)
      const xL = xs[cfg.numLayers];
      const cpu = s.targets.slice(0, T - 1).map((target, t) => {
        const x = xL.subarray(t * C, (t + 1) * C);
        const inv = 1 / Math.sqrt(x.reduce((a, v) => a + v * v, 0) / C + cfg.rmsNormEps);
        const h = Array.from(x, (v, c) => v * inv * w[c]);
        const z = Array.from({ length: V }, (_, v) => h.reduce((a, hc, c) => a + hc * W[v * C + c], 0));
        const mx = Math.max(...z);
        return z[target] - mx - Math.log(z.reduce((a, zv) => a + Math.exp(zv - mx), 0));
      });
      const f32 = new TrainingPass(s.model, s.adapter, s.ids, s.targets);
      const logp32 = await f32.forward();
      f32.release();
      const err = maxAbsDiff(logp, cpu),
        shift = maxAbsDiff(logp, logp32);
      console.log(
        `${dtype}: log-probs vs CPU head of the rounded x_L ${err.toExponential(2)}; vs the f32 pass ${shift.toExponential(2)}`,
      );
      expect(err).toBeLessThanOrEqual(1e-4); // f32 head arithmetic on |logits| ~ 1e2
      expect(shift).toBeGreaterThan(10 * err); // the check can tell rounded from unrounded
      s.adapter.destroy();
    },
  );
});

describe('LM head chunks spanning runs of targets, with MLP chunks (T = 70)', () => {
  it('log-probs match the inference path and the backward is linear over the runs', async () => {
    const s = await setup('tied-all');
    const T = 70,
      V = s.cfg.vocabSize;
    const ids = Array.from({ length: T }, (_, t) => (t * 7919 + 13) % V);
    // Targets at 0..29 and 33..68: 66 rows, so the first head chunk of 64 spans both runs.
    const runA = (t: number) => t < 30,
      runB = (t: number) => t >= 33 && t < 69;
    const tgt = (keep: (t: number) => boolean) => ids.map((_, t) => (keep(t) ? ids[t + 1] : -1));
    const dl = (M: number) => Array.from({ length: M }, (_, m) => Math.sin(m + 1));
    const opts = { mlpChunk: 16 };
    const both = await gradients(
      s,
      opts,
      ids,
      tgt((t) => runA(t) || runB(t)),
      dl,
    );
    expect(both.logp.length).toBe(66);

    const cache = s.model.createCache(1, T);
    const rows = ids.map((_, t) => t);
    const buf = s.model.forward({ ids, slots: rows.map(() => 0), positions: rows, logitRows: rows }, cache);
    const logits = await gpu.readF32(buf, T * V);
    gpu.releaseBuffer(buf);
    cache.destroy();
    const want = rows
      .filter((t) => runA(t) || runB(t))
      .map((t) => {
        const z = logits.subarray(t * V, (t + 1) * V);
        const mx = z.reduce((a, b) => Math.max(a, b), -Infinity);
        return z[ids[t + 1]] - mx - Math.log(z.reduce((a, b) => a + Math.exp(b - mx), 0));
      });
    expect(maxAbsDiff(both.logp, want)).toBeLessThanOrEqual(1e-3 * Math.max(1, ...want.map(Math.abs)));

    // dlogp of rows m (A: m < 30; B: 30 + m') gives the same gradient split into two passes.
    const a = await gradients(s, opts, ids, tgt(runA), (M) => dl(66).slice(0, M));
    const b = await gradients(s, opts, ids, tgt(runB), () => dl(66).slice(30));
    const sum: Grads = new Map([...a.grads].map(([k, v]) => [k, v.map((x, i) => x + b.grads.get(k)![i])]));
    const lin = compareGrads(both.grads, sum, 1e-5, 1e-7);
    expect(lin.bad).toEqual([]);
    s.adapter.destroy();
  });
});

/** Live bytes of buffers created through gpu.createBuffer, and their peak. */
function trackLiveBytes(g: Gpu) {
  const live = new Map<GPUBuffer, number>();
  let bytes = 0,
    peak = 0;
  const create = g.createBuffer.bind(g),
    release = g.releaseBuffer.bind(g);
  g.createBuffer = (n: number, label: string) => {
    const buf = create(n, label);
    live.set(buf, buf.size);
    bytes += buf.size;
    peak = Math.max(peak, bytes);
    return buf;
  };
  g.releaseBuffer = (buf: GPUBuffer) => {
    const n = live.get(buf);
    if (n !== undefined) {
      live.delete(buf);
      bytes -= n;
    }
    release(buf);
  };
  return {
    get bytes() {
      return bytes;
    },
    get peak() {
      return peak;
    },
    resetPeak() {
      peak = bytes;
    },
    restore() {
      g.createBuffer = create;
      g.releaseBuffer = release;
    },
  };
}

/**
 * One forward and backward (dlogp = -1) of a fresh pass, its buffers tracked from construction:
 * the live peaks of the forward and of the backward, the pass's own formula (bytes) and its
 * log-probs; every buffer released at the end (live bytes back to 0).
 */
async function measuredPass(
  s: Pick<Setup, 'model' | 'adapter'>,
  ids: number[],
  targets: number[],
  cands: number[] | null,
  opts: TrainingPassOptions,
) {
  const track = trackLiveBytes(gpu);
  try {
    const pass = new TrainingPass(s.model, s.adapter, ids, targets, cands, opts);
    const logp = await pass.forward();
    const fwdPeak = track.peak;
    track.resetPeak();
    pass.backward(logp.map(() => -1));
    const bwdPeak = track.peak;
    const want = pass.bytes;
    pass.release();
    return { fwdPeak, bwdPeak, want, logp, live: track.bytes };
  } finally {
    track.restore();
  }
}

// Kept layers: the forward keeps the last k layers' products and the backward uses them instead
// of recomputing them. Same kernels on the same inputs, in the same MLP chunks, so the log-probs
// and gradients are the recomputing pass's bit for bit, with the MLP in one chunk or in several.
describe.each(['tied-all', 'untied-rslora'])('kept layers: %s', (variant) => {
  it("give the recomputing pass's log-probs and gradients exactly, and still match PyTorch", async () => {
    const s = await setup(variant);
    const L = s.cfg.numLayers;
    expect(L).toBeGreaterThan(1); // some layers kept, some recomputed
    for (const checkpoints of ['f32', 'bf16'] as const) {
      const base = await gradients(s, { checkpoints });
      for (const keepLayers of [1, L]) {
        const kept = await gradients(s, { checkpoints, keepLayers });
        expect(kept.logp, `${checkpoints} keepLayers ${keepLayers}`).toEqual(base.logp);
        for (const [key, g] of base.grads)
          expect(kept.grads.get(key), `${checkpoints} ${keepLayers} ${key}`).toEqual(g);
      }
    }
    const chunked = await gradients(s, { mlpChunk: 5 });
    for (const keepLayers of [1, L]) {
      const keptChunked = await gradients(s, { mlpChunk: 5, keepLayers });
      expect(keptChunked.logp, `5-token chunks, keepLayers ${keepLayers}`).toEqual(chunked.logp);
      for (const [key, g] of chunked.grads)
        expect(keptChunked.grads.get(key), `5-token chunks, keepLayers ${keepLayers} ${key}`).toEqual(g);
    }
    const keptChunked = await gradients(s, { mlpChunk: 5, keepLayers: 1 });
    const vsTorch = compareGrads(keptChunked.grads, await readF32Tensors(join(s.dir, 'grads.safetensors')), 1e-3, 1e-6);
    expect(vsTorch.bad).toEqual([]);
    s.adapter.destroy();
  });

  it('a second backward after one forward recomputes what the first spent', async () => {
    const s = await setup(variant);
    const once = await gradients(s, {});
    s.adapter.zeroGrad();
    const pass = new TrainingPass(s.model, s.adapter, s.ids, s.targets, null, { keepLayers: s.cfg.numLayers });
    const { dlogp } = crossEntropyLoss(await pass.forward());
    pass.backward(dlogp);
    pass.backward(dlogp);
    pass.release();
    const twice = await s.adapter.getTensors('grads');
    for (const [key, g] of once.grads) {
      const got = twice.get(key)!;
      expect(
        maxAbsDiff(
          got,
          g.map((x) => 2 * x),
        ),
        key,
      ).toBeLessThanOrEqual(1e-6 * Math.max(1, ...g.map(Math.abs)));
    }
    s.adapter.destroy();
  });
});

describe('trainingPassBytes against the live bytes of real passes', () => {
  const cases: { name: string; opts: TrainingPassOptions; T?: number; restrict?: boolean; targets?: string[] }[] = [
    { name: 'f32, one MLP chunk, all targets', opts: {} },
    { name: 'f16, 5-token MLP chunks', opts: { checkpoints: 'f16', mlpChunk: 5 } },
    { name: 'bf16, restricted vote, 3-token chunks', opts: { checkpoints: 'bf16', mlpChunk: 3 }, restrict: true },
    { name: 'f16, T = 70: two head chunks, 16-token MLP chunks', opts: { checkpoints: 'f16', mlpChunk: 16 }, T: 70 },
    { name: 'f32, every layer kept', opts: { keepLayers: 2 } },
    { name: 'f16, 5-token MLP chunks, 1 layer kept', opts: { checkpoints: 'f16', mlpChunk: 5, keepLayers: 1 } },
    {
      name: 'bf16, restricted vote, 1 layer kept',
      opts: { checkpoints: 'bf16', mlpChunk: 3, keepLayers: 1 },
      restrict: true,
    },
    {
      name: 'f16, T = 70, 16-token MLP chunks, every layer kept',
      opts: { checkpoints: 'f16', mlpChunk: 16, keepLayers: 2 },
      T: 70,
    },
  ];
  it.each(cases)('$name', async ({ opts, T, restrict }) => {
    const s = await setup('tied-all');
    const V = s.cfg.vocabSize;
    const ids = T ? Array.from({ length: T }, (_, t) => (t * 7919 + 13) % V) : s.ids;
    const cands = [ids[ids.length - 1], 5, 9];
    const targets = restrict ? ids.map((_, t) => (t === ids.length - 2 ? ids[t + 1] : -1)) : [...ids.slice(1), -1];
    await gradients(s, opts, ids, targets); // warm-up: the RoPE table is cached per device
    try {
      const { fwdPeak, bwdPeak, want, live } = await measuredPass(s, ids, targets, restrict ? cands : null, opts);
      expect(live).toBe(0);
      expect({ fwdPeak, bwdPeak }).toEqual({ fwdPeak: want.peakForward, bwdPeak: want.peakBackward });
      const k = opts.keepLayers ?? 0;
      const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I } = s.cfg;
      const { r, targetModules } = s.adapter.settings;
      // k layers' products (q, k, v, attention output and lse, xMid, gate, up, u) and one workspace
      // for what element-wise kernels form from them (h1, h2, normed and rotated q and k, the MLP
      // chunk's act) and, with chunks, the chunk's gate, up, MLP u and row staging.
      const T = ids.length,
        Tc = Math.min(T, opts.mlpChunk ?? 256),
        nM = targetModules.filter((t) => ['gate_proj', 'up_proj', 'down_proj'].includes(t)).length;
      expect(want.kept).toBe(
        k &&
          4 *
            (T * k * (C + 2 * NH * HD + 2 * NKV * HD + NH + 2 * I + r * targetModules.length) +
              T * (2 * C + NH * HD + NKV * HD) +
              Tc * I +
              (Tc < T ? Tc * (2 * I + 2 * C + r * nM) : 0)),
      );
      expect(want.checkpoints).toBe(
        (s.cfg.numLayers + 1) *
          ids.length *
          s.cfg.hiddenSize *
          (opts.checkpoints && opts.checkpoints !== 'f32' ? 2 : 4),
      );
    } finally {
      s.adapter.destroy();
    }
  });

  // A GPU's choices (autoFor=gpu): the tiled GEMMs with split-K, and with gemmQ4Dequant 'on' the
  // f32 copy of each q4 weight dequantized before its product (src/ops/q4Dequant.ts), from 128 rows.
  it("q4 weights with a GPU's choices and gemmQ4Dequant 'on', T = 136: split partials and the copies", async () => {
    const s = await loadLoraGolden(gpu, 'tied-all', 'q4');
    const saved = { ...K.tuning }; // what the file started from (SPYRL_KERNELS in npm test's GPU-choice stage)
    K.tuning.autoFor = 'gpu';
    K.tuning.gemmQ4Dequant = 'on';
    try {
      const V = s.cfg.vocabSize;
      const ids = Array.from({ length: 136 }, (_, t) => (t * 7919 + 13) % V);
      const targets = [...ids.slice(1), -1];
      const opts = { checkpoints: 'f16' } as const;
      await measuredPass(s, ids, targets, null, opts); // warm-up: the RoPE table is cached per device
      const { fwdPeak, bwdPeak, want, logp, live } = await measuredPass(s, ids, targets, null, opts);
      expect(live).toBe(0);
      // The same log-probs, bit for bit, from the q4 tiles.
      K.tuning.gemmQ4Dequant = 'off';
      const plain = await measuredPass(s, ids, targets, null, opts);
      expect(Array.from(plain.logp)).toEqual(Array.from(logp));
      expect(plain.want.peakBackward).toBeLessThan(want.peakBackward);
      expect({ fwdPeak, bwdPeak }).toEqual({ fwdPeak: want.peakForward, bwdPeak: want.peakBackward });
      // The copy is counted: the formula without it is short, and the layer's scratch holds at
      // least the MLP weight's copy.
      const { intermediateSize: I, hiddenSize: C } = s.cfg;
      const without = trainingPassBytes(s.cfg, {
        seqLen: ids.length,
        numTargets: ids.length - 1,
        lora: { r: s.adapter.settings.r, targetModules: s.adapter.settings.targetModules },
        checkpoints: 'f16',
        splitK: true,
      });
      expect(want.peakBackward).toBeGreaterThanOrEqual(without.peakBackward);
      expect(want.layerBackward).toBeGreaterThan(without.layerBackward);
      const scratch = want.layout.backwardLayers.find((b) => b.name === 'matmul.scratch')!;
      expect(scratch.bytes).toBeGreaterThanOrEqual(I * C * 4);
    } finally {
      Object.assign(K.tuning, saved);
      s.adapter.destroy();
    }
  });

  // tuning.gemmTile '128': the 16-byte-load products take 128-row tiles (TM8), which make half the
  // workgroups and so may split over R more; the LoRA weight gradients keep the r-major 64-row
  // tiles. The live bytes still equal the formula.
  it("a GPU's choices with gemmTile '128', T = 136: the tall tiles' split partials", async () => {
    const s = await loadLoraGolden(gpu, 'tied-all');
    const saved = { ...K.tuning };
    K.tuning.autoFor = 'gpu';
    try {
      const V = s.cfg.vocabSize;
      const ids = Array.from({ length: 136 }, (_, t) => (t * 7919 + 13) % V);
      const targets = [...ids.slice(1), -1];
      const opts = { checkpoints: 'f16' } as const;
      K.tuning.gemmTile = '64';
      await measuredPass(s, ids, targets, null, opts); // warm-up: the RoPE table is cached per device
      const short = await measuredPass(s, ids, targets, null, opts);
      K.tuning.gemmTile = '128';
      const { fwdPeak, bwdPeak, want, logp, live } = await measuredPass(s, ids, targets, null, opts);
      expect(K.kernelVariant(gpu, 'matmulLora')!.defines.TM8, 'the tall tiles ran (the LoRA projections)').toBe(1);
      expect(live).toBe(0);
      expect({ fwdPeak, bwdPeak }).toEqual({ fwdPeak: want.peakForward, bwdPeak: want.peakBackward });
      // At these sizes R bounds the slices either way (src/ops/splitK.ts SPLITK_MIN_SLICE), so the
      // plan is the 64-row tiles'; test/ops/gemmTall.test.ts checks 4B shapes, where it is not.
      expect(want.peakBackward).toBe(short.want.peakBackward);
      // Within f32 rounding of the 64-row tiles' log-probs (split-K slices R differently).
      for (let i = 0; i < logp.length; i++) expect(Math.abs(logp[i]! - short.logp[i]!)).toBeLessThan(1e-4);
    } finally {
      Object.assign(K.tuning, saved);
      s.adapter.destroy();
    }
  });

  it("counts the tall tiles' split partials where they split more (Qwen3-4B sizes, T = 512)", () => {
    const cfg = {
      hiddenSize: 2560,
      numLayers: 36,
      numHeads: 32,
      numKvHeads: 8,
      headDim: 128,
      intermediateSize: 9728,
      vocabSize: 151936,
    } as Qwen3Config;
    const lora = {
      r: 16,
      targetModules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const,
    };
    const shape = { seqLen: 512, numTargets: 511, lora, checkpoints: 'bf16', mlpChunk: 512 } as const;
    const short = trainingPassBytes(cfg, shape);
    const tall = trainingPassBytes(cfg, { ...shape, gemmTileRows: 128 });
    // down_proj's input gradient (512, 2,560) over R = 9,728 makes 160 tiles of 64 rows (no split)
    // and 80 of 128 (4 slices: splitK.ts); gate/up's forward (512, 9,728) makes 608 or 304 (none).
    const scratch = (b: typeof short) => b.layout.backwardLayers.find((x) => x.name === 'matmul.scratch')?.bytes ?? 0;
    expect(scratch(short)).toBeLessThan(4 * 512 * 2560 * 4);
    expect(scratch(tall)).toBeGreaterThanOrEqual(4 * 512 * 2560 * 4);
    expect(tall.layerBackward).toBeGreaterThan(short.layerBackward);
  });

  it('equals the closed-form formula of its doc comment (Qwen3-0.6B sizes)', () => {
    const cfg = {
      hiddenSize: 1024,
      numLayers: 28,
      numHeads: 16,
      numKvHeads: 8,
      headDim: 128,
      intermediateSize: 3072,
      vocabSize: 151936,
    } as Qwen3Config;
    const {
      hiddenSize: C,
      numLayers: L,
      numHeads: NH,
      numKvHeads: NKV,
      headDim: HD,
      intermediateSize: I,
      vocabSize: V,
    } = cfg;
    const w = 4;
    for (const [T, M, dtype, chunk, r, targets, nc] of [
      [4096, 4095, 'f16', 256, 16, ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], 0],
      [100, 1, 'f32', 256, 8, ['q_proj', 'v_proj'], 4],
      [777, 200, 'bf16', 100, 4, ['down_proj'], 0],
    ] as const) {
      const Tc = Math.min(T, chunk),
        c = T > chunk ? 1 : 0,
        Hr = Math.min(64, M);
      const nA = targets.filter((t) => ['q_proj', 'k_proj', 'v_proj', 'o_proj'].includes(t)).length;
      const nM = targets.length - nA;
      const ck = dtype === 'f32' ? T * C * w : Math.ceil((T * C) / 2) * w;
      const layerForward =
        w * (T * (3 * C + 3 * NH * HD + 3 * NKV * HD + NH) + 3 * Tc * I + 2 * c * Tc * C + r * (nA * T + nM * Tc));
      // gemv_cols' split scratch (Pl, Ph of the doc comment)
      const rowCounts = (n: number, k: number) => [Math.min(n, k), n % k || k];
      const proj: [string, number, number][] = [
        ['q_proj', NH * HD, C],
        ['k_proj', NKV * HD, C],
        ['v_proj', NKV * HD, C],
        ['o_proj', C, NH * HD],
        ['gate_proj', I, C],
        ['up_proj', I, C],
        ['down_proj', C, I],
      ];
      const Pl = Math.max(
        0,
        ...proj.flatMap(([t, N, Kin]) =>
          (['gate_proj', 'up_proj', 'down_proj'].includes(t) ? rowCounts(T, Tc) : [T]).flatMap((rows) => [
            colsScratchBytes(rows, Kin, N),
            ...((targets as readonly string[]).includes(t)
              ? [colsScratchBytes(rows, r, N), colsScratchBytes(rows, Kin, r)]
              : []),
          ]),
        ),
      );
      const Ph = Math.max(...rowCounts(M, Hr).map((R) => colsScratchBytes(R, C, V)));
      const layerBackward =
        layerForward + w * (T * (2 * C + 2 * NH * HD + 2 * NKV * HD + r) + 3 * Tc * I) + Math.max(w * T * NH, Pl);
      // [g]: the forward forms the LM head's gradient (full vocabulary, an adapter).
      const g = nc ? 0 : 1;
      const headForward = nc
        ? w * (M * nc + Hr * (2 * C + V))
        : w * (M + Hr * (2 * C + V + 3)) + g * (w * Hr * (2 * C + V + 1) + Ph);
      const headBackward = g ? w * (T * C + M) : w * (T * C + M + Hr * (4 * C + 2 * V + 3)) + Ph;
      const base = (L + 1) * ck + w * (T + 2 * M) + g * w * M * (C + 1) + (dtype === 'f32' ? 0 : T * C * w);
      const shape = {
        seqLen: T,
        numTargets: M,
        lora: { r, targetModules: [...targets] },
        checkpoints: dtype as CheckpointDtype,
        mlpChunk: chunk,
        candidates: nc || undefined,
        splitK: false, // the formula's Pl and Ph above: gemv_cols' alone (a CPU adapter)
      };
      const got = trainingPassBytes(cfg, shape);
      // k kept layers' products, and the workspace of a kept layer.
      for (const k of [1, 5, L]) {
        const kept = trainingPassBytes(cfg, { ...shape, keepLayers: k });
        expect(kept.kept).toBe(
          w * T * k * (C + 2 * NH * HD + 2 * NKV * HD + NH + 2 * I + r * (nA + nM)) +
            w * (T * (2 * C + NH * HD + NKV * HD) + Tc * I) +
            c * w * Tc * (2 * I + 2 * C + r * nM),
        );
        expect(kept.layerForward).toBe(k === L ? 0 : layerForward);
      }
      expect(got).toMatchObject({
        checkpoints: (L + 1) * ck,
        layerForward,
        layerBackward,
        headForward,
        headBackward,
        peakForward: base + Math.max(w * T, layerForward, headForward),
        peakBackward: base + Math.max(headBackward, layerBackward),
      });
    }
  });
});

describe('TrainingPass options', () => {
  it('refuses an unknown checkpoint dtype and a bad MLP chunk, naming the option', async () => {
    const s = await setup('tied-all');
    expect(
      () => new TrainingPass(s.model, s.adapter, s.ids, s.targets, null, { checkpoints: 'fp8' as CheckpointDtype }),
    ).toThrow(/option checkpoints must be one of f32, f16, bf16/);
    expect(() => new TrainingPass(s.model, s.adapter, s.ids, s.targets, null, { mlpChunk: 0 })).toThrow(
      /option mlpChunk must be a positive integer/,
    );
    for (const keepLayers of [-1, 1.5, s.cfg.numLayers + 1])
      expect(() => new TrainingPass(s.model, s.adapter, s.ids, s.targets, null, { keepLayers })).toThrow(
        `option keepLayers must be an integer in 0..${s.cfg.numLayers} (got ${keepLayers})`,
      );
    s.adapter.destroy();
  });

  it('release() after a forward with kept layers and no backward frees every buffer', async () => {
    const s = await setup('tied-all');
    await gradients(s, {}); // warm-up: the RoPE table is cached per device
    const track = trackLiveBytes(gpu);
    try {
      const pass = new TrainingPass(s.model, s.adapter, s.ids, s.targets, null, { keepLayers: 2 });
      await pass.forward();
      // The kept products stay after the forward; the workspace of a kept layer does not.
      const products = pass.bytes.layout.forwardKept.filter((b) => b.name.startsWith('kept.'));
      const workspace = pass.bytes.layout.forwardKept.filter((b) => b.name.startsWith('keptWork.'));
      expect(products.length).toBeGreaterThan(0);
      expect(workspace.length).toBe(5);
      const held = pass.bytes.checkpoints + pass.bytes.pass;
      expect(track.bytes).toBeGreaterThanOrEqual(held + products.reduce((n, b) => n + b.bytes, 0));
      expect(track.bytes).toBeLessThan(held + pass.bytes.kept);
      pass.release();
      expect(track.bytes).toBe(0);
    } finally {
      track.restore();
      s.adapter.destroy();
    }
  });
});
