// Backward kernels of LoRA training (docs/ENGINE.md, "Training (LoRA) additions"), in two links:
//   1. the CPU backward references (test/helpers/reference.ts) against f64 central finite differences of
//      the CPU forward references: L = sum(forward(x) * g), so dL/dx is the backward given dy = g;
//   2. the GPU kernels against those CPU backward references, at small odd shapes, with the
//      gradient buffers pre-filled so that "adds into" (+=) is checked too.
// Each link also gets a deliberately wrong backward (sign, missing term, wrong rotation, ...)
// that the same comparator must reject, so neither check passes vacuously.
// Run: npx vitest run test/ops/backward.test.ts
//
// Tolerances (|err|max <= rel * |ref|max + abs):
// - finite differences: f64 with h = 1e-5: truncation ~h^2 and cancellation ~1e-16/h, both
//   < 1e-9 relative here, so rel 1e-6 leaves a wide margin; measured values print at the end.
// - GPU vs reference: as test/ops/kernels.test.ts (rel 1e-5, abs 1e-6): f32 rounding growing with
//   the reduction length; measured <= 5e-7 relative for the matmuls (T reductions up to 300).
//   Attention uses rel 2e-5: dk and dv sum P-weighted rows over every later query and head of the
//   group, measured 1e-6 (T=1000) and 3e-6 (T=2048, 4096 terms) relative for dv.

import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import * as ref from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { measured, f32Buf, u32Buf, bf16Buf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
});

afterAll(() => {
  h.report('backward errors');
  gpu?.destroy();
});

const REL = 1e-5;
const ABS = 1e-6;
const FD_REL = 1e-6;
const FD_ABS = 1e-9;

/** The comparator must reject `wrong`, and by a wide margin (> 10x its tolerance). */
function expectRejected(
  name: string,
  got: ArrayLike<number>,
  wrong: ArrayLike<number>,
  rel: number,
  abs: number,
): void {
  const d = ref.compare(got, wrong, rel, abs);
  measured[`${name} (must fail)`] =
    `max|err| ${d.maxAbs.toExponential(2)} vs tolerance ${(rel * d.maxRef + abs).toExponential(2)}`;
  expect(d.maxAbs, `${name}: a wrong backward was accepted`).toBeGreaterThan(10 * (rel * d.maxRef + abs));
}

const f64 = (x: ArrayLike<number>) => Float64Array.from(x);
const dot = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
};

/** Central differences of loss() with respect to every element of x (perturbed in place). */
function numGrad(loss: () => number, x: Float64Array, h = 1e-5): Float64Array {
  const grad = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const x0 = x[i];
    x[i] = x0 + h;
    const up = loss();
    x[i] = x0 - h;
    const down = loss();
    x[i] = x0;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

// ---- deliberately wrong backwards (each a classic bug) -----------------------------------------

/** rmsNorm backward without the rstd^3 mean(w dy x) term (treating rstd as a constant). */
function rmsNormBackwardNoMeanTerm(
  dx: ref.Vec,
  dy: ref.Vec,
  x: ref.Vec,
  w: ref.Vec,
  R: number,
  D: number,
  eps: number,
): void {
  for (let r = 0; r < R; r++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[r * D + i] ** 2;
    const rstd = 1 / Math.sqrt(ss / D + eps);
    for (let i = 0; i < D; i++) dx[r * D + i] += w[i] * dy[r * D + i] * rstd;
  }
}

/** silu' taken as sigmoid (the g s (1 - s) term dropped). */
function siluMulBackwardNoProductRule(
  dgate: ref.Vec,
  dup: ref.Vec,
  dout: ref.Vec,
  gate: ref.Vec,
  up: ref.Vec,
  n: number,
): void {
  for (let i = 0; i < n; i++) {
    const s = 1 / (1 + Math.exp(-gate[i]));
    dgate[i] += dout[i] * up[i] * s;
    dup[i] += dout[i] * gate[i] * s;
  }
}

// ---- 1. CPU backward references vs finite differences of the CPU forwards ---------------------

describe('reference backward vs finite differences (f64)', () => {
  it('matmulF32: dx and dw (scale 0.7)', () => {
    const [T, N, Kd, s] = [3, 5, 7, 0.7];
    const rand = ref.rng(100);
    const x = f64(ref.randn(T * Kd, rand));
    const w = f64(ref.randn(N * Kd, rand));
    const g = f64(ref.randn(T * N, rand));
    const y = new Float64Array(T * N);
    const loss = () => (ref.matmulF32(y, x, w, T, N, Kd, false, s), dot(y, g));
    const dx = new Float64Array(T * Kd);
    ref.matmulBackwardInput(dx, g, w, T, N, Kd, true, s);
    const numDx = numGrad(loss, x);
    expectClose('fd matmul dx', dx, numDx, FD_REL, FD_ABS);
    const dw = new Float64Array(N * Kd);
    ref.matmulBackwardWeight(dw, g, x, T, N, Kd, s);
    const numDw = numGrad(loss, w);
    expectClose('fd matmul dw', dw, numDw, FD_REL, FD_ABS);

    // Forgotten scale; dw computed as (K, N) instead of (N, K).
    const dxNoScale = new Float64Array(T * Kd);
    ref.matmulBackwardInput(dxNoScale, g, w, T, N, Kd, true, 1);
    expectRejected('fd matmul dx without scale', dxNoScale, numDx, FD_REL, FD_ABS);
    const dwT = new Float64Array(N * Kd);
    for (let n = 0; n < N; n++) for (let k = 0; k < Kd; k++) dwT[k * N + n] = dw[n * Kd + k];
    expectRejected('fd matmul dw transposed', dwT, numDw, FD_REL, FD_ABS);
  });

  it('rmsNorm: dx (R=3, D=7)', () => {
    const [R, D, eps] = [3, 7, 1e-6];
    const rand = ref.rng(101);
    const x = f64(ref.randn(R * D, rand, 2));
    const w = f64(ref.roundBf16(ref.randn(D, rand)));
    const g = f64(ref.randn(R * D, rand));
    const y = new Float64Array(R * D);
    const numDx = numGrad(() => (ref.rmsNorm(y, x, w, R, D, eps), dot(y, g)), x);
    const dx = new Float64Array(R * D);
    ref.rmsNormBackward(dx, g, x, w, R, D, eps);
    expectClose('fd rmsNorm dx', dx, numDx, FD_REL, FD_ABS);
    const wrong = new Float64Array(R * D);
    rmsNormBackwardNoMeanTerm(wrong, g, x, w, R, D, eps);
    expectRejected('fd rmsNorm dx without mean term', wrong, numDx, FD_REL, FD_ABS);
  });

  it('rope: dx (T=3, H=2, HD=8, pos up to 1000)', () => {
    const [T, H, HD, theta] = [3, 2, 8, 1e4];
    const pos = Uint32Array.from([0, 5, 1000]);
    const rand = ref.rng(102);
    const x = f64(ref.randn(T * H * HD, rand));
    const g = f64(ref.randn(T * H * HD, rand));
    const numDx = numGrad(() => {
      const y = x.slice();
      ref.rope(y, pos, T, H, HD, theta);
      return dot(y, g);
    }, x);
    const dx = g.slice();
    ref.ropeBackward(dx, pos, T, H, HD, theta);
    expectClose('fd rope dx', dx, numDx, FD_REL, FD_ABS);
    const wrong = g.slice(); // rotating by +angle again instead of -angle
    ref.rope(wrong, pos, T, H, HD, theta);
    expectRejected('fd rope dx rotated by +angle', wrong, numDx, FD_REL, FD_ABS);
  });

  it.each([
    [5, 4, 2, 8],
    [4, 2, 2, 6],
    [3, 3, 1, 4],
  ])('attention: dq, dk, dv (T=%i NH=%i NKV=%i HD=%i)', (T, NH, NKV, HD) => {
    const rand = ref.rng(103 + T);
    const q = f64(ref.randn(T * NH * HD, rand));
    const k = f64(ref.randn(T * NKV * HD, rand));
    const v = f64(ref.randn(T * NKV * HD, rand));
    const g = f64(ref.randn(T * NH * HD, rand));
    const out = new Float64Array(T * NH * HD);
    const lse = new Float64Array(T * NH);
    const loss = () => (ref.attentionForwardLse(out, lse, q, k, v, T, NH, NKV, HD), dot(out, g));
    const num = { dq: numGrad(loss, q), dk: numGrad(loss, k), dv: numGrad(loss, v) };
    loss(); // out and lse at the unperturbed point
    const grads = (o: Float64Array) => {
      const r = { dq: new Float64Array(q.length), dk: new Float64Array(k.length), dv: new Float64Array(v.length) };
      ref.attentionBackward(r.dq, r.dk, r.dv, g, o, lse, q, k, v, T, NH, NKV, HD);
      return r;
    };
    const got = grads(out);
    for (const key of ['dq', 'dk', 'dv'] as const)
      expectClose(`fd attention ${key} T=${T} NH=${NH} NKV=${NKV}`, got[key], num[key], FD_REL, FD_ABS);
    // Without the D_i = dout_i . out_i term (out passed as zeros), dq and dk are wrong.
    const wrong = grads(new Float64Array(out.length));
    expectRejected(`fd attention dq without D T=${T}`, wrong.dq, num.dq, FD_REL, FD_ABS);
    expectRejected(`fd attention dk without D T=${T}`, wrong.dk, num.dk, FD_REL, FD_ABS);
  });

  it('siluMul: dgate, dup (incl. |gate| = 30)', () => {
    const n = 20;
    const rand = ref.rng(104);
    const gate = f64(ref.randn(n, rand, 3));
    gate[0] = -30;
    gate[1] = 30;
    const up = f64(ref.randn(n, rand));
    const g = f64(ref.randn(n, rand));
    const y = new Float64Array(n);
    const loss = () => (ref.siluMul(y, gate, up, n), dot(y, g));
    const numDgate = numGrad(loss, gate);
    const numDup = numGrad(loss, up);
    const dgate = new Float64Array(n);
    const dup = new Float64Array(n);
    ref.siluMulBackward(dgate, dup, g, gate, up, n);
    expectClose('fd siluMul dgate', dgate, numDgate, FD_REL, FD_ABS);
    expectClose('fd siluMul dup', dup, numDup, FD_REL, FD_ABS);
    const wrong = new Float64Array(n);
    siluMulBackwardNoProductRule(wrong, new Float64Array(n), g, gate, up, n);
    expectRejected('fd siluMul dgate without product rule', wrong, numDgate, FD_REL, FD_ABS);
  });
});

// ---- 2. GPU kernels vs the CPU backward references ----------------------------------------------

// 'tiled-sg': the tiled GEMM with A shared by subgroup shuffles (SGA): SwiftShader's subgroups
// of 4 and lavapipe's 8 and 16 each take a different split of the 16 values of r per step.
describe.each(['rows', 'gemv', 'lanes', 'tiled', 'tiled-sg'] as const)('matmul training ops, %s', (variant) => {
  beforeEach((ctx) => {
    if (variant === 'tiled-sg' && !gpu.features.subgroups) ctx.skip();
  });
  beforeAll(() => {
    K.tuning.matmul = variant === 'tiled-sg' ? 'tiled' : variant;
    K.tuning.gemmSubgroups = variant === 'tiled-sg' ? 'on' : 'off';
  });
  afterAll(() => {
    K.resetTuning();
  });
  // (T, N, K): a single token, odd K, K not a multiple of 16, LoRA-rank sizes, several 64x64
  // tiles in both output dimensions, a long T reduction.
  const shapes: [number, number, number][] = [
    [1, 8, 33],
    [3, 37, 99],
    [17, 16, 130],
    [17, 70, 8],
    [70, 130, 200],
    [300, 8, 40],
  ];
  // 'gemv', 'lanes': the row-major products with few rows (the LoRA A and B products in decode) take the GEMV.
  it.each(shapes.filter(([T]) => (variant !== 'gemv' && variant !== 'lanes') || T <= K.GEMV_MAX_T))(
    'T=%i N=%i K=%i',
    async (T, N, Kd) => {
      const rand = ref.rng(200 + T + N);
      const name = `${variant} T=${T} N=${N} K=${Kd}`;
      const x = ref.randn(T * Kd, rand);
      const dy = ref.randn(T * N, rand);
      const wF = ref.randn(N * Kd, rand, 0.1);
      const wB = ref.roundBf16(wF);
      const initOut = ref.randn(T * N, rand);
      const initDx = ref.randn(T * Kd, rand);
      const initDw = ref.randn(N * Kd, rand);
      const xb = f32Buf(x, 'x');
      const dyb = f32Buf(dy, 'dy');
      const wFb = f32Buf(wF, 'wF32');
      const wBb = bf16Buf(wB, 'wBf16');

      // matmulF32: plain and accumulate with scale.
      const out = f32Buf(initOut, 'out');
      K.matmulF32(gpu, out, xb, wFb, T, N, Kd);
      let want = new Float64Array(T * N);
      ref.matmulF32(want, x, wF, T, N, Kd);
      expectClose(`matmulF32 ${name}`, await gpu.readF32(out, T * N), want, REL, ABS);
      gpu.write(out, initOut);
      K.matmulF32(gpu, out, xb, wFb, T, N, Kd, true, 0.5);
      want = f64(initOut);
      ref.matmulF32(want, x, wF, T, N, Kd, true, 0.5);
      expectClose(`matmulF32+= ${name}`, await gpu.readF32(out, T * N), want, REL, ABS);

      // matmulBackwardInput (bf16 w): overwrite and accumulate.
      const dx = f32Buf(initDx, 'dx');
      K.matmulBackwardInput(gpu, dx, dyb, wBb, T, N, Kd, false);
      if (variant === 'tiled-sg') expect(K.kernelVariant(gpu, 'matmulBackwardInput')?.defines.SGA).toBe(1);
      want = new Float64Array(T * Kd);
      ref.matmulBackwardInput(want, dy, wB, T, N, Kd, false);
      expectClose(`matmulBackwardInput ${name}`, await gpu.readF32(dx, T * Kd), want, REL, ABS);
      gpu.write(dx, initDx);
      K.matmulBackwardInput(gpu, dx, dyb, wBb, T, N, Kd);
      want = f64(initDx);
      ref.matmulBackwardInput(want, dy, wB, T, N, Kd, true);
      const gotDx = await gpu.readF32(dx, T * Kd);
      expectClose(`matmulBackwardInput+= ${name}`, gotDx, want, REL, ABS);
      const wrongDx = f64(initDx); // w transposed in the reduction: dy . w read as (K, N)
      for (let t = 0; t < T; t++)
        for (let k = 0; k < Kd; k++) {
          let s = 0;
          for (let n = 0; n < N; n++) s += dy[t * N + n] * wB[(k * N + n) % (N * Kd)];
          wrongDx[t * Kd + k] += s;
        }
      expectRejected(`matmulBackwardInput ${name} transposed w`, gotDx, wrongDx, REL, ABS);

      // matmulBackwardInputF32 with scale.
      gpu.write(dx, initDx);
      K.matmulBackwardInputF32(gpu, dx, dyb, wFb, T, N, Kd, true, 1.5);
      want = f64(initDx);
      ref.matmulBackwardInput(want, dy, wF, T, N, Kd, true, 1.5);
      expectClose(`matmulBackwardInputF32+= ${name}`, await gpu.readF32(dx, T * Kd), want, REL, ABS);

      // matmulBackwardWeightF32: adds into dw, reduction over T.
      const dw = f32Buf(initDw, 'dw');
      K.matmulBackwardWeightF32(gpu, dw, dyb, xb, T, N, Kd, 2);
      want = f64(initDw);
      ref.matmulBackwardWeight(want, dy, x, T, N, Kd, 2);
      const gotDw = await gpu.readF32(dw, N * Kd);
      expectClose(`matmulBackwardWeightF32+= ${name}`, gotDw, want, REL, ABS);
      const wrongDw = f64(initDw); // the scale forgotten
      ref.matmulBackwardWeight(wrongDw, dy, x, T, N, Kd, 1);
      expectRejected(`matmulBackwardWeightF32 ${name} without scale`, gotDw, wrongDw, REL, ABS);
      for (const b of [xb, dyb, wFb, wBb, out, dx, dw]) gpu.releaseBuffer(b);
    },
  );
});

describe('rmsNormBackward', () => {
  it.each([
    [3, 100],
    [17, 16],
    [2, 1000],
    [5, 33],
    [1, 128],
  ])('R=%i D=%i', async (R, D) => {
    const rand = ref.rng(300 + D);
    const x = ref.randn(R * D, rand, 3);
    const w = ref.roundBf16(ref.randn(D, rand));
    const dy = ref.randn(R * D, rand);
    const init = ref.randn(R * D, rand);
    const dx = f32Buf(init, 'dx');
    K.rmsNormBackward(gpu, dx, f32Buf(dy, 'dy'), f32Buf(x, 'x'), bf16Buf(w, 'w'), R, D, 1e-6);
    const got = await gpu.readF32(dx, R * D);
    const want = f64(init);
    ref.rmsNormBackward(want, dy, x, w, R, D, 1e-6);
    expectClose(`rmsNormBackward R=${R} D=${D}`, got, want, REL, ABS);
    const wrong = f64(init);
    rmsNormBackwardNoMeanTerm(wrong, dy, x, w, R, D, 1e-6);
    expectRejected(`rmsNormBackward R=${R} D=${D} without mean term`, got, wrong, REL, ABS);
  });
});

describe('ropeBackward', () => {
  // Same error budget as the forward's sin/cos (~1e-6 absolute on unit-scale inputs).
  it.each([
    [3, 2, 16, 1e4, [0, 1, 7]],
    [17, 3, 32, 1e6, Array.from({ length: 17 }, (_, i) => i * 2411)],
    [1, 4, 128, 1e6, [40000]],
  ])('T=%i H=%i HD=%i theta=%d', async (T, H, HD, theta, pos) => {
    const rand = ref.rng(400 + HD);
    const dy = ref.randn(T * H * HD, rand);
    const buf = f32Buf(dy, 'dx');
    K.ropeBackward(gpu, buf, u32Buf(pos), T, H, HD, theta);
    const got = await gpu.readF32(buf, T * H * HD);
    const want = f64(dy);
    ref.ropeBackward(want, Uint32Array.from(pos), T, H, HD, theta);
    expectClose(`ropeBackward T=${T} HD=${HD}`, got, want, 0, 1e-5);
    const wrong = f64(dy);
    ref.rope(wrong, Uint32Array.from(pos), T, H, HD, theta);
    if (Math.max(...pos) > 0) expectRejected(`ropeBackward T=${T} HD=${HD} rotated by +angle`, got, wrong, 0, 1e-5);
    // rope then ropeBackward is the identity (the rotation is orthogonal).
    gpu.write(buf, dy);
    const posBuf = u32Buf(pos);
    K.rope(gpu, buf, posBuf, T, H, HD, theta);
    K.ropeBackward(gpu, buf, posBuf, T, H, HD, theta);
    expectClose(`rope o ropeBackward T=${T} HD=${HD}`, await gpu.readF32(buf, T * H * HD), dy, 0, 1e-5);
  });
});

describe('attentionForwardLse + attentionBackward', () => {
  const ATT_REL = 2e-5;
  // (T, NH, NKV, HD): one token, GQA and MHA, HD 16/32/128, T past one 64-key block (130: three
  // blocks of keys in dq and of (query, head) pairs in dk/dv) and long sequences.
  const shapes: [number, number, number, number][] = [
    [1, 4, 2, 16],
    [3, 4, 2, 32],
    [17, 4, 2, 16],
    [17, 2, 2, 32],
    [70, 2, 1, 128],
    [130, 4, 2, 16],
    [1000, 2, 1, 16],
    [2048, 2, 1, 8],
  ];
  it.each(shapes)('T=%i NH=%i NKV=%i HD=%i', async (T, NH, NKV, HD) => {
    const name = `T=${T} NH=${NH} NKV=${NKV} HD=${HD}`;
    const rand = ref.rng(500 + T + HD);
    const q = ref.randn(T * NH * HD, rand);
    const k = ref.randn(T * NKV * HD, rand);
    const v = ref.randn(T * NKV * HD, rand);
    const dout = ref.randn(T * NH * HD, rand);
    const init = { dq: ref.randn(q.length, rand), dk: ref.randn(k.length, rand), dv: ref.randn(v.length, rand) };
    const [qb, kb, vb, doutb] = [f32Buf(q, 'q'), f32Buf(k, 'k'), f32Buf(v, 'v'), f32Buf(dout, 'dout')];
    const out = gpu.createBuffer(q.length * 4, 'out');
    const lse = gpu.createBuffer(T * NH * 4, 'lse');
    K.attentionForwardLse(gpu, out, lse, qb, kb, vb, T, NH, NKV, HD);
    const wantOut = new Float64Array(q.length);
    const wantLse = new Float64Array(T * NH);
    ref.attentionForwardLse(wantOut, wantLse, q, k, v, T, NH, NKV, HD);
    expectClose(`attentionForwardLse out ${name}`, await gpu.readF32(out, q.length), wantOut, REL, ABS);
    expectClose(`attentionForwardLse lse ${name}`, await gpu.readF32(lse, T * NH), wantLse, REL, ABS);

    // The backward runs on the GPU forward's saved out and lse, as in training.
    const grads = { dq: f32Buf(init.dq, 'dq'), dk: f32Buf(init.dk, 'dk'), dv: f32Buf(init.dv, 'dv') };
    K.attentionBackward(gpu, grads.dq, grads.dk, grads.dv, doutb, out, lse, qb, kb, vb, T, NH, NKV, HD);
    const want = { dq: f64(init.dq), dk: f64(init.dk), dv: f64(init.dv) };
    ref.attentionBackward(want.dq, want.dk, want.dv, dout, wantOut, wantLse, q, k, v, T, NH, NKV, HD);
    const wrong = { dq: f64(init.dq), dk: f64(init.dk), dv: f64(init.dv) };
    ref.attentionBackward(
      wrong.dq,
      wrong.dk,
      wrong.dv,
      dout,
      new Float64Array(q.length),
      wantLse,
      q,
      k,
      v,
      T,
      NH,
      NKV,
      HD,
    );
    for (const key of ['dq', 'dk', 'dv'] as const) {
      const got = await gpu.readF32(grads[key]);
      expectClose(`attentionBackward ${key} ${name}`, got.subarray(0, want[key].length), want[key], ATT_REL, ABS);
      // Without D (dout . out), dq and dk go wrong; with T = 1 the softmax is constant and
      // dq = dk = 0 either way, so that case has nothing to catch.
      if (key !== 'dv' && T > 1)
        expectRejected(
          `attentionBackward ${key} ${name} without D`,
          got.subarray(0, want[key].length),
          wrong[key],
          ATT_REL,
          ABS,
        );
    }
    for (const b of [qb, kb, vb, doutb, out, lse, grads.dq, grads.dk, grads.dv]) gpu.releaseBuffer(b);
  });
});

describe('siluMulBackward + add', () => {
  it('siluMulBackward n=1000 incl. large |gate|', async () => {
    const n = 1000;
    const rand = ref.rng(600);
    const gate = ref.randn(n, rand, 4);
    gate[0] = -100;
    gate[1] = 100;
    gate[2] = -1000;
    const up = ref.randn(n, rand);
    const dout = ref.randn(n, rand);
    const initG = ref.randn(n, rand);
    const initU = ref.randn(n, rand);
    const dgate = f32Buf(initG, 'dgate');
    const dup = f32Buf(initU, 'dup');
    K.siluMulBackward(gpu, dgate, dup, f32Buf(dout, 'dout'), f32Buf(gate, 'gate'), f32Buf(up, 'up'), n);
    const [wantG, wantU] = [f64(initG), f64(initU)];
    ref.siluMulBackward(wantG, wantU, dout, gate, up, n);
    const gotG = await gpu.readF32(dgate, n);
    expectClose('siluMulBackward dgate', gotG, wantG, REL, ABS);
    expectClose('siluMulBackward dup', await gpu.readF32(dup, n), wantU, REL, ABS);
    const wrong = f64(initG);
    siluMulBackwardNoProductRule(wrong, new Float64Array(n), dout, gate, up, n);
    expectRejected('siluMulBackward dgate without product rule', gotG, wrong, REL, ABS);
  });

  it('add n=1000', async () => {
    const n = 1000;
    const rand = ref.rng(601);
    const init = ref.randn(n, rand);
    const a = ref.randn(n, rand);
    const out = f32Buf(init, 'out');
    K.add(gpu, out, f32Buf(a, 'a'), n);
    const want = init.slice();
    ref.add(want, a, n);
    expectClose('add', await gpu.readF32(out, n), want, 0, 0);
  });

  it('rejects the same buffer bound twice', () => {
    const b = gpu.createBuffer(64, 'shared');
    expect(() => K.add(gpu, b, b, 4)).toThrow(RangeError);
    expect(() => K.matmulBackwardWeightF32(gpu, b, b, gpu.createBuffer(64, 'x'), 2, 2, 2)).toThrow(RangeError);
  });
});
