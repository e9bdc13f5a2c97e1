// attention_lanes (shaders/attention.wgsl LANES: split-K decode attention with each key's row read
// by LK lanes together, the GPUs' 'auto' for decode) against the CPU reference over a paged cache
// written by kvWrite through a scrambled page table, f32 and f16, at Qwen3-4B's head_dim 128 (LK
// up to 16 lanes: this file runs on lavapipe at 8 and 16 lanes, see scripts/test.mjs) and smaller
// ones, with long contexts split many ways (some splits past a sequence's end) and short ones in
// one split. test/model/kvCache.test.ts covers it at SwiftShader's 4 lanes on its own shapes.
// With `next` (K.AttentionAProduct), a split attention's attention_combine also writes the next
// LoRA A product u = out A^T as per-head partial sums (shaders/attention.wgsl APART), checked
// against the reference's out times A, after attention_lanes and after attention_split (forced).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { f16BitsToF32, f32ToF16Bits } from '../../src/model/q4.ts';
import * as ref from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, u32Buf, outBuf, expectClose } = h;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => {
  h.report('attention_lanes');
  gpu?.destroy();
});

const REL = 1e-5; // f32 sums over <= ~1,000 terms, as test/model/kvCache.test.ts (the split order differs)
const ABS = 1e-6;

/** The largest power of two <= n. */
const pow2 = (n: number) => 2 ** Math.floor(Math.log2(n));

async function run(dtype: 'f32' | 'f16', NH: number, NKV: number, HD: number, P: number, lens: number[]) {
  const S = lens.length;
  const maxT = Math.max(...lens);
  const perSlot = Math.ceil(maxT / P);
  const row = NKV * HD;
  const rand = ref.rng(7 + HD + P + maxT);
  // Each slot's pages on shuffled physical pages.
  const pages = S * perSlot;
  const perm = Array.from({ length: pages }, (_, i) => i).sort(() => rand() - 0.5);
  const table = Uint32Array.from({ length: S * perSlot }, (_, i) => perm[i]);
  const kv: K.KvPaging = { dtype, pageSize: P, pages, pagesPerSlot: perSlot, maxT };
  const words = K.kvPoolBytes(kv, NKV, HD) / 4;
  const kCache = outBuf(words, 'kPool');
  const vCache = outBuf(words, 'vPool');
  const tableBuf = u32Buf(table, 'pageTable');
  const kRef = new Float32Array(S * maxT * row);
  const vRef = new Float32Array(S * maxT * row);
  const stored = (x: number) => (dtype === 'f32' ? x : f16BitsToF32(f32ToF16Bits(x)));
  for (let s = 0; s < S; s++) {
    const T = lens[s];
    const k = ref.randn(T * row, rand, 2);
    const v = ref.randn(T * row, rand, 2);
    const slot = new Uint32Array(T).fill(s);
    const pos = Uint32Array.from({ length: T }, (_, i) => i);
    K.kvWrite(gpu, kCache, vCache, f32Buf(k), f32Buf(v), tableBuf, u32Buf(slot), u32Buf(pos), T, NKV, HD, kv);
    for (let i = 0; i < T * row; i++) {
      kRef[s * maxT * row + i] = stored(k[i]);
      vRef[s * maxT * row + i] = stored(v[i]);
    }
  }
  const B = S;
  const q = ref.randn(B * NH * HD, rand);
  const slot = Uint32Array.from(lens.keys());
  const pos = Uint32Array.from(lens, (l) => l - 1);
  const want = new Float32Array(B * NH * HD);
  ref.attention(want, q, kRef, vRef, slot, pos, B, NH, NKV, HD, maxT);

  const lanes = K.attentionLanes(gpu, HD, dtype);
  expect(lanes, 'attention_lanes runs on this adapter (subgroups)').not.toBeNull();
  const pieces = HD / (dtype === 'f16' ? 8 : 4);
  let LK = 1;
  while (LK * 2 <= Math.min(16, pow2(gpu.info.subgroupMinSize)) && pieces % (LK * 2) === 0) LK *= 2;
  expect(lanes).toEqual({ LK, VPT: pieces / LK });

  // 'auto' with a GPU's choices takes it for decode (B rows of NH / HG head groups, far fewer
  // than the ~512 workgroups where one a (token, head group) fills a GPU); on a CPU adapter's
  // choices it is one workgroup a (token, head group); then forced.
  const modes: [string, Partial<K.Tuning>, string][] = [
    ['auto for gpu', { autoFor: 'gpu' }, `attention.attention_lanes`],
    ['auto for cpu', { autoFor: 'cpu' }, 'attention.attention_forward'],
    ['lanes', { attention: 'lanes' }, `attention.attention_lanes`],
    // attention_split (a GPU without subgroups), split where its rule says: the same combine
    ['split', { attention: 'split' }, 'attention.attention_'],
  ];
  for (const [mode, set, kernel] of modes) {
    Object.assign(K.tuning, set);
    try {
      const out = outBuf(B * NH * HD);
      K.attention(gpu, out, f32Buf(q), kCache, vCache, tableBuf, u32Buf(slot), u32Buf(pos), B, NH, NKV, HD, kv);
      const label = K.kernelVariant(gpu, 'attention')?.label ?? '';
      expect(label, mode).toContain(kernel);
      if (kernel.endsWith('lanes')) expect(label, mode).toContain(`LK=${LK}`);
      const name = `attention ${mode} ${dtype} NH=${NH} NKV=${NKV} HD=${HD} LK=${LK} lens=${lens}`;
      expectClose(name, await gpu.readF32(out, B * NH * HD), want, REL, ABS);
      // With `next` (K.AttentionAProduct): where attention_combine writes out (a split decode
      // attention), it begins the next LoRA A product u = out A^T as (NH, B, r) partial sums.
      const r = 5;
      const A = ref.randn(r * NH * HD, rand, 0.1);
      const parts = outBuf(NH * B * r, 'parts');
      const out2 = outBuf(B * NH * HD);
      const next = { A: f32Buf(A, 'A'), parts, r };
      const qBuf = f32Buf(q);
      const slotBuf = u32Buf(slot),
        posBuf = u32Buf(pos);
      const attend = () =>
        K.attention(gpu, out2, qBuf, kCache, vCache, tableBuf, slotBuf, posBuf, B, NH, NKV, HD, kv, next);
      const d0 = gpu.dispatchCount;
      const n = attend();
      const combined = gpu.dispatchCount - d0 === 2; // the splits, then attention_combine
      if (kernel.endsWith('lanes')) expect(combined, `${name}: split`).toBe(maxT > 256);
      if (mode === 'split') expect(combined, `${name}: split`).toBe(label.includes('attention_split'));
      expect(n, `${name}: partial sums a row`).toBe(combined ? NH : 0);
      expectClose(`${name} (with next)`, await gpu.readF32(out2, B * NH * HD), want, REL, ABS);
      if (n > 0) {
        const got = await gpu.readF32(parts, NH * B * r);
        const sum = new Float64Array(B * r);
        for (let g = 0; g < NH; g++) for (let i = 0; i < B * r; i++) sum[i] += got[g * B * r + i];
        const u = new Float64Array(B * r);
        ref.matmulF32(u, want, A, B, r, NH * HD);
        expectClose(`${name}: u from the combine's partial sums`, sum, u, REL, ABS);
        K.tuning.loraAFold = 'off';
        expect(attend(), "tuning.loraAFold 'off'").toBe(0);
      }
    } finally {
      K.tuning.loraAFold = 'auto';
      K.tuning.autoFor = 'auto';
      K.tuning.attention = 'auto';
    }
  }
}

describe('attention_lanes: split-K decode attention, a key row read by LK lanes together', () => {
  for (const dtype of ['f16', 'f32'] as const) {
    // 8 splits of 192 keys: 6 hold the first sequence's 1,100, 2 the second's 300 (the rest empty).
    it(`${dtype}: Qwen3-4B heads (32 query, 8 KV, HD 128), 1,100 and 300 keys, P=16`, () =>
      run(dtype, 32, 8, 128, 16, [1100, 300]));
    // One split (a short context), 4 heads a group in one workgroup, pages of 4 tokens.
    it(`${dtype}: GQA NH=8 NKV=2 HD=128, 40, 3 and 17 keys (one split), P=4`, () =>
      run(dtype, 8, 2, 128, 4, [40, 3, 17]));
    // MQA: 8 heads a group, two workgroups of 4; HD 64; one split.
    it(`${dtype}: MQA NH=8 NKV=1 HD=64, 200 keys, P=8`, () => run(dtype, 8, 1, 64, 8, [200]));
    // 6 heads a group (two workgroups of 3, a padded lane), HD 32 (4 or 8 pieces a row: fewer than
    // the lanes of a wide subgroup); 4 splits of 192 keys, 3 of them empty for the 70.
    it(`${dtype}: NH=12 NKV=2 HD=32, 600 and 70 keys, P=4`, () => run(dtype, 12, 2, 32, 4, [600, 70]));
  }
});
