// q4 weights dequantized before the tiled GEMM (shaders/quant.wgsl dequantize_q4,
// src/ops/q4Dequant.ts, tuning.gemmQ4Dequant). The copy against the CPU dequantization of the
// same q4 bytes (src/model/q4.ts), bit for bit; then every tiled product over a q4 weight (the
// forward x . W^T and the input gradient dy . W, with split-K on and off, accumulate) with the
// copy and without it: the same bits (the same f32 values q * s in the same sums), the launched
// GEMM checked to be the f32-weight one, and both within the f32 tolerance of the f64
// reference. Then the rule ('on' from 128 rows), pure arithmetic.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import {
  Q4_DEQUANT_MAX_BYTES,
  Q4_DEQUANT_MIN_ROWS,
  q4DequantFor,
  q4DequantScratchBytes,
} from '../../src/ops/q4Dequant.ts';
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
  h.report('gemm_tiled over dequantized q4 errors');
  gpu?.destroy();
});

const q4Buf = (w: K.Weight) => (w as { buf: GPUBuffer }).buf;

describe('dequantize_q4', () => {
  it.for([
    [3, 64],
    [7, 96],
    [1, 32],
  ] as const)('N=%i K=%i: the f32 values of src/model/q4.ts, bit for bit', async ([N, Kd]) => {
    const { w, vals } = h.weight('q4', N, Kd, N * 31 + Kd);
    const out = outBuf(N * Kd);
    K.dequantizeQ4(gpu, out, q4Buf(w), N, Kd);
    expect(Array.from(await gpu.readF32(out, N * Kd))).toEqual(Array.from(vals));
  });

  it('names what is wrong', () => {
    const { w } = h.weight('q4', 2, 64, 5);
    expect(() => K.dequantizeQ4(gpu, outBuf(2 * 48), q4Buf(w), 2, 48)).toThrow(/dequantizeQ4: K = 48/);
    expect(() => K.dequantizeQ4(gpu, outBuf(64), q4Buf(w), 2, 64)).toThrow(/dequantizeQ4 out/);
  });
});

/**
 * Runs `call` (at least Q4_DEQUANT_MIN_ROWS rows) with gemmQ4Dequant 'off' and 'on' (split-K as given): 'on' must run dequantize_q4
 * and the f32-weight tile, 'off' the q4 tile; the two outputs the same bits, both near `want`.
 */
async function bothWays(label: string, op: string, n: number, want: Float32Array, call: () => GPUBuffer) {
  const got: Float32Array[] = [];
  for (const mode of ['off', 'on'] as const) {
    K.tuning.gemmQ4Dequant = mode;
    try {
      K.forgetKernelVariants(gpu);
      const out = call();
      const d = K.kernelVariant(gpu, op)!;
      expect(d.label, `${label}: the tiled GEMM ran`).toContain('gemm_tiled');
      expect(d.defines.WEIGHTS, `${label} ${mode}`).toBe(mode === 'on' ? 'f32' : 'q4');
      if (mode === 'on') expect(K.kernelVariant(gpu, 'dequantizeQ4')?.label).toContain('dequantize_q4');
      else expect(K.kernelVariant(gpu, 'dequantizeQ4')).toBeUndefined();
      got.push(await gpu.readF32(out, n));
      h.expectClose(`${label} dequant ${mode}`, got[got.length - 1]!, want, REL, ABS);
    } finally {
      K.tuning.gemmQ4Dequant = 'auto';
    }
  }
  expect(Array.from(got[1]!), `${label}: the same bits either way`).toEqual(Array.from(got[0]!));
}

describe('the tiled GEMM over a dequantized q4 weight', () => {
  it.for([
    [130, 40, 256, false, 'off'],
    [128, 132, 96, true, 'off'],
    [140, 24, 512, true, 'on'],
  ] as const)('forward T=%i N=%i K=%i accumulate=%s split-K %s', async ([T, N, Kd, accumulate, splitK]) => {
    K.tuning.gemmSplitK = splitK;
    try {
      const rand = ref.rng(T * 11 + N + Kd);
      const x = ref.randn(T * Kd, rand);
      const init = accumulate ? ref.randn(T * N, rand) : null;
      const { w, vals } = h.weight('q4', N, Kd, T + 5 * N);
      const expected = init ? Float32Array.from(init) : new Float32Array(T * N);
      ref.matmulF32(expected, x, vals, T, N, Kd, accumulate, 1);
      await bothWays(`matmul q4 T=${T} N=${N} K=${Kd} split-K ${splitK}`, 'matmul', T * N, expected, () => {
        const out = init ? f32Buf(init, 'out') : outBuf(T * N);
        K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, accumulate);
        return out;
      });
    } finally {
      K.tuning.gemmSplitK = 'auto';
    }
  });

  // dx (T, K) (+)= dy (T, N) . w (N, K): R = N, the (N, K) tensor read along the outputs (BT).
  it.for([
    [130, 200, 64, false, 'off'],
    [128, 264, 96, true, 'on'],
  ] as const)('input gradient T=%i N=%i K=%i accumulate=%s split-K %s', async ([T, N, Kd, accumulate, splitK]) => {
    K.tuning.gemmSplitK = splitK;
    try {
      const rand = ref.rng(T * 13 + N + Kd);
      const dy = ref.randn(T * N, rand);
      const init = accumulate ? ref.randn(T * Kd, rand) : null;
      const { w, vals } = h.weight('q4', N, Kd, T + 7 * Kd);
      const expected = init ? Float32Array.from(init) : new Float32Array(T * Kd);
      ref.matmulBackwardInput(expected, dy, vals, T, N, Kd, accumulate, 1);
      await bothWays(`matmulBackwardInput q4 T=${T} N=${N} K=${Kd}`, 'matmulBackwardInput', T * Kd, expected, () => {
        const dx = init ? f32Buf(init, 'dx') : outBuf(T * Kd);
        K.matmulBackwardInput(gpu, dx, f32Buf(dy), w, T, N, Kd, accumulate);
        return dx;
      });
    } finally {
      K.tuning.gemmSplitK = 'auto';
    }
  });

  it("'on' leaves products of fewer rows to the q4 tile, and 'auto' every product", async () => {
    const [N, Kd] = [8, 64];
    const { w } = h.weight('q4', N, Kd, 3);
    const weightsOf = (T: number, mode: 'on' | 'auto') => {
      K.tuning.gemmQ4Dequant = mode;
      try {
        K.matmul(gpu, outBuf(T * N), f32Buf(ref.randn(T * Kd, ref.rng(T))), w, T, N, Kd);
        return K.kernelVariant(gpu, 'matmul')!.defines.WEIGHTS;
      } finally {
        K.tuning.gemmQ4Dequant = 'auto';
      }
    };
    expect(weightsOf(Q4_DEQUANT_MIN_ROWS, 'on')).toBe('f32');
    expect(weightsOf(Q4_DEQUANT_MIN_ROWS - 1, 'on')).toBe('q4');
    expect(weightsOf(Q4_DEQUANT_MIN_ROWS, 'auto')).toBe('q4');
  });
});

describe("gemmQ4Dequant's rule (src/ops/q4Dequant.ts)", () => {
  it("'on' takes Qwen3-4B's layer products from 128 rows, never the LM head; 'auto' and 'off' nothing", () => {
    // gate/up (9,728 x 2,560): 99.6 MB of f32; q_proj 4,096 x 2,560; down_proj's input gradient.
    expect(q4DequantFor('on', 256, 9728, 2560)).toBe(true);
    expect(q4DequantScratchBytes(256, 9728, 2560)).toBe(9728 * 2560 * 4);
    expect(q4DequantFor('on', 512, 2560, 9728)).toBe(true);
    expect(q4DequantFor('on', 128, 4096, 2560)).toBe(true);
    // Fewer rows than two output tiles: each weight tile is read once anyway.
    expect(q4DequantFor('on', 127, 9728, 2560)).toBe(false);
    expect(q4DequantScratchBytes(64, 9728, 2560)).toBe(0);
    // The LM head (tied embedding, 151,936 x 2,560): 1.56 GB of f32, past the cap.
    expect(q4DequantFor('on', 512, 151936, 2560)).toBe(false);
    expect(Q4_DEQUANT_MAX_BYTES).toBe(128 * 2 ** 20);
    expect(q4DequantFor('auto', 512, 9728, 2560)).toBe(false);
    expect(q4DequantFor('off', 512, 9728, 2560)).toBe(false);
  });
});
