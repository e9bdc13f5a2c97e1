// Per-op microbenchmarks at Qwen3-4B shapes (or cut shapes on CPU adapters): the decode GEMV over
// bf16 and q4 weights, the prefill/training GEMM and its input-gradient GEMM, training attention
// forward and backward, and paged decode attention. Each calls the public op of src/ops (nothing
// here is a kernel) and writes its FLOPs and bytes out next to the call.
import type { Gpu } from '../src/gpu/index.ts';
import * as K from '../src/ops/index.ts';
import { KV_PAGE_SIZE } from '../src/model/kvLayout.ts';
import { makeRecord, timeCalls, type BenchRecord, type Roofline } from './measure.ts';

/** Shapes of the op benchmarks, in the project's dimension names. */
export interface OpShapes {
  /** Qwen3-4B: C 2560, I 9728, NH 32, NKV 8, HD 128. */
  C: number;
  I: number;
  NH: number;
  NKV: number;
  HD: number;
  /** GEMV weight (N, K) and its batches B (decode: one token of each of B sequences). */
  gemvN: number;
  gemvK: number;
  gemvB: number[];
  /** GEMM: M tokens x weight (N, K) (prefill and training). */
  gemmM: number[];
  gemmN: number;
  gemmK: number;
  /** Training attention, one causal sequence of T tokens. */
  attnT: number;
  /** Decode attention: B sequences, one query each, over ctx cached positions (+ its own). */
  decodeCtx: number;
  decodeB: number[];
}

const QWEN3_4B = { C: 2560, I: 9728, NH: 32, NKV: 8, HD: 128 };

/**
 * full: the MLP gate/up projection (9728 x 2560) for GEMV and GEMM, sequences of 512 for
 * training attention, context 2,048 for decode. quick (CPU adapters): the same C, heads and
 * head_dim, with fewer rows and tokens, so the whole default run stays a few minutes.
 */
export const OP_SHAPES: Record<'quick' | 'full', OpShapes> = {
  full: {
    ...QWEN3_4B,
    gemvN: 9728,
    gemvK: 2560,
    gemvB: [1, 4],
    gemmM: [128, 512],
    gemmN: 9728,
    gemmK: 2560,
    attnT: 512,
    decodeCtx: 2048,
    decodeB: [1, 4],
  },
  quick: {
    ...QWEN3_4B,
    gemvN: 2560,
    gemvK: 2560,
    gemvB: [1, 4],
    gemmM: [32],
    gemmN: 1024,
    gemmK: 2560,
    attnT: 64,
    decodeCtx: 256,
    decodeB: [1, 4],
  },
};

export const OP_NAMES = ['gemv', 'gemm', 'attention', 'decode-attention'] as const;
export type OpName = (typeof OP_NAMES)[number];

// ---- arithmetic (exported for test/bench) -------------------------------------------------------

/** Bytes of an (N, K) weight as stored: bf16 2 per element; q4 nibbles plus f16 group scales. */
export function weightBytes(N: number, Kd: number, format: 'bf16' | 'q4'): number {
  return format === 'q4' ? K.q4Words(N, Kd) * 4 : N * Kd * 2;
}

/** out (M, N) = x (M, K) . w^T: 2 FLOPs per MAC; bytes: the weight once, x read, out written. */
export function matmulCost(M: number, N: number, Kd: number, format: 'bf16' | 'q4'): { flops: number; bytes: number } {
  return { flops: 2 * M * N * Kd, bytes: weightBytes(N, Kd, format) + 4 * M * (Kd + N) };
}

/**
 * Causal attention over T tokens: T(T+1)/2 (query, key) pairs per head (or `pairs`, a packed
 * tree's visible ones), QK and PV 2*HD FLOPs each.
 */
export function attentionCost(
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  pairs = (T * (T + 1)) / 2,
): { flops: number; bytes: number } {
  return { flops: 4 * HD * NH * pairs, bytes: 4 * (2 * T * NH * HD + 2 * T * NKV * HD + T * NH) };
}

/**
 * Its backward, counted as FlashAttention-2 does: 5 products per pair (S = QK again, dP = dO V,
 * dQ, dK, dV), 2.5x the forward; bytes: q k v out dout lse read, dq dk dv read and written.
 */
export function attentionBackwardCost(
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  pairs = (T * (T + 1)) / 2,
): { flops: number; bytes: number } {
  const q = T * NH * HD,
    kv = T * NKV * HD;
  return { flops: 10 * HD * NH * pairs, bytes: 4 * (3 * q + 2 * kv + T * NH) + 4 * 2 * (q + 2 * kv) };
}

/**
 * A packed round's prefix tree over T tokens (src/train/packing.ts): a shared prefix of 40%, then
 * two sibling branches of 30% each, as when the spy's prompt joins the civilians' pack (the report
 * up to the removed span shared, then the civilians' rest and the spy's); keyEnd and its visible
 * (query, key) pairs, sum over keys of keyEnd[j] - j.
 */
export function benchTree(T: number): { keyEnd: number[]; pairs: number } {
  const a = Math.round(0.4 * T),
    b = Math.round(0.7 * T);
  const keyEnd = Array.from({ length: T }, (_, j) => (j < a || j >= b ? T : b));
  return { keyEnd, pairs: keyEnd.reduce((n, e, j) => n + e - j, 0) };
}

/** Decode attention: B queries, each over `keys` cached positions of its own sequence. */
export function decodeAttentionCost(
  B: number,
  keys: number,
  NH: number,
  NKV: number,
  HD: number,
  kvBytes: number,
): { flops: number; bytes: number } {
  return { flops: 4 * B * keys * NH * HD, bytes: B * keys * 2 * NKV * HD * kvBytes + 4 * 2 * B * NH * HD };
}

// ---- buffers --------------------------------------------------------------------------------------

/** Values in [-1, 1) from a fixed LCG: the data never affects the timing, but NaN or denormals could on a CPU. */
function pattern(n: number): Float32Array {
  const out = new Float32Array(n);
  let s = 2463534242;
  for (let i = 0; i < n; i++) {
    s = (s * 1664525 + 1013904223) >>> 0;
    out[i] = s / 2 ** 31 - 1;
  }
  return out;
}

const BLOCK = pattern(1 << 16);

class Buffers {
  private made: GPUBuffer[] = [];
  constructor(private readonly gpu: Gpu) {}

  /** n f32 values of the pattern. */
  f32(n: number, label: string): GPUBuffer {
    return this.filled(n * 4, label, BLOCK);
  }

  /** An (N, K) bf16 weight: the pattern scaled to ~0.02, rounded to bf16 (high halves). */
  bf16(N: number, K: number, label: string): GPUBuffer {
    const words = new Uint32Array(BLOCK.length / 2);
    const f = new Float32Array(BLOCK.map((x) => x * 0.02));
    const bits = new Uint32Array(f.buffer);
    for (let i = 0; i < words.length; i++) words[i] = (bits[2 * i] >>> 16) | (bits[2 * i + 1] & 0xffff0000);
    return this.filled(weightBytes(N, K, 'bf16'), label, words);
  }

  /** An (N, K) q4 weight: pattern nibbles, then f16 scales of 2^-8 (finite, normal). */
  q4(N: number, Kd: number, label: string): K.Q4Weight {
    const buf = this.filled(weightBytes(N, Kd, 'q4'), label, new Uint32Array(BLOCK.buffer));
    const scaleWords = Math.ceil((N * Kd) / 64);
    this.fillRange(buf, (N * Kd) / 2, scaleWords * 4, new Uint32Array(1 << 14).fill(0x1c001c00));
    return { format: 'q4', buf, N, K: Kd };
  }

  u32(values: ArrayLike<number>, label: string): GPUBuffer {
    const buf = this.gpu.createBuffer(Math.max(4, values.length * 4), label);
    this.gpu.write(buf, Uint32Array.from(values));
    this.made.push(buf);
    return buf;
  }

  private filled(bytes: number, label: string, block: ArrayBufferView): GPUBuffer {
    const buf = this.gpu.createBuffer(bytes, label);
    this.made.push(buf);
    this.fillRange(buf, 0, bytes, block);
    return buf;
  }

  private fillRange(buf: GPUBuffer, offset: number, bytes: number, block: ArrayBufferView): void {
    const src = new Uint8Array(block.buffer, block.byteOffset, block.byteLength);
    for (let at = 0; at < bytes; at += src.byteLength)
      this.gpu.write(buf, src.subarray(0, Math.min(src.byteLength, bytes - at)), offset + at);
  }

  releaseAll(): void {
    for (const b of this.made) this.gpu.releaseBuffer(b);
    this.made = [];
  }
}

// ---- the benchmarks -----------------------------------------------------------------------------

/** Pattern words as f16 pairs would include NaN and inf: fill f16 caches with 0.5 pairs. */
function fillHalf(gpu: Gpu, bufs: GPUBuffer[]): void {
  const half = new Uint32Array(1 << 14).fill(0x38003800);
  for (const b of bufs)
    for (let at = 0; at < b.size; at += half.byteLength)
      gpu.write(b, half.subarray(0, Math.min(half.length, (b.size - at) / 4)), at);
}

/** The attention kernel an op's last call launched (its pipeline label), for the record's note. */
function kernelNote(gpu: Gpu, op: string): string {
  return `kernel: ${K.kernelVariant(gpu, op)?.label ?? '?'}`;
}

/**
 * An attention variant side by side: tuning.attention ('single' or 'tiled': the tiled kernels
 * 'auto' picks), and for 'tiled' after a colon the rows' kernels (tuning.attentionForward 'rows')
 * with the backward's rows (tuning.attentionBackward: 'row' one thread a row, 'split' 4;
 * 'splitwide': split, with the dK/dV workgroups of ROWS / 4 keys, tuning.attentionDkvGroup) or
 * register-tiled products in both ('blocks': tuning.attentionForward and attentionBackward, dK/dV
 * at 4 keys a thread; 'blocks2': at 2, tuning.attentionDkvRows).
 */
export type AttentionBenchVariant =
  'single' | 'tiled' | 'tiled:row' | 'tiled:split' | 'tiled:splitwide' | 'tiled:blocks' | 'tiled:blocks2';

export interface OpBenchOptions {
  shapes: OpShapes;
  ops: readonly OpName[];
  kv: 'f32' | 'f16';
  minSeconds: number;
  roofline?: Roofline;
  log?: (r: BenchRecord) => void;
  /**
   * Attention side by side: each attention record once per variant (tuning.attention forced),
   * named `... [variant]`, the variants alternated `rounds` times (A B A B: drift hits both), plus
   * a paged prefill record per variant. Absent: one record per op with the 'auto' choice.
   */
  attentionVariants?: { variants: AttentionBenchVariant[]; rounds: number };
  /**
   * Decode GEMV side by side: each gemv record once per matmul variant (tuning.matmul forced),
   * named `gemv ... [variant]`, alternated `rounds` times. Absent: the 'auto' choice.
   */
  gemvVariants?: { variants: ('blocks' | 'lanes' | 'gemv')[]; rounds: number };
  /**
   * Decode attention side by side: each record once per tuning.attentionHeads ('group': a GQA
   * group's heads per workgroup, K/V read once for them; 'one': a head per workgroup), named
   * `decode attention ... [heads]`, alternated `rounds` times. Absent: the 'auto' choice.
   */
  decodeHeads?: { variants: ('group' | 'one')[]; rounds: number };
  /**
   * Prefill GEMM side by side: the forward gemm records once per tile precision of gemm_tiled
   * (tuning.matmul 'tiled'; 'f32', or 'f16': tuning.gemmF16 'on', shader-f16 only), named
   * `gemm bf16 M=.. [f16]`, alternated `rounds` times. Absent: the 'auto' choice.
   */
  gemmVariants?: { variants: ('f32' | 'f16')[]; rounds: number };
}

export async function benchOps(gpu: Gpu, o: OpBenchOptions): Promise<BenchRecord[]> {
  const records: BenchRecord[] = [];
  const s = o.shapes;
  const timing = { minSeconds: o.minSeconds, maxReps: 100 };
  const run = async (
    name: string,
    shape: string,
    cost: { flops: number; bytes: number },
    encode: () => void,
    tokens?: number,
    note?: string | (() => string), // a function: read after the calls (e.g. the kernel they launched)
  ) => {
    const t = await timeCalls(gpu, encode, timing);
    const r = makeRecord(
      { group: 'op', name, shape, ...cost, ...t, tokens, note: typeof note === 'function' ? note() : note },
      o.roofline,
    );
    records.push(r);
    o.log?.(r);
  };
  const bufs = new Buffers(gpu);
  try {
    if (o.ops.includes('gemv')) {
      const { gemvN: N, gemvK: Kd } = s;
      const maxB = Math.max(...s.gemvB);
      const x = bufs.f32(maxB * Kd, 'gemv.x'),
        out = bufs.f32(maxB * N, 'gemv.out');
      const variants = o.gemvVariants?.variants ?? [undefined];
      const before = K.tuning.matmul;
      try {
        for (const format of ['bf16', 'q4'] as const) {
          const w = format === 'q4' ? bufs.q4(N, Kd, 'gemv.w') : bufs.bf16(N, Kd, 'gemv.w');
          for (const B of s.gemvB) {
            for (let round = 0; round < (o.gemvVariants?.rounds ?? 1); round++) {
              for (const variant of variants) {
                if (variant) K.tuning.matmul = variant;
                await run(
                  `gemv ${format} B=${B}${variant ? ` [${variant}]` : ''}`,
                  `N=${N} K=${Kd}`,
                  matmulCost(B, N, Kd, format),
                  () => K.matmul(gpu, out, x, w, B, N, Kd),
                  B,
                  () => kernelNote(gpu, 'matmul'),
                );
              }
            }
          }
        }
      } finally {
        K.tuning.matmul = before;
      }
    }
    if (o.ops.includes('gemm')) {
      const { gemmN: N, gemmK: Kd } = s;
      const maxM = Math.max(...s.gemmM);
      const w = bufs.bf16(N, Kd, 'gemm.w');
      const x = bufs.f32(maxM * Kd, 'gemm.x'),
        out = bufs.f32(maxM * N, 'gemm.out');
      for (const M of s.gemmM) {
        const variants = o.gemmVariants?.variants ?? [undefined];
        const before = { matmul: K.tuning.matmul, gemmF16: K.tuning.gemmF16 };
        try {
          for (let round = 0; round < (o.gemmVariants?.rounds ?? 1); round++) {
            for (const variant of variants) {
              if (variant) Object.assign(K.tuning, { matmul: 'tiled', gemmF16: variant === 'f16' ? 'on' : 'off' });
              await run(
                `gemm bf16 M=${M}${variant ? ` [${variant}]` : ''}`,
                `N=${N} K=${Kd}`,
                matmulCost(M, N, Kd, 'bf16'),
                () => K.matmul(gpu, out, x, w, M, N, Kd),
                M,
                () => kernelNote(gpu, 'matmul'),
              );
            }
          }
        } finally {
          Object.assign(K.tuning, before);
        }
        // Training's input gradient dx (M, K) += dy (M, N) . W: the same product through the weight's other side.
        await run(
          `gemm dx bf16 M=${M}`,
          `N=${N} K=${Kd}`,
          matmulCost(M, N, Kd, 'bf16'),
          () => K.matmulBackwardInput(gpu, x, out, w, M, N, Kd),
          M,
        );
      }
    }
    if (o.ops.includes('attention')) {
      const { attnT: T, NH, NKV, HD } = s;
      const q = bufs.f32(T * NH * HD, 'attn.q'),
        k = bufs.f32(T * NKV * HD, 'attn.k'),
        v = bufs.f32(T * NKV * HD, 'attn.v');
      const out = bufs.f32(T * NH * HD, 'attn.out'),
        lse = bufs.f32(T * NH, 'attn.lse');
      const dq = bufs.f32(T * NH * HD, 'attn.dq'),
        dk = bufs.f32(T * NKV * HD, 'attn.dk'),
        dv = bufs.f32(T * NKV * HD, 'attn.dv');
      const dout = bufs.f32(T * NH * HD, 'attn.dout');
      // Prefill over the paged cache (one slot, positions 0..T-1, pages in reverse order): side by side only.
      const pagesPerSlot = Math.ceil(T / KV_PAGE_SIZE);
      const kv: K.KvPaging = { dtype: o.kv, pageSize: KV_PAGE_SIZE, pages: pagesPerSlot, pagesPerSlot, maxT: T };
      const prefill = o.attentionVariants && {
        kCache: bufs.f32(K.kvPoolBytes(kv, NKV, HD) / 4, 'attn.kCache'),
        vCache: bufs.f32(K.kvPoolBytes(kv, NKV, HD) / 4, 'attn.vCache'),
        pageTable: bufs.u32(
          Array.from({ length: pagesPerSlot }, (_, i) => pagesPerSlot - 1 - i),
          'attn.pageTable',
        ),
        slot: bufs.u32(new Array(T).fill(0), 'attn.slot'),
        pos: bufs.u32(
          Array.from({ length: T }, (_, i) => i),
          'attn.pos',
        ),
      };
      if (prefill && o.kv === 'f16') fillHalf(gpu, [prefill.kCache, prefill.vCache]);
      // Side by side only, and for the tiled kernels (a tree takes no other): the same attention
      // over a packed round's tree (benchTree), its FLOPs counted on the visible pairs.
      const layout = benchTree(T);
      const tree = o.attentionVariants && { ...layout, buf: bufs.u32(layout.keyEnd, 'attn.keyEnd') };
      const shape = `T=${T} NH=${NH} NKV=${NKV} HD=${HD}`;
      const variants = o.attentionVariants?.variants ?? [undefined];
      const before = {
        attention: K.tuning.attention,
        attentionBackward: K.tuning.attentionBackward,
        attentionForward: K.tuning.attentionForward,
        attentionDkvRows: K.tuning.attentionDkvRows,
        attentionDkvGroup: K.tuning.attentionDkvGroup,
      };
      try {
        for (let round = 0; round < (o.attentionVariants?.rounds ?? 1); round++) {
          for (const variant of variants) {
            if (variant) {
              const [attention, how] = variant.split(':') as [
                'single' | 'tiled',
                ('row' | 'split' | 'splitwide' | 'blocks' | 'blocks2')?,
              ];
              const blocks = how === 'blocks' || how === 'blocks2';
              const rows = how === 'splitwide' ? 'split' : how === 'row' || how === 'split' ? how : undefined;
              Object.assign(K.tuning, {
                attention,
                attentionBackward: rows ?? (blocks ? 'blocks' : before.attentionBackward),
                attentionDkvGroup: how === 'splitwide' ? 'wide' : before.attentionDkvGroup,
                attentionForward: blocks ? 'blocks' : rows ? 'rows' : before.attentionForward,
                attentionDkvRows: how === 'blocks2' ? '2' : how === 'blocks' ? '4' : before.attentionDkvRows,
              });
            }
            const tag = variant ? ` [${variant}]` : '';
            await run(
              `attention fwd (train)${tag}`,
              shape,
              attentionCost(T, NH, NKV, HD),
              () => K.attentionForwardLse(gpu, out, lse, q, k, v, T, NH, NKV, HD),
              T,
              () => kernelNote(gpu, 'attentionForwardLse'),
            );
            await run(
              `attention bwd (train)${tag}`,
              shape,
              attentionBackwardCost(T, NH, NKV, HD),
              () => K.attentionBackward(gpu, dq, dk, dv, dout, out, lse, q, k, v, T, NH, NKV, HD),
              T,
              () =>
                `FLOPs: 5 products per pair (FA-2 count); ${kernelNote(gpu, 'attentionBackward')}, ${kernelNote(gpu, 'attentionBackward.dkv')}`,
            );
            if (tree && variant?.startsWith('tiled')) {
              const note = `a 40% prefix, two 30% branches: ${((100 * tree.pairs) / ((T * (T + 1)) / 2)).toFixed(0)}% of the causal pairs`;
              await run(
                `attention fwd (tree)${tag}`,
                shape,
                attentionCost(T, NH, NKV, HD, tree.pairs),
                () => K.attentionForwardLse(gpu, out, lse, q, k, v, T, NH, NKV, HD, tree.buf),
                T,
                () => `${note}; ${kernelNote(gpu, 'attentionForwardLse')}`,
              );
              await run(
                `attention bwd (tree)${tag}`,
                shape,
                attentionBackwardCost(T, NH, NKV, HD, tree.pairs),
                () => K.attentionBackward(gpu, dq, dk, dv, dout, out, lse, q, k, v, T, NH, NKV, HD, tree.buf),
                T,
                () => `${note}; ${kernelNote(gpu, 'attentionBackward')}, ${kernelNote(gpu, 'attentionBackward.dkv')}`,
              );
            }
            if (prefill) {
              const { kCache, vCache, pageTable, slot, pos } = prefill;
              await run(
                `attention prefill ${o.kv}${tag}`,
                shape,
                attentionCost(T, NH, NKV, HD),
                () => K.attention(gpu, out, q, kCache, vCache, pageTable, slot, pos, T, NH, NKV, HD, kv),
                T,
                () => kernelNote(gpu, 'attention'),
              );
            }
          }
        }
      } finally {
        Object.assign(K.tuning, before);
      }
    }
    if (o.ops.includes('decode-attention')) {
      const { decodeCtx: ctx, NH, NKV, HD } = s;
      const maxB = Math.max(...s.decodeB);
      const maxT = ctx + 1;
      const pagesPerSlot = Math.ceil(maxT / KV_PAGE_SIZE);
      const kv: K.KvPaging = { dtype: o.kv, pageSize: KV_PAGE_SIZE, pages: maxB * pagesPerSlot, pagesPerSlot, maxT };
      const poolFloats = K.kvPoolBytes(kv, NKV, HD) / 4;
      const kCache = bufs.f32(poolFloats, 'dec.k'),
        vCache = bufs.f32(poolFloats, 'dec.v');
      if (o.kv === 'f16') fillHalf(gpu, [kCache, vCache]);
      const pageTable = bufs.u32(
        Array.from({ length: maxB * pagesPerSlot }, (_, i) => i),
        'dec.pageTable',
      );
      const slot = bufs.u32(
        Array.from({ length: maxB }, (_, b) => b),
        'dec.slot',
      );
      const pos = bufs.u32(new Array(maxB).fill(ctx), 'dec.pos');
      const q = bufs.f32(maxB * NH * HD, 'dec.q'),
        out = bufs.f32(maxB * NH * HD, 'dec.out');
      const variants = o.decodeHeads?.variants ?? [undefined];
      const before = K.tuning.attentionHeads;
      try {
        for (const B of s.decodeB) {
          for (let round = 0; round < (o.decodeHeads?.rounds ?? 1); round++) {
            for (const heads of variants) {
              if (heads) K.tuning.attentionHeads = heads;
              await run(
                `decode attention ${o.kv} B=${B}${heads ? ` [${heads}]` : ''}`,
                `ctx=${ctx} NH=${NH} NKV=${NKV} HD=${HD}`,
                decodeAttentionCost(B, ctx + 1, NH, NKV, HD, o.kv === 'f16' ? 2 : 4),
                () => K.attention(gpu, out, q, kCache, vCache, pageTable, slot, pos, B, NH, NKV, HD, kv),
                B,
                () => kernelNote(gpu, 'attention'),
              );
            }
          }
        }
      } finally {
        K.tuning.attentionHeads = before;
      }
    }
  } finally {
    await gpu.sync();
    bufs.releaseAll();
  }
  return records;
}
