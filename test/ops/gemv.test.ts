// shaders/gemv.wgsl gemv_rows (the 'blocks' matmul variant: 16-byte weight loads, rows of x in
// unrolled accumulators) against test/helpers/reference.ts, for bf16, q4 and f32 weights, at odd shapes:
// N odd and past one workgroup's 64 * COLS columns, M = 1..11 (every TMAX, and M > 8 over the
// z grid), and K that is not a whole number of
// 16-byte blocks, which must fall back to the word-by-word kernels.
// Run: npx vitest run test/ops/gemv.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { dequantizeQ4, quantizeQ4 } from '../../src/model/q4.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, bf16Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  K.tuning.matmul = 'blocks';
});

afterAll(() => {
  K.tuning.matmul = 'auto';
  h.report('gemv errors');
  gpu?.destroy();
});

const REL = 1e-5;
const ABS = 1e-6;

function q4Weight(N: number, Kd: number, seed: number): { w: K.Q4Weight; deq: Float32Array } {
  const vals = ref.randn(N * Kd, ref.rng(seed), 0.1);
  const bits = new Uint16Array(N * Kd);
  for (let i = 0; i < bits.length; i++) bits[i] = ref.f32ToBf16(vals[i]!);
  const packed = quantizeQ4(bits, N, Kd, 'w');
  const buf = gpu.createBuffer(packed.byteLength, 'q4w');
  gpu.write(buf, packed);
  return { w: { format: 'q4', buf, N, K: Kd }, deq: dequantizeQ4(packed, N, Kd) };
}

const entry = (op: string) => K.kernelVariant(gpu, op)!.label;

describe('bf16', () => {
  // (M, N, K): K % 8 == 0 takes gemv_rows; 99 and 130 fall back to matmul_rows.
  it.each([
    [1, 37, 64],
    [2, 33, 136],
    [3, 50, 104],
    [4, 17, 264],
    [5, 9, 80],
    [8, 65, 40],
    [11, 21, 48],
    [2, 300, 16],
    [9, 200, 24],
    [3, 50, 99],
    [2, 19, 130],
  ])('M=%i N=%i K=%i', async (M, N, Kd) => {
    const rand = ref.rng(100 + M + N);
    const x = ref.randn(M * Kd, rand);
    const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
    const out = outBuf(M * N);
    K.matmul(gpu, out, f32Buf(x), bf16Buf(w), M, N, Kd);
    expect(entry('matmul')).toContain(Kd % 8 === 0 ? 'gemv_rows' : 'matmul_rows');
    const want = new Float32Array(M * N);
    ref.matmul(want, x, w, M, N, Kd);
    expectClose(`bf16 M=${M} N=${N} K=${Kd}`, await gpu.readF32(out, M * N), want, REL, ABS);
  });

  it('accumulate M=3 N=33 K=48', async () => {
    const [M, N, Kd] = [3, 33, 48];
    const rand = ref.rng(7);
    const x = ref.randn(M * Kd, rand);
    const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
    const init = ref.randn(M * N, rand);
    const out = f32Buf(init);
    K.matmul(gpu, out, f32Buf(x), bf16Buf(w), M, N, Kd, true);
    expect(entry('matmul')).toContain('gemv_rows');
    const want = init.slice();
    ref.matmul(want, x, w, M, N, Kd, true);
    expectClose('bf16 accumulate', await gpu.readF32(out, M * N), want, REL, ABS);
  });

  it('auto picks gemv_rows on a CPU adapter, gemv_lanes on a GPU', async () => {
    K.tuning.matmul = 'auto';
    try {
      const out = outBuf(2 * 9);
      K.matmul(gpu, out, f32Buf(new Float32Array(2 * 16)), bf16Buf(new Float32Array(9 * 16)), 2, 9, 16);
      expect(entry('matmul')).toContain(K.isCpuAdapter(gpu) ? 'gemv_rows' : 'gemv_lanes');
    } finally {
      K.tuning.matmul = 'blocks';
    }
  });

  // tuning.autoFor: 'auto' as a GPU would pick it, or as a CPU adapter would, whatever this adapter
  // is (npm test runs the golden model tests with autoFor=gpu on SwiftShader and lavapipe).
  it.each(['gpu', 'cpu'] as const)("autoFor=%s makes that adapter's 'auto' choices here", async (autoFor) => {
    const saved = { ...K.tuning };
    K.tuning.matmul = 'auto';
    K.tuning.autoFor = autoFor;
    try {
      expect(K.autoForCpu(gpu)).toBe(autoFor === 'cpu');
      const out = outBuf(16 * 9);
      K.matmul(gpu, out, f32Buf(new Float32Array(2 * 16)), bf16Buf(new Float32Array(9 * 16)), 2, 9, 16);
      expect(entry('matmul')).toContain(autoFor === 'gpu' ? 'gemv_lanes' : 'gemv_rows');
      K.matmul(gpu, out, f32Buf(new Float32Array(16 * 16)), bf16Buf(new Float32Array(9 * 16)), 16, 9, 16);
      expect(entry('matmul')).toContain(autoFor === 'gpu' ? 'gemm_tiled' : 'gemv_rows');
      // Attention: query tiles on a GPU from 1,024 tokens in training and 4,096 in prefill (the
      // H200's crossovers), from 9 on a CPU adapter.
      expect(K.attentionVariant(gpu, 64, 16, 'training')).toBe(autoFor === 'gpu' ? 'other' : 'tiled');
      expect(K.attentionVariant(gpu, 2048, 16, 'training')).toBe('tiled');
      expect(K.attentionVariant(gpu, 2048, 16, 'prefill')).toBe(autoFor === 'gpu' ? 'other' : 'tiled');
      expect(K.attentionVariant(gpu, 4096, 16, 'prefill')).toBe('tiled');
      expect(K.useGemmF16(gpu)).toBe(autoFor === 'gpu' && gpu.features.f16);
    } finally {
      Object.assign(K.tuning, saved);
    }
  });
});

describe('q4', () => {
  // (3, 32): 12 nibble words + 2 scale words end mid-vec4, which takes matmul_rows unless the
  // buffer was allocated past a whole vec4.
  it.each([
    [1, 37, 64],
    [3, 33, 96],
    [4, 17, 160],
    [6, 8, 32],
    [9, 16, 64],
    [2, 3, 32],
  ])('M=%i N=%i K=%i', async (M, N, Kd) => {
    const { w, deq } = q4Weight(N, Kd, 200 + M);
    const x = ref.randn(M * Kd, ref.rng(300 + M));
    const out = outBuf(M * N);
    K.matmul(gpu, out, f32Buf(x), w, M, N, Kd);
    const fits = w.buf.size % 16 === 0 || Math.floor(w.buf.size / 16) * 16 >= Math.ceil(K.q4Words(N, Kd) / 4) * 16;
    expect(entry('matmul')).toContain(fits ? 'gemv_rows' : 'matmul_rows');
    expect(entry('matmul')).toContain('WEIGHTS=q4');
    const want = new Float32Array(M * N);
    ref.matmul(want, x, deq, M, N, Kd);
    expectClose(`q4 M=${M} N=${N} K=${Kd}`, await gpu.readF32(out, M * N), want, REL, ABS);
  });
});

describe('f32 (the LoRA A and B products)', () => {
  // matmulF32 with scale and accumulate, as loraForward calls it: u = x A^T, out += scale u B^T.
  it.each([
    [1, 16, 64],
    [4, 40, 16],
    [3, 7, 20],
    [9, 5, 12],
    [2, 11, 18],
  ])('M=%i N=%i K=%i', async (M, N, Kd) => {
    const rand = ref.rng(400 + M + Kd);
    const x = ref.randn(M * Kd, rand);
    const w = ref.randn(N * Kd, rand, 0.1);
    const init = ref.randn(M * N, rand);
    const out = f32Buf(init);
    K.matmulF32(gpu, out, f32Buf(x), f32Buf(w), M, N, Kd, true, 0.75);
    expect(entry('matmulF32')).toContain(Kd % 4 === 0 ? 'gemv_rows' : 'gemm_rows');
    const prod = new Float32Array(M * N);
    ref.matmul(prod, x, w, M, N, Kd);
    const want = init.map((v, i) => v + 0.75 * prod[i]!);
    expectClose(`f32 M=${M} N=${N} K=${Kd}`, await gpu.readF32(out, M * N), want, REL, ABS);
  });
});
