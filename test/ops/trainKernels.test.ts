// The loss and optimizer ops of src/ops (loss.ts, optimizer.ts) against f64 CPU references.
// Run: npx vitest run test/ops/trainKernels.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
//
// Tolerances (|gpu - ref|max <= rel * |ref|max + abs, test/helpers/reference.ts compare), each with what
// it is made of; the errors measured on the run are printed at the end (SwiftShader figures here):
// - logSoftmaxGather: lse = max + log(sum of exps) in f32. The sum's relative error over 151936
//   terms (per-thread, then tree order) becomes an absolute error in lse, and lse (~50 for N(0, 10)
//   logits) itself rounds at ~4e-6. Measured <= 1.1e-6; abs 2e-5 leaves room for GPUs' exp/log.
// - logSoftmaxBackward: softmax values are <= 1 and WGSL's exp is good to 3 + 2|x| ulp, so the
//   error is a few 1e-7 times |dlogp| (measured 3e-8 relative): rel 2e-6 plus abs 1e-7.
// - sumSquares: an f32 sum of 1.5e6 squares in <= 256 partials: rel 1e-5 (measured ~1e-7).
// - adamw: per element, 1e-6 * |param| (param * decay and the update each round once a step: a
//   few ulp over 5 steps) plus 1e-5 * max|update| (sqrt/divide rounding). Measured <= 0.25 of it;
//   a missing bias correction, decay, gradScale, or L2 instead of decoupled decay is >= 300x off.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as TK from '../../src/ops/index.ts';
import * as ref from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { measured, f32Buf, u32Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
});

afterAll(() => {
  h.report('train kernel errors');
  gpu?.destroy();
});

// ---- CPU references (f64) -------------------------------------------------------------------

/** lse[r] = logsumexp(logits[r, :]), logp[r] = logits[r, targets[r]] - lse[r], in f64. */
function logSoftmaxRef(
  logits: Float32Array,
  targets: ArrayLike<number>,
  R: number,
  V: number,
): { logp: Float64Array; lse: Float64Array } {
  const logp = new Float64Array(R);
  const lse = new Float64Array(R);
  for (let r = 0; r < R; r++) {
    let mx = -Infinity;
    for (let v = 0; v < V; v++) mx = Math.max(mx, logits[r * V + v]);
    let s = 0;
    for (let v = 0; v < V; v++) s += Math.exp(logits[r * V + v] - mx);
    lse[r] = mx + Math.log(s);
    logp[r] = logits[r * V + targets[r]] - lse[r];
  }
  return { logp, lse };
}

function logSoftmaxBackwardRef(
  dlogp: ArrayLike<number>,
  logits: Float32Array,
  lse: Float64Array,
  targets: ArrayLike<number>,
  R: number,
  V: number,
): Float64Array {
  const d = new Float64Array(R * V);
  for (let r = 0; r < R; r++) {
    for (let v = 0; v < V; v++)
      d[r * V + v] = dlogp[r] * ((v === targets[r] ? 1 : 0) - Math.exp(logits[r * V + v] - lse[r]));
  }
  return d;
}

interface AdamWState {
  param: Float32Array;
  m: Float32Array;
  v: Float32Array;
}

type AdamWVariant = 'torch' | 'noBiasCorrection' | 'l2Decay' | 'noDecay' | 'noGradScale';

/**
 * torch.optim.AdamW (amsgrad off, maximize off) on f32 tensors, _single_tensor_adam with decoupled
 * decay; each in-place op stores f32 (Math.fround), the scalars are Python f64:
 *   step += 1; param.mul_(1 - lr*wd); exp_avg.lerp_(grad, 1 - beta1);
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2);
 *   denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2**step)).add_(eps);
 *   param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
 * `variant` breaks it on purpose, to show the comparison would catch a wrong optimizer.
 */
function adamwRef(s: AdamWState, grad: Float32Array, hp: TK.AdamWHyper, variant: AdamWVariant = 'torch'): void {
  const bias1 = variant === 'noBiasCorrection' ? 1 : 1 - hp.beta1 ** hp.step;
  const bias2 = variant === 'noBiasCorrection' ? 1 : 1 - hp.beta2 ** hp.step;
  const fr = Math.fround;
  for (let i = 0; i < s.param.length; i++) {
    let g = variant === 'noGradScale' ? grad[i] : fr(grad[i] * hp.gradScale);
    if (variant === 'l2Decay')
      g = fr(g + hp.weightDecay * s.param[i]); // Adam + L2, not AdamW
    else if (variant !== 'noDecay') s.param[i] = fr(s.param[i] * (1 - hp.lr * hp.weightDecay));
    s.m[i] = fr(s.m[i] + (1 - hp.beta1) * (g - s.m[i]));
    s.v[i] = fr(fr(hp.beta2 * s.v[i]) + (1 - hp.beta2) * g * g);
    const denom = fr(fr(Math.sqrt(s.v[i]) / Math.sqrt(bias2)) + hp.eps);
    s.param[i] = fr(s.param[i] - (hp.lr / bias1) * (s.m[i] / denom));
  }
}

// ---- tests ----------------------------------------------------------------------------------

describe('logSoftmaxGather', () => {
  for (const [V, sigma] of [
    [1000, 10],
    [151936, 10],
    [151936, 1],
  ] as const) {
    it(`matches f64 at R=3, V=${V}, logits ~ N(0, ${sigma})`, async () => {
      const R = 3;
      const rand = ref.rng(V + sigma);
      const logits = ref.randn(R * V, rand, sigma);
      // One target at the row max, one at the row min, one arbitrary.
      const targets = [0, 0, Math.floor(rand() * V)];
      for (let v = 0; v < V; v++) {
        if (logits[v] > logits[targets[0]]) targets[0] = v;
        if (logits[V + v] < logits[V + targets[1]]) targets[1] = v;
      }
      const want = logSoftmaxRef(logits, targets, R, V);
      const logp = outBuf(R, 'logp');
      const lse = outBuf(R, 'lse');
      const t0 = performance.now();
      TK.logSoftmaxGather(gpu, logp, lse, f32Buf(logits, 'logits'), u32Buf(targets), R, V);
      await gpu.sync();
      const ms = performance.now() - t0;
      expectClose(`logSoftmaxGather V=${V} s=${sigma} lse`, await gpu.readF32(lse, R), want.lse, 0, 2e-5);
      expectClose(`logSoftmaxGather V=${V} s=${sigma} logp`, await gpu.readF32(logp, R), want.logp, 0, 2e-5);
      measured[`logSoftmaxGather V=${V} s=${sigma} time`] = `${ms.toFixed(1)} ms (incl. upload + pipeline)`;
    });
  }

  it('matches f64 over many short rows (V < workgroup size)', async () => {
    const [R, V] = [70, 37];
    const rand = ref.rng(5);
    const logits = ref.randn(R * V, rand, 10);
    const targets = Array.from({ length: R }, () => Math.floor(rand() * V));
    const want = logSoftmaxRef(logits, targets, R, V);
    const logp = outBuf(R, 'logp');
    const lse = outBuf(R, 'lse');
    TK.logSoftmaxGather(gpu, logp, lse, f32Buf(logits, 'logits'), u32Buf(targets), R, V);
    expectClose('logSoftmaxGather R=70 V=37 lse', await gpu.readF32(lse, R), want.lse, 0, 2e-5);
    expectClose('logSoftmaxGather R=70 V=37 logp', await gpu.readF32(logp, R), want.logp, 0, 2e-5);
  });

  it('gives NaN for a target outside the vocabulary', async () => {
    const V = 50;
    const logits = ref.randn(2 * V, ref.rng(3));
    const logp = outBuf(2, 'logp');
    const lse = outBuf(2, 'lse');
    TK.logSoftmaxGather(gpu, logp, lse, f32Buf(logits), u32Buf([V, 7]), 2, V);
    const got = await gpu.readF32(logp, 2);
    expect(Number.isNaN(got[0])).toBe(true);
    expect(got[1]).toBeCloseTo(logSoftmaxRef(logits, [0, 7], 2, V).logp[1], 5);
  });
});

describe('logSoftmaxBackward', () => {
  it('matches f64 at R=3, V=151936 and overwrites dlogits', async () => {
    const [R, V] = [3, 151936];
    const rand = ref.rng(11);
    const logits = ref.randn(R * V, rand, 10);
    const targets = [5, 151935, 77777];
    const dlogp = [1.5, -0.25, 3];
    const logitsBuf = f32Buf(logits, 'logits');
    const targetsBuf = u32Buf(targets);
    const logp = outBuf(R, 'logp');
    const lse = outBuf(R, 'lse');
    const dlogits = f32Buf(new Float32Array(R * V).fill(123), 'dlogits'); // garbage to overwrite
    TK.logSoftmaxGather(gpu, logp, lse, logitsBuf, targetsBuf, R, V);
    TK.logSoftmaxBackward(gpu, dlogits, f32Buf(dlogp, 'dlogp'), logitsBuf, lse, targetsBuf, R, V);
    const got = await gpu.readF32(dlogits, R * V);
    // The reference uses the GPU's lse so this isolates the backward kernel.
    const want = logSoftmaxBackwardRef(dlogp, logits, Float64Array.from(await gpu.readF32(lse, R)), targets, R, V);
    expectClose('logSoftmaxBackward V=151936', got, want, 2e-6, 1e-7);
  });

  it('matches central finite differences of the f64 log-softmax', async () => {
    // f(logits) = sum_r dlogp[r] * logp[r]; df/dlogits = dlogits. N(0, 2) logits keep the
    // softmax spread over many tokens so the differences are not all ~0.
    const [R, V] = [2, 1000];
    const rand = ref.rng(12);
    const logits = ref.randn(R * V, rand, 2);
    const targets = [3, 999];
    const dlogp = [0.7, -1.3];
    const logitsBuf = f32Buf(logits, 'logits');
    const targetsBuf = u32Buf(targets);
    const lse = outBuf(R, 'lse');
    const dlogits = outBuf(R * V, 'dlogits');
    TK.logSoftmaxGather(gpu, outBuf(R, 'logp'), lse, logitsBuf, targetsBuf, R, V);
    TK.logSoftmaxBackward(gpu, dlogits, f32Buf(dlogp, 'dlogp'), logitsBuf, lse, targetsBuf, R, V);
    const got = await gpu.readF32(dlogits, R * V);

    const x = Float64Array.from(logits);
    const f = (): number => {
      const { logp } = logSoftmaxRef(x as unknown as Float32Array, targets, R, V);
      return dlogp[0] * logp[0] + dlogp[1] * logp[1];
    };
    const h = 1e-5;
    let argmax = 0;
    for (let v = 0; v < V; v++) if (logits[v] > logits[argmax]) argmax = v;
    const probe = [3, argmax, 0, 500, 998, V + 999, V + 1, V + 321];
    const fd: number[] = [];
    for (const i of probe) {
      const x0 = x[i];
      x[i] = x0 + h;
      const up = f();
      x[i] = x0 - h;
      const down = f();
      x[i] = x0;
      fd.push((up - down) / (2 * h));
    }
    // Central differences in f64 are good to ~1e-9 here; the GPU side carries f32 roundings.
    expectClose(
      'logSoftmaxBackward vs finite differences',
      probe.map((i) => got[i]),
      fd,
      1e-5,
      1e-7,
    );
    expect(Math.abs(fd[0])).toBeGreaterThan(0.5); // the target's own term is exercised
  });
});

describe('sumSquares', () => {
  it('adds sum(x^2) of 1.5e6 elements into out[outIndex], accumulating across calls', async () => {
    const n = 1_500_001; // > 256 partials x 4096: the grid-stride loop runs with the partials capped
    const rand = ref.rng(21);
    const a = ref.randn(n, rand);
    const b = ref.randn(1234, rand, 3);
    let sa = 0;
    for (const v of a) sa += v * v;
    let sb = 0;
    for (const v of b) sb += v * v;
    const out = f32Buf([0.5, 7, 0.25], 'out');
    const aBuf = f32Buf(a, 'a');
    const t0 = performance.now();
    TK.sumSquares(gpu, out, aBuf, n, 1);
    TK.sumSquares(gpu, out, f32Buf(b, 'b'), b.length, 1);
    TK.sumSquares(gpu, out, aBuf, 10, 2); // a prefix only
    const got = await gpu.readF32(out, 3);
    measured['sumSquares n=1.5e6 time'] = `${(performance.now() - t0).toFixed(1)} ms (incl. upload + pipeline)`;
    let s10 = 0;
    for (let i = 0; i < 10; i++) s10 += a[i] * a[i];
    expect(got[0]).toBe(0.5);
    expectClose('sumSquares n=1.5e6', [got[1]], [7 + sa + sb], 1e-5, 0);
    expectClose('sumSquares n=10', [got[2]], [0.25 + s10], 1e-6, 0);
  });

  it('makes out[outIndex] NaN for a NaN or Inf anywhere, and keeps it NaN', async () => {
    const n = 300_001;
    const out = f32Buf([0, 0, 0, 0], 'out');
    for (const [k, bad, at] of [
      [0, NaN, n - 1],
      [1, Infinity, 0],
      [2, -Infinity, 123_457],
    ] as const) {
      const x = ref.randn(n, ref.rng(k));
      x[at] = bad;
      TK.sumSquares(gpu, out, f32Buf(x, 'x'), n, k);
    }
    // Overflow of the sum itself, then a finite tensor added on top of a NaN.
    TK.sumSquares(gpu, out, f32Buf(new Float32Array(4).fill(3e38), 'huge'), 4, 3);
    TK.sumSquares(gpu, out, f32Buf(ref.randn(1000, ref.rng(9)), 'fine'), 1000, 3);
    const got = await gpu.readF32(out, 4);
    for (let k = 0; k < 4; k++) expect(Number.isNaN(got[k]), `out[${k}] = ${got[k]}`).toBe(true);
  });
});

describe('adamw', () => {
  const n = 10_007; // not a multiple of the workgroup size
  const hp0: TK.AdamWHyper = {
    lr: 1e-3,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weightDecay: 0.1,
    step: 1,
    gradScale: 0.5,
  };

  // Per element: |got - want| <= REL_P * |want| + REL_U * max|want - param0|. A few f32 ulps of
  // the parameter (decay and the update each round once per step) plus a small fraction of the
  // total update (the kernel's sqrt/divide round differently from the reference's).
  const REL_P = 1e-6;
  const REL_U = 1e-5;

  function adamwCompare(
    got: Float32Array,
    want: Float32Array,
    param0: Float32Array,
  ): { ok: boolean; worst: number; ratio: number } {
    let maxUpdate = 0;
    for (let i = 0; i < n; i++) maxUpdate = Math.max(maxUpdate, Math.abs(want[i] - param0[i]));
    let ratio = 0; // worst |err| / tolerance
    let worst = -1;
    for (let i = 0; i < n; i++) {
      const r = Math.abs(got[i] - want[i]) / (REL_P * Math.abs(want[i]) + REL_U * maxUpdate);
      if (!(r <= ratio)) {
        ratio = Number.isNaN(r) ? Infinity : r;
        worst = i;
      }
    }
    return { ok: ratio <= 1, worst, ratio };
  }

  async function run5Steps(): Promise<{
    got: Float32Array;
    grads: Float32Array[];
    hps: TK.AdamWHyper[];
    param0: Float32Array;
  }> {
    const rand = ref.rng(31);
    // LoRA-sized values (A ~ 0.02) and unit-sized ones, where the weight decay term is visible.
    const param0 = ref.randn(n, rand, 0.02);
    for (let i = 0; i < n; i += 3) param0[i] *= 50;
    const paramBuf = f32Buf(param0, 'param');
    const mBuf = f32Buf(new Float32Array(n), 'm');
    const vBuf = f32Buf(new Float32Array(n), 'v');
    const gradBuf = outBuf(n, 'grad');
    const grads: Float32Array[] = [];
    const hps: TK.AdamWHyper[] = [];
    for (let step = 1; step <= 5; step++) {
      const g = ref.randn(n, rand, step === 3 ? 1e-9 : 1); // step 3: gradients below eps
      for (let i = 0; i < n; i += 97) g[i] = 0;
      grads.push(g);
      const hp = { ...hp0, step, lr: hp0.lr * (1 - 0.1 * step), gradScale: step === 5 ? 1 : 0.5 };
      hps.push(hp);
      gpu.write(gradBuf, g);
      TK.adamw(gpu, paramBuf, gradBuf, mBuf, vBuf, n, hp);
    }
    return { got: await gpu.readF32(paramBuf, n), grads, hps, param0 };
  }

  function reference(
    param0: Float32Array,
    grads: Float32Array[],
    hps: TK.AdamWHyper[],
    variant?: AdamWVariant,
  ): Float32Array {
    const s: AdamWState = { param: param0.slice(), m: new Float32Array(n), v: new Float32Array(n) };
    grads.forEach((g, k) => adamwRef(s, g, hps[k], variant));
    return s.param;
  }

  it('matches torch.optim.AdamW over 5 steps (decay, bias correction, gradScale, tiny grads)', async () => {
    const { got, grads, hps, param0 } = await run5Steps();
    const want = reference(param0, grads, hps);
    const c = adamwCompare(got, want, param0);
    measured['adamw 5 steps'] =
      `worst |err| / tolerance ${c.ratio.toExponential(2)} at ${c.worst} (got ${got[c.worst]}, want ${want[c.worst]})`;
    expect(c.ok, measured['adamw 5 steps']).toBe(true);
  });

  it('comparator rejects a wrong optimizer (no bias correction, L2 decay, no decay, no gradScale)', async () => {
    const { got, grads, hps, param0 } = await run5Steps();
    for (const variant of ['noBiasCorrection', 'l2Decay', 'noDecay', 'noGradScale'] as const) {
      const c = adamwCompare(got, reference(param0, grads, hps, variant), param0);
      measured[`adamw vs ${variant}`] = `worst |err| / tolerance ${c.ratio.toExponential(2)}`;
      expect(c.ok, variant).toBe(false);
    }
  });

  it('rejects a step below 1', () => {
    const b = outBuf(4);
    expect(() => TK.adamw(gpu, b, outBuf(4), outBuf(4), outBuf(4), 1, { ...hp0, step: 0 })).toThrow(RangeError);
  });
});
