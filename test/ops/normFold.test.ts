// The RMSNorm folded into the group GEMVs (K.matmulGroup / K.matmulGroupF32 with a FoldedNorm;
// shaders/gemv.wgsl gemv_lanes_group with define NORM): one dispatch where K.rmsNorm then the group
// product take two, each output within f32 rounding of what those two write and of the CPU
// reference (f64 RMSNorm, then the product), for bf16, q4 and f32 weights, 2 and 3 weights,
// T = 1..8 (1 to 8 rows of staged x), rows of x in one staged chunk and in several, rows past the
// last in a chunk, with subgroup and shared-memory lane reductions; the cases that do not fold
// (tuning.normFold 'off', the CPU adapters' gemv_rows, the word-by-word GEMV, prefill's tiled GEMM,
// too few storage bindings) run K.rmsNorm first, bitwise the same; and a norm weight too short is
// one error naming it. The LoRA A products at 4B's width with their lanes widened (64 a column).
// Run: npx vitest run test/ops/normFold.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, bf16Buf, outBuf, expectClose } = h;
const EPS = 1e-6;

beforeAll(async () => {
  gpu = await createGpu();
});

afterEach(() => {
  K.resetTuning();
});

afterAll(() => {
  h.report('normFold errors');
  gpu?.destroy();
});

type Format = 'f32' | 'bf16' | 'q4';

/**
 * The group product of rmsNorm(x) with the norm passed in (folded where it can be), against
 * K.rmsNorm then the same product without it: bitwise equal where it did not fold, within f32
 * rounding where it did, and close to the CPU reference either way. Returns the folded call's
 * dispatches and the pipeline it ran.
 */
async function foldedVsNormed(
  g: Gpu,
  format: Format,
  T: number,
  Ns: readonly number[],
  Kd: number,
  name: string,
): Promise<{ dispatches: number; label: string }> {
  const rand = ref.rng(T * 13 + Kd + Ns.length);
  const x = ref.randn(T * Kd, rand, 2);
  const normVals = ref.roundBf16(ref.randn(Kd, rand));
  const xb = f32Buf(x);
  const nw = bf16Buf(normVals);
  const ws = Ns.map((N, i) => h.weight(format, N, Kd, 100 * T + 7 * i + Kd));
  const op = format === 'f32' ? 'matmulGroupF32' : 'matmulGroup';
  const product = (outs: GPUBuffer[], input: GPUBuffer, norm?: K.FoldedNorm) => {
    if (format === 'f32') {
      K.matmulGroupF32(
        g,
        outs,
        input,
        ws.map((w) => w.w as GPUBuffer),
        T,
        Ns,
        Kd,
        norm,
      );
    } else
      K.matmulGroup(
        g,
        outs,
        input,
        ws.map((w) => w.w),
        T,
        Ns,
        Kd,
        norm,
      );
  };
  const folded = Ns.map((N) => outBuf(T * N, 'folded'));
  const hb = outBuf(T * Kd, 'h');
  const plain = Ns.map((N) => outBuf(T * N, 'plain'));
  gpu.flush(); // the uploads above, before g (maybe a view of gpu) encodes anything
  const before = g.dispatchCount;
  product(folded, xb, { w: nw, eps: EPS });
  const dispatches = g.dispatchCount - before;
  const label = K.kernelVariant(g, op)?.label ?? '';
  K.rmsNorm(g, hb, xb, nw, T, Kd, EPS);
  product(plain, hb);
  g.flush();
  const normed = new Float64Array(T * Kd);
  ref.rmsNorm(normed, x, normVals, T, Kd, EPS);
  const didFold = label.includes('NORM') && dispatches === 1;
  for (let i = 0; i < Ns.length; i++) {
    const got = await gpu.readF32(folded[i], T * Ns[i]);
    const separate = await gpu.readF32(plain[i], T * Ns[i]);
    if (didFold) expectClose(`${name} w${i} folded vs rmsNorm + product`, got, separate, 2e-6, 2e-6);
    else expect(Array.from(got), `${name} weight ${i}: != rmsNorm + product`).toEqual(Array.from(separate));
    const want = new Float64Array(T * Ns[i]);
    ref.matmul(want, normed, ws[i].vals, T, Ns[i], Kd);
    expectClose(`${name} w${i}`, got, want, 1e-5, 1e-5);
  }
  return { dispatches, label };
}

// (T, Ns, K): q/k/v-like triples and gate/up-like pairs; K <= 512 (64-wide norm sums) and above.
// A staged chunk holds 2,048 / TMAX elements of each row (TMAX: T rounded up to 1, 2, 4 or 8): K
// 2560 at T = 2, 544 at T = 3 and 384 at T = 8 take 3, 2 and 2 chunks, the last one part empty.
// (T = 8 with q4 only compiles slowly on lavapipe: its 8-row kernels are covered by bf16 and f32.)
const SHAPES: [number, number[], number][] = [
  [1, [37, 300, 9], 64],
  [2, [33, 65], 96],
  [3, [50, 17, 20], 544],
  [4, [129, 258], 64],
  [2, [9, 9, 9], 2560],
  [8, [70, 30, 30], 384],
];

describe.each(['bf16', 'q4', 'f32'] as const)("folded into gemv_lanes_group ('lanes'), %s", (format) => {
  it.each(SHAPES.filter(([T]) => format !== 'q4' || T < 8))('T=%i Ns=%j K=%i', async (T, Ns, Kd) => {
    K.tuning.matmul = 'lanes';
    expect(K.foldsNorm(gpu, T)).toBe(true);
    const { dispatches, label } = await foldedVsNormed(gpu, format, T, Ns, Kd, `${format} T=${T} K=${Kd}`);
    expect(dispatches).toBe(1);
    expect(label).toContain('gemv.gemv_lanes_group');
    expect(label).toContain('NORM=1');
  });
});

// The LoRA A products of a q/k/v or gate/up group at Qwen3-4B's width (r = 16 rows each, K = 2560),
// their lanes widened (tuning.gemvWideLanes 'on', what 'auto' does on GPUs): 64 a column, each
// workgroup still staging whole rows, so the folded norm's sums of squares are whole.
describe('folded, lanes widened (the LoRA A products of a group at 4B)', () => {
  it.each([
    [1, [16, 16, 16]],
    [4, [16, 16]],
  ] as const)('f32 T=%i Ns=%j K=2560', async (T, Ns) => {
    K.resetTuning({ matmul: 'lanes', gemvWideLanes: 'on' });
    const { dispatches, label } = await foldedVsNormed(gpu, 'f32', T, Ns, 2560, `wide f32 T=${T}`);
    expect(dispatches).toBe(1);
    expect(label).toContain('gemv.gemv_lanes_group');
    expect(label).toContain('NORM=1');
    expect(label).toContain('LANES=64');
  });
});

describe('folded, with the shared-memory reduction (no subgroups)', () => {
  let sg: Gpu;
  beforeAll(async () => {
    sg = gpu;
    gpu = await createGpu({ disableFeatures: ['subgroups'] });
  });
  afterAll(() => {
    gpu.destroy();
    gpu = sg;
  });
  it.each([
    ['bf16', 3, [37, 300, 9], 64],
    ['q4', 2, [40, 70], 1024],
    ['f32', 1, [16, 16, 16], 544],
  ] as const)('%s T=%i Ns=%j K=%i', async (format, T, Ns, Kd) => {
    K.tuning.matmul = 'lanes';
    const { dispatches, label } = await foldedVsNormed(gpu, format, T, Ns, Kd, `shared ${format} T=${T}`);
    expect(dispatches).toBe(1);
    expect(label).toContain('NORM=');
    expect(label).not.toContain('SUBGROUPS');
  });
});

describe('not folded: K.rmsNorm first, bitwise the same', () => {
  it.each([
    ["tuning.normFold 'off'", { normFold: 'off' }, 2, 'gemv_lanes_group'],
    ["tuning.matmul 'blocks' (CPU adapters' gemv_rows)", { matmul: 'blocks' }, 2, 'gemv_rows_group'],
    ["tuning.matmul 'gemv' (word-by-word GEMV)", { matmul: 'gemv' }, 2, 'matmul_gemv_group'],
    ['fusions off: one matmul per weight', 'fusions off', 4, null],
  ] as const)('%s', async (name, setup, dispatches, entry) => {
    K.resetTuning({ matmul: 'lanes', ...(setup === 'fusions off' ? {} : setup) });
    K.fusions.enabled = setup !== 'fusions off';
    try {
      expect(K.foldsNorm(gpu, 2)).toBe(false);
      const got = await foldedVsNormed(gpu, 'bf16', 2, [40, 24, 24], 64, name);
      expect(got.dispatches).toBe(dispatches);
      if (entry) {
        expect(got.label).toContain(entry);
        expect(got.label).not.toContain('NORM');
      }
    } finally {
      K.fusions.enabled = true;
    }
  });

  it('prefill (T > GEMV_MAX_T): the tiled GEMM per weight', async () => {
    K.tuning.matmul = 'lanes';
    const T = K.GEMV_MAX_T + 4;
    expect(K.foldsNorm(gpu, T)).toBe(false);
    const got = await foldedVsNormed(gpu, 'bf16', T, [40, 24], 64, 'prefill');
    expect(got.dispatches).toBe(3);
    expect(K.kernelVariant(gpu, 'matmul')?.label).toContain('gemm_tiled');
  });

  it('a device with fewer storage bindings than three weights and the norm need', async () => {
    K.tuning.matmul = 'lanes';
    // The same Gpu seen with maxStorageBuffersPerShaderStage = 7 (three weights, x and the norm
    // need 8); its encoder state lives on the view until it is flushed.
    const limits: Record<string, number> = {};
    for (const key in gpu.limits) limits[key] = gpu.limits[key as keyof GPUSupportedLimits] as number;
    limits.maxStorageBuffersPerShaderStage = 7;
    const small = Object.create(gpu, { limits: { value: limits } }) as Gpu;
    expect(K.foldsNorm(small, 1, 3)).toBe(false);
    expect(K.foldsNorm(small, 1, 2)).toBe(true); // two weights, x and the norm: 6
    const got = await foldedVsNormed(small, 'bf16', 1, [16, 16, 16], 64, 'few bindings');
    expect(got.dispatches).toBe(2);
    expect(got.label).not.toContain('NORM');
  });
});

describe('bad input', () => {
  it('names a norm weight that is too short', () => {
    K.tuning.matmul = 'lanes';
    const Kd = 64;
    const ws = [h.weight('bf16', 8, Kd, 1).w, h.weight('bf16', 8, Kd, 2).w];
    const norm = { w: bf16Buf(new Float32Array(Kd / 2)), eps: EPS };
    expect(() =>
      K.matmulGroup(gpu, [outBuf(8), outBuf(8)], f32Buf(new Float32Array(Kd)), ws, 1, [8, 8], Kd, norm),
    ).toThrow(/matmulGroup norm w: buffer 'bf16' has 64 bytes, needs 128/);
  });
});
