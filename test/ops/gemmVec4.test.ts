// The tiled GEMM's 16-byte loads (shaders/matmul.wgsl define VEC, tuning.gemmVec4): A read along
// r into a tile along r, one vec4 of A and one 8-element run of B per thread and step, 4x8 outputs
// per thread as vector x 4x4-matrix products; B read along r (the forward matmul, the LoRA forward
// matmulF32) or along n (define BT: the input gradients matmulBackwardInput and its F32 LoRA part).
// Against an f64 CPU reference with the f32 tolerance of the other matmul tests, in every weight
// format (bf16, q4, f32), across the tile edges in M (64), N (128) and R (16; R % 16 == 8 or 4
// leaves a part step), with accumulate and scale; and the launched kernel checked to be VEC (BT)
// where it fits and the r-major tiles where it does not (R % 8 or N % 8, rows of A off 16 bytes,
// gemmVec4 'off'). The f16 tiles over VEC are tested in gemmF16.test.ts (lavapipe).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, outBuf } = h;
const REL = 1e-5;
const ABS = 1e-6;

beforeAll(async () => {
  gpu = await createGpu();
  K.tuning.matmul = 'tiled';
  K.tuning.gemmF16 = 'off';
  K.tuning.gemmSubgroups = 'off';
});

afterAll(() => {
  K.resetTuning();
  h.report('gemm_tiled VEC errors');
  gpu?.destroy();
});

/** out (T, N) = init + scale * x (T, K) . vals (N, K)^T in f64. */
function reference(
  x: Float32Array,
  vals: Float32Array,
  init: Float32Array | null,
  T: number,
  N: number,
  Kd: number,
  scale = 1,
) {
  const want = new Float32Array(T * N);
  for (let t = 0; t < T; t++) {
    for (let n = 0; n < N; n++) {
      let s = 0;
      for (let r = 0; r < Kd; r++) s += x[t * Kd + r]! * vals[n * Kd + r]!;
      want[t * N + n] = (init ? init[t * N + n]! : 0) + scale * s;
    }
  }
  return want;
}

const defines = (op: string) => K.kernelVariant(gpu, op)!.defines as Record<string, unknown>;

/**
 * Runs `call` (writing `n` floats to the buffer it returns) with gemmVec4 'auto' and 'off': the
 * first must launch VEC (with BT as `bt` says), the second the r-major tiles; both within the f32
 * tolerance of `want`.
 */
async function bothWays(label: string, op: string, bt: boolean, n: number, want: Float32Array, call: () => GPUBuffer) {
  for (const vec4 of ['auto', 'off'] as const) {
    K.tuning.gemmVec4 = vec4;
    const out = call();
    const d = defines(op);
    if (vec4 === 'auto') expect([d.VEC, d.BT], `${label}: the 16-byte loads ran`).toEqual([1, bt ? 1 : undefined]);
    else expect(d.VEC, `${label}: gemmVec4 'off': the r-major tiles ran`).toBeUndefined();
    h.expectClose(
      `${label} ${vec4 === 'auto' ? (bt ? 'VEC BT' : 'VEC') : 'r-major'}`,
      await gpu.readF32(out, n),
      want,
      REL,
      ABS,
    );
  }
}

describe('gemm_tiled with 16-byte loads', () => {
  // (format, T, N, K, accumulate)
  it.for([
    ['bf16', 70, 130, 200, false],
    ['bf16', 65, 129, 8, true],
    ['bf16', 1, 300, 64, false],
    ['bf16', 130, 260, 48, true],
    ['q4', 40, 96, 256, false],
    ['q4', 9, 200, 96, true],
    ['f32', 70, 33, 40, false],
    ['f32', 66, 8, 16, true],
  ] as const)('%s T=%i N=%i K=%i accumulate=%s', async ([format, T, N, Kd, accumulate]) => {
    const rand = ref.rng(T * 5 + N + Kd);
    const x = ref.randn(T * Kd, rand);
    const init = accumulate ? ref.randn(T * N, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + N);
    const scale = format === 'f32' ? 0.5 : 1; // the LoRA forward's alpha / r
    const op = format === 'f32' ? 'matmulF32' : 'matmul';
    const want = reference(x, vals, init, T, N, Kd, scale);
    await bothWays(`${op} ${format} T=${T} N=${N} K=${Kd}`, op, false, T * N, want, () => {
      const out = init ? f32Buf(init, 'out') : outBuf(T * N);
      if (format === 'f32') K.matmulF32(gpu, out, f32Buf(x), w as GPUBuffer, T, N, Kd, accumulate, scale);
      else K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, accumulate);
      return out;
    });
  });

  // The input gradient dx (T, K) (+)= scale * dy (T, N) . w (N, K): B(k, n) = w[n * K + k], read
  // along the outputs k. (format, T, N, K, accumulate)
  it.for([
    ['bf16', 70, 132, 200, false],
    ['bf16', 65, 36, 136, true],
    ['q4', 40, 96, 256, true],
    ['q4', 9, 20, 96, false],
    ['f32', 70, 16, 40, true],
    ['f32', 66, 8, 264, false],
  ] as const)('input gradient, %s T=%i N=%i K=%i accumulate=%s', async ([format, T, N, Kd, accumulate]) => {
    const rand = ref.rng(T * 3 + N + Kd);
    const dy = ref.randn(T * N, rand);
    const init = accumulate ? ref.randn(T * Kd, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + Kd);
    const scale = format === 'f32' ? 0.5 : 1;
    const op = format === 'f32' ? 'matmulBackwardInputF32' : 'matmulBackwardInput';
    // vals^T (K, N): the reference's "weight" for dx = dy . vals
    const valsT = new Float32Array(Kd * N);
    for (let n = 0; n < N; n++) for (let k = 0; k < Kd; k++) valsT[k * N + n] = vals[n * Kd + k]!;
    const want = reference(dy, valsT, init, T, Kd, N, scale);
    await bothWays(`${op} ${format} T=${T} N=${N} K=${Kd}`, op, true, T * Kd, want, () => {
      const dx = init ? f32Buf(init, 'dx') : outBuf(T * Kd);
      if (format === 'f32') K.matmulBackwardInputF32(gpu, dx, f32Buf(dy), w as GPUBuffer, T, N, Kd, accumulate, scale);
      else K.matmulBackwardInput(gpu, dx, f32Buf(dy), w, T, N, Kd, accumulate);
      return dx;
    });
  });

  it('an input gradient with K not a multiple of 8 takes the r-major tiles', async () => {
    K.tuning.gemmVec4 = 'auto';
    const [T, N, Kd] = [20, 16, 36];
    const rand = ref.rng(15);
    const dy = ref.randn(T * N, rand);
    const { w, vals } = h.weight('bf16', N, Kd, 16);
    const valsT = new Float32Array(Kd * N);
    for (let n = 0; n < N; n++) for (let k = 0; k < Kd; k++) valsT[k * N + n] = vals[n * Kd + k]!;
    const dx = outBuf(T * Kd);
    K.matmulBackwardInput(gpu, dx, f32Buf(dy), w, T, N, Kd, false);
    expect(defines('matmulBackwardInput').VEC).toBeUndefined();
    h.expectClose(
      'matmulBackwardInput K=36',
      await gpu.readF32(dx, T * Kd),
      reference(dy, valsT, null, T, Kd, N),
      REL,
      ABS,
    );
  });

  it('K not a multiple of 8 takes the r-major tiles', async () => {
    K.tuning.gemmVec4 = 'auto';
    const [T, N, Kd] = [20, 40, 36];
    const rand = ref.rng(11);
    const x = ref.randn(T * Kd, rand);
    const { w, vals } = h.weight('bf16', N, Kd, 12);
    const out = outBuf(T * N);
    K.matmul(gpu, out, f32Buf(x), w, T, N, Kd);
    expect(defines('matmul').VEC).toBeUndefined();
    h.expectClose('matmul K=36', await gpu.readF32(out, T * N), reference(x, vals, null, T, N, Kd), REL, ABS);
  });

  it('rows of A off 16 bytes take the r-major tiles', async () => {
    K.tuning.gemmVec4 = 'auto';
    // A (M, R) with row stride R + 2: rows 1, 3, ... start 8 bytes past a 16-byte boundary.
    const [M, N, R] = [20, 24, 16];
    const aM = R + 2;
    const rand = ref.rng(13);
    const a = ref.randn(M * aM, rand);
    const { w, vals } = h.weight('f32', N, R, 14);
    const out = outBuf(M * N);
    K.gemm(gpu, 'matmulF32', out, f32Buf(a), w as GPUBuffer, 'f32', M, N, R, [aM, 1, R, 1], false, 1);
    expect(defines('matmulF32').VEC).toBeUndefined();
    const x = new Float32Array(M * R);
    for (let m = 0; m < M; m++) x.set(a.subarray(m * aM, m * aM + R), m * R);
    h.expectClose('gemm aM=R+2', await gpu.readF32(out, M * N), reference(x, vals, null, M, N, R), REL, ABS);
    // The same product with aligned rows (stride R + 4) takes VEC.
    const a4 = new Float32Array(M * (R + 4));
    for (let m = 0; m < M; m++) a4.set(x.subarray(m * R, m * R + R), m * (R + 4));
    K.gemm(gpu, 'matmulF32', out, f32Buf(a4), w as GPUBuffer, 'f32', M, N, R, [R + 4, 1, R, 1], false, 1);
    expect(defines('matmulF32').VEC).toBe(1);
    h.expectClose('gemm aM=R+4', await gpu.readF32(out, M * N), reference(x, vals, null, M, N, R), REL, ABS);
  });
});
