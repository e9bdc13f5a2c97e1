// The tiled GEMM's 128-row tiles (shaders/matmul.wgsl define TM8 with VEC, tuning.gemmTile '128'):
// 128 x 128 outputs per workgroup, 8 x 8 per thread, the rows 64..127 of the tile from a second
// vec4 of A per thread and a second set of accumulators. Against the f64 CPU reference with the f32
// tolerance of the other matmul tests, in every weight format (bf16, q4, f32), forward (B read along
// r) and input gradient (define BT, read along n), across the tile edges in M (64 and 128), N (128)
// and R (16), with accumulate and scale; split-K with the tall tile's grid; the launched kernel
// checked to be TM8 where it is asked for and fits, and 64-row tiles where it is not asked for, where
// the 16-byte loads do not fit (the r-major tiles have no TM8), and on a device whose workgroup
// memory holds less than the tall tile's 20 KiB. The f16 tall tiles run in gemmF16.test.ts
// (lavapipe); the memory plan's split-K count for them in test/train/trainingMemory.test.ts.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { splitKFor, splitKScratchBytes } from '../../src/ops/splitK.ts';
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
  K.tuning.gemmTile = '128';
});

afterAll(() => {
  K.resetTuning();
  h.report('gemm_tiled TM8 errors');
  gpu?.destroy();
});

const defines = (op: string) => K.kernelVariant(gpu, op)!.defines as Record<string, unknown>;

/** The forward product (format's op) into a fresh or initialized buffer. */
function forward(
  format: string,
  x: Float32Array,
  w: K.Weight,
  init: Float32Array | null,
  T: number,
  N: number,
  Kd: number,
) {
  const out = init ? f32Buf(init, 'out') : outBuf(T * N);
  if (format === 'f32') K.matmulF32(gpu, out, f32Buf(x), w as GPUBuffer, T, N, Kd, !!init, 0.5);
  else K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, !!init);
  return out;
}

describe('gemm_tiled with 128-row tiles', () => {
  // (format, T, N, K, accumulate): T across 64 and 128, N across 128, K across 16.
  it.for([
    ['bf16', 130, 130, 200, false],
    ['bf16', 129, 256, 8, true],
    ['bf16', 70, 300, 64, false],
    ['bf16', 1, 40, 48, true],
    ['q4', 200, 96, 256, false],
    ['q4', 128, 136, 96, true],
    ['f32', 150, 33, 40, false],
    ['f32', 64, 8, 24, true],
  ] as const)('%s T=%i N=%i K=%i accumulate=%s', async ([format, T, N, Kd, accumulate]) => {
    const rand = ref.rng(T * 11 + N + Kd);
    const x = ref.randn(T * Kd, rand);
    const init = accumulate ? ref.randn(T * N, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + 2 * N);
    const op = format === 'f32' ? 'matmulF32' : 'matmul';
    const want = init ? Float64Array.from(init) : new Float64Array(T * N);
    ref.matmulF32(want, x, vals, T, N, Kd, accumulate, format === 'f32' ? 0.5 : 1);
    const out = forward(format, x, w, init, T, N, Kd);
    const d = defines(op);
    expect([d.VEC, d.BT, d.TM8], 'the 128-row tiles ran').toEqual([1, undefined, 1]);
    h.expectClose(`${op} ${format} T=${T} N=${N} K=${Kd} TM8`, await gpu.readF32(out, T * N), want, REL, ABS);
  });

  // The input gradient dx (T, K) (+)= scale * dy (T, N) . w (N, K). (format, T, N, K, accumulate)
  it.for([
    ['bf16', 130, 136, 200, false],
    ['bf16', 65, 40, 136, true],
    ['q4', 140, 96, 256, true],
    ['q4', 9, 32, 96, false],
    ['f32', 200, 16, 40, true],
  ] as const)('input gradient, %s T=%i N=%i K=%i accumulate=%s', async ([format, T, N, Kd, accumulate]) => {
    const rand = ref.rng(T * 13 + N + Kd);
    const dy = ref.randn(T * N, rand);
    const init = accumulate ? ref.randn(T * Kd, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + 3 * Kd);
    const scale = format === 'f32' ? 0.5 : 1;
    const op = format === 'f32' ? 'matmulBackwardInputF32' : 'matmulBackwardInput';
    const want = init ? Float64Array.from(init) : new Float64Array(T * Kd);
    ref.matmulBackwardInput(want, dy, vals, T, N, Kd, accumulate, scale);
    const dx = init ? f32Buf(init, 'dx') : outBuf(T * Kd);
    if (format === 'f32') K.matmulBackwardInputF32(gpu, dx, f32Buf(dy), w as GPUBuffer, T, N, Kd, accumulate, scale);
    else K.matmulBackwardInput(gpu, dx, f32Buf(dy), w, T, N, Kd, accumulate);
    const d = defines(op);
    expect([d.VEC, d.BT, d.TM8], 'the 128-row tiles ran, B along n').toEqual([1, 1, 1]);
    h.expectClose(`${op} ${format} T=${T} N=${N} K=${Kd} TM8 BT`, await gpu.readF32(dx, T * Kd), want, REL, ABS);
  });

  it('split-K over tall tiles: the grid and slices of 128-row tiles', async () => {
    K.tuning.gemmSplitK = 'on';
    try {
      const [T, N, Kd] = [130, 136, 256];
      const rand = ref.rng(5);
      const x = ref.randn(T * Kd, rand);
      const { w, vals } = h.weight('bf16', N, Kd, 77);
      const want = new Float64Array(T * N);
      ref.matmul(want, x, vals, T, N, Kd);
      const out = forward('bf16', x, w, null, T, N, Kd);
      expect(defines('matmul')).toMatchObject({ VEC: 1, TM8: 1, SPLITK: 1 });
      h.expectClose(`matmul bf16 T=${T} N=${N} K=${Kd} TM8 split-K`, await gpu.readF32(out, T * N), want, REL, ABS);
    } finally {
      K.tuning.gemmSplitK = 'auto';
    }
  });

  it("'auto' and '64' keep 64-row tiles; so do products off the 16-byte loads", async () => {
    const [T, N, Kd] = [130, 64, 40];
    const rand = ref.rng(9);
    const x = ref.randn(T * Kd, rand);
    const { w } = h.weight('bf16', N, Kd, 3);
    for (const tile of ['auto', '64'] as const) {
      K.tuning.gemmTile = tile;
      gpu.releaseBuffer(forward('bf16', x, w, null, T, N, Kd));
      expect(defines('matmul'), `gemmTile '${tile}'`).toMatchObject({ VEC: 1 });
      expect(defines('matmul').TM8, `gemmTile '${tile}'`).toBeUndefined();
      expect(K.gemmTileRows(gpu)).toBe(64);
    }
    K.tuning.gemmTile = '128';
    expect(K.gemmTileRows(gpu)).toBe(128);
    // K % 8 != 0: B cannot come in 8-element runs, so the r-major tiles run, which have no TM8.
    const x2 = ref.randn(T * 12, rand);
    const { w: w2 } = h.weight('bf16', N, 12, 4);
    gpu.releaseBuffer(forward('bf16', x2, w2, null, T, N, 12));
    expect([defines('matmul').VEC, defines('matmul').TM8]).toEqual([undefined, undefined]);
  });

  it('a device with less than 20 KiB of workgroup memory keeps 64-row tiles', async () => {
    const small = await createGpu({ limitsAtMost: { maxComputeWorkgroupStorageSize: 16384 } });
    try {
      expect(small.limits.maxComputeWorkgroupStorageSize).toBe(16384);
      expect(K.gemmTileRows(small)).toBe(64);
      const [T, N, Kd] = [130, 40, 32];
      const rand = ref.rng(21);
      const x = ref.randn(T * Kd, rand);
      const vals = ref.randn(N * Kd, rand);
      const out = small.createBuffer(T * N * 4, 'out');
      const xb = small.createBuffer(x.byteLength, 'x');
      const wb = small.createBuffer(vals.byteLength, 'w');
      small.write(xb, x);
      small.write(wb, vals);
      K.matmulF32(small, out, xb, wb, T, N, Kd);
      const d = K.kernelVariant(small, 'matmulF32')!.defines as Record<string, unknown>;
      expect([d.VEC, d.TM8]).toEqual([1, undefined]);
      const want = new Float64Array(T * N);
      ref.matmul(want, x, vals, T, N, Kd);
      h.expectClose(`matmulF32 T=${T} N=${N} K=${Kd} 16 KiB device`, await small.readF32(out, T * N), want, REL, ABS);
    } finally {
      small.destroy();
    }
  });
});

describe('split-K with 128-row tiles (src/ops/splitK.ts)', () => {
  it('counts the tall tiles: fewer workgroups, more slices, more scratch', () => {
    // 512 x 2,560 over R = 9,728 (down_proj's input gradient at T = 512): 160 tiles of 64 rows
    // need no split; 80 of 128 rows do.
    expect(splitKFor('auto', false, 512, 2560, 9728).slices).toBe(1);
    expect(splitKFor('auto', false, 512, 2560, 9728, 128)).toEqual({ slices: 4, rSlice: 2432 });
    expect(splitKScratchBytes(512, 2560, 9728)).toBe(0);
    expect(splitKScratchBytes(512, 2560, 9728, 128)).toBe(4 * 512 * 2560 * 4);
    for (const [M, N, R] of [
      [64, 2560, 151936],
      [512, 16, 2560],
      [256, 9728, 2560],
      [512, 1024, 2560],
    ] as const) {
      expect(splitKScratchBytes(M, N, R, 128), `${M} x ${N} over ${R}`).toBeGreaterThanOrEqual(
        splitKScratchBytes(M, N, R),
      );
    }
  });
});
