// The GPU decode GEMV gemv_lanes (shaders/gemv.wgsl, tuning.matmul 'lanes', the 'auto' choice on
// GPUs for T <= GEMV_MAX_T): LANES threads per column over 16-byte weight blocks, x staged in
// workgroup memory KCV vec4s per row at a time. Against the CPU reference (f64) for bf16, q4 and
// f32 (LoRA) weights at shapes whose rows cross several staging chunks at every TMAX (1, 2, 4, 8
// rows: chunks of 4096, 2048, 1024, 512 elements with 16 KB of staged x, half that with 8 KB),
// rows past M in a TMAX group, a chunk that ends mid-way through a lane's blocks, gemm's
// accumulate and scale, with the subgroup and the shared-memory reductions, and with 16 KB of
// staged x (these adapters' 32 KB of workgroup memory) or 8 KB (a device limited to WebGPU's
// default 16 KB); the launched entry and its staging are checked each time, and unaligned rows
// fall back to matmul_gemv.
// Run: npx vitest run test/ops/gemvLanes.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
let tree: Gpu; // no subgroups: the shared-memory reduction
let small: Gpu; // workgroup memory limited to WebGPU's default 16 KB: 8 KB of staged x
let current: Gpu;
const h = gpuHarness(() => current);
const { f32Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
  small = await createGpu();
  // A proxy over the limits changes one and reads the rest (as test/cli/runCore.test.ts does).
  const real = small.limits;
  const get = (_: GPUSupportedLimits, k: string | symbol) =>
    k === 'maxComputeWorkgroupStorageSize' ? 16384 : real[k as keyof GPUSupportedLimits];
  Object.defineProperty(small, 'limits', { value: new Proxy(real, { get }) });
  K.tuning.matmul = 'lanes';
});

afterAll(() => {
  K.tuning.matmul = 'auto';
  h.report('gemv_lanes errors');
  gpu?.destroy();
  tree?.destroy();
  small?.destroy();
});

type Format = 'bf16' | 'q4' | 'f32';

/** matmul (bf16, q4) or matmulF32 (f32) through gemv_lanes; checks the entry and the values. */
async function check(format: Format, T: number, N: number, Kd: number, accumulate: boolean): Promise<void> {
  const name = `${format} T=${T} N=${N} K=${Kd}${accumulate ? ' +=' : ''} ${current === tree ? 'shared' : 'subgroups'}${current === small ? ' 8KB' : ''}`;
  const rand = ref.rng(T * 31 + N + Kd);
  const x = ref.randn(T * Kd, rand);
  const { w, vals } = h.weight(format, N, Kd, T + N);
  const init = ref.randn(T * N, rand);
  const out = accumulate ? f32Buf(init, 'out') : outBuf(T * N);
  const want = new Float64Array(T * N);
  if (format === 'f32') {
    // The LoRA products go through gemm with a scale (matmulF32).
    K.matmulF32(current, out, f32Buf(x), w as GPUBuffer, T, N, Kd, accumulate, 0.5);
    if (accumulate) want.set(init);
    ref.matmulF32(want, x, vals, T, N, Kd, accumulate, 0.5);
  } else {
    K.matmul(current, out, f32Buf(x), w, T, N, Kd, accumulate);
    if (accumulate) want.set(init);
    ref.matmul(want, x, vals, T, N, Kd, accumulate);
  }
  const op = format === 'f32' ? 'matmulF32' : 'matmul';
  const v = K.kernelVariant(current, op)!;
  expect(v.label, name).toContain('gemv.gemv_lanes');
  expect(v.subgroups, name).toBe(current.features.subgroups);
  expect(v.defines.XS, name).toBe(current === small ? 512 : 1024);
  expectClose(name, await current.readF32(out, T * N), want, 2e-6, 1e-6);
}

describe.each([
  ['subgroups', () => gpu],
  ['shared memory', () => tree],
  ['subgroups, 8 KB of staged x,', () => small],
] as const)('gemv_lanes, %s reduction', (_, getGpu) => {
  beforeAll(() => {
    current = getGpu();
  });
  // (format, T, N, K): K past one staging chunk at each TMAX (8 KB of x / 16 KB); N past one
  // workgroup's columns and odd.
  it.each([
    ['bf16', 1, 37, 2560], // TMAX 1: chunks of 2048 -> 2048 + 512 / one chunk
    ['bf16', 1, 24, 4160], // 2048 x 2 + 64 / 4096 + 64
    ['bf16', 2, 20, 1088], // TMAX 2: 1024 + 64 / one
    ['bf16', 2, 12, 2112], // 1024 x 2 + 64 / 2048 + 64
    ['bf16', 3, 33, 1032], // TMAX 4 (row 3 zero): 512 + 512 + 8, one block in the last chunk / 1024 + 8
    ['bf16', 8, 17, 776], // TMAX 8: 256 x 3 + 8 / 512 + 264
    ['q4', 1, 40, 2560], // 64 blocks + 16 / one chunk
    ['q4', 1, 8, 4352], // 64 blocks x 2 + 8 / 128 + 8
    ['q4', 4, 6, 1088], // TMAX 4: 16 blocks x 2 + 2 / 32 + 2
    ['q4', 5, 9, 800], // TMAX 8: 8 blocks per chunk, 8 lanes, 25 blocks / 16 a chunk
    ['q4', 4, 70, 544],
    ['f32', 1, 16, 2560], // LoRA A: r = 16 rows over the hidden size
    ['f32', 4, 300, 16], // LoRA B: 4 blocks of 4 per row
    ['f32', 7, 16, 1028],
  ] as const)('%s T=%i N=%i K=%i', async (format, T, N, Kd) => {
    await check(format, T, N, Kd, false);
  });
  it.each([
    ['bf16', 4, 50, 520],
    ['q4', 2, 33, 2080],
    ['f32', 8, 24, 260],
  ] as const)('accumulate %s T=%i N=%i K=%i', async (format, T, N, Kd) => {
    await check(format, T, N, Kd, true);
  });
});

describe('fallbacks', () => {
  beforeAll(() => {
    current = gpu;
  });
  it('rows that are not whole 16-byte blocks take matmul_gemv; more than GEMV_MAX_T rows the tiled GEMM', async () => {
    const [N, Kd] = [20, 100]; // bf16 K % 8 != 0
    const x = ref.randn(3 * Kd, ref.rng(1));
    const vals = ref.roundBf16(ref.randn(N * Kd, ref.rng(2), 0.1));
    const w = h.bf16Buf(vals);
    const out = outBuf(3 * N);
    K.matmul(gpu, out, f32Buf(x), w, 3, N, Kd);
    expect(K.kernelVariant(gpu, 'matmul')?.label).toContain('matmul.matmul_gemv');
    const want = new Float64Array(3 * N);
    ref.matmul(want, x, vals, 3, N, Kd);
    expectClose('unaligned fallback', await gpu.readF32(out, 3 * N), want, 2e-6, 1e-6);

    const T = K.GEMV_MAX_T + 1;
    const x2 = ref.randn(T * 64, ref.rng(3));
    const w2 = ref.roundBf16(ref.randn(N * 64, ref.rng(4), 0.1));
    const out2 = outBuf(T * N);
    K.matmul(gpu, out2, f32Buf(x2), h.bf16Buf(w2), T, N, 64);
    expect(K.kernelVariant(gpu, 'matmul')?.label).toContain('matmul.gemm_tiled');
    const want2 = new Float64Array(T * N);
    ref.matmul(want2, x2, w2, T, N, 64);
    expectClose('T > GEMV_MAX_T', await gpu.readF32(out2, T * N), want2, 2e-6, 1e-6);
  });
});
