// Every op in src/ops (forward and backward) against test/helpers/reference.ts at small, odd shapes.
// Run: npx vitest run test/ops/kernels.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
//
// Tolerances: |gpu - ref|max <= rel * |ref|max + abs. The reference accumulates in f64 on the
// same bf16-rounded weights, so the only differences are the kernels' f32 roundings (~6e-8
// relative each) growing with the reduction length: ~1e-6 relative measured for K <= 1000.
// We allow rel = 1e-5 (10x margin) for reductions, exact equality for copies (embed, gather,
// kvWrite), and rope's documented 2e-6 absolute sin/cos error on unit-scale inputs.

import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import * as ref from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { measured, f32Buf, u32Buf, bf16Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
});

afterAll(() => {
  h.report('kernel errors');
  gpu?.destroy();
});

const REL = 1e-5;
const ABS = 1e-6;

describe('comparator', () => {
  it('fails on a perturbed reference (a wrong kernel would be caught)', async () => {
    const rand = ref.rng(1);
    const [T, N, Kd] = [3, 40, 64];
    const x = ref.randn(T * Kd, rand);
    const w = ref.roundBf16(ref.randn(N * Kd, rand));
    const out = outBuf(T * N);
    K.matmul(gpu, out, f32Buf(x), bf16Buf(w), T, N, Kd);
    const got = await gpu.readF32(out, T * N);
    const want = new Float32Array(T * N);
    ref.matmul(want, x, w, T, N, Kd);
    expect(ref.compare(got, want, REL, ABS).ok).toBe(true);
    // A one-element error 10x the tolerance, as an off-by-one or dropped term would make.
    const wrong = want.slice();
    wrong[17] += 10 * (REL * ref.compare(got, want, REL, ABS).maxRef + ABS);
    expect(ref.compare(got, wrong, REL, ABS).ok).toBe(false);
    // Transposed weights (a classic layout bug) are far outside tolerance.
    const wT = new Float32Array(N * Kd);
    for (let n = 0; n < N; n++)
      for (let k = 0; k < Kd; k++) wT[n * Kd + k] = w[((n * Kd + k) % N) * Kd + Math.floor((n * Kd + k) / N)];
    ref.matmul(wrong, x, wT, T, N, Kd);
    expect(ref.compare(got, wrong, REL, ABS).ok).toBe(false);
    expect(ref.compare(got, new Float32Array(T * N + 1), REL, ABS).ok).toBe(false);
    const nan = got.slice();
    nan[0] = NaN;
    expect(ref.compare(nan, want, REL, ABS).ok).toBe(false);
  });
});

describe('bf16 helpers', () => {
  it('round to nearest even and pack low half first', () => {
    expect(ref.f32ToBf16(1)).toBe(0x3f80);
    expect(ref.f32ToBf16(-2)).toBe(0xc000);
    // 1 + 2^-8 is exactly halfway between bf16 1 and 1 + 2^-7: ties go to the even mantissa (1).
    expect(ref.f32ToBf16(1 + 2 ** -8)).toBe(0x3f80);
    expect(ref.f32ToBf16(1 + 3 * 2 ** -8)).toBe(0x3f82);
    expect(ref.f32ToBf16(Infinity)).toBe(0x7f80);
    expect(Number.isNaN(ref.bf16ToF32(ref.f32ToBf16(NaN)))).toBe(true);
    const packed = ref.packBf16(Float32Array.from([1, -2, 0.5]));
    expect(Array.from(packed)).toEqual([0xc0003f80, 0x3f00]);
    expect(Array.from(ref.unpackBf16(packed, 3))).toEqual([1, -2, 0.5]);
  });
});

describe('embed', () => {
  it.each([
    [3, 37, 50],
    [1, 64, 10],
  ])('T=%i C=%i V=%i', async (T, C, V) => {
    const rand = ref.rng(2);
    const table = ref.roundBf16(ref.randn(V * C, rand));
    const ids = Array.from({ length: T }, (_, i) => (i * 7 + 3) % V);
    const out = outBuf(T * C);
    K.embed(gpu, out, u32Buf(ids), bf16Buf(table), T, C, V);
    const want = new Float32Array(T * C);
    ref.embed(want, Uint32Array.from(ids), table, T, C);
    expectClose(`embed T=${T} C=${C}`, await gpu.readF32(out, T * C), want, 0, 0);
  });
});

describe('rmsNorm', () => {
  // R=70000 rows = 70000 workgroups > 65535: the launch splits the grid over x/y.
  it.each([
    [3, 100],
    [17, 16],
    [2, 1000],
    [70000, 2],
  ])('R=%i D=%i', async (R, D) => {
    const rand = ref.rng(3);
    const x = ref.randn(R * D, rand, 3);
    const w = ref.roundBf16(ref.randn(D, rand));
    const out = outBuf(R * D);
    K.rmsNorm(gpu, out, f32Buf(x), bf16Buf(w), R, D, 1e-6);
    const want = new Float32Array(R * D);
    ref.rmsNorm(want, x, w, R, D, 1e-6);
    expectClose(`rmsNorm R=${R} D=${D}`, await gpu.readF32(out, R * D), want, REL, ABS);
  });
});

// 'tiled-sg': the tiled GEMM with A shared by subgroup shuffles (SGA): SwiftShader's subgroups
// of 4 and lavapipe's 8 and 16 each take a different split of the 16 values of r per step.
describe.each(['rows', 'gemv', 'lanes', 'tiled', 'tiled-sg'] as const)('matmul %s', (variant) => {
  beforeEach((ctx) => {
    if (variant === 'tiled-sg' && !gpu.features.subgroups) ctx.skip();
  });
  beforeAll(() => {
    K.tuning.matmul = variant === 'tiled-sg' ? 'tiled' : variant;
    K.tuning.gemmSubgroups = variant === 'tiled-sg' ? 'on' : 'off';
  });
  afterAll(() => {
    K.resetTuning();
  });
  // (T, N, K): decode sizes (T <= 8) and prefill sizes, odd K, N not a multiple of any tile.
  const shapes: [number, number, number][] = [
    [1, 1000, 100],
    [3, 37, 64],
    [3, 50, 99],
    [8, 17, 130],
    [17, 100, 99],
    [17, 70, 64],
    [70, 130, 200],
  ];
  it.each(shapes.filter(([T]) => (variant !== 'gemv' && variant !== 'lanes') || T <= K.GEMV_MAX_T))(
    'T=%i N=%i K=%i',
    async (T, N, Kd) => {
      const rand = ref.rng(4 + T);
      const x = ref.randn(T * Kd, rand);
      const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
      const out = outBuf(T * N);
      K.matmul(gpu, out, f32Buf(x), bf16Buf(w), T, N, Kd);
      if (variant.startsWith('tiled')) {
        expect(K.kernelVariant(gpu, 'matmul')?.defines.SGA, 'the subgroup A variant ran').toBe(
          variant === 'tiled-sg' ? 1 : undefined,
        );
      }
      const want = new Float32Array(T * N);
      ref.matmul(want, x, w, T, N, Kd);
      expectClose(`matmul ${variant} T=${T} N=${N} K=${Kd}`, await gpu.readF32(out, T * N), want, REL, ABS);
    },
  );

  it.each(
    [
      [2, 33, 48],
      [20, 33, 48],
    ].filter(([T]) => (variant !== 'gemv' && variant !== 'lanes') || T <= K.GEMV_MAX_T),
  )('accumulate T=%i N=%i K=%i', async (T, N, Kd) => {
    const rand = ref.rng(5);
    const x = ref.randn(T * Kd, rand);
    const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
    const init = ref.randn(T * N, rand);
    const out = f32Buf(init);
    K.matmul(gpu, out, f32Buf(x), bf16Buf(w), T, N, Kd, true);
    const want = init.slice();
    ref.matmul(want, x, w, T, N, Kd, true);
    expectClose(`matmul+= ${variant} T=${T}`, await gpu.readF32(out, T * N), want, REL, ABS);
  });

  // The real Qwen3 vocabulary on one token: N/64 = 2374 workgroups (rows, tiled) or N/32 = 4748
  // (gemv) stay under 65535, so the x/y grid split is exercised separately in gpu.test.ts.
  it.skipIf(variant === 'tiled' || variant === 'tiled-sg')('LM head shape: T=1, N=151936, K=64', async () => {
    const [T, N, Kd] = [1, 151936, 64];
    const rand = ref.rng(6);
    const x = ref.randn(T * Kd, rand);
    const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
    const out = outBuf(T * N);
    K.matmul(gpu, out, f32Buf(x), bf16Buf(w), T, N, Kd);
    const want = new Float32Array(T * N);
    ref.matmul(want, x, w, T, N, Kd);
    expectClose(`matmul ${variant} LM head`, await gpu.readF32(out, T * N), want, REL, ABS);
  });
});

describe('rope', () => {
  // Unit-scale inputs; error budget = the sin/cos polynomial + range reduction (~1e-6 abs).
  it.each([
    [3, 2, 16, 10000, [0, 1, 7]],
    [3, 2, 128, 1e6, [0, 40000, 32767]],
    [17, 3, 16, 1e6, Array.from({ length: 17 }, (_, i) => i * 2411)],
  ])('T=%i H=%i HD=%i theta=%d', async (T, H, HD, theta, pos) => {
    const rand = ref.rng(7);
    const x = ref.randn(T * H * HD, rand);
    const xb = f32Buf(x);
    K.rope(gpu, xb, u32Buf(pos), T, H, HD, theta);
    const want = x.slice();
    ref.rope(want, Uint32Array.from(pos), T, H, HD, theta);
    expectClose(`rope HD=${HD} maxpos=${Math.max(...pos)}`, await gpu.readF32(xb, T * H * HD), want, 0, 1e-5);
  });
});

describe('kvWrite + attention', () => {
  async function run(
    NH: number,
    NKV: number,
    HD: number,
    S: number,
    maxT: number,
    slots: number[],
    lens: number[],
    name: string,
  ) {
    // Fill every slot's history with kvWrite (prefill-style, pos 0..len-1), then attend with one
    // query per listed slot at position len-1 (decode-style) and also prefill-style on slot 0.
    const rand = ref.rng(8 + HD);
    const row = NKV * HD;
    // Identity page table, one token per page: the pool is then exactly the (S, maxT, NKV, HD)
    // layout of the reference (paging and f16 are tested in test/model/kvCache.test.ts).
    const kv: K.KvPaging = { dtype: 'f32', pageSize: 1, pages: S * maxT, pagesPerSlot: maxT, maxT };
    const table = u32Buf(
      Array.from({ length: S * maxT }, (_, i) => i),
      'pageTable',
    );
    const kC = new Float32Array(S * maxT * row);
    const vC = new Float32Array(S * maxT * row);
    const kCache = f32Buf(kC.slice(), 'kCache');
    const vCache = f32Buf(vC.slice(), 'vCache');
    for (let si = 0; si < slots.length; si++) {
      const T = lens[si];
      const k = ref.randn(T * row, rand);
      const v = ref.randn(T * row, rand);
      const slot = new Uint32Array(T).fill(slots[si]);
      const pos = Uint32Array.from({ length: T }, (_, i) => i);
      K.kvWrite(gpu, kCache, vCache, f32Buf(k), f32Buf(v), table, u32Buf(slot), u32Buf(pos), T, NKV, HD, kv);
      ref.kvWrite(kC, vC, k, v, slot, pos, T, NKV, HD, maxT);
    }
    expectClose(`kvWrite ${name}`, await gpu.readF32(kCache), kC, 0, 0);
    expectClose(`kvWrite v ${name}`, await gpu.readF32(vCache), vC, 0, 0);

    // Batched decode: token b is slot slots[b] at position lens[b]-1.
    const B = slots.length;
    const q = ref.randn(B * NH * HD, rand);
    const slot = Uint32Array.from(slots);
    const pos = Uint32Array.from(lens, (l) => l - 1);
    const out = outBuf(B * NH * HD);
    K.attention(gpu, out, f32Buf(q), kCache, vCache, table, u32Buf(slot), u32Buf(pos), B, NH, NKV, HD, kv);
    const want = new Float32Array(B * NH * HD);
    ref.attention(want, q, kC, vC, slot, pos, B, NH, NKV, HD, maxT);
    expectClose(`attention decode ${name}`, await gpu.readF32(out, B * NH * HD), want, REL, ABS);

    // Prefill: T tokens of slot slots[0], causal by position.
    const T = lens[0];
    const qp = ref.randn(T * NH * HD, rand);
    const slotP = new Uint32Array(T).fill(slots[0]);
    const posP = Uint32Array.from({ length: T }, (_, i) => i);
    const outP = outBuf(T * NH * HD);
    K.attention(gpu, outP, f32Buf(qp), kCache, vCache, table, u32Buf(slotP), u32Buf(posP), T, NH, NKV, HD, kv);
    const wantP = new Float32Array(T * NH * HD);
    ref.attention(wantP, qp, kC, vC, slotP, posP, T, NH, NKV, HD, maxT);
    expectClose(`attention prefill ${name}`, await gpu.readF32(outP, T * NH * HD), wantP, REL, ABS);
  }

  it('GQA NH=4 NKV=2 HD=16, 3 slots, T=17 prefill', () => run(4, 2, 16, 3, 20, [1, 0, 2], [17, 3, 20], 'gqa hd16'));
  it('NH=NKV=2 HD=128, 2 slots, 130 keys (3 blocks)', () => run(2, 2, 128, 2, 150, [1, 0], [130, 1], 'mha hd128'));
  it('GQA NH=8 NKV=1 HD=64, single key', () => run(8, 1, 64, 1, 4, [0], [1], 'mqa hd64'));
});

describe('siluMul', () => {
  it('n=1000 incl. large |gate|', async () => {
    const n = 1000;
    const rand = ref.rng(9);
    const gate = ref.randn(n, rand, 4);
    gate[0] = -100;
    gate[1] = 100;
    gate[2] = -1000;
    const up = ref.randn(n, rand);
    const out = outBuf(n);
    K.siluMul(gpu, out, f32Buf(gate), f32Buf(up), n);
    const want = new Float32Array(n);
    ref.siluMul(want, gate, up, n);
    expectClose('siluMul', await gpu.readF32(out, n), want, REL, ABS);
  });
});

describe('gatherRows', () => {
  it('R=3 of T=7, C=37', async () => {
    const [T, R, C] = [7, 3, 37];
    const x = ref.randn(T * C, ref.rng(10));
    const rows = Uint32Array.from([6, 0, 6]);
    const out = outBuf(R * C);
    K.gatherRows(gpu, out, f32Buf(x), u32Buf(rows), R, C);
    const want = new Float32Array(R * C);
    ref.gatherRows(want, x, rows, R, C);
    expectClose('gatherRows', await gpu.readF32(out, R * C), want, 0, 0);
  });
});

describe('scatterRowsScaled', () => {
  it('R=4 rows of C=37 into T=9, each scaled; the other rows kept; a row past T writes nothing', async () => {
    const [T, R, C] = [9, 4, 37];
    const rand = ref.rng(12);
    const init = ref.randn(T * C, rand);
    const src = ref.randn(R * C, rand);
    const scale = Float32Array.from([0.5, -2, 3, 7]);
    const rows = Uint32Array.from([8, 0, 3, 9]); // 9 is past T: skipped
    const out = f32Buf(init, 'out');
    K.scatterRowsScaled(gpu, out, f32Buf(src, 'src'), u32Buf(rows), f32Buf(scale, 'scale'), R, C, T);
    const want = Float32Array.from(init);
    for (let r = 0; r < R; r++)
      if (rows[r] < T) for (let c = 0; c < C; c++) want[rows[r] * C + c] = Math.fround(scale[r] * src[r * C + c]);
    expectClose('scatterRowsScaled', await gpu.readF32(out, T * C), want, 0, 0);
  });
  it('names a buffer that is too small', () => {
    const b = outBuf(4);
    expect(() => K.scatterRowsScaled(gpu, outBuf(8 * 3), outBuf(2 * 3), b, outBuf(1), 2, 3, 8)).toThrow(
      'scatterRowsScaled scale',
    );
  });
});

describe('sample', () => {
  const greedy = { temperature: 0, topK: 0, topP: 1 };

  it('greedy equals CPU argmax (ties -> lowest index), V=1000 and V=151936', async () => {
    for (const [B, V] of [
      [4, 1000],
      [1, 151936],
    ]) {
      const logits = ref.randn(B * V, ref.rng(11 + V), 3);
      if (V === 1000) {
        logits[1 * V + 500] = logits[1 * V + 900] = 50; // tie: expect 500
        logits[2 * V + 999] = 60; // max at the very end
        for (let i = 0; i < V; i++) logits[3 * V + i] = -1; // all equal: expect 0
      } else logits[70000] = logits[5000] = 50; // a tie across chunks of 2,048: expect 5000
      const ids = outBuf(B, 'ids');
      const want = Array.from({ length: B }, (_, b) => ref.argmax(logits, b * V, V));
      if (V === 1000) expect(want.slice(1)).toEqual([500, 999, 0]);
      else expect(want).toEqual([5000]);
      // The chunked draw (tuning.sampleChunks 'on'; 'auto' takes it on GPUs) and the one-workgroup
      // kernel ('off'; 'auto' on CPU adapters) pick the same.
      for (const mode of ['on', 'off'] as const) {
        K.tuning.sampleChunks = mode;
        try {
          K.sample(gpu, ids, f32Buf(logits), B, V, greedy, 1, 0);
          const kernel = mode === 'on' ? 'sample.sample_pick' : 'sample.sample_forward';
          expect(K.kernelVariant(gpu, 'sample')?.label).toContain(kernel);
          expect(Array.from(await gpu.readU32(ids, B)), `${kernel}, V = ${V}`).toEqual(want);
        } finally {
          K.tuning.sampleChunks = 'auto';
        }
      }
    }
  });

  it('fixed seed is deterministic; seed/step change the draw; top-k=1 is argmax', async () => {
    const [B, V] = [64, 300];
    const logits = f32Buf(ref.randn(B * V, ref.rng(12), 2));
    const opts = { temperature: 1, topK: 0, topP: 1 };
    const ids = outBuf(B, 'ids');
    const draw = async (o: K.SampleOptions, seed: number, step: number) => {
      K.sample(gpu, ids, logits, B, V, o, seed, step);
      return Array.from(await gpu.readU32(ids, B));
    };
    const a = await draw(opts, 42, 3);
    expect(await draw(opts, 42, 3)).toEqual(a);
    expect(await draw(opts, 43, 3)).not.toEqual(a);
    expect(await draw(opts, 42, 4)).not.toEqual(a);
    expect(await draw({ temperature: 0.7, topK: 1, topP: 1 }, 5, 0)).toEqual(await draw(greedy, 0, 0));
    expect(await draw({ temperature: 1.3, topK: 0, topP: 1e-6 }, 5, 0)).toEqual(await draw(greedy, 0, 0));
  });

  // Qwen3's vocabulary: the radix-selected top-k key and the top-p bisection, over the candidates in
  // workgroup memory (top-k 20; top-p alone on a peaked row, whose 2,048 largest hold the mass) and
  // over the whole row (top-p alone on a flat row), against the f64 reference's kept set: every
  // drawn id kept, and its log-prob, (z - max) - log(kept mass), the reference's to f32 rounding
  // (a kept set one token off moves it by that token's share of the mass).
  it.each([
    ['top-k 20, top-p 0.8 (candidates: the top-k set)', 3, 0.7, 20, 0.8],
    ['top-k 3000, top-p 0.9 (candidates: the 2,048 largest)', 4, 1, 3000, 0.9],
    ['top-p 0.8, peaked (candidates: the 2,048 largest)', 8, 1, 0, 0.8],
    ['top-p 0.8, flat (bisection over the row)', 0.05, 1, 0, 0.8],
    ['top-k 50 alone', 2, 1, 50, 1],
    ["no top-k or top-p (a round's sampling: the chunked draw, 75 chunks)", 2, 1, 0, 1],
  ] as const)('V = 151,936: %s', async (_name, spread, temperature, topK, topP) => {
    const V = 151936;
    const N = 8;
    const row = ref.randn(V, ref.rng(V + topK + Math.round(spread * 100)), spread);
    const logits = new Float32Array(N * V);
    for (let b = 0; b < N; b++) logits.set(row, b * V);
    const ids = outBuf(N, 'ids');
    const logp = outBuf(N, 'logp');
    K.tuning.sampleChunks = 'on'; // the GPUs' 'auto' (top-k or top-p: the one-workgroup kernel anyway)
    try {
      K.sample(gpu, ids, f32Buf(logits), N, V, { temperature, topK, topP }, 99, 3, logp);
      const chunked = topK === 0 && topP >= 1;
      expect(K.kernelVariant(gpu, 'sample')?.label).toContain(chunked ? 'sample.sample_pick' : 'sample.sample_forward');
    } finally {
      K.tuning.sampleChunks = 'auto';
    }
    const got = await gpu.readU32(ids, N);
    const lp = await gpu.readF32(logp, N);
    const p = ref.sampleDistribution(row, temperature, topK, topP);
    const kept = p.filter((x) => x > 0).length;
    // Which path runs follows from the kept set: within the 2,048 candidates, or past them.
    if (spread === 8) expect(kept, 'a peaked row keeps fewer than 2,048 tokens').toBeLessThan(2048);
    if (spread === 0.05) expect(kept, 'a flat row keeps more than 2,048 tokens').toBeGreaterThan(2048);
    for (let b = 0; b < N; b++) {
      const id = got[b]!;
      expect(p[id], `row ${b}: drawn id ${id} is outside the kept set`).toBeGreaterThan(0);
      expect(Math.abs(lp[b]! - Math.log(p[id]!)), `row ${b}: log-prob of ${id}`).toBeLessThan(2e-5);
    }
  });

  // The chunked draw over several chunks (V = 5,000: chunks of 2,048, 2,048 and 904 tokens), the
  // mass on 8 tokens at chunk edges and inside (the rest exp-underflows to 0): 1,000 draws, the
  // Pearson chi-square as below, each log-prob against the reference (tuning.sampleChunks 'on', the
  // GPUs' 'auto'); then the one-workgroup kernel ('off', the CPU adapters' 'auto') on the same rows,
  // which must follow the same distribution.
  it('distribution matches CPU: no top-k or top-p over 3 chunks, sampleChunks on and off', async () => {
    const V = 5000;
    const N = 1000;
    const at = [3, 2047, 2048, 2049, 3000, 4095, 4096, 4999];
    const vals = [1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.9, 2.2];
    const row = new Float32Array(V).fill(-1e4);
    at.forEach((i, j) => (row[i] = vals[j]!));
    const logits = new Float32Array(N * V);
    for (let b = 0; b < N; b++) logits.set(row, b * V);
    const lbuf = f32Buf(logits);
    const p = ref.sampleDistribution(row, 1, 0, 1);
    expect(p.filter((x) => x > 0).length).toBe(8);
    for (const mode of ['on', 'off'] as const) {
      K.tuning.sampleChunks = mode;
      try {
        const ids = outBuf(N, 'ids');
        const logp = outBuf(N, 'logp');
        K.sample(gpu, ids, lbuf, N, V, { temperature: 1, topK: 0, topP: 1 }, 1234, 7, logp);
        const label = K.kernelVariant(gpu, 'sample')?.label ?? '';
        expect(label).toContain(mode === 'on' ? 'sample.sample_pick' : 'sample.sample_forward');
        const got = await gpu.readU32(ids, N);
        const lp = await gpu.readF32(logp, N);
        const counts = new Map<number, number>();
        for (let b = 0; b < N; b++) {
          const id = got[b]!;
          expect(p[id], `row ${b}: drawn id ${id} has no mass`).toBeGreaterThan(0);
          expect(Math.abs(lp[b]! - Math.log(p[id]!)), `row ${b}: log-prob of ${id}`).toBeLessThan(2e-5);
          counts.set(id, (counts.get(id) ?? 0) + 1);
        }
        let chi2 = 0;
        for (const i of at) chi2 += ((counts.get(i) ?? 0) - N * p[i]!) ** 2 / (N * p[i]!);
        measured[`sample chi2 3 chunks, sampleChunks ${mode}`] = `${chi2.toFixed(2)} (df 7)`;
        expect(chi2).toBeLessThan(40);
      } finally {
        K.tuning.sampleChunks = 'auto';
      }
    }
  });

  // V=8, 2000 draws (one row per draw, RNG counter = row). Pearson chi-square over the kept
  // tokens; with <= 7 degrees of freedom, P(chi2 > 40) < 1e-6, so the test does not flake while a
  // wrong distribution (e.g. top-p not renormalized, an off-by-one in the cut) lands far above.
  const cases: [string, number, number, number][] = [
    ['plain softmax', 1, 0, 1],
    ['temperature 0.5, top-k 5', 0.5, 5, 1],
    ['top-p 0.8', 1, 0, 0.8],
    ['temperature 1.5, top-k 6, top-p 0.7', 1.5, 6, 0.7],
  ];
  it.each(cases)('distribution matches CPU: %s', async (_name, temperature, topK, topP) => {
    const V = 8;
    const N = 2000;
    const row = Float32Array.from([1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.9, 2.2]);
    const logits = new Float32Array(N * V);
    for (let b = 0; b < N; b++) logits.set(row, b * V);
    const ids = outBuf(N, 'ids');
    K.sample(gpu, ids, f32Buf(logits), N, V, { temperature, topK, topP }, 1234, 7);
    const got = await gpu.readU32(ids, N);
    const p = ref.sampleDistribution(row, temperature, topK, topP);
    const counts = new Array(V).fill(0);
    for (const id of got) counts[id]++;
    let chi2 = 0;
    for (let i = 0; i < V; i++) {
      if (p[i] === 0) expect(counts[i], `excluded token ${i} drawn`).toBe(0);
      else chi2 += (counts[i] - N * p[i]) ** 2 / (N * p[i]);
    }
    measured[`sample chi2 ${_name}`] = `${chi2.toFixed(2)} (df ${p.filter((x) => x > 0).length - 1})`;
    expect(chi2).toBeLessThan(40);
  });
});
