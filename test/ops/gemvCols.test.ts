// shaders/gemv.wgsl gemv_cols (the 'blocks' input gradient dx (T, K) (+)= dy (T, N) . W (N, K) on
// CPU adapters: 8 output columns per thread, W read along its rows four rows at a time) against a
// plain CPU product, for bf16, q4 and f32 weights, at odd shapes: every TMAX (T = 1..11), outputs
// past one workgroup, narrow outputs whose rows of W are split over workgroups and summed by
// gemv_cols_reduce, accumulate and scale; shapes it cannot take (K % 8, N % 4) fall back to
// gemm_rows.
// Run: npx vitest run test/ops/gemvCols.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { dequantizeQ4, quantizeQ4 } from '../../src/model/q4.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, bf16Buf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  K.tuning.matmul = 'blocks';
});

afterAll(() => {
  K.tuning.matmul = 'auto';
  h.report('gemv_cols errors');
  gpu?.destroy();
});

const REL = 1e-5;
const ABS = 1e-6;

/** dx (T, Kd) (+)= scale * dy (T, N) . w (N, Kd), in f64. */
function dxRef(dy: Float32Array, w: Float32Array, T: number, N: number, Kd: number, init?: Float32Array, scale = 1) {
  const out = new Float32Array(T * Kd);
  for (let t = 0; t < T; t++)
    for (let k = 0; k < Kd; k++) {
      let s = 0;
      for (let n = 0; n < N; n++) s += dy[t * N + n]! * w[n * Kd + k]!;
      out[t * Kd + k] = (init ? init[t * Kd + k]! : 0) + scale * s;
    }
  return out;
}

const labels = (op: string) => K.kernelVariant(gpu, op)!.label;

describe('bf16', () => {
  // (T, N, K): K % 8 == 0 and N % 4 == 0 take gemv_cols; N = 2048 with few outputs is split.
  it.each([
    [1, 64, 40],
    [2, 36, 136],
    [3, 260, 72],
    [4, 12, 16],
    [5, 100, 8],
    [8, 44, 528],
    [11, 20, 24],
    [2, 2048, 16],
    [9, 1028, 64],
    [3, 50, 99],
    [2, 37, 64],
  ])('T=%i N=%i K=%i', async (T, N, Kd) => {
    const rand = ref.rng(300 + T + N + Kd);
    const dy = ref.randn(T * N, rand);
    const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
    const init = ref.randn(T * Kd, rand);
    const dx = f32Buf(init);
    K.matmulBackwardInput(gpu, dx, f32Buf(dy), bf16Buf(w), T, N, Kd);
    const fits = Kd % 8 === 0 && N % 4 === 0;
    expect(labels('matmulBackwardInput')).toContain(fits ? 'gemv_cols' : 'gemm_rows');
    expectClose(`bf16 T=${T} N=${N} K=${Kd}`, await gpu.readF32(dx, T * Kd), dxRef(dy, w, T, N, Kd, init), REL, ABS);
  });

  it('splits a narrow output over the rows of W and sums the splits (not accumulating)', async () => {
    const [T, N, Kd] = [3, 4096, 8];
    const rand = ref.rng(11);
    const dy = ref.randn(T * N, rand);
    const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
    const dx = f32Buf(ref.randn(T * Kd, rand)); // overwritten
    K.matmulBackwardInput(gpu, dx, f32Buf(dy), bf16Buf(w), T, N, Kd, false);
    expect(labels('matmulBackwardInput')).toContain('gemv_cols_reduce');
    expectClose('bf16 split', await gpu.readF32(dx, T * Kd), dxRef(dy, w, T, N, Kd), REL, ABS);
  });
});

describe('q4', () => {
  it.each([
    [1, 64, 64],
    [4, 36, 96],
    [7, 20, 288],
    [9, 1024, 32],
    [2, 40, 256],
  ])('T=%i N=%i K=%i', async (T, N, Kd) => {
    const rand = ref.rng(400 + T + N);
    const vals = ref.randn(N * Kd, rand, 0.1);
    const bits = new Uint16Array(N * Kd);
    for (let i = 0; i < bits.length; i++) bits[i] = ref.f32ToBf16(vals[i]!);
    const packed = quantizeQ4(bits, N, Kd, 'w');
    const buf = gpu.createBuffer(packed.byteLength, 'q4w');
    gpu.write(buf, packed);
    const w: K.Q4Weight = { format: 'q4', buf, N, K: Kd };
    const dy = ref.randn(T * N, rand);
    const init = ref.randn(T * Kd, rand);
    const dx = f32Buf(init);
    K.matmulBackwardInput(gpu, dx, f32Buf(dy), w, T, N, Kd);
    const wholeVec4 = Math.floor(buf.size / 16) * 16 >= Math.ceil(K.q4Words(N, Kd) / 4) * 16;
    expect(labels('matmulBackwardInput')).toContain(wholeVec4 ? 'gemv_cols' : 'gemm_rows');
    // The last pipeline is gemv_cols itself, or the f32 reduce of its splits (N = 1024 here).
    expect(labels('matmulBackwardInput')).toContain(N >= 1024 ? 'gemv_cols_reduce' : 'WEIGHTS=q4');
    const want = dxRef(dy, dequantizeQ4(packed, N, Kd), T, N, Kd, init);
    expectClose(`q4 T=${T} N=${N} K=${Kd}`, await gpu.readF32(dx, T * Kd), want, REL, ABS);
  });
});

describe('f32 (the LoRA products)', () => {
  it.each([
    [3, 16, 64, true, 0.5],
    [6, 8, 2560, false, 2],
    [8, 2000, 16, true, 0.25],
    [1, 4, 8, true, 1],
  ])('T=%i N=%i K=%i accumulate=%s scale=%f', async (T, N, Kd, accumulate, scale) => {
    const rand = ref.rng(500 + T + N);
    const dy = ref.randn(T * N, rand);
    const w = ref.randn(N * Kd, rand, 0.1);
    const init = ref.randn(T * Kd, rand);
    const dx = f32Buf(init);
    K.matmulBackwardInputF32(gpu, dx, f32Buf(dy), f32Buf(w), T, N, Kd, accumulate, scale);
    expect(labels('matmulBackwardInputF32')).toContain('gemv_cols');
    const want = dxRef(dy, w, T, N, Kd, accumulate ? init : undefined, scale);
    expectClose(`f32 T=${T} N=${N} K=${Kd}`, await gpu.readF32(dx, T * Kd), want, REL, ABS);
  });
});
