// The SwiGLU activation folded into the decode GEMV (shaders/gemv.wgsl define SILU,
// tuning.siluFold): matmul and matmulF32 given `up` multiply x = silu(gate) * up, formed as
// gemv_lanes stages x. Against the CPU reference (f64) of silu then the product, for bf16 and q4
// weights (with and without the LoRA branch in the store) and f32 ones (down_proj's LoRA A
// product, also split over K as the GPUs' 'auto' does it), and bitwise against silu_mul then the
// same product (the same expression per element). Where gemv_lanes does not take the shape
// (rows not whole 16-byte blocks, prefill) or tuning.siluFold is 'off', the ops form the
// activation first themselves: the same values through the unfused kernels.
// Run: npx vitest run test/ops/siluFold.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
});
afterEach(() => K.resetTuning());
afterAll(() => {
  h.report('SwiGLU fold errors');
  gpu?.destroy();
});

type Format = 'bf16' | 'q4' | 'f32';

/** silu(g) * u in f64, as the reference's x. */
const siluTimes = (g: Float32Array, u: Float32Array) => Float64Array.from(g, (v, i) => (v / (1 + Math.exp(-v))) * u[i]);

/**
 * out (T, N) (+)= (silu(gate) * up) . w^T through matmul (bf16, q4; with the LoRA term when
 * `r` > 0) or matmulF32 (f32, scale 0.5), fused; then the same through siluMul and the plain op.
 * Returns the fused op's launched label.
 */
async function run(format: Format, T: number, N: number, Kd: number, r: number, accumulate: boolean): Promise<string> {
  const name = `${format} T=${T} N=${N} K=${Kd}${r ? ` r=${r}` : ''}${accumulate ? ' +=' : ''} ${K.tuning.matmul}/${K.tuning.siluFold}`;
  const rand = ref.rng(T * 17 + N + Kd + r);
  const g = ref.randn(T * Kd, rand).map((v) => 3 * v); // both tails of silu
  const u = ref.randn(T * Kd, rand);
  const { w, vals } = h.weight(format, N, Kd, T + N + 5);
  const init = ref.randn(T * N, rand);
  const uL = ref.randn(T * r, rand);
  const BL = ref.randn(N * r, rand, 0.1);
  const gate = f32Buf(g, 'gate');
  const upB = f32Buf(u, 'up');
  const lora = r ? { u: f32Buf(uL, 'loraU'), B: f32Buf(BL, 'loraB'), r, scale: 2 } : undefined;
  const product = (out: GPUBuffer, x: GPUBuffer, up?: GPUBuffer) =>
    format === 'f32'
      ? K.matmulF32(gpu, out, x, w as GPUBuffer, T, N, Kd, accumulate, 0.5, up)
      : K.matmul(gpu, out, x, w, T, N, Kd, accumulate, lora, up);
  const fused = accumulate ? f32Buf(init, 'out') : outBuf(T * N);
  product(fused, gate, upB);
  const label = K.kernelVariant(gpu, format === 'f32' ? 'matmulF32' : r ? 'matmulLora' : 'matmul')!.label;

  const want = new Float64Array(T * N);
  if (accumulate) want.set(init);
  const x = siluTimes(g, u);
  if (format === 'f32') ref.matmulF32(want, x, vals, T, N, Kd, accumulate, 0.5);
  else ref.matmul(want, x, vals, T, N, Kd, accumulate);
  if (lora)
    for (let t = 0; t < T; t++)
      for (let n = 0; n < N; n++) {
        let s = 0;
        for (let j = 0; j < r; j++) s += uL[t * r + j] * BL[n * r + j];
        want[t * N + n] += 2 * s;
      }
  const got = await gpu.readF32(fused, T * N);
  expectClose(name, got, want, 4e-6, 2e-6);

  // The unfused path: silu_mul into act, then the same product.
  const act = outBuf(T * Kd, 'act');
  K.siluMul(gpu, act, gate, upB, T * Kd);
  const apart = accumulate ? f32Buf(init, 'out') : outBuf(T * N);
  product(apart, act);
  expect(Array.from(got), `${name}: bitwise silu_mul then the product`).toEqual(
    Array.from(await gpu.readF32(apart, T * N)),
  );
  return label;
}

describe("gemv_lanes with the SwiGLU folded in (tuning.matmul 'lanes', a GPU's choices)", () => {
  beforeAll(() => {
    K.resetTuning({ matmul: 'lanes', autoFor: 'gpu' });
  });
  // K past one staging chunk at each TMAX, N past one workgroup's columns and odd.
  it.each([
    ['bf16', 1, 37, 2560, 0],
    ['bf16', 4, 20, 1088, 4],
    ['q4', 1, 40, 2560, 8],
    ['q4', 4, 70, 544, 0],
    ['q4', 3, 9, 800, 16],
    ['f32', 1, 16, 2560, 0], // down_proj's LoRA A product: r = 16 rows over I (split over K)
    ['f32', 4, 16, 1088, 0],
  ] as const)('%s T=%i N=%i K=%i r=%i', async (format, T, N, Kd, r) => {
    K.resetTuning({ matmul: 'lanes', autoFor: 'gpu' });
    K.forgetKernelVariants(gpu);
    const label = await run(format, T, N, Kd, r, false);
    expect(label).toContain('gemv.gemv_lanes[');
    expect(label).toContain('SILU=1');
    // A LoRA A product's 16 columns over K = 2560 split over K (colsSplit.ts lanesSplit).
    if (format === 'f32' && Kd === 2560) expect(K.kernelVariant(gpu, 'matmulF32.splitK')).toBeDefined();
  });
  it.each([
    ['bf16', 4, 50, 520, 2],
    ['f32', 2, 16, 2080, 0],
  ] as const)('accumulate %s T=%i N=%i K=%i r=%i', async (format, T, N, Kd, r) => {
    K.resetTuning({ matmul: 'lanes', autoFor: 'gpu' });
    expect(await run(format, T, N, Kd, r, true)).toContain('SILU=1');
  });
});

describe('the ops form the activation themselves where the GEMV does not take it', () => {
  it.each([
    // (foldsSilu: the model's choice by T alone, true here; the op still falls back for the shape)
    ['bf16 rows not whole 16-byte blocks', 'bf16', 3, 20, 100, { matmul: 'lanes' }, true],
    ["tuning.siluFold 'off'", 'q4', 2, 24, 256, { matmul: 'lanes', siluFold: 'off' }, false],
    // (f32 tiles: the f16 GEMM's rounding is test/ops/gemmF16's to check)
    [
      'more than GEMV_MAX_T rows (prefill)',
      'bf16',
      K.GEMV_MAX_T + 1,
      20,
      64,
      { autoFor: 'gpu', gemmF16: 'off' },
      false,
    ],
    ["a CPU adapter's gemv_rows", 'q4', 2, 24, 256, { matmul: 'blocks' }, false],
  ] as const)('%s', async (_, format, T, N, Kd, tuning, folds) => {
    K.resetTuning(tuning);
    expect(K.foldsSilu(gpu, T)).toBe(folds);
    const label = await run(format, T, N, Kd, 0, false);
    expect(label).not.toContain('SILU');
  });
});
