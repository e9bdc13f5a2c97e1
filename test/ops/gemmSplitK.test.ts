// Split-K for the tiled GEMM (shaders/matmul.wgsl define SPLITK, src/ops/splitK.ts,
// tuning.gemmSplitK): slices of R written as partial outputs, then summed by gemv_cols_reduce.
// Against an f64 CPU reference with the f32 tolerance of the other matmul tests: every product that
// takes the tiled GEMM (the forward matmul over bf16 and q4, the LoRA forward, the input gradients
// along n (BT), the LoRA weight gradient through the r-major tiles, A by subgroup shuffles), with
// a last slice shorter than the others and R not a multiple of the tile step, with accumulate and
// scale; the launched kernel checked to be the split one. Then 'auto''s rule, pure arithmetic.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { splitKFor, splitKScratchBytes, SPLITK_MAX_SCRATCH } from '../../src/ops/splitK.ts';
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
  h.report('gemm_tiled SPLITK errors');
  gpu?.destroy();
});

/** The f64 reference (test/helpers/reference.ts) of a product that (+)= into a copy of init. */
function want(init: Float32Array | null, n: number, product: (out: Float32Array) => void): Float32Array {
  const out = init ? Float32Array.from(init) : new Float32Array(n);
  product(out);
  return out;
}

/** Runs `call` with gemmSplitK 'on' (it must launch SPLITK) and 'off' (it must not); both within the f32 tolerance. */
async function bothWays(label: string, op: string, n: number, want: Float32Array, call: () => GPUBuffer) {
  for (const mode of ['on', 'off'] as const) {
    K.tuning.gemmSplitK = mode;
    try {
      const out = call();
      const d = K.kernelVariant(gpu, op)!;
      expect(d.label, `${label}: the tiled GEMM ran`).toContain('gemm_tiled');
      expect(d.defines.SPLITK, `${label} ${mode}`).toBe(mode === 'on' ? 1 : undefined);
      h.expectClose(`${label} split ${mode}`, await gpu.readF32(out, n), want, REL, ABS);
    } finally {
      K.tuning.gemmSplitK = 'auto';
    }
  }
}

describe('gemm_tiled sliced over R', () => {
  // (format, T, N, K, accumulate): K % 16 == 8 or 0, slices of 16+ with a shorter last one.
  it.for([
    ['bf16', 70, 40, 200, false],
    ['bf16', 9, 132, 264, true],
    ['q4', 40, 96, 256, true],
    ['q4', 66, 20, 96, false],
    ['f32', 70, 16, 200, true],
  ] as const)('forward %s T=%i N=%i K=%i accumulate=%s', async ([format, T, N, Kd, accumulate]) => {
    const rand = ref.rng(T * 7 + N + Kd);
    const x = ref.randn(T * Kd, rand);
    const init = accumulate ? ref.randn(T * N, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + 3 * N);
    const scale = format === 'f32' ? 0.5 : 1;
    const op = format === 'f32' ? 'matmulF32' : 'matmul';
    const expected = want(init, T * N, (o) => ref.matmulF32(o, x, vals, T, N, Kd, accumulate, scale));
    await bothWays(`${op} ${format} T=${T} N=${N} K=${Kd}`, op, T * N, expected, () => {
      const out = init ? f32Buf(init, 'out') : outBuf(T * N);
      if (format === 'f32') K.matmulF32(gpu, out, f32Buf(x), w as GPUBuffer, T, N, Kd, accumulate, scale);
      else K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, accumulate);
      return out;
    });
  });

  // dx (T, K) (+)= scale * dy (T, N) . w (N, K): R = N, B read along the outputs (BT).
  it.for([
    ['bf16', 64, 200, 40, false],
    ['q4', 12, 264, 64, true],
    ['f32', 70, 136, 16, true],
  ] as const)('input gradient %s T=%i N=%i K=%i accumulate=%s', async ([format, T, N, Kd, accumulate]) => {
    const rand = ref.rng(T * 5 + N + Kd);
    const dy = ref.randn(T * N, rand);
    const init = accumulate ? ref.randn(T * Kd, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + Kd);
    const scale = format === 'f32' ? 0.5 : 1;
    const op = format === 'f32' ? 'matmulBackwardInputF32' : 'matmulBackwardInput';
    const expected = want(init, T * Kd, (o) => ref.matmulBackwardInput(o, dy, vals, T, N, Kd, accumulate, scale));
    await bothWays(`${op} ${format} T=${T} N=${N} K=${Kd}`, op, T * Kd, expected, () => {
      const dx = init ? f32Buf(init, 'dx') : outBuf(T * Kd);
      if (format === 'f32') K.matmulBackwardInputF32(gpu, dx, f32Buf(dy), w as GPUBuffer, T, N, Kd, accumulate, scale);
      else K.matmulBackwardInput(gpu, dx, f32Buf(dy), w, T, N, Kd, accumulate);
      return dx;
    });
  });

  it('the LoRA weight gradient dw += scale * dy^T . x (r-major tiles, R = T)', async () => {
    const [T, N, Kd] = [200, 16, 40];
    const rand = ref.rng(21);
    const dy = ref.randn(T * N, rand);
    const x = ref.randn(T * Kd, rand);
    const init = ref.randn(N * Kd, rand);
    const expected = want(init, N * Kd, (o) => ref.matmulBackwardWeight(o, dy, x, T, N, Kd, 0.25));
    await bothWays('matmulBackwardWeightF32', 'matmulBackwardWeightF32', N * Kd, expected, () => {
      const dw = f32Buf(init, 'dw');
      K.matmulBackwardWeightF32(gpu, dw, f32Buf(dy), f32Buf(x), T, N, Kd, 0.25);
      return dw;
    });
  });

  it.runIf(() => gpu.features.subgroups)('A by subgroup shuffles (SGA)', async () => {
    K.tuning.gemmSubgroups = 'on';
    try {
      const [T, N, Kd] = [70, 40, 200];
      const rand = ref.rng(31);
      const x = ref.randn(T * Kd, rand);
      const { w, vals } = h.weight('bf16', N, Kd, 32);
      const expected = want(null, T * N, (o) => ref.matmulF32(o, x, vals, T, N, Kd));
      await bothWays('matmul SGA', 'matmul', T * N, expected, () => {
        const out = outBuf(T * N);
        K.matmul(gpu, out, f32Buf(x), w, T, N, Kd);
        expect(K.kernelVariant(gpu, 'matmul')!.defines.SGA).toBe(1);
        return out;
      });
    } finally {
      K.tuning.gemmSubgroups = 'off';
    }
  });
});

describe("gemmSplitK 'auto' (src/ops/splitK.ts)", () => {
  it('slices the narrow and short products of Qwen3-4B on a GPU', () => {
    // The LM head's input gradient over a 64-row chunk: 20 tiles, R = 151,936.
    const head = splitKFor('auto', false, 64, 2560, 151936);
    expect(head.slices).toBe(13);
    expect(head.rSlice % 16).toBe(0);
    expect((head.slices - 1) * head.rSlice).toBeLessThan(151936);
    expect(head.slices * head.rSlice).toBeGreaterThanOrEqual(151936);
    // The LoRA A product x . A^T at T = 512: 8 tiles, R = 2,560 (slices of at least 128).
    expect(splitKFor('auto', false, 512, 16, 2560)).toEqual({ slices: 20, rSlice: 128 });
    // A 512-token prefill's MLP GEMM has 160 tiles: left alone.
    expect(splitKFor('auto', false, 512, 9728, 2560).slices).toBe(1);
  });

  it('leaves CPU adapters, short R, odd outputs and big scratch alone', () => {
    expect(splitKFor('auto', true, 64, 2560, 151936).slices).toBe(1);
    expect(splitKFor('off', false, 64, 2560, 151936).slices).toBe(1);
    expect(splitKFor('auto', false, 512, 16, 200).slices).toBe(1); // one slice of 128 fits
    expect(splitKFor('on', false, 7, 9, 200).slices).toBe(1); // M N % 4 != 0
    expect(splitKFor('on', false, 70, 40, 200)).toEqual({ slices: 7, rSlice: 32 }); // the last slice: 8 of R
    const big = splitKFor('auto', false, 64, 8192, 1 << 20); // 64 tiles, 2 MiB a slice
    expect(big.slices * 64 * 8192 * 4).toBeLessThanOrEqual(SPLITK_MAX_SCRATCH);
    expect(splitKScratchBytes(64, 2560, 151936)).toBe(13 * 64 * 2560 * 4);
    expect(splitKScratchBytes(512, 9728, 2560)).toBe(0);
  });
});
