// K.qkNormRopeKv (shaders/rope.wgsl qk_norm_rope with KV): q/k norms, RoPE and the KV-cache write
// in one dispatch. Bitwise against qkNormRope + kvWrite (q, and both pools word for word, pools
// pre-filled with noise so a skipped or stray write shows), f32 and f16 caches, through a
// scrambled page table with an unmapped page and a position past maxT, GQA, HD 6 (f16 words
// straddle the rotation halves), 16 and 128, with and without subgroups; against the CPU
// reference; and the two-kernel fallback on a device with too few storage bindings.
// Run: npx vitest run test/ops/qkNormRopeKv.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let sg: Gpu, tree: Gpu, gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, u32Buf, bf16Buf, outBuf, expectClose } = h;
beforeAll(async () => {
  sg = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
  gpu = sg;
});
afterAll(() => {
  h.report('qkNormRopeKv');
  sg?.destroy();
  tree?.destroy();
});

const UNMAPPED = 0xffffffff;
const eps = 1e-6,
  theta = 1e6;

interface Case {
  dtype: 'f32' | 'f16';
  T: number;
  NH: number;
  NKV: number;
  HD: number;
}

/** Inputs for T tokens over 3 slots of a paged cache (page size 4, maxT 12), scrambled pages. */
function setup({ dtype, T, NH, NKV, HD }: Case, seed: number) {
  const rand = ref.rng(seed);
  const P = 4,
    maxT = 12,
    S = 3;
  const perSlot = maxT / P;
  // Slot s's page j on physical page perm[s * perSlot + j]; slot 1's page 2 unmapped.
  const pages = S * perSlot + 1;
  const perm = Array.from({ length: pages }, (_, i) => i).sort(() => rand() - 0.5);
  const table = Uint32Array.from({ length: S * perSlot }, (_, i) => perm[i]);
  table[1 * perSlot + 2] = UNMAPPED;
  const kv: K.KvPaging = { dtype, pageSize: P, pages, pagesPerSlot: perSlot, maxT };
  // Token t: slot t % 3 at a distinct position; token 1 lands in the unmapped page, the last one past maxT.
  const slot = Uint32Array.from({ length: T }, (_, t) => t % S);
  const pos = Uint32Array.from({ length: T }, (_, t) => Math.floor(t / S) + 3 * (t % S));
  if (T > 1) pos[1] = 9;
  if (T > 2) pos[T - 1] = maxT + 5;
  const q = ref.randn(T * NH * HD, rand, 3);
  const k = ref.randn(T * NKV * HD, rand, 3);
  const v = ref.randn(T * NKV * HD, rand, 2);
  const qw = ref.roundBf16(ref.randn(HD, rand));
  const kw = ref.roundBf16(ref.randn(HD, rand));
  const poolWords = K.kvPoolBytes(kv, NKV, HD) / 4;
  const noise = Uint32Array.from({ length: poolWords }, () => Math.floor(rand() * 2 ** 32));
  return { kv, table, slot, pos, q, k, v, qw, kw, noise, poolWords, P };
}

/** Runs the fused op on g (or the two kernels it replaces) and reads back q and both pools. */
async function run(g: Gpu, c: Case, s: ReturnType<typeof setup>, fused: boolean) {
  const { T, NH, NKV, HD } = c;
  const kCache = g.createBuffer(s.poolWords * 4, 'kPool');
  const vCache = g.createBuffer(s.poolWords * 4, 'vPool');
  g.write(kCache, s.noise);
  g.write(vCache, s.noise);
  const up = (d: Float32Array | Uint32Array, label: string) => {
    const b = g.createBuffer(Math.max(4, d.byteLength), label);
    g.write(b, d);
    return b;
  };
  const [qb, kb, vb] = [up(s.q, 'q'), up(s.k, 'k'), up(s.v, 'v')];
  const [qwb, kwb] = [up(ref.packBf16(s.qw), 'qNorm'), up(ref.packBf16(s.kw), 'kNorm')];
  const [tb, sb, pb] = [up(s.table, 'pageTable'), up(s.slot, 'slot'), up(s.pos, 'pos')];
  const qOut = g.createBuffer(T * NH * HD * 4, 'qOut');
  const before = g.dispatchCount;
  if (fused) {
    K.qkNormRopeKv(g, qOut, kCache, vCache, qb, kb, vb, qwb, kwb, tb, sb, pb, T, NH, NKV, HD, eps, theta, s.kv);
  } else {
    const kn = g.createBuffer(T * NKV * HD * 4, 'kNormed');
    K.qkNormRope(g, qOut, kn, qb, kb, qwb, kwb, pb, T, NH, NKV, HD, eps, theta);
    K.kvWrite(g, kCache, vCache, kn, vb, tb, sb, pb, T, NKV, HD, s.kv);
  }
  const dispatches = g.dispatchCount - before;
  const [qr, kr, vr] = [await g.read(qOut), await g.read(kCache), await g.read(vCache)];
  return { dispatches, q: new Float32Array(qr), k: new Uint32Array(kr), v: new Uint32Array(vr) };
}

/** Element e of a pool as f32 (f16 halves widened). */
const poolAt = (pool: Uint32Array, dtype: 'f32' | 'f16', e: number) =>
  dtype === 'f32' ? new Float32Array(pool.buffer)[e] : f16ToF32((pool[e >> 1] >>> (16 * (e & 1))) & 0xffff);

function f16ToF32(b: number): number {
  const s = b & 0x8000 ? -1 : 1;
  const e = (b >> 10) & 0x1f,
    m = b & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

const CASES: Case[] = [
  { dtype: 'f32', T: 1, NH: 4, NKV: 2, HD: 16 },
  { dtype: 'f32', T: 7, NH: 4, NKV: 2, HD: 16 },
  { dtype: 'f32', T: 5, NH: 2, NKV: 1, HD: 128 },
  { dtype: 'f16', T: 1, NH: 4, NKV: 2, HD: 16 },
  { dtype: 'f16', T: 7, NH: 4, NKV: 4, HD: 6 },
  { dtype: 'f16', T: 5, NH: 8, NKV: 2, HD: 128 },
];

describe.each(['subgroups', 'shared'] as const)('qkNormRopeKv (%s reduction)', (reduction) => {
  beforeAll(() => {
    gpu = reduction === 'subgroups' ? sg : tree;
  });
  it.each(CASES)('$dtype T=$T NH=$NH NKV=$NKV HD=$HD', async (c) => {
    const s = setup(c, c.T * 13 + c.HD + (c.dtype === 'f16' ? 1 : 0));
    const a = await run(gpu, c, s, true);
    expect(K.kernelVariant(gpu, 'qkNormRopeKv')?.label).toContain(`rope.qk_norm_rope[KV=${c.dtype}`);
    expect(a.dispatches).toBe(1);
    const b = await run(gpu, c, s, false);
    expect(b.dispatches).toBe(2);
    expect(Array.from(a.q), 'q').toEqual(Array.from(b.q));
    expect(Array.from(a.k), 'k pool').toEqual(Array.from(b.k));
    expect(Array.from(a.v), 'v pool').toEqual(Array.from(b.v));

    // The CPU reference: each written row holds rope(rmsNorm(k)) and v (f16: rounded); skipped
    // tokens leave the noise.
    const { T, NH, NKV, HD } = c;
    const wq = new Float64Array(T * NH * HD),
      wk = new Float64Array(T * NKV * HD);
    ref.rmsNorm(wq, s.q, s.qw, T * NH, HD, eps);
    ref.rmsNorm(wk, s.k, s.kw, T * NKV, HD, eps);
    ref.rope(wq, s.pos, T, NH, HD, theta);
    ref.rope(wk, s.pos, T, NKV, HD, theta);
    const tag = `${reduction} ${c.dtype} T=${T} HD=${HD}`;
    expectClose(`q ${tag}`, a.q, wq, 1e-5, 1e-5);
    const row = NKV * HD;
    const gotK: number[] = [],
      wantK: number[] = [],
      gotV: number[] = [],
      wantV: number[] = [];
    let written = 0;
    for (let t = 0; t < T; t++) {
      const pt = s.pos[t];
      const page = pt < s.kv.maxT ? s.table[s.slot[t] * s.kv.pagesPerSlot + Math.floor(pt / s.P)] : UNMAPPED;
      if (page === UNMAPPED) continue;
      written++;
      for (let i = 0; i < row; i++) {
        const e = (page * s.P + (pt % s.P)) * row + i;
        gotK.push(poolAt(a.k, c.dtype, e));
        wantK.push(wk[t * row + i]);
        gotV.push(poolAt(a.v, c.dtype, e));
        wantV.push(s.v[t * row + i]);
      }
    }
    expect(written).toBe(T > 2 ? T - 2 : T > 1 ? T - 1 : 1);
    const rel = c.dtype === 'f16' ? 2 ** -11 : 1e-5;
    expectClose(`k cache ${tag}`, gotK, wantK, rel, 1e-5);
    expectClose(`v cache ${tag}`, gotV, wantV, rel, c.dtype === 'f16' ? 1e-4 : 0);
  });
});

describe('fallback', () => {
  it('a device with 8 storage bindings per stage runs qkNormRope + kvWrite (2 dispatches), same cache', async () => {
    gpu = sg;
    const c: Case = { dtype: 'f16', T: 4, NH: 4, NKV: 2, HD: 16 };
    const s = setup(c, 99);
    const want = await run(sg, c, s, true);
    sg.flush();
    const limits: Record<string, number> = {};
    for (const key in sg.limits) limits[key] = sg.limits[key as keyof GPUSupportedLimits] as number;
    limits.maxStorageBuffersPerShaderStage = 8;
    const small = Object.create(sg, { limits: { value: limits } }) as Gpu; // encoder state lives on the view
    const got = await run(small, c, s, true);
    expect(got.dispatches).toBe(2);
    expect(Array.from(got.q)).toEqual(Array.from(want.q));
    expect(Array.from(got.k)).toEqual(Array.from(want.k));
    expect(Array.from(got.v)).toEqual(Array.from(want.v));
  });

  it('bad paging is refused by name', () => {
    gpu = sg;
    const c: Case = { dtype: 'f32', T: 1, NH: 2, NKV: 1, HD: 8 };
    const s = setup(c, 5);
    const b = (n: number) => outBuf(n);
    const kv = { ...s.kv, pageSize: 3 };
    expect(() =>
      K.qkNormRopeKv(
        sg,
        b(16),
        b(4096),
        b(4096),
        f32Buf(s.q),
        f32Buf(s.k),
        f32Buf(s.v),
        bf16Buf(s.qw),
        bf16Buf(s.kw),
        u32Buf(s.table),
        u32Buf(s.slot),
        u32Buf(s.pos),
        1,
        2,
        1,
        8,
        eps,
        theta,
        kv,
      ),
    ).toThrow(/qkNormRopeKv: page size 3/);
  });
});
