// q4 on the GPU: the quantize kernel (shaders/quant.wgsl) bit for bit against the f64 CPU
// quantizer (src/model/q4.ts, itself checked against scripts/golden_q4.py) and against the
// script's per-tensor sha256 of every quantized tensor of the three golden checkpoints; then every
// kernel that reads a q4 weight (matmul rows / gemv with and without subgroups / tiled,
// matmulBackwardInput, embed) against CPU references on the dequantized weight (dequantizeQ4).
// Tolerances as test/ops/kernels.test.ts: the reference sums in f64 over the same (exact) q * s
// values, so only the kernel's f32 roundings differ: rel 1e-5 for products, exact for embed.
// Run: npx vitest run test/ops/q4Kernels.test.ts
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { dequantizeQ4, f16BitsToF32, f32ToF16Bits, q4Words, quantizeQ4 as cpuQuantizeQ4 } from '../../src/model/q4.ts';
import { openSafetensorsModel } from '../../src/model/safetensors.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

const ROOT = join(import.meta.dirname, '../..');
const U = 2 ** -24; // smallest f16 subnormal
const REL = 1e-5;
const ABS = 1e-6;

let gpu: Gpu; // subgroups when the adapter has them (SwiftShader does)
let tree: Gpu; // subgroups disabled: the shared-memory GEMV reduction
const h = gpuHarness(() => gpu);
const { f32Buf, u32Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
});
afterAll(() => {
  h.report('q4 kernel errors');
  gpu?.destroy();
  tree?.destroy();
});

/** bf16 bits of x, which must be a bf16 value exactly. */
function bf16(x: number): number {
  const u = new Uint32Array(Float32Array.of(x).buffer)[0]!;
  if ((u & 0xffff) !== 0 || new Float32Array(Uint32Array.of(u).buffer)[0] !== x)
    throw new Error(`${x} is not a bf16 value`);
  return u >>> 16;
}

/**
 * Quantizes a bf16 (N, K) tensor on the GPU in chunks of `chunks` rows (cycled), into an output
 * buffer first filled with garbage, so every word must be written. Returns the packed words and
 * the status word.
 */
async function gpuQuantize(
  g: Gpu,
  w: Uint16Array,
  N: number,
  Kd: number,
  chunks: number[] = [N],
): Promise<{ packed: Uint32Array; status: number }> {
  const words = q4Words(N, Kd);
  const out = g.createBuffer(words * 4, 'q4');
  g.write(out, new Uint32Array(words).fill(0xdeadbeef));
  const status = g.createBuffer(8, 'status');
  g.write(status, Uint32Array.of(0x12345678, K.Q4_STATUS_OK)); // slot 1: slot 0 must stay untouched
  const staging = g.createBuffer(Math.max(4, Math.max(...chunks) * Kd * 2), 'staging');
  for (let row0 = 0, c = 0; row0 < N; c++) {
    const rows = Math.min(chunks[c % chunks.length]!, N - row0);
    g.write(staging, w.subarray(row0 * Kd, (row0 + rows) * Kd));
    K.quantizeQ4(g, out, status, staging, row0, rows, N, Kd, 1);
    row0 += rows;
  }
  const packed = await g.readU32(out, words);
  const st = await g.readU32(status, 2);
  expect(st[0]).toBe(0x12345678);
  for (const b of [out, status, staging]) g.releaseBuffer(b);
  return { packed, status: st[1]! };
}

/** Index and value of the first differing word, for a readable failure. */
function firstDiff(a: Uint32Array, b: Uint32Array): string {
  for (let i = 0; i < Math.max(a.length, b.length); i++)
    if (a[i] !== b[i]) return `word ${i}: ${a[i]?.toString(16)} vs ${b[i]?.toString(16)}`;
  return 'equal';
}

async function expectSameAsCpu(w: Uint16Array, N: number, Kd: number, chunks?: number[]): Promise<Uint32Array> {
  const want = cpuQuantizeQ4(w, N, Kd, 'test');
  const { packed, status } = await gpuQuantize(gpu, w, N, Kd, chunks);
  expect(status).toBe(K.Q4_STATUS_OK);
  expect(firstDiff(packed, want)).toBe('equal');
  return packed;
}

const sha256 = (u: Uint32Array) =>
  createHash('sha256')
    .update(new Uint8Array(u.buffer, u.byteOffset, u.byteLength))
    .digest('hex');

describe('quantize_q4 against the CPU quantizer, bit for bit', () => {
  // The hand-built groups of test/model/q4.test.ts, one per row of a (rows, 32) tensor: exact ties of
  // w / s, f16 midpoints of amax / 7 (subnormal), clamps after a rounded-down subnormal scale,
  // s = 0 with amax != 0, subnormal scales, the largest finite scale, -0.
  const GROUPS: number[][] = [
    [7, 2.5, -2.5, 3.5, 0.5, -0.5, 1.5, -1.5, 6.5, -6.5, 4.5, -5.5],
    [-7, 1, 0, -0],
    [(21 * U) / 2, (5 * U) / 2, (3 * U) / 2],
    [(35 * U) / 2, 5 * U],
    [(7 * U) / 2, -U],
    [-10 * U, 7.5 * U, 3 * U, -8.5 * U],
    [-7.5 * U, 6.5 * U, 2.5 * U],
    [0, 0],
    [3 * 2 ** -30, -(2 ** -27), 2 ** -126],
    [48 * U, -6 * U, 5 * U, -4 * U],
    [512 * U, 100 * U, -256 * U],
    [456704, -456704, 1],
    [-(2 ** -130), 2 ** -133], // f32 subnormals (bf16 exponent 0)
  ];

  it('hand-built groups: ties to even, subnormal scales, clamps, s = 0, the largest scale', async () => {
    const w = new Uint16Array(GROUPS.length * 32);
    GROUPS.forEach((g, r) =>
      g.forEach((x, i) => {
        w[r * 32 + i] = bf16(x);
      }),
    );
    const packed = await expectSameAsCpu(w, GROUPS.length, 32, [1, 2, 3]);
    // Spot checks straight from the spec, independent of the CPU quantizer.
    const q = (r: number, i: number) => ((packed[(r * 32 + i) >> 3]! >>> (4 * (i & 7))) & 15) - 8;
    const s = (r: number) => f16BitsToF32((packed[GROUPS.length * 4 + (r >> 1)]! >>> (16 * (r & 1))) & 0xffff);
    expect([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11].map((i) => q(0, i))).toEqual([2, -2, 4, 0, 0, 2, -2, 6, -6, 4, -6]);
    expect([s(2), s(3), s(4), s(5), s(11)]).toEqual([2 * U, 2 * U, 0, U, 65248]);
    expect([0, 1, 2, 3].map((i) => q(5, i))).toEqual([-8, 7, 3, -8]);
  });

  it('every finite scale: one row per bf16 amax from 0 up to the largest that fits f16', async () => {
    const maxBits = bf16(456704);
    const N = maxBits + 1,
      Kd = 32;
    const rand = ref.rng(11);
    const w = new Uint16Array(N * Kd);
    for (let r = 0; r < N; r++) {
      const at = Math.floor(rand() * Kd);
      for (let i = 0; i < Kd; i++) {
        const mag = i === at ? r : Math.floor(rand() * (r + 1)); // bits <= r: |w| <= amax
        w[r * Kd + i] = mag | (rand() < 0.5 ? 0x8000 : 0);
      }
    }
    expect(f32ToF16Bits(456704 / 7)).toBe(0x7bf7); // the last row's scale is finite
    await expectSameAsCpu(w, N, Kd, [4093]); // 4093 rows per chunk: chunks start mid-pair
  });

  it('random tensors of every magnitude, odd groups per row, chunks of 1..7 rows', async () => {
    const rand = ref.rng(12);
    for (const [N, Kd] of [
      [37, 96],
      [5, 32],
      [64, 160],
      [3, 1024],
    ] as const) {
      const w = new Uint16Array(N * Kd);
      for (let g = 0; g < (N * Kd) / 32; g++) {
        const e0 = Math.floor(rand() * 140); // bf16 exponent field of the group's largest values
        for (let i = 0; i < 32; i++) {
          const e = Math.max(0, e0 - Math.floor(rand() * 12));
          w[g * 32 + i] = (rand() < 0.5 ? 0x8000 : 0) | (e << 7) | Math.floor(rand() * 128);
        }
      }
      await expectSameAsCpu(w, N, Kd, [1, 7, 2, 3]);
    }
  });

  it('reports the first NaN group and the first group whose scale overflows f16', async () => {
    const N = 4,
      Kd = 96; // 12 groups
    const w = new Uint16Array(N * Kd).fill(bf16(0.5));
    w[2 * Kd + 40] = bf16(-458752); // row 2, group 1: 458752 / 7 = 65536 -> Inf
    w[3 * Kd + 70] = 0x7fc0; // row 3, group 2: NaN
    let { status } = await gpuQuantize(gpu, w, N, Kd, [1]);
    expect(K.q4StatusGroup(status, Kd)).toEqual({ row: 2, col: 32, nan: false });
    w[2 * Kd + 40] = bf16(0.5);
    ({ status } = await gpuQuantize(gpu, w, N, Kd, [3]));
    expect(K.q4StatusGroup(status, Kd)).toEqual({ row: 3, col: 64, nan: true });
    w[3 * Kd + 70] = 0x7f80; // +Inf: amax / 7 overflows
    ({ status } = await gpuQuantize(gpu, w, N, Kd));
    expect(K.q4StatusGroup(status, Kd)).toEqual({ row: 3, col: 64, nan: false });
    expect(K.q4StatusGroup(K.Q4_STATUS_OK, Kd)).toBeNull();
  });

  it('refuses K % 32 != 0 and rows outside the tensor', () => {
    const b = gpu.createBuffer(1024, 'b'),
      s = gpu.createBuffer(4, 's'),
      src = gpu.createBuffer(1024, 'src');
    expect(() => K.quantizeQ4(gpu, b, s, src, 0, 1, 2, 48, 0)).toThrow(/multiple of 32/);
    expect(() => K.quantizeQ4(gpu, b, s, src, 1, 2, 2, 32, 0)).toThrow(/outside/);
    for (const x of [b, s, src]) gpu.releaseBuffer(x);
  });
});

describe('quantize_q4 against scripts/golden_q4.py: per-tensor sha256 of the golden checkpoints', () => {
  interface Expected {
    q4: Record<string, { shape: [number, number]; words: number; sha256: string }>;
  }
  it.each(['tied', 'untied-sharded', 'mha'])('%s', async (variant) => {
    const exp = JSON.parse(
      await readFile(join(ROOT, 'test/fixtures/golden-q4', variant, 'expected.json'), 'utf8'),
    ) as Expected;
    const st = await openSafetensorsModel(nodeFolderSource(join(ROOT, 'test/fixtures/golden', variant)));
    for (const [name, e] of Object.entries(exp.q4)) {
      const [N, Kd] = st.tensors.get(name)!.shape as [number, number];
      expect([N, Kd]).toEqual(e.shape);
      const b = await st.readTensor(name);
      const w = new Uint16Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
      const { packed, status } = await gpuQuantize(gpu, w, N, Kd, [Math.max(1, Math.floor(N / 3))]);
      expect(status).toBe(K.Q4_STATUS_OK);
      expect(packed.length).toBe(e.words);
      expect(sha256(packed), name).toBe(e.sha256);
    }
  });
});

// ---- kernels reading q4 weights --------------------------------------------------------------

/** A random q4 (N, K) weight: bf16 values of scale `scale`, quantized on the CPU; its
 *  dequantized f32 values are the reference weight. */
function q4Weight(g: Gpu, N: number, Kd: number, seed: number, scale = 0.1): { w: K.Q4Weight; deq: Float32Array } {
  const vals = ref.randn(N * Kd, ref.rng(seed), scale);
  const bits = new Uint16Array(N * Kd);
  for (let i = 0; i < bits.length; i++) bits[i] = ref.f32ToBf16(vals[i]!);
  const packed = cpuQuantizeQ4(bits, N, Kd, 'w');
  const buf = g.createBuffer(packed.byteLength, 'q4w');
  g.write(buf, packed);
  return { w: { format: 'q4', buf, N, K: Kd }, deq: dequantizeQ4(packed, N, Kd) };
}

const upload = (g: Gpu, data: Float32Array, label: string) => {
  const b = g.createBuffer(Math.max(4, data.byteLength), label);
  g.write(b, data);
  return b;
};

describe.each([
  ['rows', () => gpu],
  ['gemv (subgroups)', () => gpu],
  ['gemv (shared memory)', () => tree],
  ['lanes (subgroups)', () => gpu],
  ['lanes (shared memory)', () => tree],
  ['tiled', () => gpu],
] as const)('matmul q4 %s', (name, getGpu) => {
  const variant = name.split(' ')[0] as 'rows' | 'gemv' | 'lanes' | 'tiled';
  const gemvLike = variant === 'gemv' || variant === 'lanes';
  const entry = { rows: 'matmul_rows', gemv: 'matmul_gemv', lanes: 'gemv_lanes', tiled: 'gemm_tiled' }[variant];
  beforeAll(() => {
    K.tuning.matmul = variant;
  });
  afterAll(() => {
    K.tuning.matmul = 'auto';
  });
  const shapes: [number, number, number][] = [
    [1, 1000, 128],
    [3, 37, 64],
    [8, 17, 160],
    [17, 100, 96],
    [70, 130, 224],
  ];
  it.each(shapes.filter(([T]) => !gemvLike || T <= K.GEMV_MAX_T))('T=%i N=%i K=%i', async (T, N, Kd) => {
    const g = getGpu();
    const { w, deq } = q4Weight(g, N, Kd, 20 + T);
    const x = ref.randn(T * Kd, ref.rng(30 + T));
    const out = g.createBuffer(T * N * 4, 'out');
    K.matmul(g, out, upload(g, x, 'x'), w, T, N, Kd);
    const v = K.kernelVariant(g, 'matmul')!;
    // gemv_lanes binds whole vec4s: a tensor whose scales end mid-vec4 falls back to matmul_gemv.
    expect(v.label).toContain(variant === 'lanes' && w.buf.size % 16 !== 0 ? 'matmul_gemv' : entry);
    expect(v.label).toContain('WEIGHTS=q4');
    if (gemvLike) expect(v.subgroups).toBe(g.features.subgroups);
    const want = new Float32Array(T * N);
    ref.matmul(want, x, deq, T, N, Kd);
    expectClose(`matmul q4 ${name} T=${T} N=${N} K=${Kd}`, await g.readF32(out, T * N), want, REL, ABS);
  });

  it.each(
    [
      [2, 33, 64],
      [20, 33, 96],
    ].filter(([T]) => !gemvLike || T <= K.GEMV_MAX_T),
  )('accumulate T=%i N=%i K=%i', async (T, N, Kd) => {
    const g = getGpu();
    const { w, deq } = q4Weight(g, N, Kd, 40);
    const rand = ref.rng(41);
    const x = ref.randn(T * Kd, rand);
    const init = ref.randn(T * N, rand);
    const out = upload(g, init, 'out');
    K.matmul(g, out, upload(g, x, 'x'), w, T, N, Kd, true);
    const want = init.slice();
    ref.matmul(want, x, deq, T, N, Kd, true);
    expectClose(`matmul+= q4 ${name} T=${T}`, await g.readF32(out, T * N), want, REL, ABS);
  });

  // Weights ~1e-5: every group scale is an f16 subnormal (< 2^-14), which the kernels must decode
  // exactly (no flush to zero); no absolute slack, so a flushed scale fails.
  it('subnormal scales', async () => {
    const g = getGpu();
    const [T, N, Kd] = [2, 40, 64];
    const { w, deq } = q4Weight(g, N, Kd, 50, 1e-5);
    const x = ref.randn(T * Kd, ref.rng(51));
    const out = g.createBuffer(T * N * 4, 'out');
    K.matmul(g, out, upload(g, x, 'x'), w, T, N, Kd);
    const want = new Float32Array(T * N);
    ref.matmul(want, x, deq, T, N, Kd);
    expect(Math.max(...want.map(Math.abs))).toBeGreaterThan(1e-5);
    expectClose(`matmul q4 ${name} subnormal scales`, await g.readF32(out, T * N), want, REL, 0);
  });

  // The real vocabulary: scales start 1.2M words in, 2374 workgroups. One variant: 5-15 s each here.
  it.runIf(name === 'rows')('LM head shape: T=1, N=151936, K=64', async () => {
    const g = getGpu();
    const [T, N, Kd] = [1, 151936, 64];
    const { w, deq } = q4Weight(g, N, Kd, 60);
    const x = ref.randn(T * Kd, ref.rng(61));
    const out = g.createBuffer(T * N * 4, 'out');
    K.matmul(g, out, upload(g, x, 'x'), w, T, N, Kd);
    const want = new Float32Array(T * N);
    ref.matmul(want, x, deq, T, N, Kd);
    expectClose(`matmul q4 ${name} LM head`, await g.readF32(out, T * N), want, REL, ABS);
  });
});

describe.each(['rows', 'tiled'] as const)('matmulBackwardInput q4 (gemm %s)', (variant) => {
  beforeAll(() => {
    K.tuning.matmul = variant;
  });
  afterAll(() => {
    K.tuning.matmul = 'auto';
  });
  it.each([
    [3, 40, 64],
    [20, 33, 96],
    [70, 130, 224],
  ])('T=%i N=%i K=%i, overwrite and accumulate', async (T, N, Kd) => {
    const { w, deq } = q4Weight(gpu, N, Kd, 70 + T);
    const rand = ref.rng(71);
    const dy = ref.randn(T * N, rand);
    const init = ref.randn(T * Kd, rand);
    const dyb = f32Buf(dy, 'dy');
    const dx = outBuf(T * Kd, 'dx');
    K.matmulBackwardInput(gpu, dx, dyb, w, T, N, Kd, false);
    expect(K.kernelVariant(gpu, 'matmulBackwardInput')!.label).toContain(
      variant === 'rows' ? 'gemm_rows' : 'gemm_tiled',
    );
    const want = new Float32Array(T * Kd);
    ref.matmulBackwardInput(want, dy, deq, T, N, Kd, false);
    expectClose(
      `matmulBackwardInput q4 ${variant} T=${T} N=${N} K=${Kd}`,
      await gpu.readF32(dx, T * Kd),
      want,
      REL,
      ABS,
    );
    const acc = f32Buf(init, 'dxAcc');
    K.matmulBackwardInput(gpu, acc, dyb, w, T, N, Kd, true);
    const wantAcc = init.slice();
    ref.matmulBackwardInput(wantAcc, dy, deq, T, N, Kd, true);
    expectClose(`matmulBackwardInput+= q4 ${variant} T=${T}`, await gpu.readF32(acc, T * Kd), wantAcc, REL, ABS);
  });
});

describe('embed q4', () => {
  it.each([
    [5, 64, 300],
    [9, 96, 37],
  ])('T=%i C=%i V=%i: exactly the dequantized rows', async (T, C, V) => {
    const { w, deq } = q4Weight(gpu, V, C, 80 + C);
    const ids = Array.from({ length: T }, (_, t) => (t * 7919 + 3) % V);
    ids[T - 1] = V - 1; // the last row: its scales sit at the end of the buffer
    const out = outBuf(T * C);
    K.embed(gpu, out, u32Buf(ids), w, T, C, V);
    const want = new Float32Array(T * C);
    ref.embed(want, Uint32Array.from(ids), deq, T, C);
    expectClose(`embed q4 T=${T} C=${C}`, await gpu.readF32(out, T * C), want, 0, 0);
  });

  it('refuses a q4 table of the wrong shape', () => {
    const { w } = q4Weight(gpu, 10, 32, 90);
    expect(() => K.embed(gpu, outBuf(64), u32Buf([0]), w, 1, 64, 10)).toThrow(/embed table/);
  });
});
