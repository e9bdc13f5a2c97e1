// gemv_lanes split over K (tuning.gemvSplitK, src/ops/colsSplit.ts lanesSplit): where the columns
// make few workgroups (the LoRA A products in decode, N = r) and each lane would walk a long row,
// each slice of K runs as a workgroup of its own and gemv_cols_reduce adds the slices' partial
// sums in order. The rule's arithmetic; then, with the GPU GEMV forced ('lanes'), split products
// against the CPU reference (f64) for f32, bf16 and q4 weights, a short last slice, gemm's
// accumulate and scale, with the subgroup and the shared-memory reductions; one dispatch more than
// 'off', whose unsplit sum it matches within f32 rounding; and the shapes it leaves alone.
// Then the narrow products that do not split widening their lanes instead (tuning.gemvWideLanes,
// src/ops/colsSplit.ts wideLanes): the rule's arithmetic, and the widened GEMV (64 and 32 lanes a
// column) against the CPU reference and the narrow layout, f32 (with the SwiGLU formed as x is
// staged), bf16 and q4, both reductions; the splits keep the narrow lanes.
// Run: npx vitest run test/ops/gemvSplit.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { LANES_SPLIT_BLOCKS, LANES_SPLIT_MAX, lanesSplit, wideLanes } from '../../src/ops/colsSplit.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

describe('lanesSplit', () => {
  it('splits K into slices of 8 rounds of the lanes where the columns make few workgroups', () => {
    // LoRA A of down_proj at 4B: r = 16 columns (1 workgroup), K = 9728 f32, 16 lanes of 4 elements:
    // 152 rounds, 19 slices of 8.
    expect(lanesSplit(16, 9728, 4, 16, 16)).toEqual({ kChunk: 8 * 64, splits: 19 });
    // A rounds count that is not a multiple of 8: the last slice is short.
    expect(lanesSplit(16, 9732, 4, 16, 16)).toEqual({ kChunk: 512, splits: 20 });
    // Enough workgroups of columns already (o_proj itself: N = 2560 over 32 columns a workgroup).
    expect(lanesSplit(2560, 9728, 32, 8, 32)).toEqual({ kChunk: 0, splits: 1 });
    expect(lanesSplit(31 * 16, 9728, 4, 16, 16).splits).toBeGreaterThan(1);
    expect(lanesSplit(32 * 16, 9728, 4, 16, 16).splits).toBe(1);
    // Too short to make two slices of 8 rounds.
    expect(lanesSplit(16, 2 * LANES_SPLIT_BLOCKS * 64 - 64, 4, 16, 16).splits).toBe(1);
    expect(lanesSplit(16, 2 * LANES_SPLIT_BLOCKS * 64, 4, 16, 16).splits).toBe(2);
    // Very long rows: at most LANES_SPLIT_MAX slices, each whole rounds.
    const long = lanesSplit(8, 4 * 16 * 8 * 1000, 4, 16, 16);
    expect(long.splits).toBeLessThanOrEqual(LANES_SPLIT_MAX);
    expect(long.kChunk % 64).toBe(0);
    expect(long.kChunk * long.splits).toBeGreaterThanOrEqual(4 * 16 * 8 * 1000);
    expect(long.kChunk * (long.splits - 1)).toBeLessThan(4 * 16 * 8 * 1000);
  });
});

describe('wideLanes', () => {
  it('doubles the lanes up to 64 while the columns make few workgroups and each lane keeps 8 blocks', () => {
    // The LoRA A products at 4B (r = 16 columns, K = 2560 f32: 640 blocks): 16 lanes -> 64.
    expect(wideLanes(16, 2560, 4, 16)).toBe(64);
    expect(wideLanes(48, 2560, 4, 16)).toBe(64); // 12 workgroups of 4 columns
    // 1024 blocks: 32 lanes keep 16 each, 64 would keep 8: still 64; 256 blocks stop at 32.
    expect(wideLanes(20, 8192, 8, 16)).toBe(64);
    expect(wideLanes(12, 8192, 32, 16)).toBe(32);
    // Enough workgroups already: o_proj itself (2560 columns, 32 a workgroup), or 600 columns at 16 lanes.
    expect(wideLanes(2560, 9728, 32, 8)).toBe(8);
    expect(wideLanes(600, 2560, 4, 16)).toBe(16);
    // 300 columns: 32 lanes would make 38 workgroups, so 16 lanes (19) become 32 and stop there.
    expect(wideLanes(300, 8192, 4, 16)).toBe(32);
    // Rows too short to share out: a tiny model's K = 64.
    expect(wideLanes(16, 64, 4, 4)).toBe(4);
  });
});

let gpu: Gpu;
let tree: Gpu; // no subgroups: the shared-memory reduction
let current: Gpu;
const h = gpuHarness(() => current);
const { f32Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
  K.tuning.matmul = 'lanes';
});

afterAll(() => {
  K.tuning.matmul = 'auto';
  K.tuning.autoFor = 'auto';
  K.tuning.gemvSplitK = 'auto';
  K.tuning.gemvWideLanes = 'auto';
  h.report('gemv_lanes split errors');
  gpu?.destroy();
  tree?.destroy();
});

type Format = 'bf16' | 'q4' | 'f32';

/** One product through matmul (bf16, q4) or matmulF32 (f32, accumulating with a scale of 0.5). */
async function product(
  format: Format,
  T: number,
  N: number,
  Kd: number,
  accumulate: boolean,
  seed: number,
  silu = false,
): Promise<{ got: Float32Array; want: Float64Array; dispatches: number }> {
  const rand = ref.rng(seed);
  const x = ref.randn(T * Kd, rand);
  const { w, vals } = h.weight(format, N, Kd, seed + 1);
  const init = ref.randn(T * N, rand);
  const out = accumulate ? f32Buf(init, 'out') : outBuf(T * N);
  const want = new Float64Array(T * N);
  if (accumulate) want.set(init);
  const xb = f32Buf(x);
  const d0 = current.dispatchCount;
  if (silu) {
    // x is the gate, and the product is of silu(gate) * up (matmulF32's `up`, f32 only).
    const up = ref.randn(T * Kd, rand);
    K.matmulF32(current, out, xb, w as GPUBuffer, T, N, Kd, accumulate, 0.5, f32Buf(up, 'up'));
    const act = Float64Array.from(x, (g, i) => (g / (1 + Math.exp(-g))) * up[i]);
    ref.matmulF32(want, act, vals, T, N, Kd, accumulate, 0.5);
  } else if (format === 'f32') {
    K.matmulF32(current, out, xb, w as GPUBuffer, T, N, Kd, accumulate, 0.5);
    ref.matmulF32(want, x, vals, T, N, Kd, accumulate, 0.5);
  } else {
    K.matmul(current, out, xb, w, T, N, Kd, accumulate);
    ref.matmul(want, x, vals, T, N, Kd, accumulate);
  }
  const dispatches = current.dispatchCount - d0;
  return { got: await current.readF32(out, T * N), want, dispatches };
}

describe.each([
  ['subgroups', () => gpu],
  ['shared memory', () => tree],
] as const)('gemv_lanes split over K, %s reduction', (_, getGpu) => {
  beforeAll(() => {
    current = getGpu();
  });
  beforeEach(() => {
    // A GPU's choices: 'auto' never splits on a CPU adapter (SwiftShader) of its own.
    K.tuning.autoFor = 'gpu';
    K.tuning.gemvSplitK = 'auto';
    K.forgetKernelVariants(current);
  });
  // (format, T, N, K, accumulate): every one splits (N over few workgroups, K long).
  it.each([
    ['f32', 1, 16, 9728, false], // the LoRA A of down_proj at 4B: 19 slices
    ['f32', 4, 16, 9732, true], // a short last slice (1 block), accumulate with a scale
    ['f32', 8, 8, 4096, false], // TMAX 8 (chunks of 256): 16 lanes, 64 rounds
    ['bf16', 3, 20, 4096, false], // 16 lanes of 8 elements: 32 rounds, 4 slices
    ['q4', 1, 12, 8192, true], // 16 lanes of 32 elements: 16 rounds, 2 slices
  ] as const)('%s T=%i N=%i K=%i accumulate=%s', async (format, T, N, Kd, accumulate) => {
    const name = `${format} T=${T} N=${N} K=${Kd}${accumulate ? ' +=' : ''} ${current === gpu ? 'subgroups' : 'shared'}`;
    const op = format === 'f32' ? 'matmulF32' : 'matmul';
    const split = await product(format, T, N, Kd, accumulate, T * 7 + N + Kd);
    expect(K.kernelVariant(current, op)?.label, name).toContain('gemv.gemv_lanes[');
    expect(K.kernelVariant(current, op)?.label, `${name}: a split keeps its lanes`).toContain('LANES=16');
    expect(K.kernelVariant(current, `${op}.splitK`)?.label, name).toContain('gemv.gemv_cols_reduce');
    expect(split.dispatches, name).toBe(2);
    expectClose(name, split.got, split.want, 2e-6, 1e-6);

    K.tuning.gemvSplitK = 'off';
    const whole = await product(format, T, N, Kd, accumulate, T * 7 + N + Kd);
    expect(whole.dispatches, `${name} off`).toBe(1);
    expectClose(`${name} off`, whole.got, whole.want, 2e-6, 1e-6);
    // The same sum in another order: within f32 rounding of each other, and not the same bits
    // everywhere (a split that silently did not happen would be bitwise the unsplit one).
    expectClose(`${name} split vs off`, split.got, Float64Array.from(whole.got), 2e-6, 1e-6);
    expect(Array.from(split.got), name).not.toEqual(Array.from(whole.got));
  });
  it("not split on a CPU adapter's own choices (SwiftShader), even with 'lanes' forced", async () => {
    K.tuning.autoFor = 'auto';
    const { got, want, dispatches } = await product('f32', 1, 16, 9728, false, 5);
    expect(dispatches).toBe(1);
    expect(K.kernelVariant(current, 'matmulF32')?.label).toContain('gemv.gemv_lanes[');
    expectClose('f32 T=1 N=16 K=9728 CPU adapter', got, want, 2e-6, 1e-6);
  });
  it.each([
    ['f32', 1, 15, 9728, 'M N not a multiple of 4: the reduce reads vec4s'],
    ['f32', 2, 16, 956, 'K under two slices of 8 rounds'],
    ['bf16', 1, 512, 8192, 'enough workgroups of columns'],
  ] as const)('not split: %s T=%i N=%i K=%i (%s)', async (format, T, N, Kd, _why) => {
    const name = `${format} T=${T} N=${N} K=${Kd}`;
    const { got, want, dispatches } = await product(format, T, N, Kd, false, N + Kd);
    expect(dispatches, name).toBe(1);
    expect(K.kernelVariant(current, format === 'f32' ? 'matmulF32.splitK' : 'matmul.splitK'), name).toBeUndefined();
    expectClose(name, got, want, 2e-6, 1e-6);
  });
});

// Products that do not split (here: a CPU adapter's own choices, which never split) widen their
// lanes with 'on' (what 'auto' does on GPUs): the same products over 64 or 32 lanes a column,
// against the CPU reference and within f32 rounding of the narrow layout ('off'), whose bits they
// do not all share (a widening that silently did not happen would).
describe.each([
  ['subgroups', () => gpu],
  ['shared memory', () => tree],
] as const)('gemv_lanes widened, %s reduction', (_, getGpu) => {
  beforeAll(() => {
    current = getGpu();
  });
  beforeEach(() => {
    K.tuning.autoFor = 'auto';
    K.tuning.gemvSplitK = 'auto';
    K.forgetKernelVariants(current);
  });
  it.each([
    ['f32', 1, 16, 2560, false, false, 64], // a LoRA A product at 4B: 4 workgroups, 10 blocks a lane
    ['f32', 4, 16, 2560, true, true, 64], // with the SwiGLU (down_proj's A product), accumulating
    ['bf16', 2, 20, 8192, false, false, 64],
    ['q4', 3, 12, 8192, true, false, 32], // 256 blocks a row: 32 lanes keep 8 each
  ] as const)('%s T=%i N=%i K=%i accumulate=%s silu=%s: %i lanes', async (format, T, N, Kd, acc, silu, lanes) => {
    const name = `${format} T=${T} N=${N} K=${Kd}${silu ? ' silu' : ''} ${current === gpu ? 'subgroups' : 'shared'}`;
    const op = format === 'f32' ? 'matmulF32' : 'matmul';
    const seed = T * 5 + N + Kd;
    K.tuning.gemvWideLanes = 'on';
    const wide = await product(format, T, N, Kd, acc, seed, silu);
    const label = K.kernelVariant(current, op)?.label ?? '';
    expect(label, name).toContain('gemv.gemv_lanes[');
    expect(label, name).toContain(`LANES=${lanes}`);
    expect(label, name).toContain(`COLS=${256 / lanes}`);
    if (silu) expect(label, name).toContain('SILU=1');
    expect(wide.dispatches, name).toBe(1);
    expectClose(name, wide.got, wide.want, 2e-6, 1e-6);

    K.tuning.gemvWideLanes = 'off';
    const narrow = await product(format, T, N, Kd, acc, seed, silu);
    expect(K.kernelVariant(current, op)?.label, `${name} off`).toContain('LANES=16');
    expectClose(`${name} off`, narrow.got, narrow.want, 2e-6, 1e-6);
    expectClose(`${name} wide vs off`, wide.got, Float64Array.from(narrow.got), 2e-6, 1e-6);
    expect(Array.from(wide.got), name).not.toEqual(Array.from(narrow.got));
  });
  it("'auto' keeps a CPU adapter's lanes; a GPU's choices split this product instead", async () => {
    K.tuning.gemvWideLanes = 'auto';
    await product('f32', 1, 16, 2560, false, 3);
    expect(K.kernelVariant(current, 'matmulF32')?.label).toContain('LANES=16');
    K.tuning.autoFor = 'gpu';
    const split = await product('f32', 1, 16, 2560, false, 3);
    expect(split.dispatches).toBe(2);
    expect(K.kernelVariant(current, 'matmulF32')?.label).toContain('LANES=16');
  });
});

// The lanes a column forced (tuning.gemvLanes, a GPU's A/B: fewer lanes, more columns sharing one
// staged x): the same products over 4 and 16 lanes against the CPU reference, within f32 rounding
// of 'auto''s 8 (q4 over K = 2,560, as Qwen3-4B's projections) and not bit for bit (a forcing
// that silently did not happen would be).
describe('gemv_lanes with its lanes forced (tuning.gemvLanes)', () => {
  beforeAll(() => {
    current = gpu;
    K.tuning.gemvCols = '1'; // one column a thread: the lanes as forced (test/ops/gemvCpt.test.ts multiplies them)
  });
  afterAll(() => {
    K.tuning.gemvLanes = 'auto';
    K.tuning.gemvCols = 'auto';
  });
  it.each([
    ['q4', 4, 40, 2560, 4],
    ['q4', 1, 40, 2560, 16],
    ['bf16', 3, 24, 1024, 4],
  ] as const)('%s T=%i N=%i K=%i: %i lanes', async (format, T, N, Kd, lanes) => {
    const name = `${format} T=${T} N=${N} K=${Kd} lanes=${lanes}`;
    K.tuning.gemvLanes = 'auto';
    const auto = await product(format, T, N, Kd, false, T + N + Kd);
    const autoLabel = K.kernelVariant(current, 'matmul')?.label ?? '';
    expect(autoLabel, name).toContain('gemv.gemv_lanes[');
    expect(autoLabel, name).not.toContain(`LANES=${lanes},`);
    K.tuning.gemvLanes = String(lanes) as '4' | '16';
    const forced = await product(format, T, N, Kd, false, T + N + Kd);
    const label = K.kernelVariant(current, 'matmul')?.label ?? '';
    expect(label, name).toContain(`LANES=${lanes},`);
    expect(label, name).toContain(`COLS=${256 / lanes},`);
    expectClose(name, forced.got, forced.want, 2e-6, 1e-6);
    expectClose(`${name} vs auto`, forced.got, Float64Array.from(auto.got), 2e-6, 1e-6);
    expect(Array.from(forced.got), name).not.toEqual(Array.from(auto.got));
  });
});
