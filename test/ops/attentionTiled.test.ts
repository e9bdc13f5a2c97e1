// The query-tiled (FlashAttention-2 style) attention kernels of shaders/attention.wgsl (define TILED),
// forced with tuning.attention = 'tiled' and checked to have run (kernelVariant), against
// test/helpers/reference.ts (f64) at odd shapes:
// - prefill over the paged cache: T not a multiple of the query tile, several slots in one chunk
//   (runs of a slot, a lone token, non-contiguous positions), pages in shuffled order, f32 and
//   f16 KV, GQA ratios 1, 2, 4 and 16 (32 heads over one KV head: two head groups per KV head);
// - training forward with lse and the backward (dq, dk, dv) against the reference gradient, and
//   a finite-difference check of the GPU backward against the GPU forward itself (directional
//   derivatives along random directions in q, k and v).
// Run: npx vitest run test/ops/attentionTiled.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { f16BitsToF32, f32ToF16Bits } from '../../src/model/q4.ts';
import * as K from '../../src/ops/index.ts';
import {
  ATTENTION_BLOCKED_MIN_T_GPU,
  ATTENTION_TILED_MIN_T_CPU,
  ATTENTION_TILED_MIN_T_GPU,
  ATTENTION_TILED_MIN_T_GPU_PREFILL,
  BACKWARD_SPLIT,
  attentionBlockedBytes,
  attentionBlocking,
  attentionTiledMinT,
  attentionTiling,
} from '../../src/ops/attentionTiled.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, u32Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  K.tuning.attention = 'tiled';
});

afterAll(() => {
  K.tuning.attention = 'auto';
  h.report('tiled attention errors');
  gpu?.destroy();
});

const REL = 1e-5;
const ABS = 1e-6;
const ATT_REL = 2e-5; // as test/ops/backward.test.ts: dk, dv sum over every later query and head

const label = (op: string) => K.kernelVariant(gpu, op)!.label;

describe('tile geometry', () => {
  const fake = (bytes: number, threads = 256) =>
    ({
      limits: { maxComputeWorkgroupStorageSize: bytes, maxComputeInvocationsPerWorkgroup: threads },
    }) as unknown as Gpu;
  it('takes the whole GQA group where it fits, K/V tiles within the workgroup memory', () => {
    // Qwen3-4B: 32 heads over 8 KV heads, HD 128, the WebGPU default 16 KiB.
    expect(attentionTiling(fake(16384), 32, 8, 128)).toEqual({ BQ: 32, HG: 4, ROWS: 128, BK: 8 });
    expect(attentionTiling(fake(32768), 32, 8, 128)).toEqual({ BQ: 32, HG: 4, ROWS: 128, BK: 16 });
    expect(attentionTiling(fake(16384), 8, 8, 64)).toEqual({ BQ: 64, HG: 1, ROWS: 64, BK: 16 });
    // 32 query heads per KV head: 16 of them per tile (8 tokens), two tiles of heads.
    expect(attentionTiling(fake(16384), 32, 1, 16)).toEqual({ BQ: 8, HG: 16, ROWS: 128, BK: 64 });
    // The backward with rows split over 4 threads: 256 threads hold 64 rows, 16 tokens x 4 heads.
    expect(attentionTiling(fake(16384), 32, 8, 128, 4)).toEqual({ BQ: 16, HG: 4, ROWS: 256, BK: 8 });
    expect(attentionTiling(fake(16384, 1024), 32, 8, 128, 4)).toEqual({ BQ: 32, HG: 4, ROWS: 512, BK: 8 });
    for (const [NH, NKV, HD] of [
      [32, 8, 128],
      [16, 2, 256],
      [4, 4, 8],
    ]) {
      const t = attentionTiling(fake(16384), NH, NKV, HD);
      expect(2 * t.BK * HD * 4 + 2 * t.BK * 4 + 64).toBeLessThanOrEqual(16384);
    }
  });
});

// ---- prefill over the paged cache ----------------------------------------------------------------

/** The value the cache holds for x: f32 as is, f16 rounded to nearest even. */
const stored = (x: number, dtype: 'f32' | 'f16') => (dtype === 'f32' ? x : f16BitsToF32(f32ToF16Bits(x)));

interface PagedCase {
  NH: number;
  NKV: number;
  HD: number;
  dtype: 'f32' | 'f16';
  pageSize: number;
  S: number;
  maxT: number;
  /** The chunk: (slot, pos) of each token. */
  tokens: [number, number][];
}

async function pagedCase(c: PagedCase, seed: number, entry = 'attention.attention_tiled[') {
  const { NH, NKV, HD, dtype, pageSize: P, S, maxT, tokens } = c;
  const name = `NH=${NH} NKV=${NKV} HD=${HD} ${dtype} T=${tokens.length}`;
  const rand = ref.rng(seed);
  const row = NKV * HD;
  const pagesPerSlot = Math.ceil(maxT / P);
  const pages = S * pagesPerSlot;
  // Logical cache (S, maxT, NKV, HD) as the reference reads it, values as stored.
  const kC = ref.randn(S * maxT * row, rand).map((x) => stored(x, dtype));
  const vC = ref.randn(S * maxT * row, rand).map((x) => stored(x, dtype));
  // Pages in shuffled order: logical page i of slot s lives at physical page perm[s * pagesPerSlot + i].
  const perm = Array.from({ length: pages }, (_, i) => i);
  for (let i = pages - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [perm[i], perm[j]] = [perm[j]!, perm[i]!];
  }
  const poolK = new Float32Array(pages * P * row);
  const poolV = new Float32Array(pages * P * row);
  for (let s = 0; s < S; s++)
    for (let t = 0; t < maxT; t++) {
      const dst = (perm[s * pagesPerSlot + Math.floor(t / P)]! * P + (t % P)) * row;
      poolK.set(kC.subarray((s * maxT + t) * row, (s * maxT + t + 1) * row), dst);
      poolV.set(vC.subarray((s * maxT + t) * row, (s * maxT + t + 1) * row), dst);
    }
  const upload = (pool: Float32Array, what: string) =>
    dtype === 'f32'
      ? f32Buf(pool, what)
      : h.upload(new Uint32Array(Uint16Array.from(pool, (x) => f32ToF16Bits(x)).buffer), what);
  const kv: K.KvPaging = { dtype, pageSize: P, pages, pagesPerSlot, maxT };
  const T = tokens.length;
  const slot = Uint32Array.from(tokens, ([s]) => s);
  const pos = Uint32Array.from(tokens, ([, p]) => p);
  const q = ref.randn(T * NH * HD, rand);
  const out = outBuf(T * NH * HD);
  K.attention(
    gpu,
    out,
    f32Buf(q),
    upload(poolK, 'kCache'),
    upload(poolV, 'vCache'),
    u32Buf(perm, 'pageTable'),
    u32Buf(slot),
    u32Buf(pos),
    T,
    NH,
    NKV,
    HD,
    kv,
  );
  expect(label('attention')).toContain(entry);
  const want = new Float32Array(T * NH * HD);
  ref.attention(want, q, kC, vC, slot, pos, T, NH, NKV, HD, maxT);
  expectClose(`paged ${name}`, await gpu.readF32(out, T * NH * HD), want, REL, ABS);
}

/** Tokens pos first..last of slot s. */
const run = (s: number, first: number, last: number): [number, number][] =>
  Array.from({ length: last - first + 1 }, (_, i) => [s, first + i]);

// A chunk like GpuPolicy's: one slot's prompt from 0, another's tail after a shared prefix, a
// lone token, and a slot whose run is split by another slot's token.
const mixed: [number, number][] = [
  ...run(1, 0, 40),
  ...run(2, 16, 37),
  [0, 9],
  ...run(3, 5, 9),
  [1, 50],
  ...run(3, 10, 12),
];

describe('attention (prefill, paged cache)', () => {
  it.each([
    [4, 4, 16, 'f32'],
    [4, 2, 16, 'f16'],
    [8, 2, 8, 'f32'],
    [8, 2, 128, 'f16'],
    [32, 1, 16, 'f32'],
  ] as const)('mixed chunk NH=%i NKV=%i HD=%i %s', (NH, NKV, HD, dtype) =>
    pagedCase({ NH, NKV, HD, dtype, pageSize: 4, S: 4, maxT: 56, tokens: mixed }, 10 + NH + HD),
  );

  it('one prompt of 150 tokens (tiles of 32 and 64 queries, keys past one page size), f16', () =>
    pagedCase({ NH: 4, NKV: 1, HD: 16, dtype: 'f16', pageSize: 16, S: 2, maxT: 160, tokens: run(1, 0, 149) }, 3));

  it('positions past maxT attend to the maxT keys the cache holds', () =>
    pagedCase({ NH: 2, NKV: 2, HD: 8, dtype: 'f32', pageSize: 2, S: 1, maxT: 6, tokens: run(0, 3, 5) }, 4));

  it('HD not a multiple of 4 falls back to attention_forward', async () => {
    const kv: K.KvPaging = { dtype: 'f32', pageSize: 1, pages: 4, pagesPerSlot: 4, maxT: 4 };
    const [NH, NKV, HD, T] = [2, 1, 6, 4];
    const q = ref.randn(T * NH * HD, ref.rng(5));
    const kC = ref.randn(4 * NKV * HD, ref.rng(6));
    const vC = ref.randn(4 * NKV * HD, ref.rng(7));
    const out = outBuf(T * NH * HD);
    const slot = new Uint32Array(T);
    const pos = Uint32Array.from([0, 1, 2, 3]);
    K.attention(
      gpu,
      out,
      f32Buf(q),
      f32Buf(kC),
      f32Buf(vC),
      u32Buf([0, 1, 2, 3]),
      u32Buf(slot),
      u32Buf(pos),
      T,
      NH,
      NKV,
      HD,
      kv,
    );
    expect(label('attention')).toContain('attention.attention_forward');
    const want = new Float32Array(T * NH * HD);
    ref.attention(want, q, kC, vC, slot, pos, T, NH, NKV, HD, 4);
    expectClose('paged fallback HD=6', await gpu.readF32(out, T * NH * HD), want, REL, ABS);
  });
});

describe("'auto'", () => {
  // Decode batches (a token per slot, T <= GEMV_MAX_T) keep attention_forward; longer chunks take
  // the tiled kernel from the adapter's cutoff (CPU adapters: past the decode cutoff).
  it.each([
    [4, 'decode batch'],
    [ATTENTION_TILED_MIN_T_CPU, 'prefill'],
  ])('T=%i (%s)', async (T) => {
    K.tuning.attention = 'auto';
    try {
      const cutoff = K.isCpuAdapter(gpu) ? ATTENTION_TILED_MIN_T_CPU : ATTENTION_TILED_MIN_T_GPU_PREFILL;
      const entry = T >= cutoff ? 'attention.attention_tiled[' : 'attention.attention_forward[';
      const tokens =
        T < ATTENTION_TILED_MIN_T_CPU
          ? run(0, 0, T - 1).map(([, p], i): [number, number] => [i, 10 + p])
          : run(1, 0, T - 1);
      await pagedCase({ NH: 4, NKV: 2, HD: 16, dtype: 'f32', pageSize: 4, S: 4, maxT: 24, tokens }, 20 + T, entry);
    } finally {
      K.tuning.attention = 'tiled';
    }
  });
});

// ---- training: forward with lse, backward ------------------------------------------------------

const f64 = (x: Float32Array) => Float64Array.from(x);

// The backward both ways: one thread per row, and rows split over BACKWARD_SPLIT threads summed
// with subgroup shuffles (shaders/attention.wgsl SPLIT; SwiftShader's subgroups are 4 wide,
// lavapipe's 8). Each run checks the variant that ran.
describe.each(['row', 'split'] as const)('attentionForwardLse + attentionBackward (tiled), rows: %s', (mode) => {
  beforeAll(() => {
    K.tuning.attentionBackward = mode;
  });
  afterAll(() => {
    K.tuning.attentionBackward = 'auto';
  });
  const checkSplit = (HD: number) => {
    const want = mode === 'split' && (HD / 4) % BACKWARD_SPLIT === 0 ? BACKWARD_SPLIT : undefined;
    if (want) expect(gpu.features.subgroups && gpu.info.subgroupMinSize >= want, 'subgroups wide enough').toBe(true);
    expect(K.kernelVariant(gpu, 'attentionBackward')!.defines.SPLIT).toBe(want);
    expect(K.kernelVariant(gpu, 'attentionBackward.dkv')!.defines.SPLIT).toBe(want);
  };

  // (T, NH, NKV, HD): one token, T past one query tile (33 with 32-query tiles, 130 with 64),
  // past one key tile and one dK/dV tile, GQA 1, 2, 4, 16 and 32 (two head groups), HD 4..128.
  it.each([
    [1, 4, 2, 16],
    [33, 4, 1, 16],
    [37, 2, 2, 16],
    [70, 8, 2, 128],
    [130, 4, 4, 8],
    [20, 16, 1, 4],
    [19, 32, 1, 8],
  ])('T=%i NH=%i NKV=%i HD=%i', async (T, NH, NKV, HD) => {
    const name = `T=${T} NH=${NH} NKV=${NKV} HD=${HD}`;
    const rand = ref.rng(700 + T + HD);
    const q = ref.randn(T * NH * HD, rand);
    const k = ref.randn(T * NKV * HD, rand);
    const v = ref.randn(T * NKV * HD, rand);
    const dout = ref.randn(T * NH * HD, rand);
    const init = { dq: ref.randn(q.length, rand), dk: ref.randn(k.length, rand), dv: ref.randn(v.length, rand) };
    const [qb, kb, vb, doutb] = [f32Buf(q, 'q'), f32Buf(k, 'k'), f32Buf(v, 'v'), f32Buf(dout, 'dout')];
    const out = gpu.createBuffer(q.length * 4, 'out');
    const lse = gpu.createBuffer(T * NH * 4, 'lse');
    K.attentionForwardLse(gpu, out, lse, qb, kb, vb, T, NH, NKV, HD);
    expect(label('attentionForwardLse')).toContain('attention_tiled_lse');
    const wantOut = new Float64Array(q.length);
    const wantLse = new Float64Array(T * NH);
    ref.attentionForwardLse(wantOut, wantLse, q, k, v, T, NH, NKV, HD);
    expectClose(`lse out ${name}`, await gpu.readF32(out, q.length), wantOut, REL, ABS);
    expectClose(`lse lse ${name}`, await gpu.readF32(lse, T * NH), wantLse, REL, ABS);

    const grads = { dq: f32Buf(init.dq, 'dq'), dk: f32Buf(init.dk, 'dk'), dv: f32Buf(init.dv, 'dv') };
    K.attentionBackward(gpu, grads.dq, grads.dk, grads.dv, doutb, out, lse, qb, kb, vb, T, NH, NKV, HD);
    expect(label('attentionBackward')).toContain('attention_tiled_dq');
    expect(label('attentionBackward.dkv')).toContain('attention_tiled_dkv');
    checkSplit(HD);
    const want = { dq: f64(init.dq), dk: f64(init.dk), dv: f64(init.dv) };
    ref.attentionBackward(want.dq, want.dk, want.dv, dout, wantOut, wantLse, q, k, v, T, NH, NKV, HD);
    for (const key of ['dq', 'dk', 'dv'] as const) {
      const got = await gpu.readF32(grads[key]);
      expectClose(`backward ${key} ${name}`, got.subarray(0, want[key].length), want[key], ATT_REL, ABS);
    }
    for (const b of [qb, kb, vb, doutb, out, lse, grads.dq, grads.dk, grads.dv]) gpu.releaseBuffer(b);
  });

  // The GPU backward against central differences of the GPU forward: loss = sum(out * g); for a
  // random direction u in one input x, (loss(x + eps u) - loss(x - eps u)) / 2 eps must equal
  // grad_x . u. f32 forward: eps 1e-2, tolerance 1e-3 relative (measured error ~1e-5).
  it.each([
    [13, 4, 2, 8],
    [40, 4, 1, 16],
  ])('finite differences T=%i NH=%i NKV=%i HD=%i', (T, NH, NKV, HD) =>
    finiteDifferences(T, NH, NKV, HD, 900 + T, 'fd', () => {
      expect(label('attentionBackward.dkv')).toContain('attention_tiled_dkv');
      checkSplit(HD);
    }),
  );
});

/**
 * The GPU backward against central differences of the GPU forward: loss = sum(out * g); for a
 * random direction u in one input x, (loss(x + eps u) - loss(x - eps u)) / 2 eps must equal
 * grad_x . u. f32 forward: eps 1e-2, tolerance 1e-3 relative (measured error ~1e-5). `ran`
 * checks the kernels that ran, after the backward.
 */
async function finiteDifferences(
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  seed: number,
  name: string,
  ran: () => void,
) {
  const rand = ref.rng(seed);
  const x = { q: ref.randn(T * NH * HD, rand), k: ref.randn(T * NKV * HD, rand), v: ref.randn(T * NKV * HD, rand) };
  const g = ref.randn(T * NH * HD, rand);
  const bufs = { q: f32Buf(x.q, 'q'), k: f32Buf(x.k, 'k'), v: f32Buf(x.v, 'v') };
  const out = gpu.createBuffer(T * NH * HD * 4, 'out');
  const lse = gpu.createBuffer(T * NH * 4, 'lse');
  const loss = async () => {
    K.attentionForwardLse(gpu, out, lse, bufs.q, bufs.k, bufs.v, T, NH, NKV, HD);
    const o = await gpu.readF32(out, T * NH * HD);
    let s = 0;
    for (let i = 0; i < o.length; i++) s += o[i]! * g[i]!;
    return s;
  };
  await loss(); // out and lse at x, saved for the backward
  const grads = { q: outBuf(x.q.length), k: outBuf(x.k.length), v: outBuf(x.v.length) };
  for (const b of Object.values(grads)) gpu.clear(b);
  const gb = f32Buf(g, 'g');
  K.attentionBackward(gpu, grads.q, grads.k, grads.v, gb, out, lse, bufs.q, bufs.k, bufs.v, T, NH, NKV, HD);
  ran();
  const eps = 1e-2;
  for (const key of ['q', 'k', 'v'] as const) {
    const grad = await gpu.readF32(grads[key], x[key].length);
    for (let dir = 0; dir < 2; dir++) {
      const u = ref.randn(x[key].length, rand);
      let analytic = 0;
      for (let i = 0; i < u.length; i++) analytic += grad[i]! * u[i]!;
      const at = async (sign: number) => {
        gpu.write(
          bufs[key],
          x[key].map((xi, i) => xi + sign * eps * u[i]!),
        );
        return loss();
      };
      const numeric = ((await at(1)) - (await at(-1))) / (2 * eps);
      gpu.write(bufs[key], x[key]);
      expectClose(`${name} d${key} T=${T} NH=${NH} NKV=${NKV} dir ${dir}`, [analytic], [numeric], 1e-3, 1e-3);
    }
  }
  for (const b of [gb, out, lse, bufs.q, bufs.k, bufs.v, grads.q, grads.k, grads.v]) gpu.releaseBuffer(b);
}

// ---- packed prefix trees (define TREE: keyEnd) ---------------------------------------------------

/** A node of a packed prefix tree: its own token count, then its children, laid out depth-first. */
type TreeNode = [number, ...TreeNode[]];

/** keyEnd of the depth-first layout of `root`: each token's subtree end; and each leaf's path. */
function layoutTree(root: TreeNode): { keyEnd: number[]; paths: number[][] } {
  const keyEnd: number[] = [];
  const paths: number[][] = [];
  const walk = (node: TreeNode, above: number[]) => {
    const [len, ...children] = node;
    const start = keyEnd.length;
    const mine = Array.from({ length: len }, (_, i) => start + i);
    for (let i = 0; i < len; i++) keyEnd.push(-1);
    for (const c of children) walk(c, [...above, ...mine]);
    if (children.length === 0) paths.push([...above, ...mine]);
    for (const t of mine) keyEnd[t] = keyEnd.length;
  };
  walk(root, []);
  return { keyEnd, paths };
}

/**
 * A backward case from the reference's forward: random q, k, v and dout for (NH, NKV, HD) over T
 * tokens (or the tree's, its keyEnd), the f64 out and lse, and the stream for further draws.
 */
function referenceCase(dims: readonly [number, number, number, number], tree: TreeNode | null, seed: number) {
  const [T0, NH, NKV, HD] = dims;
  const keyEnd = tree ? layoutTree(tree).keyEnd : undefined;
  const T = keyEnd?.length ?? T0;
  const rand = ref.rng(seed + T + HD);
  const x = {
    q: ref.randn(T * NH * HD, rand),
    k: ref.randn(T * NKV * HD, rand),
    v: ref.randn(T * NKV * HD, rand),
    dout: ref.randn(T * NH * HD, rand),
  };
  const want = { out: new Float64Array(x.q.length), lse: new Float64Array(T * NH) };
  ref.attentionForwardLse(want.out, want.lse, x.q, x.k, x.v, T, NH, NKV, HD, keyEnd);
  return { T, NH, NKV, HD, keyEnd, rand, x, want };
}

/** Rows `rows` (tokens) of x (T, H, HD) as a (rows.length, H, HD) array. */
const gatherTokens = (x: ArrayLike<number>, rows: number[], H: number, HD: number) =>
  Float64Array.from(rows.flatMap((t) => Array.from({ length: H * HD }, (_, i) => x[t * H * HD + i]!)));

describe.each(['row', 'split'] as const)('attention over a packed prefix tree (keyEnd), rows: %s', (mode) => {
  beforeAll(() => {
    K.tuning.attentionBackward = mode;
  });
  afterAll(() => {
    K.tuning.attentionBackward = 'auto';
  });

  it('is supported here', () => {
    expect(K.treeAttentionSupported(gpu, 128)).toBe(true);
    expect(K.treeAttentionSupported(gpu, 6)).toBe(false); // not a multiple of 4: no tiled kernel
  });

  // Three leaves under a root; two levels; branches past a query tile and a key tile; a chain.
  it.each([
    [[5, [3], [4], [6]] as TreeNode, 4, 2, 16],
    [[10, [7, [3], [5]], [9]] as TreeNode, 8, 2, 128],
    [[40, [30], [1], [35]] as TreeNode, 4, 1, 16],
    [[20, [15]] as TreeNode, 2, 2, 8],
    // Sibling branches longer than a tile: the second's queries skip the first's key tiles, and
    // the first's dK/dV workgroups stop at its end.
    [[8, [150], [40]] as TreeNode, 4, 2, 16],
  ])('tree %j NH=%i NKV=%i HD=%i', async (tree, NH, NKV, HD) => {
    const { keyEnd, paths } = layoutTree(tree);
    const T = keyEnd.length;
    const name = `${JSON.stringify(tree)} NH=${NH}`;
    const rand = ref.rng(1300 + T + HD);
    const q = ref.randn(T * NH * HD, rand);
    const k = ref.randn(T * NKV * HD, rand);
    const v = ref.randn(T * NKV * HD, rand);
    const dout = ref.randn(T * NH * HD, rand);
    const init = { dq: ref.randn(q.length, rand), dk: ref.randn(k.length, rand), dv: ref.randn(v.length, rand) };
    const [qb, kb, vb, doutb] = [f32Buf(q, 'q'), f32Buf(k, 'k'), f32Buf(v, 'v'), f32Buf(dout, 'dout')];
    const ke = u32Buf(Uint32Array.from(keyEnd), 'keyEnd');
    const out = gpu.createBuffer(q.length * 4, 'out');
    const lse = gpu.createBuffer(T * NH * 4, 'lse');
    K.attentionForwardLse(gpu, out, lse, qb, kb, vb, T, NH, NKV, HD, ke);
    expect(K.kernelVariant(gpu, 'attentionForwardLse')!.defines.TREE).toBe(1);
    const gotOut = await gpu.readF32(out, q.length);
    const wantOut = new Float64Array(q.length);
    const wantLse = new Float64Array(T * NH);
    ref.attentionForwardLse(wantOut, wantLse, q, k, v, T, NH, NKV, HD, keyEnd);
    expectClose(`tree out ${name}`, gotOut, wantOut, REL, ABS);
    expectClose(`tree lse ${name}`, await gpu.readF32(lse, T * NH), wantLse, REL, ABS);
    // What packing means: each leaf's path read on its own, as one causal sequence, gives the
    // same rows as the packed tree.
    for (const path of paths) {
      const n = path.length;
      const pOut = new Float64Array(n * NH * HD);
      ref.attentionForwardLse(
        pOut,
        new Float64Array(n * NH),
        gatherTokens(q, path, NH, HD),
        gatherTokens(k, path, NKV, HD),
        gatherTokens(v, path, NKV, HD),
        n,
        NH,
        NKV,
        HD,
      );
      expectClose(`tree path ${path[n - 1]} ${name}`, gatherTokens(gotOut, path, NH, HD), pOut, REL, ABS);
    }

    const grads = { dq: f32Buf(init.dq, 'dq'), dk: f32Buf(init.dk, 'dk'), dv: f32Buf(init.dv, 'dv') };
    K.attentionBackward(gpu, grads.dq, grads.dk, grads.dv, doutb, out, lse, qb, kb, vb, T, NH, NKV, HD, ke);
    expect(K.kernelVariant(gpu, 'attentionBackward')!.defines.TREE).toBe(1);
    expect(K.kernelVariant(gpu, 'attentionBackward.dkv')!.defines.TREE).toBe(1);
    const want = { dq: f64(init.dq), dk: f64(init.dk), dv: f64(init.dv) };
    ref.attentionBackward(want.dq, want.dk, want.dv, dout, wantOut, wantLse, q, k, v, T, NH, NKV, HD, keyEnd);
    for (const key of ['dq', 'dk', 'dv'] as const) {
      const got = await gpu.readF32(grads[key]);
      expectClose(`tree backward ${key} ${name}`, got.subarray(0, want[key].length), want[key], ATT_REL, ABS);
    }
    for (const b of [qb, kb, vb, doutb, ke, out, lse, grads.dq, grads.dk, grads.dv]) gpu.releaseBuffer(b);
  });

  it('refuses a keyEnd buffer shorter than T', () => {
    const T = 8,
      NH = 2,
      HD = 8;
    const x = outBuf(T * NH * HD);
    const lse = outBuf(T * NH);
    const [q, k, v] = [outBuf(T * NH * HD), outBuf(T * NH * HD), outBuf(T * NH * HD)];
    const short = u32Buf(new Uint32Array(T / 2), 'shortKeyEnd');
    expect(() => K.attentionForwardLse(gpu, x, lse, q, k, v, T, NH, NH, HD, short)).toThrow(/keyEnd/);
  });
});

// ---- the tiled dK/dV's workgroups (tuning.attentionDkvGroup) ------------------------------------

describe.each(['row', 'split'] as const)("the tiled dK/dV's keys a workgroup on a GPU's choices, rows: %s", (mode) => {
  beforeAll(() => {
    Object.assign(K.tuning, { attentionBackward: mode, autoFor: 'gpu' });
  });
  afterAll(() => {
    Object.assign(K.tuning, { attentionBackward: 'auto', autoFor: 'auto', attentionDkvGroup: 'auto' });
  });

  // 'auto' (a GPU's): the query tile's BQ keys a workgroup, at least 64 threads; 'wide': ROWS / S.
  it.each([
    ['auto', 'T=70 NH=8 NKV=2 HD=128', [70, 8, 2, 128], null],
    ['wide', 'T=70 NH=8 NKV=2 HD=128', [70, 8, 2, 128], null],
    ['auto', 'T=130 NH=4 NKV=1 HD=16', [130, 4, 1, 16], null],
    ['auto', 'tree [8,[150],[40]] NH=4 NKV=2 HD=16', [0, 4, 2, 16], [8, [150], [40]] as TreeNode],
  ] as const)('%s: %s against the f64 reference', async (group, desc, dims, tree) => {
    K.tuning.attentionDkvGroup = group;
    const { T, NH, NKV, HD, keyEnd, rand, x, want } = referenceCase(dims, tree as TreeNode | null, 2500);
    const { q, k, v, dout } = x;
    const init = { dq: ref.randn(q.length, rand), dk: ref.randn(k.length, rand), dv: ref.randn(v.length, rand) };
    const bufs = [f32Buf(q, 'q'), f32Buf(k, 'k'), f32Buf(v, 'v'), f32Buf(dout, 'dout')];
    const [qb, kb, vb, doutb] = bufs as [GPUBuffer, GPUBuffer, GPUBuffer, GPUBuffer];
    const out = f32Buf(Float32Array.from(want.out), 'out');
    const lse = f32Buf(Float32Array.from(want.lse), 'lse');
    const ke = keyEnd ? u32Buf(Uint32Array.from(keyEnd), 'keyEnd') : null;
    const grads = { dq: f32Buf(init.dq, 'dq'), dk: f32Buf(init.dk, 'dk'), dv: f32Buf(init.dv, 'dv') };
    K.attentionBackward(gpu, grads.dq, grads.dk, grads.dv, doutb, out, lse, qb, kb, vb, T, NH, NKV, HD, ke);
    const S = mode === 'split' && (HD / 4) % BACKWARD_SPLIT === 0 ? BACKWARD_SPLIT : 1;
    const t = attentionTiling(gpu, NH, NKV, HD, S);
    const dkv = K.kernelVariant(gpu, 'attentionBackward.dkv')!;
    expect(dkv.label).toContain('attention_tiled_dkv');
    expect(dkv.constants.ROWS).toBe(group === 'wide' ? t.ROWS : Math.min(t.ROWS, Math.max(64, t.BQ * S)));
    expect(K.kernelVariant(gpu, 'attentionBackward')!.constants.ROWS).toBe(t.ROWS);
    const g = { dq: f64(init.dq), dk: f64(init.dk), dv: f64(init.dv) };
    ref.attentionBackward(g.dq, g.dk, g.dv, dout, want.out, want.lse, q, k, v, T, NH, NKV, HD, keyEnd);
    for (const key of ['dq', 'dk', 'dv'] as const) {
      const got = await gpu.readF32(grads[key]);
      expectClose(`dkvGroup=${group} ${mode} ${key} ${desc}`, got.subarray(0, g[key].length), g[key], ATT_REL, ABS);
    }
    for (const b of [...bufs, out, lse, ...(ke ? [ke] : []), grads.dq, grads.dk, grads.dv]) gpu.releaseBuffer(b);
  });
});

// ---- 'auto' on a GPU: the blocked kernels from ATTENTION_BLOCKED_MIN_T_GPU tokens -------------

describe("'auto' with a GPU's choices (autoFor=gpu)", () => {
  beforeAll(() => {
    Object.assign(K.tuning, { attention: 'auto', autoFor: 'gpu' });
  });
  afterAll(() => {
    Object.assign(K.tuning, { attention: 'tiled', autoFor: 'auto', attentionForward: 'auto' });
  });

  it('takes the blocked cutoff where the blocked kernels run, else the rows', () => {
    expect(attentionTiledMinT(gpu, 'training', 32)).toBe(ATTENTION_BLOCKED_MIN_T_GPU);
    expect(attentionTiledMinT(gpu, 'prefill', 128)).toBe(ATTENTION_BLOCKED_MIN_T_GPU);
    // head_dim 16: no blocked kernel
    expect(attentionTiledMinT(gpu, 'training', 16)).toBe(ATTENTION_TILED_MIN_T_GPU);
    expect(attentionTiledMinT(gpu, 'prefill', 16)).toBe(ATTENTION_TILED_MIN_T_GPU_PREFILL);
    // the rows' forward forced: their cutoffs, as before the blocked kernels were 'auto'
    K.tuning.attentionForward = 'rows';
    try {
      expect(attentionTiledMinT(gpu, 'training', 32)).toBe(ATTENTION_TILED_MIN_T_GPU);
      expect(attentionTiledMinT(gpu, 'prefill', 32)).toBe(ATTENTION_TILED_MIN_T_GPU_PREFILL);
    } finally {
      K.tuning.attentionForward = 'auto';
    }
    expect(K.attentionVariant(gpu, ATTENTION_BLOCKED_MIN_T_GPU - 1, 32, 'training')).toBe('other');
    expect(K.attentionVariant(gpu, ATTENTION_BLOCKED_MIN_T_GPU, 32, 'training')).toBe('tiled');
  });

  // At the cutoff: the blocked forward, dQ, and dK/dV at 2 keys a thread; one token short: the
  // per-(token, head) kernels. Both against the f64 reference.
  it.each([
    [ATTENTION_BLOCKED_MIN_T_GPU, 'attention_blocked_lse', 'attention_blocked_dq', 'attention_blocked_dkv'],
    [ATTENTION_BLOCKED_MIN_T_GPU - 1, 'attention_forward_lse', 'attention_backward_dq', 'attention_backward_dkv'],
  ])('T=%i NH=4 NKV=2 HD=32: %s, %s, %s', async (T, fwd, dq, dkv) => {
    const { NH, NKV, HD, rand, x, want } = referenceCase([T, 4, 2, 32], null, 2700);
    const bufs = [f32Buf(x.q, 'q'), f32Buf(x.k, 'k'), f32Buf(x.v, 'v'), f32Buf(x.dout, 'dout')];
    const [qb, kb, vb, doutb] = bufs as [GPUBuffer, GPUBuffer, GPUBuffer, GPUBuffer];
    const out = outBuf(x.q.length);
    const lse = outBuf(T * NH);
    K.attentionForwardLse(gpu, out, lse, qb, kb, vb, T, NH, NKV, HD);
    expect(label('attentionForwardLse')).toContain(fwd);
    expectClose(`auto out T=${T}`, await gpu.readF32(out, x.q.length), want.out, REL, ABS);
    expectClose(`auto lse T=${T}`, await gpu.readF32(lse, T * NH), want.lse, REL, ABS);
    const init = { dq: ref.randn(x.q.length, rand), dk: ref.randn(x.k.length, rand), dv: ref.randn(x.v.length, rand) };
    const grads = { dq: f32Buf(init.dq, 'dq'), dk: f32Buf(init.dk, 'dk'), dv: f32Buf(init.dv, 'dv') };
    K.attentionBackward(gpu, grads.dq, grads.dk, grads.dv, doutb, out, lse, qb, kb, vb, T, NH, NKV, HD, null);
    expect(label('attentionBackward')).toContain(dq);
    expect(label('attentionBackward.dkv')).toContain(dkv);
    if (dkv === 'attention_blocked_dkv') {
      expect(K.kernelVariant(gpu, 'attentionBackward')!.defines.RI).toBe(4);
      expect(K.kernelVariant(gpu, 'attentionBackward.dkv')!.defines.RI).toBe(2);
    }
    const g = { dq: f64(init.dq), dk: f64(init.dk), dv: f64(init.dv) };
    ref.attentionBackward(g.dq, g.dk, g.dv, x.dout, want.out, want.lse, x.q, x.k, x.v, T, NH, NKV, HD);
    for (const key of ['dq', 'dk', 'dv'] as const) {
      const got = await gpu.readF32(grads[key]);
      expectClose(`auto ${key} T=${T}`, got.subarray(0, g[key].length), g[key], ATT_REL, ABS);
    }
    for (const b of [...bufs, out, lse, grads.dq, grads.dk, grads.dv]) gpu.releaseBuffer(b);
  });
});

// ---- the register-tiled training forward (tuning.attentionForward = 'blocks') -------------------

describe('attention_blocked_lse, _dq, _dkv (attentionForward, attentionBackward: blocks)', () => {
  beforeAll(() => {
    K.tuning.attentionForward = 'blocks';
    K.tuning.attentionBackward = 'blocks';
  });
  afterAll(() => {
    K.tuning.attentionForward = 'auto';
    K.tuning.attentionBackward = 'auto';
  });

  /** The blocked backward from init (dq, dk, dv), against the f64 reference's. */
  async function checkBackward(
    name: string,
    x: { q: Float32Array; k: Float32Array; v: Float32Array; dout: Float32Array },
    bufs: { q: GPUBuffer; k: GPUBuffer; v: GPUBuffer; out: GPUBuffer; lse: GPUBuffer; keyEnd?: GPUBuffer },
    want: { out: Float64Array; lse: Float64Array },
    dims: [number, number, number, number],
    keyEnd?: number[],
    rand = ref.rng(2100 + dims[0]),
  ) {
    const [T, NH, NKV, HD] = dims;
    const init = { dq: ref.randn(x.q.length, rand), dk: ref.randn(x.k.length, rand), dv: ref.randn(x.v.length, rand) };
    const grads = { dq: f32Buf(init.dq, 'dq'), dk: f32Buf(init.dk, 'dk'), dv: f32Buf(init.dv, 'dv') };
    const doutb = f32Buf(x.dout, 'dout');
    K.attentionBackward(
      gpu,
      grads.dq,
      grads.dk,
      grads.dv,
      doutb,
      bufs.out,
      bufs.lse,
      bufs.q,
      bufs.k,
      bufs.v,
      T,
      NH,
      NKV,
      HD,
      bufs.keyEnd ?? null,
    );
    expect(label('attentionBackward')).toContain('attention_blocked_dq');
    expect(label('attentionBackward.dkv')).toContain('attention_blocked_dkv');
    const g = { dq: f64(init.dq), dk: f64(init.dk), dv: f64(init.dv) };
    ref.attentionBackward(g.dq, g.dk, g.dv, x.dout, want.out, want.lse, x.q, x.k, x.v, T, NH, NKV, HD, keyEnd);
    for (const key of ['dq', 'dk', 'dv'] as const) {
      const got = await gpu.readF32(grads[key]);
      expectClose(`backward ${key} ${name}`, got.subarray(0, g[key].length), g[key], ATT_REL, ABS);
    }
    for (const b of [doutb, grads.dq, grads.dk, grads.dv]) gpu.releaseBuffer(b);
  }

  it('picks the largest blocks that fit the workgroup memory', () => {
    const fake = (bytes: number) => ({ limits: { maxComputeWorkgroupStorageSize: bytes } }) as unknown as Gpu;
    // Qwen3-4B heads: 64 rows (16 tokens x 4 heads), 32 keys a tile; the chunk of the head dim
    // that fits 48 KiB (the H200's), 32 KiB and the WebGPU default 16 KiB.
    expect(attentionBlocking(fake(49152), 32, 8, 128)).toEqual({ RI: 4, KJ: 4, DC: 64, HG: 4, BQ: 16 });
    expect(attentionBlocking(fake(32768), 32, 8, 128)).toEqual({ RI: 4, KJ: 4, DC: 32, HG: 4, BQ: 16 });
    expect(attentionBlocking(fake(16384), 32, 8, 128)).toEqual({ RI: 2, KJ: 2, DC: 32, HG: 4, BQ: 8 });
    // 32 query heads over one KV head: 64 rows hold 32 of them (2 tokens); GQA 1: 64 tokens.
    expect(attentionBlocking(fake(32768), 32, 1, 64)).toMatchObject({ RI: 4, KJ: 4, HG: 32, BQ: 2 });
    expect(attentionBlocking(fake(32768), 8, 8, 64)).toMatchObject({ HG: 1, BQ: 64 });
    // Head dims that are not multiples of 32: the row kernel.
    expect(attentionBlocking(fake(49152), 4, 2, 16)).toBeNull();
    expect(attentionBlocking(fake(49152), 4, 2, 72)).toBeNull();
    for (const bytes of [16384, 32768, 49152]) {
      const b = attentionBlocking(fake(bytes), 32, 8, 128)!;
      expect(attentionBlockedBytes(128, b.RI, b.KJ, b.DC, true)).toBeLessThanOrEqual(bytes);
    }
  });

  // (T, NH, NKV, HD): T past one query tile and one key tile, not multiples of either; GQA 1, 2,
  // 4 and 32 (two tokens a tile); HD 32, 64, 128. Packed trees: the next cases.
  it.each([
    [1, 4, 2, 32],
    [37, 4, 1, 32],
    [70, 8, 2, 128],
    [130, 4, 4, 64],
    [19, 32, 1, 32],
  ])('T=%i NH=%i NKV=%i HD=%i against the f64 reference', async (T, NH, NKV, HD) => {
    const name = `blocks T=${T} NH=${NH} NKV=${NKV} HD=${HD}`;
    const rand = ref.rng(1700 + T + HD);
    const q = ref.randn(T * NH * HD, rand);
    const k = ref.randn(T * NKV * HD, rand);
    const v = ref.randn(T * NKV * HD, rand);
    const [qb, kb, vb] = [f32Buf(q, 'q'), f32Buf(k, 'k'), f32Buf(v, 'v')];
    const out = gpu.createBuffer(q.length * 4, 'out');
    const lse = gpu.createBuffer(T * NH * 4, 'lse');
    K.attentionForwardLse(gpu, out, lse, qb, kb, vb, T, NH, NKV, HD);
    expect(label('attentionForwardLse')).toContain('attention_blocked_lse');
    const wantOut = new Float64Array(q.length);
    const wantLse = new Float64Array(T * NH);
    ref.attentionForwardLse(wantOut, wantLse, q, k, v, T, NH, NKV, HD);
    expectClose(`out ${name}`, await gpu.readF32(out, q.length), wantOut, REL, ABS);
    expectClose(`lse ${name}`, await gpu.readF32(lse, T * NH), wantLse, REL, ABS);
    const dout = ref.randn(T * NH * HD, rand);
    await checkBackward(name, { q, k, v, dout }, { q: qb, k: kb, v: vb, out, lse }, { out: wantOut, lse: wantLse }, [
      T,
      NH,
      NKV,
      HD,
    ]);
    for (const b of [qb, kb, vb, out, lse]) gpu.releaseBuffer(b);
  });

  it.each([
    [[5, [3], [4], [6]] as TreeNode, 4, 2, 32],
    [[40, [30], [1], [35]] as TreeNode, 8, 2, 64],
    [[8, [150], [40]] as TreeNode, 4, 2, 32], // skipped tiles, as in the row kernels' cases
  ])('tree %j NH=%i NKV=%i HD=%i against the f64 reference', async (tree, NH, NKV, HD) => {
    const { keyEnd } = layoutTree(tree);
    const T = keyEnd.length;
    const name = `blocks tree ${JSON.stringify(tree)} NH=${NH}`;
    const rand = ref.rng(1900 + T + HD);
    const q = ref.randn(T * NH * HD, rand);
    const k = ref.randn(T * NKV * HD, rand);
    const v = ref.randn(T * NKV * HD, rand);
    const [qb, kb, vb] = [f32Buf(q, 'q'), f32Buf(k, 'k'), f32Buf(v, 'v')];
    const ke = u32Buf(Uint32Array.from(keyEnd), 'keyEnd');
    const out = gpu.createBuffer(q.length * 4, 'out');
    const lse = gpu.createBuffer(T * NH * 4, 'lse');
    K.attentionForwardLse(gpu, out, lse, qb, kb, vb, T, NH, NKV, HD, ke);
    const used = K.kernelVariant(gpu, 'attentionForwardLse')!;
    expect(used.label).toContain('attention_blocked_lse');
    expect(used.defines.TREE).toBe(1);
    const wantOut = new Float64Array(q.length);
    const wantLse = new Float64Array(T * NH);
    ref.attentionForwardLse(wantOut, wantLse, q, k, v, T, NH, NKV, HD, keyEnd);
    expectClose(`out ${name}`, await gpu.readF32(out, q.length), wantOut, REL, ABS);
    expectClose(`lse ${name}`, await gpu.readF32(lse, T * NH), wantLse, REL, ABS);
    const dout = ref.randn(T * NH * HD, rand);
    await checkBackward(
      name,
      { q, k, v, dout },
      { q: qb, k: kb, v: vb, out, lse, keyEnd: ke },
      { out: wantOut, lse: wantLse },
      [T, NH, NKV, HD],
      keyEnd,
    );
    expect(K.kernelVariant(gpu, 'attentionBackward.dkv')!.defines.TREE).toBe(1);
    for (const b of [qb, kb, vb, ke, out, lse]) gpu.releaseBuffer(b);
  });

  // dK/dV at fewer keys a thread (tuning.attentionDkvRows: 32 or 16 keys a workgroup), from the
  // reference's out and lse; the dQ pass keeps the geometry's 4.
  it.each([
    ['2', 'T=70 NH=8 NKV=2 HD=128', [70, 8, 2, 128], null],
    ['1', 'T=130 NH=4 NKV=4 HD=64', [130, 4, 4, 64], null],
    ['2', 'tree [8,[150],[40]] NH=4 NKV=2 HD=32', [0, 4, 2, 32], [8, [150], [40]] as TreeNode],
  ] as const)('dK/dV at %s keys a thread: %s', async (rows, desc, dims, tree) => {
    const { T, NH, NKV, HD, keyEnd, x, want } = referenceCase(dims, tree as TreeNode | null, 2300);
    const name = `dkvRows=${rows} ${desc}`;
    const bufs = {
      q: f32Buf(x.q, 'q'),
      k: f32Buf(x.k, 'k'),
      v: f32Buf(x.v, 'v'),
      out: f32Buf(Float32Array.from(want.out), 'out'),
      lse: f32Buf(Float32Array.from(want.lse), 'lse'),
      ...(keyEnd ? { keyEnd: u32Buf(Uint32Array.from(keyEnd), 'keyEnd') } : {}),
    };
    K.tuning.attentionDkvRows = rows;
    try {
      await checkBackward(name, x, bufs, want, [T, NH, NKV, HD], keyEnd);
    } finally {
      K.tuning.attentionDkvRows = 'auto';
    }
    expect(K.kernelVariant(gpu, 'attentionBackward')!.defines.RI).toBe(4);
    expect(K.kernelVariant(gpu, 'attentionBackward.dkv')!.defines.RI).toBe(Number(rows));
    for (const b of Object.values(bufs)) gpu.releaseBuffer(b);
  });

  // The prefill over the paged cache (attention_blocked): the mixed chunk of the row kernel's
  // tests (runs of slots, a lone token, a run split by another slot's token, shuffled pages),
  // f32 and f16 KV, GQA 1, 4 and 32; a long prompt past several key tiles; positions past maxT.
  it.each([
    [4, 4, 32, 'f32'],
    [8, 2, 128, 'f16'],
    [32, 1, 32, 'f32'],
  ] as const)('prefill: mixed chunk NH=%i NKV=%i HD=%i %s', (NH, NKV, HD, dtype) =>
    pagedCase(
      { NH, NKV, HD, dtype, pageSize: 4, S: 4, maxT: 56, tokens: mixed },
      30 + NH + HD,
      'attention.attention_blocked[',
    ),
  );
  it('prefill: one prompt of 150 tokens, f16; positions past maxT', async () => {
    const entry = 'attention.attention_blocked[';
    const long = {
      NH: 4,
      NKV: 1,
      HD: 64,
      dtype: 'f16',
      pageSize: 16,
      S: 2,
      maxT: 160,
      tokens: run(1, 0, 149),
    } as const;
    await pagedCase(long, 33, entry);
    await pagedCase(
      { NH: 2, NKV: 2, HD: 32, dtype: 'f32', pageSize: 2, S: 1, maxT: 6, tokens: run(0, 3, 5) },
      34,
      entry,
    );
  });

  // The blocked backward against central differences of the blocked forward.
  it.each([
    [13, 4, 2, 32],
    [40, 4, 1, 64],
  ])('finite differences T=%i NH=%i NKV=%i HD=%i', (T, NH, NKV, HD) =>
    finiteDifferences(T, NH, NKV, HD, 2300 + T, 'blocks fd', () => {
      expect(label('attentionForwardLse')).toContain('attention_blocked_lse');
      expect(label('attentionBackward.dkv')).toContain('attention_blocked_dkv');
    }),
  );

  it('keeps the row kernel for a head dim that is not a multiple of 32', async () => {
    const [T, NH, HD] = [9, 2, 16];
    const x = outBuf(T * NH * HD);
    const lse = outBuf(T * NH);
    const [q, k, v] = [outBuf(T * NH * HD), outBuf(T * NH * HD), outBuf(T * NH * HD)];
    K.attentionForwardLse(gpu, x, lse, q, k, v, T, NH, NH, HD);
    expect(label('attentionForwardLse')).toContain('attention_tiled_lse');
    const [dq, dk, dv] = [outBuf(T * NH * HD), outBuf(T * NH * HD), outBuf(T * NH * HD)];
    K.attentionBackward(gpu, dq, dk, dv, outBuf(T * NH * HD), x, lse, q, k, v, T, NH, NH, HD);
    expect(label('attentionBackward')).toContain('attention_tiled_dq');
  });
});
