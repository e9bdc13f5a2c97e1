// K.matmulGroup, the fused q/k/v and gate/up projections (shaders/gemv.wgsl gemv_rows_group on CPU
// adapters, gemv_lanes_group on GPUs, shaders/matmul.wgsl matmul_gemv_group on GPUs where a row is
// not whole 16-byte blocks): each output against the CPU reference
// and bitwise equal to one K.matmul per weight, for bf16 and q4 weights, 2 and 3 weights of odd
// widths (past one workgroup's columns), T = 1..8, each GEMV variant forced and checked to have
// run (gemv_lanes_group and matmul_gemv_group with subgroup and shared-memory reductions); and the fallbacks to one matmul per weight (unaligned K, prefill's tiled GEMM, mixed
// formats, too few storage bindings). K.matmulGroupF32 (the LoRA A products of a group) and
// K.matmulEachF32 (their B products, each over its own u) bitwise one matmulF32 each, also with
// the lanes widened at 4B's width (tuning.gemvWideLanes).
// Run: npx vitest run test/ops/matmulGroup.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
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

afterEach(() => {
  K.tuning.matmul = 'auto';
  K.tuning.gemvWideLanes = 'auto';
});

afterAll(() => {
  h.report('matmulGroup errors');
  gpu?.destroy();
});

type Format = 'bf16' | 'q4';

/**
 * Runs matmulGroup and one matmul per weight on the same inputs; checks the fused outputs are
 * bitwise the unfused ones and close to the CPU reference. Returns the pipeline matmulGroup ran.
 */
async function fusedVsUnfused(format: Format, T: number, Ns: number[], Kd: number, name: string): Promise<string> {
  const rand = ref.rng(T * 7 + Kd);
  const x = ref.randn(T * Kd, rand);
  const xb = f32Buf(x);
  const ws = Ns.map((N, i) => h.weight(format, N, Kd, 10 * T + i));
  const fused = Ns.map((N) => outBuf(T * N, 'fused'));
  K.matmulGroup(
    gpu,
    fused,
    xb,
    ws.map((w) => w.w),
    T,
    Ns,
    Kd,
  );
  const label = K.kernelVariant(gpu, 'matmulGroup')?.label ?? '';
  const single = Ns.map((N) => outBuf(T * N, 'single'));
  Ns.forEach((N, i) => K.matmul(gpu, single[i], xb, ws[i].w, T, N, Kd));
  for (let i = 0; i < Ns.length; i++) {
    const got = await gpu.readF32(fused[i], T * Ns[i]);
    const unfused = await gpu.readF32(single[i], T * Ns[i]);
    expect(Array.from(got), `${name} weight ${i}: fused != unfused`).toEqual(Array.from(unfused));
    const want = new Float32Array(T * Ns[i]);
    ref.matmul(want, x, ws[i].vals, T, Ns[i], Kd);
    expectClose(`${name} w${i}`, got, want, 1e-5, 1e-6);
  }
  return label;
}

// (T, Ns, K): q/k/v-like triples and gate/up-like pairs, widths past 256 columns and odd.
const SHAPES: [number, number[], number][] = [
  [1, [37, 300, 9], 64],
  [2, [33, 65], 96],
  [3, [50, 17, 260], 32],
  [4, [129, 258], 64],
  [5, [9, 9, 9], 128],
  [6, [1, 300], 32],
  [7, [70, 30, 30], 64],
  [8, [200, 65, 33], 96],
];

describe.each(['blocks', 'lanes', 'gemv'] as const)("tuning.matmul '%s'", (variant) => {
  const entry = { blocks: 'gemv.gemv_rows_group', lanes: 'gemv.gemv_lanes_group', gemv: 'matmul.matmul_gemv_group' }[
    variant
  ];
  describe.each(['bf16', 'q4'] as const)('%s', (format) => {
    it.each(SHAPES)('T=%i Ns=%j K=%i', async (T, Ns, Kd) => {
      K.tuning.matmul = variant;
      const label = await fusedVsUnfused(format, T, Ns, Kd, `${variant} ${format} T=${T} Ns=${Ns.join(',')} K=${Kd}`);
      expect(label).toContain(entry);
      expect(label).toContain(`GROUP=${Ns.length}`);
    });
  });
});

describe.each([
  ['gemv', 'matmul.matmul_gemv_group'],
  ['lanes', 'gemv.gemv_lanes_group'],
] as const)("tuning.matmul '%s' with the shared-memory reduction (no subgroups)", (variant, entry) => {
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
    ['q4', 8, [129, 258], 64],
  ] as const)('%s T=%i Ns=%j K=%i', async (format, T, Ns, Kd) => {
    K.tuning.matmul = variant;
    const label = await fusedVsUnfused(format, T, [...Ns], Kd, `${variant} shared ${format} T=${T} Ns=${Ns.join(',')}`);
    expect(label).toContain(entry);
    expect(K.kernelVariant(gpu, 'matmulGroup')?.subgroups).toBe(false);
  });
});

// The LoRA A products of a group (f32 (r, K) weights over one x): bitwise one matmulF32 each.
describe.each(['blocks', 'lanes', 'gemv'] as const)("matmulGroupF32, tuning.matmul '%s'", (variant) => {
  const entry = { blocks: 'gemv.gemv_rows_group', lanes: 'gemv.gemv_lanes_group', gemv: 'matmul.matmul_gemv_group' }[
    variant
  ];
  it.each([
    [1, [16, 16, 16], 64],
    [4, [8, 8], 96],
    [8, [16, 16, 16], 100], // K % 4 != 0: not whole 16-byte rows ('lanes' takes matmul_gemv_group, 'blocks' one product each)
    [2, [16, 16, 16], 2560], // 4B's width: 'lanes' widened to 64 lanes a column in the group and alone
  ] as const)('T=%i Ns=%j K=%i', async (T, Ns, Kd) => {
    K.tuning.matmul = variant;
    K.tuning.gemvWideLanes = 'on';
    const rand = ref.rng(T + Kd);
    const x = ref.randn(T * Kd, rand);
    const xb = f32Buf(x);
    const ws = Ns.map((N) => ref.randn(N * Kd, rand, 0.1));
    const fused = Ns.map((N) => outBuf(T * N, 'fused'));
    K.matmulGroupF32(
      gpu,
      fused,
      xb,
      ws.map((w) => f32Buf(w)),
      T,
      [...Ns],
      Kd,
    );
    const label = K.kernelVariant(gpu, 'matmulGroupF32')?.label ?? '';
    const aligned = Kd % 4 === 0;
    if (aligned) expect(label).toContain(entry);
    else if (variant !== 'blocks') expect(label).toContain('matmul.matmul_gemv_group');
    if (variant === 'lanes' && Kd === 2560) expect(label).toContain('LANES=64');
    for (let i = 0; i < Ns.length; i++) {
      const single = outBuf(T * Ns[i], 'single');
      K.matmulF32(gpu, single, xb, f32Buf(ws[i]), T, Ns[i], Kd);
      const got = await gpu.readF32(fused[i], T * Ns[i]);
      expect(Array.from(got), `weight ${i}: fused != matmulF32`).toEqual(
        Array.from(await gpu.readF32(single, T * Ns[i])),
      );
      const want = new Float64Array(T * Ns[i]);
      ref.matmulF32(want, x, ws[i], T, Ns[i], Kd);
      expectClose(`matmulGroupF32 ${variant} T=${T} w${i}`, got, want, 1e-5, 1e-6);
    }
  });
});

// The LoRA B products of a group (f32 (N, r) weights, each over its own u, accumulating with the
// LoRA scale): one gemv_lanes_group dispatch (XEACH) with 'lanes', bitwise one matmulF32 each;
// one matmulF32 each elsewhere. With and without subgroups.
describe.each([
  ['lanes', true],
  ['lanes', false],
  ['blocks', true],
  ['gemv', true],
] as const)("matmulEachF32, tuning.matmul '%s', subgroups %s", (variant, subgroups) => {
  // Without subgroups, a device of its own stands in for `gpu` (the harness uploads to `gpu`).
  let g: Gpu, saved: Gpu;
  beforeAll(async () => {
    saved = gpu;
    if (!subgroups) gpu = await createGpu({ disableFeatures: ['subgroups'] });
    g = gpu;
  });
  afterAll(() => {
    if (!subgroups) gpu.destroy();
    gpu = saved;
  });
  it.each([
    [1, [64, 32, 32], 16, true],
    [4, [300, 300], 8, true],
    [3, [37, 9, 70], 4, false],
    [8, [20, 20, 20], 6, true], // r % 4 != 0: not whole 16-byte rows, one product each
  ] as const)('T=%i Ns=%j r=%i accumulate %s', async (T, Ns, r, accumulate) => {
    K.tuning.matmul = variant;
    const rand = ref.rng(T * 3 + r);
    const us = Ns.map(() => ref.randn(T * r, rand));
    const Bs = Ns.map((N) => ref.randn(N * r, rand, 0.3));
    const inits = Ns.map((N) => ref.randn(T * N, rand));
    const scale = 1.5;
    const uBufs = us.map((u) => f32Buf(u, 'u'));
    const bBufs = Bs.map((b) => f32Buf(b, 'B'));
    const fused = inits.map((init) => f32Buf(init, 'fused'));
    const before = g.dispatchCount;
    K.matmulEachF32(g, fused, uBufs, bBufs, T, [...Ns], r, accumulate, scale);
    const one = variant === 'lanes' && r % 4 === 0;
    expect(g.dispatchCount - before).toBe(one ? 1 : Ns.length);
    if (one) {
      const v = K.kernelVariant(g, 'matmulEachF32')!;
      expect(v.label).toContain('gemv.gemv_lanes_group');
      expect(v.label).toContain('XEACH=1');
      expect(v.subgroups).toBe(subgroups);
    }
    for (let i = 0; i < Ns.length; i++) {
      const single = f32Buf(inits[i], 'single');
      K.matmulF32(g, single, uBufs[i], bBufs[i], T, Ns[i], r, accumulate, scale);
      const got = await g.readF32(fused[i], T * Ns[i]);
      expect(Array.from(got), `product ${i}: matmulEachF32 != matmulF32`).toEqual(
        Array.from(await g.readF32(single, T * Ns[i])),
      );
      const want = new Float64Array(T * Ns[i]);
      if (accumulate) want.set(inits[i]);
      ref.matmulF32(want, us[i], Bs[i], T, Ns[i], r, accumulate, scale);
      expectClose(`matmulEachF32 ${variant} sg=${subgroups} T=${T} r=${r} w${i}`, got, want, 1e-5, 1e-6);
    }
  });
  it('an output that is also an input is refused, naming the op', () => {
    const u = f32Buf(new Float32Array(16)),
      B = f32Buf(new Float32Array(64)),
      out = outBuf(16);
    expect(() => K.matmulEachF32(g, [out, u], [u, u], [B, B], 1, [16, 16], 4, true, 1)).toThrow(/matmulEachF32/);
    expect(() => K.matmulEachF32(g, [out], [u], [B], 1, [16], 4, true, 1)).toThrow(/needs 2 or 3 weights/);
  });
});

describe('one dispatch', () => {
  it('three weights take one dispatch where three matmuls take three', () => {
    K.tuning.matmul = 'blocks';
    const [T, Kd] = [2, 64];
    const ws = [0, 1, 2].map((i) => h.weight('bf16', 40, Kd, 90 + i).w);
    const x = f32Buf(ref.randn(T * Kd, ref.rng(3)));
    const outs = [0, 1, 2].map(() => outBuf(T * 40));
    const before = gpu.dispatchCount;
    K.matmulGroup(gpu, outs, x, ws, T, [40, 40, 40], Kd);
    expect(gpu.dispatchCount - before).toBe(1);
    ws.forEach((w, i) => K.matmul(gpu, outs[i], x, w, T, 40, Kd));
    expect(gpu.dispatchCount - before).toBe(4);
  });
});

describe('falls back to one matmul per weight, bitwise the same', () => {
  const fallback = async (Kd: number, T: number, name: string, setup: () => void) => {
    setup();
    const before = gpu.dispatchCount;
    const rand = ref.rng(Kd + T);
    const x = ref.randn(T * Kd, rand);
    const ws = [h.weight('bf16', 33, Kd, 1), h.weight('bf16', 20, Kd, 2)];
    const outs = [outBuf(T * 33), outBuf(T * 20)];
    const xb = f32Buf(x);
    K.matmulGroup(
      gpu,
      outs,
      xb,
      ws.map((w) => w.w),
      T,
      [33, 20],
      Kd,
    );
    expect(gpu.dispatchCount - before, name).toBe(2);
    for (const [i, N] of [33, 20].entries()) {
      const single = outBuf(T * N);
      K.matmul(gpu, single, xb, ws[i].w, T, N, Kd);
      const got = await gpu.readF32(outs[i], T * N);
      expect(Array.from(got)).toEqual(Array.from(await gpu.readF32(single, T * N)));
      const want = new Float32Array(T * N);
      ref.matmul(want, x, ws[i].vals, T, N, Kd);
      expectClose(`fallback ${name} w${i}`, got, want, 1e-5, 1e-6);
    }
  };

  it("K not a whole number of 16-byte blocks ('blocks': matmul_rows)", async () => {
    await fallback(50, 3, 'unaligned', () => (K.tuning.matmul = 'blocks'));
    expect(K.kernelVariant(gpu, 'matmul')?.label).toContain('matmul_rows');
  });

  it("prefill: 'tiled' keeps the tiled GEMM", async () => {
    await fallback(64, 12, 'tiled', () => (K.tuning.matmul = 'tiled'));
    expect(K.kernelVariant(gpu, 'matmul')?.label).toContain('gemm_tiled');
  });

  it('mixed bf16 and q4 weights', async () => {
    K.tuning.matmul = 'blocks';
    const [T, Kd] = [2, 64];
    const a = h.weight('bf16', 30, Kd, 5);
    const b = h.weight('q4', 40, Kd, 6);
    const x = f32Buf(ref.randn(T * Kd, ref.rng(8)));
    const before = gpu.dispatchCount;
    K.matmulGroup(gpu, [outBuf(T * 30), outBuf(T * 40)], x, [a.w, b.w], T, [30, 40], Kd);
    expect(gpu.dispatchCount - before).toBe(2);
  });

  it('a device with fewer storage bindings than the group needs', async () => {
    K.tuning.matmul = 'blocks';
    const [T, Kd] = [1, 64];
    const ws = [0, 1, 2].map((i) => h.weight('bf16', 24, Kd, 20 + i));
    const x = ref.randn(T * Kd, ref.rng(9));
    const xb = f32Buf(x);
    const outs = [0, 1, 2].map(() => outBuf(T * 24));
    gpu.flush();
    // The same Gpu seen with maxStorageBuffersPerShaderStage = 6 (three weights need 7); its
    // encoder state lives on the view from here to its flush.
    const limits: Record<string, number> = {};
    for (const key in gpu.limits) limits[key] = gpu.limits[key as keyof GPUSupportedLimits] as number;
    limits.maxStorageBuffersPerShaderStage = 6;
    const small = Object.create(gpu, { limits: { value: limits } }) as Gpu;
    const before = small.dispatchCount;
    K.matmulGroup(
      small,
      outs,
      xb,
      ws.map((w) => w.w),
      T,
      [24, 24, 24],
      Kd,
    );
    expect(small.dispatchCount - before).toBe(3);
    small.flush();
    for (let i = 0; i < 3; i++) {
      const want = new Float32Array(T * 24);
      ref.matmul(want, x, ws[i].vals, T, 24, Kd);
      expectClose(`few bindings w${i}`, await gpu.readF32(outs[i], T * 24), want, 1e-5, 1e-6);
    }
  });
});

describe('bad input', () => {
  it('names the output whose buffer is too small', () => {
    const Kd = 32;
    const ws = [h.weight('bf16', 8, Kd, 1).w, h.weight('bf16', 8, Kd, 2).w];
    expect(() => K.matmulGroup(gpu, [outBuf(8), outBuf(4)], f32Buf(new Float32Array(Kd)), ws, 1, [8, 8], Kd)).toThrow(
      /matmulGroup out 1/,
    );
  });
  it('refuses one weight', () => {
    const ws = [h.weight('bf16', 8, 32, 1).w];
    expect(() => K.matmulGroup(gpu, [outBuf(8)], f32Buf(new Float32Array(32)), ws, 1, [8], 32)).toThrow(
      /needs 2 or 3 weights/,
    );
  });
});
