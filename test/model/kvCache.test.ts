// The paged KV cache and its f16 variant.
// 1. kvWrite + attention through a scrambled page table (one slot borrowing another's pages), f32
//    and f16, against a CPU reference that holds the logical (S, maxT, NKV, HD) cache and, for
//    f16, rounds K and V with f32ToF16Bits (round to nearest even; saturated at 65504 as the
//    kernel documents). The stored f16 bits must match exactly; attention then differs from the
//    reference only by f32 arithmetic, so the tolerance is the one of test/ops/kernels.test.ts.
// 2. KVCache bookkeeping: pages on demand, share without copies, no write into a shared page.
// 3. The golden checkpoints through `spyrl logits|generate --kv f16` against the PyTorch logits.
import { readFile, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { KVCache, kvCacheBytes } from '../../src/model/kvCache.ts';
import { parseQwen3Config } from '../../src/model/config.ts';
import { f16BitsToF32, f32ToF16Bits, logitDrift } from '../../src/model/q4.ts';
import * as ref from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import { spyrl } from '../helpers/spyrl.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, u32Buf, outBuf, expectClose } = h;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => {
  h.report('paged KV cache');
  gpu?.destroy();
});

const REL = 1e-5; // as test/ops/kernels.test.ts: f32 reductions over <= 1000 terms
const ABS = 1e-6;
const UNMAPPED = 0xffffffff;
const F16_MAX = 65504;

/** The value the cache holds for x: f32 as is, f16 rounded to nearest even and saturated. */
const stored = (x: number, dtype: 'f32' | 'f16') =>
  dtype === 'f32' ? x : f16BitsToF32(f32ToF16Bits(Math.min(F16_MAX, Math.max(-F16_MAX, x))));

describe('kvWrite + attention through a page table', () => {
  async function run(
    dtype: 'f32' | 'f16',
    NH: number,
    NKV: number,
    HD: number,
    P: number,
    lens: number[],
    borrow: { dst: number; src: number; pages: number },
  ) {
    const S = lens.length;
    const maxT = Math.max(...lens);
    const perSlot = Math.ceil(maxT / P);
    const row = NKV * HD;
    const rand = ref.rng(31 + HD + P);
    // Scrambled page table: slot s's page j lands on a random physical page; the borrower's first
    // `pages` entries point at the source's pages.
    const table = new Uint32Array(S * perSlot).fill(UNMAPPED);
    const own: [number, number][] = [];
    lens.forEach((len, s) => {
      for (let j = s === borrow.dst ? borrow.pages : 0; j < Math.ceil(len / P); j++) own.push([s, j]);
    });
    const pages = own.length + 2; // two pages never mapped
    const perm = Array.from({ length: pages }, (_, i) => i).sort(() => rand() - 0.5);
    own.forEach(([s, j], i) => (table[s * perSlot + j] = perm[i]));
    for (let j = 0; j < borrow.pages; j++) table[borrow.dst * perSlot + j] = table[borrow.src * perSlot + j];
    const kv: K.KvPaging = { dtype, pageSize: P, pages, pagesPerSlot: perSlot, maxT };
    const words = K.kvPoolBytes(kv, NKV, HD) / 4;
    const kCache = outBuf(words, 'kPool');
    const vCache = outBuf(words, 'vPool');
    const tableBuf = u32Buf(table, 'pageTable');

    // Logical reference caches (S, maxT, NKV, HD) of the stored values.
    const kRef = new Float32Array(S * maxT * row);
    const vRef = new Float32Array(S * maxT * row);
    const kRaw = new Float32Array(S * maxT * row); // unrounded, to show f16 rounding is visible
    const vRaw = new Float32Array(S * maxT * row);
    // The source is written before its borrower, which writes only past the borrowed pages.
    const order = [...lens.keys()].sort((a, b) => (a === borrow.dst ? 1 : 0) - (b === borrow.dst ? 1 : 0));
    for (const s of order) {
      const t0 = s === borrow.dst ? borrow.pages * P : 0;
      const T = lens[s] - t0;
      const k = ref.randn(T * row, rand, 2);
      const v = ref.randn(T * row, rand, 2);
      const slot = new Uint32Array(T).fill(s);
      const pos = Uint32Array.from({ length: T }, (_, i) => t0 + i);
      K.kvWrite(gpu, kCache, vCache, f32Buf(k), f32Buf(v), tableBuf, u32Buf(slot), u32Buf(pos), T, NKV, HD, kv);
      for (let t = 0; t < T; t++)
        for (let i = 0; i < row; i++) {
          const dst = (s * maxT + t0 + t) * row + i;
          kRef[dst] = stored(k[t * row + i], dtype);
          vRef[dst] = stored(v[t * row + i], dtype);
          kRaw[dst] = k[t * row + i];
          vRaw[dst] = v[t * row + i];
        }
    }
    for (let j = 0; j < borrow.pages * P; j++)
      for (let i = 0; i < row; i++) {
        for (const c of [kRef, vRef, kRaw, vRaw])
          c[(borrow.dst * maxT + j) * row + i] = c[(borrow.src * maxT + j) * row + i];
      }

    // The pools, read back through the table, hold exactly the stored values.
    const name = `${dtype} NH=${NH} NKV=${NKV} HD=${HD} P=${P}`;
    for (const [buf, want, what] of [
      [kCache, kRef, 'k'],
      [vCache, vRef, 'v'],
    ] as const) {
      const pool = new Uint32Array(await gpu.read(buf));
      const got = new Float32Array(want.length);
      const f32 = new Float32Array(pool.buffer);
      lens.forEach((len, s) => {
        for (let t = 0; t < len; t++) {
          const page = table[s * perSlot + Math.floor(t / P)];
          for (let i = 0; i < row; i++) {
            const e = (page * P + (t % P)) * row + i;
            got[(s * maxT + t) * row + i] =
              dtype === 'f32' ? f32[e] : f16BitsToF32((pool[e >> 1] >>> (16 * (e & 1))) & 0xffff);
          }
        }
      });
      expectClose(`kvWrite ${what} ${name}`, got, want, 0, 0);
    }

    // Batched decode (one query per slot at its last position) and prefill of the borrower, with a
    // GQA group's heads in one workgroup (K/V read once for them) and with one head per workgroup.
    for (const heads of ['group', 'one'] as const) {
      K.tuning.attentionHeads = heads;
      try {
        await attend(`${name} heads=${heads}`, heads === 'group' ? K.attentionHeadGroup(NH, NKV) : 1);
      } finally {
        K.tuning.attentionHeads = 'auto';
      }
    }

    async function attend(name: string, HG: number) {
      const B = S;
      const q = ref.randn(B * NH * HD, rand);
      const slot = Uint32Array.from(lens.keys());
      const pos = Uint32Array.from(lens, (l) => l - 1);
      const out = outBuf(B * NH * HD);
      K.attention(gpu, out, f32Buf(q), kCache, vCache, tableBuf, u32Buf(slot), u32Buf(pos), B, NH, NKV, HD, kv);
      const label = K.kernelVariant(gpu, 'attention')?.label ?? '';
      expect(label, name).toContain('attention.attention_');
      if (HG > 1) expect(label, name).toContain(`HG=${HG}`);
      else expect(label, name).not.toContain('HG=');
      const got = await gpu.readF32(out, B * NH * HD);
      const want = new Float32Array(B * NH * HD);
      ref.attention(want, q, kRef, vRef, slot, pos, B, NH, NKV, HD, maxT);
      expectClose(`attention decode ${name}`, got, want, REL, ABS);
      if (dtype === 'f16') {
        // Without the rounding the reference would be off by far more than the tolerance.
        const raw = new Float32Array(B * NH * HD);
        ref.attention(raw, q, kRaw, vRaw, slot, pos, B, NH, NKV, HD, maxT);
        expect(ref.compare(got, raw, REL, ABS).ok).toBe(false);
      }
      const T = lens[borrow.dst];
      const qp = ref.randn(T * NH * HD, rand);
      const slotP = new Uint32Array(T).fill(borrow.dst);
      const posP = Uint32Array.from({ length: T }, (_, i) => i);
      const outP = outBuf(T * NH * HD);
      K.attention(gpu, outP, f32Buf(qp), kCache, vCache, tableBuf, u32Buf(slotP), u32Buf(posP), T, NH, NKV, HD, kv);
      const wantP = new Float32Array(T * NH * HD);
      ref.attention(wantP, qp, kRef, vRef, slotP, posP, T, NH, NKV, HD, maxT);
      expectClose(`attention prefill ${name}`, await gpu.readF32(outP, T * NH * HD), wantP, REL, ABS);

      // Split-K (flash-decoding, forced): splits of 64 keys, the last ones past some sequences' ends
      // (empty), combined by their log-sum-exps, give the same attention for decode and prefill.
      K.tuning.attention = 'split';
      try {
        const outS = outBuf(B * NH * HD);
        K.attention(gpu, outS, f32Buf(q), kCache, vCache, tableBuf, u32Buf(slot), u32Buf(pos), B, NH, NKV, HD, kv);
        expectClose(`attention decode split-K ${name}`, await gpu.readF32(outS, B * NH * HD), want, REL, ABS);
        const outSP = outBuf(T * NH * HD);
        K.attention(gpu, outSP, f32Buf(qp), kCache, vCache, tableBuf, u32Buf(slotP), u32Buf(posP), T, NH, NKV, HD, kv);
        expectClose(`attention prefill split-K ${name}`, await gpu.readF32(outSP, T * NH * HD), wantP, REL, ABS);
      } finally {
        K.tuning.attention = 'auto';
      }

      // attention_lanes (forced; the GPUs' 'auto' for decode): each key's row read by LK lanes
      // together, a subgroup butterfly per score, one online softmax per group of lanes, the groups
      // merged at the end (one split at these lengths: test/ops/attentionLanes.test.ts splits
      // longer ones). Where it cannot run (no subgroups, HD not whole 16-byte pieces) the split
      // kernel takes the call.
      const lanes = K.attentionLanes(gpu, HD, dtype);
      K.tuning.attention = 'lanes';
      try {
        const outL = outBuf(B * NH * HD);
        K.attention(gpu, outL, f32Buf(q), kCache, vCache, tableBuf, u32Buf(slot), u32Buf(pos), B, NH, NKV, HD, kv);
        const labelL = K.kernelVariant(gpu, 'attention')?.label ?? '';
        if (lanes) {
          expect(labelL, name).toContain('attention.attention_lanes');
          expect(labelL, name).toContain(`LK=${lanes.LK}`);
          if (HG > 1) expect(labelL, name).toContain(`HG=${HG}`);
        } else expect(labelL, name).toContain('attention.attention_split');
        expectClose(`attention decode lanes ${name}`, await gpu.readF32(outL, B * NH * HD), want, REL, ABS);
        const outLP = outBuf(T * NH * HD);
        K.attention(gpu, outLP, f32Buf(qp), kCache, vCache, tableBuf, u32Buf(slotP), u32Buf(posP), T, NH, NKV, HD, kv);
        expectClose(`attention prefill lanes ${name}`, await gpu.readF32(outLP, T * NH * HD), wantP, REL, ABS);
      } finally {
        K.tuning.attention = 'auto';
      }
    }
  }

  it('attentionHeadGroup: the GQA group, or its largest divisor up to 4 heads; one head when forced', () => {
    const cases: [number, number, number][] = [
      [32, 8, 4], // Qwen3-4B, 8B
      [16, 8, 2], // Qwen3-0.6B, 1.7B
      [64, 8, 4], // Qwen3-32B: 8 heads a group, two workgroups of 4
      [40, 8, 1], // Qwen3-14B: 5 heads a group
      [12, 2, 3],
      [4, 4, 1],
    ];
    for (const [NH, NKV, want] of cases) expect(K.attentionHeadGroup(NH, NKV), `${NH}/${NKV}`).toBe(want);
    K.tuning.attentionHeads = 'one';
    try {
      expect(K.attentionHeadGroup(32, 8)).toBe(1);
    } finally {
      K.tuning.attentionHeads = 'auto';
    }
  });

  it('f16: rounds to nearest even (ties, subnormals, carries), saturates at 65504, keeps NaN', async () => {
    // Edge cases, then values log-uniform over 2^-30..2^17 with random signs.
    const edges = [
      1e5,
      -1e6,
      65504,
      65519,
      65520,
      -65536,
      Infinity,
      -Infinity,
      NaN,
      0,
      -0,
      1 + 2 ** -11,
      1 + 3 * 2 ** -11,
      2047.9,
      2 ** -14,
      2 ** -14 - 2 ** -30,
      2 ** -24 * 1.5,
      2 ** -24 * 2.5,
      2 ** -25,
      2 ** -25 * 1.0001,
      2 ** -26,
      1e-7,
      -3e-5,
      0.1,
      1 / 3,
      Math.PI,
    ];
    const rand = ref.rng(5);
    const T = 64,
      NKV = 1,
      HD = 16;
    const k = new Float32Array(T * NKV * HD).map(() => (rand() < 0.5 ? -1 : 1) * 2 ** (-30 + 47 * rand()));
    k.set(edges);
    const v = k.map((x) => -x / 3);
    const kv: K.KvPaging = { dtype: 'f16', pageSize: 1, pages: T, pagesPerSlot: T, maxT: T };
    const kCache = outBuf((T * HD) / 2, 'kPool'),
      vCache = outBuf((T * HD) / 2, 'vPool');
    const pos = Array.from({ length: T }, (_, i) => i);
    K.kvWrite(
      gpu,
      kCache,
      vCache,
      f32Buf(k),
      f32Buf(v),
      u32Buf(pos),
      u32Buf(new Uint32Array(T)),
      u32Buf(pos),
      T,
      NKV,
      HD,
      kv,
    );
    for (const [buf, x] of [
      [kCache, k],
      [vCache, v],
    ] as const) {
      const words = await gpu.readU32(buf, (T * HD) / 2);
      const got = Array.from(x, (_, i) => ((words[i >> 1] >>> (16 * (i & 1))) & 0xffff).toString(16));
      expect(got).toEqual(
        Array.from(x, (e) => f32ToF16Bits(Number.isNaN(e) ? e : Math.min(F16_MAX, Math.max(-F16_MAX, e))).toString(16)),
      );
    }
  });

  for (const dtype of ['f32', 'f16'] as const) {
    it(`${dtype}: GQA NH=4 NKV=2 HD=16, P=4, slot 2 borrows 2 pages of slot 0`, () =>
      run(dtype, 4, 2, 16, 4, [17, 5, 19], { dst: 2, src: 0, pages: 2 }));
    it(`${dtype}: NH=NKV=2 HD=128, P=16, 130 keys (3 blocks), slot 0 borrows 4 pages of slot 1`, () =>
      run(dtype, 2, 2, 128, 16, [130, 70], { dst: 0, src: 1, pages: 4 }));
    it(`${dtype}: GQA NH=8 NKV=2 HD=128 (Qwen3-4B's 4 heads a group), P=16, 150 keys, 3 slots`, () =>
      run(dtype, 8, 2, 128, 16, [150, 66, 7], { dst: 1, src: 0, pages: 2 }));
    it(`${dtype}: MQA NH=8 NKV=1 HD=64 (8 heads a group: two workgroups of 4), P=8, 70 keys`, () =>
      run(dtype, 8, 1, 64, 8, [70, 9], { dst: 1, src: 0, pages: 1 }));
    it(`${dtype}: NH=12 NKV=2 HD=32 (6 heads a group: two workgroups of 3, a padded lane), P=4`, () =>
      run(dtype, 12, 2, 32, 4, [20, 6], { dst: 1, src: 0, pages: 1 }));
    it(`${dtype}: NH=10 NKV=2 HD=16 (5 heads a group: one head a workgroup), P=4`, () =>
      run(dtype, 10, 2, 16, 4, [9, 13], { dst: 0, src: 1, pages: 1 }));
    // A head dim past the key loads' runs (8 halves, 4 floats) and 11 keys (a value run of 4 and 3 more).
    it(`${dtype}: GQA NH=4 NKV=2 HD=14 (runs of loads and their remainders), P=4, 11 keys`, () =>
      run(dtype, 4, 2, 14, 4, [11, 6], { dst: 1, src: 0, pages: 1 }));
  }
});

describe('KVCache pages', () => {
  const cfg = parseQwen3Config({
    architectures: ['Qwen3ForCausalLM'],
    model_type: 'qwen3',
    vocab_size: 64,
    hidden_size: 32,
    intermediate_size: 64,
    num_hidden_layers: 2,
    num_attention_heads: 2,
    num_key_value_heads: 1,
    head_dim: 16,
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    max_position_embeddings: 128,
    tie_word_embeddings: true,
    torch_dtype: 'bfloat16',
  });

  it('maps pages on first write, shares whole pages, refuses writes into shared pages', () => {
    const cache = new KVCache(gpu, cfg, 3, 40, { dtype: 'f16', pageSize: 8, pages: 9 });
    try {
      expect(cache.pagesPerSlot).toBe(5);
      expect(cache.bytesAllocated).toBe(kvCacheBytes(cfg, { dtype: 'f16', pageSize: 8, pages: 9, slots: 3, maxT: 40 }));
      expect(cache.bytesAllocated).toBe(2 * 2 * 9 * 8 * 1 * 16 * 2 + 3 * 5 * 4); // 2 layers x K,V x pages x P x NKV x HD x 2 B + table
      cache.prepareWrite(
        Array(21).fill(0),
        Array.from({ length: 21 }, (_, i) => i),
      ); // 3 pages, the last partial
      expect(cache.pagesInUse).toBe(3);
      expect(cache.share(1, 0, 21)).toBe(16); // two whole pages; the partial one is re-prefilled
      expect(cache.share(2, 0, 7)).toBe(0);
      expect(() => cache.prepareWrite([2], [9])).toThrow(/0\.\.7 were never written/);
      expect(cache.pagesInUse).toBe(3);
      expect(cache.mappedTokens(1)).toBe(16);
      expect(() => cache.prepareWrite([1], [15])).toThrow(/shared/);
      expect(() => cache.prepareWrite([0], [3])).toThrow(/shared/); // the source may not rewrite it either
      cache.prepareWrite([1, 1, 0], [16, 17, 21]); // past the prefix: slot 1's own page; slot 0's partial page is its own
      expect(cache.pagesInUse).toBe(4);
      expect(() => cache.share(1, 0, 8)).toThrow(/already holds pages/);
      cache.resetSlot(0); // the shared pages stay with slot 1
      expect(cache.pagesInUse).toBe(3);
      cache.prepareWrite(
        Array(40).fill(2),
        Array.from({ length: 40 }, (_, i) => i),
      );
      expect(cache.pagesInUse).toBe(8);
      expect(() =>
        cache.prepareWrite(
          Array(24).fill(0),
          Array.from({ length: 24 }, (_, i) => i),
        ),
      ).toThrow(/out of pages/);
      expect(() => cache.prepareWrite([0], [40])).toThrow(/capacity of 40/);
    } finally {
      cache.destroy();
    }
  });

  it("reslot: a new batch maps the old slots' pages in place; the rest return to the free list", () => {
    const cache = new KVCache(gpu, cfg, 3, 40, { dtype: 'f16', pageSize: 8, pages: 9 });
    try {
      // Slot 0 writes 0..23 (3 pages), slot 1 borrows its first two and writes 16..20, slot 2 writes 0..9.
      cache.prepareWrite(
        Array(24).fill(0),
        Array.from({ length: 24 }, (_, i) => i),
      );
      expect(cache.share(1, 0, 16)).toBe(16);
      cache.prepareWrite([1, 1, 1, 1, 1], [16, 17, 18, 19, 20]);
      cache.prepareWrite(
        Array(10).fill(2),
        Array.from({ length: 10 }, (_, i) => i),
      );
      expect(cache.pagesInUse).toBe(6);
      // New slot 2 takes old slot 1's 0..23 (two pages shared with old slot 0, then its own), new
      // slot 0 takes old slot 0's first page; new slot 1 starts empty.
      cache.reslot([
        { dst: 2, src: 1, tokens: 24 },
        { dst: 0, src: 0, tokens: 8 },
      ]);
      expect(cache.mappedTokens(0)).toBe(8);
      expect(cache.mappedTokens(1)).toBe(0);
      expect(cache.mappedTokens(2)).toBe(24);
      expect(cache.pagesInUse).toBe(3); // old slot 0's page 0 (twice), page 1, old slot 1's page
      expect(() => cache.prepareWrite([0], [3])).toThrow(/shared/); // page 0 is mapped by new slots 0 and 2
      cache.prepareWrite([2, 0], [24, 8]); // past their pages: fresh ones
      expect(cache.pagesInUse).toBe(5);
      cache.prepareWrite(
        Array(32).fill(1),
        Array.from({ length: 32 }, (_, i) => i),
      );
      expect(cache.pagesInUse).toBe(9);
      // Refused, and the cache left as it was.
      expect(() => cache.reslot([{ dst: 0, src: 1, tokens: 12 }])).toThrow(/whole pages/);
      expect(() => cache.reslot([{ dst: 0, src: 0, tokens: 24 }])).toThrow(/slot 0 has no page for positions 16\.\.23/);
      expect(() =>
        cache.reslot([
          { dst: 1, src: 0, tokens: 8 },
          { dst: 1, src: 2, tokens: 8 },
        ]),
      ).toThrow(/slot 1 is given twice/);
      expect(cache.pagesInUse).toBe(9);
      expect(cache.mappedTokens(1)).toBe(32);
      cache.reslot([]);
      expect(cache.pagesInUse).toBe(0);
    } finally {
      cache.destroy();
      cache.destroy(); // twice: nothing more
    }
  });

  it('kvCacheBytes counts tokens as whole pages', () => {
    expect(kvCacheBytes(cfg, { dtype: 'f32', tokens: 17 })).toBe(2 * 2 * 2 * 16 * 16 * 4); // 17 tokens -> 2 pages of 16
    expect(kvCacheBytes(cfg, { dtype: 'f16', tokens: 17, pageSize: 1 })).toBe(2 * 2 * 17 * 16 * 2);
    expect(() => kvCacheBytes(cfg, { dtype: 'f16' })).toThrow(/pages or tokens/);
  });
});

// f16 rounds each K/V element with relative error <= 2^-11 (4.9e-4); attention averages those
// errors, so the logits should move by a few 1e-4 relative: we hold f16 to the same 1e-3 x max|ref|
// budget as the f32 engine (test/model/golden.test.ts) and the mean KL(ref || f16) to 1e-5 nats.
describe('f16 KV cache on the golden checkpoints (spyrl --kv f16)', () => {
  const ROOT = join(import.meta.dirname, '../fixtures/golden');
  let tmp: string;
  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'spyrl-kv16-'));
  });
  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  it.each(['tied', 'untied-sharded', 'mha'])(
    '%s: logits within 1e-3 x max|ref|, greedy tokens identical',
    async (variant) => {
      const dir = join(ROOT, variant);
      const exp = JSON.parse(await readFile(join(dir, 'expected.json'), 'utf8')) as {
        tokens: number[];
        shape: [number, number];
      };
      const out = join(tmp, `${variant}.f32`);
      const r = await spyrl('logits', '--model', dir, '--tokens', exp.tokens.join(','), '--kv', 'f16', '--out', out);
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
      const want = new Float32Array((await readFile(join(dir, 'logits.f32'))).buffer.slice(0));
      const got = new Float32Array((await readFile(out)).buffer.slice(0));
      const d = logitDrift(want, got, exp.shape[1]);
      console.log(
        `${variant} --kv f16: max|logit - ref| ${d.maxAbs.toExponential(3)} (${d.maxRel.toExponential(2)} x max|ref|), mean KL ${d.meanKl.toExponential(2)}`,
      );
      expect(d.maxRel).toBeLessThanOrEqual(1e-3);
      expect(d.meanKl).toBeLessThanOrEqual(1e-5);

      const g = JSON.parse(await readFile(join(dir, 'greedy.json'), 'utf8')) as { prompt: number[]; tokens: number[] };
      const gen = await spyrl(
        'generate',
        '--model',
        dir,
        '--prompt-tokens',
        g.prompt.join(','),
        '--temperature',
        '0',
        '--max-new-tokens',
        String(g.tokens.length),
        '--print-tokens',
        '--kv',
        'f16',
      );
      expect(gen.code).toBe(0);
      expect((JSON.parse(gen.stdout.trim().split('\n').pop()!) as { tokens: number[] }).tokens).toEqual(g.tokens);
    },
  );
});
