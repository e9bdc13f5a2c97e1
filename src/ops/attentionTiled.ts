// The query-tiled (FlashAttention-2 style) attention kernels of shaders/attention.wgsl (define TILED):
// tile geometry, the variant choice shared by the prefill and training ops, and their dispatches.
// forward.ts (attention) and backward.ts (attentionForwardLse, attentionBackward) check sizes and
// call in here when attentionVariant picks 'tiled'.
import type { Gpu } from '../gpu/device.ts';
import { f32, type Defines, type Kernel } from '../gpu/launch.ts';
import { ATTENTION_BINDINGS, GEMV_MAX_T, autoForCpu, bindings, opKernel, tuning, type KvPaging } from './common.ts';

/**
 * 'auto' on GPUs where the register-tiled kernels run (attentionForwardBlocks, and for training
 * attentionBackwardBlocks too): the blocked kernels from this many tokens, prefill and training.
 * Measured on an NVIDIA H100 at Qwen3-4B heads, 2026-12-06 (bench/attention-ab.ts, alternated
 * rounds): median ms of the blocked kernels (dK/dV at 2 keys a thread) / the per-(token, head)
 * ones ('single') / the tiled rows (split backward); T = 2,048 from the first run
 * (bench/results/2026-12-06-h100/attention-ab.log, two rounds: their mean), the others from the
 * second (bench/results/2026-12-06-h100-b/attention-ab.log, three rounds):
 *
 * | T | forward | backward | paged prefill (blocked / single) |
 * |---|---|---|---|
 * | 128 | 0.211 / 0.346 / 0.754 | 0.636 / 1.211 / 1.786 | 0.148 / 0.189 |
 * | 256 | 0.186 / 0.750 / 1.310 | 0.905 / 3.186 / 3.434 | 0.207 / 0.370 |
 * | 512 | 0.394 / 3.163 / 2.533 | 1.941 / 10.005 / 6.738 | 0.437 / 1.061 |
 * | 2,048 | 3.72 / 39.1 / 24.1 | 13.2 / 150 / 63.2 | 4.04 / 13.8 |
 *
 * Faster at every measured length; below 128 tokens (a few query tiles a KV head) unmeasured.
 */
export const ATTENTION_BLOCKED_MIN_T_GPU = 128;
/**
 * 'auto' on GPUs where the blocked kernels do not run (a head_dim that is not a multiple of 32,
 * too little workgroup memory, or tuning.attentionForward / attentionBackward 'rows' / 'split' /
 * 'row'), training (attentionForwardLse + attentionBackward without a prefix tree): the
 * tiled kernels from this many tokens. Measured on an NVIDIA H200 (bench/attention-ab.ts, Qwen3-4B
 * heads, bench/results/2026-12-04-h200/attention-ab.log): at T = 512 the per-(token, head) kernels
 * take 3.6 + 10.3 ms for forward + backward against the tiled 2.9 + 17.1 (the tiles make T/BQ *
 * NKV = 128 workgroups there, under one per multiprocessor); at T = 2,048 the tiled ones win
 * (forward 25 against 40-49 ms, backward 80 against 148). The crossover, interpolated between the
 * two, lies near 1,000 tokens. Packed trees (keyEnd) always take the tiled kernels.
 */
export const ATTENTION_TILED_MIN_T_GPU = 1024;
/**
 * 'auto' on GPUs without the blocked kernels, prefill over the paged cache: the tiled kernel from
 * this many tokens. On the
 * H200 the per-(token, head) kernel with a GQA group a workgroup was faster at both measured
 * lengths (T = 512: 1.35 ms against 3.0; T = 2,048: 14.3 against 25). Past the measured range its
 * K/V traffic, T^2 * NKV * HD / HG words, keeps growing where the tiles' does not: 4,096 is an
 * extrapolation, not a measurement.
 */
export const ATTENTION_TILED_MIN_T_GPU_PREFILL = 4096;
/**
 * 'auto' on CPU adapters (SwiftShader): the tiled kernels for chunks past the decode cutoff
 * (GEMV_MAX_T): measured 2-4x faster than the per-(token, head) kernels there at Qwen3-4B heads,
 * T = 64 and 256 (medians of alternated runs, bench/attention-ab.ts; 1.8-8x at T = 8 to 32),
 * barriers being the cost there. Decode batches (T <= 8) keep the existing kernels.
 */
export const ATTENTION_TILED_MIN_T_CPU = GEMV_MAX_T + 1;
/** Most (query, head) rows per workgroup (threads); a tile holds at least MIN_TILE_QUERIES tokens. */
const MAX_ROWS = 128;
const MIN_TILE_QUERIES = 8;
/** Keys (or query rows in dK/dV) per tile: at most this, fewer when the workgroup memory is small. */
const MAX_BK = 64;
/** Query-tile width when a tile holds one query head (no GQA group to share with). */
const MAX_TILE_QUERIES = 64;

export interface AttentionTiling {
  /** Tokens per query tile. */
  BQ: number;
  /** Query heads per tile: all NH/NKV heads of a GQA group when they fit, else a divisor. */
  HG: number;
  /** Threads per workgroup: BQ * HG rows (forward, dQ) or keys (dK/dV), times the backward's split. */
  ROWS: number;
  /** Keys (forward, dQ) or (query, head) pairs (dK/dV) per tile in workgroup memory. */
  BK: number;
}

/** Whether the tiled kernels take this head_dim: rows are vec4s. */
export function tiledHeadDim(HD: number): boolean {
  return HD % 4 === 0 && HD >= 4 && HD <= 256;
}

/**
 * Tile shapes for (NH, NKV, HD) on gpu. A workgroup takes the G = NH/NKV query heads of a KV
 * head together (each K/V tile read once for the group) unless G * MIN_TILE_QUERIES rows exceed
 * MAX_ROWS; then the largest divisor of G that fits. BK: the largest power of two whose K and V
 * tiles (2 * BK * HD f32) plus the per-pair scalars fit maxComputeWorkgroupStorageSize (16 KiB,
 * the WebGPU default: BK = 8 at HD 128).
 */
export function attentionTiling(gpu: Gpu, NH: number, NKV: number, HD: number, split = 1): AttentionTiling {
  const G = NH / NKV;
  // With the backward's rows split over `split` threads (ROWS counts threads): fewer rows a workgroup.
  const maxRows = Math.min(MAX_ROWS, Math.floor(gpu.limits.maxComputeInvocationsPerWorkgroup / split));
  let HG = 1;
  for (let d = 1; d <= G; d++) if (G % d === 0 && d * MIN_TILE_QUERIES <= maxRows) HG = d;
  const BQ = Math.min(MAX_TILE_QUERIES, Math.floor(maxRows / HG));
  const budget = gpu.limits.maxComputeWorkgroupStorageSize - 64; // runEnd/runKeys/runSlot
  let BK = MAX_BK;
  while (BK > 1 && 2 * BK * HD * 4 + 2 * BK * 4 > budget) BK /= 2;
  return { BQ, HG, ROWS: BQ * HG * split, BK };
}

/** Threads a row of the tiled backward takes (shaders/attention.wgsl SPLIT): 1 or BACKWARD_SPLIT. */
export const BACKWARD_SPLIT = 4;

/**
 * The tiled backward's threads per row (tuning.attentionBackward): BACKWARD_SPLIT where the
 * subgroup sums can run (the subgroups feature, subgroups known to be at least that wide, whole
 * vec4s a thread) and 'auto' is on a GPU or 'split' is forced; else 1 (one thread per row).
 */
export function backwardSplit(gpu: Gpu, HD: number): number {
  const S = BACKWARD_SPLIT;
  const can = gpu.features.subgroups && gpu.info.subgroupMinSize >= S && (HD / 4) % S === 0;
  if (tuning.attentionBackward === 'row' || !can) return 1;
  return tuning.attentionBackward === 'split' || !autoForCpu(gpu) ? S : 1;
}

/** The tiled dK/dV pass's threads a workgroup at least, where it narrows (dkvThreads). */
export const MIN_DKV_THREADS = 64;

/**
 * Threads of a tiled dK/dV workgroup (attention_tiled_dkv's ROWS; its keys are that over the
 * split S): the tiling's ROWS ('wide', and 'auto' on CPU adapters, which keep the grouping their
 * timings were measured with), or on GPUs BQ * S, at least MIN_DKV_THREADS: a workgroup of the query
 * tile's BQ keys, so the pass has as many workgroups as the dQ pass (T / BQ times the KV heads,
 * with the GQA group's heads in one dQ tile) instead of HG times fewer. The H200's profile of a
 * 512-token LoRA step (bench/results/2026-12-04-h200/round.log): dK/dV 13.4 ms a layer in 32
 * workgroups, dQ 2.4 ms in 128.
 */
export function dkvThreads(gpu: Gpu, t: AttentionTiling, S: number): number {
  if (tuning.attentionDkvGroup === 'wide' || autoForCpu(gpu)) return t.ROWS;
  return Math.min(t.ROWS, Math.max(MIN_DKV_THREADS, t.BQ * S));
}

/**
 * Whether a chunk of T tokens takes the tiled kernels: tuning.attention 'tiled' forces them
 * (except for a head_dim they do not take: then the per-(token, head) kernel), 'single' and
 * 'split' force the others, 'auto' takes them from attentionTiledMinT's length. Both training
 * ops use the training rule, so a training forward and its backward run the same arrangement.
 */
export function attentionVariant(gpu: Gpu, T: number, HD: number, use: 'prefill' | 'training'): 'tiled' | 'other' {
  if (!tiledHeadDim(HD)) return 'other';
  if (tuning.attention === 'tiled') return 'tiled';
  if (tuning.attention !== 'auto') return 'other';
  return T >= attentionTiledMinT(gpu, use, HD) ? 'tiled' : 'other';
}

/**
 * The length from which 'auto' takes the tiled kernels on this adapter, for prefill or training
 * at head_dim HD: ATTENTION_TILED_MIN_T_CPU on CPU adapters; on GPUs ATTENTION_BLOCKED_MIN_T_GPU
 * where the blocked kernels run (the forward's for prefill, the forward's and the backward's for
 * training), else ATTENTION_TILED_MIN_T_GPU_PREFILL or ATTENTION_TILED_MIN_T_GPU (the rows').
 */
export function attentionTiledMinT(gpu: Gpu, use: 'prefill' | 'training', HD: number): number {
  if (autoForCpu(gpu)) return ATTENTION_TILED_MIN_T_CPU;
  const blocked = useBlocks(gpu, 'forward', HD) && (use === 'prefill' || useBlocks(gpu, 'backward', HD));
  if (blocked) return ATTENTION_BLOCKED_MIN_T_GPU;
  return use === 'prefill' ? ATTENTION_TILED_MIN_T_GPU_PREFILL : ATTENTION_TILED_MIN_T_GPU;
}

function defines(t: AttentionTiling, HD: number, kv?: KvPaging): Defines {
  return kv ? { HDT: HD, BK: t.BK, KV: kv.dtype } : { HDT: HD, BK: t.BK };
}

/** Prefill over the paged cache (forward.ts attention's arguments, sizes already checked). */
export function attentionTiledPaged(
  gpu: Gpu,
  out: GPUBuffer,
  q: GPUBuffer,
  kCache: GPUBuffer,
  vCache: GPUBuffer,
  pageTable: GPUBuffer,
  slot: GPUBuffer,
  pos: GPUBuffer,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  kv: KvPaging,
  pageShift: number,
): void {
  const b = attentionForwardBlocks(gpu, NH, NKV, HD);
  if (b) {
    const { defines: d, t } = blockedKernel(b, HD, false);
    gpu.dispatch(
      opKernel(gpu, 'attention', 'attention', 'attention_blocked', { ...d, KV: kv.dtype }),
      bindings(ATTENTION_BINDINGS.attention_tiled, { out, q, kCache, vCache, pageTable, slot, pos }),
      queryGroups(T, NH, NKV, t),
      [T, NH, NKV, t.BQ, t.HG, kv.maxT, f32(1 / Math.sqrt(HD)), kv.pagesPerSlot, pageShift, HD / 4],
    );
    return;
  }
  const t = attentionTiling(gpu, NH, NKV, HD);
  gpu.dispatch(
    opKernel(gpu, 'attention', 'attention', 'attention_tiled', { ...defines(t, HD, kv), TILED: 1 }, { ROWS: t.ROWS }),
    bindings(ATTENTION_BINDINGS.attention_tiled, { out, q, kCache, vCache, pageTable, slot, pos }),
    queryGroups(T, NH, NKV, t),
    [T, NH, NKV, t.BQ, t.HG, kv.maxT, f32(1 / Math.sqrt(HD)), kv.pagesPerSlot, pageShift, HD / 4],
  );
}

/** Workgroups of the forward and dQ kernels: query tiles times head groups. */
function queryGroups(T: number, NH: number, NKV: number, t: AttentionTiling): number {
  return Math.ceil(T / t.BQ) * NKV * (NH / NKV / t.HG);
}

function trainingParams(T: number, NH: number, NKV: number, HD: number, t: AttentionTiling) {
  return [T, NH, NKV, t.BQ, t.HG, T, f32(1 / Math.sqrt(HD)), 0, 0, HD / 4];
}

/** Storage bindings the tree backward takes (attention_tiled_dq_tree). */
export const TREE_ATTENTION_BINDINGS = ATTENTION_BINDINGS.attention_tiled_dq_tree.length;

/**
 * Whether this GPU runs the training attention over a packed prefix tree (define TREE, a keyEnd
 * buffer): the tiled kernels take the head_dim, and the backward's 9 storage bindings fit
 * maxStorageBuffersPerShaderStage (the WebGPU default is 8; most adapters offer more).
 */
export function treeAttentionSupported(gpu: Gpu, HD: number): boolean {
  return tiledHeadDim(HD) && gpu.limits.maxStorageBuffersPerShaderStage >= TREE_ATTENTION_BINDINGS;
}

/**
 * The register-tiled kernels' geometry (shaders/attention.wgsl BLOCKED: attention_blocked_lse,
 * attention_blocked, attention_blocked_dq / _dkv, whose dK/dV workgroups own 16 RI keys): 128 threads as 16 x 8, each holding RI rows of the workgroup's 16 RI (query, head) rows times
 * KJ of a tile's 8 KJ keys (S) or HD/32 of the head dim's vec4s (O); the head dim summed in
 * chunks of DC. HG and BQ as attentionTiling: HG the largest divisor of NH/NKV that divides the
 * rows, BQ = rows / HG tokens.
 */
export interface AttentionBlocking {
  RI: number;
  KJ: number;
  DC: number;
  HG: number;
  BQ: number;
}

/**
 * Workgroup bytes of the blocked kernels at (RI, KJ, DC), as the shader declares them; `tree`
 * adds the key ends of a packed tree (128 bytes at KJ 4), an allowance that also covers the
 * paged prefill's 12 bytes of run bounds.
 */
export function attentionBlockedBytes(HD: number, RI: number, KJ: number, DC: number, tree: boolean): number {
  const R = 16 * RI,
    BKB = 8 * KJ,
    QST = DC / 4 + 1;
  const area = Math.max((R + BKB) * QST, BKB * (HD / 4)) * 16;
  // the staging region, P / dS, the rows' partial maxima and sums, dK/dV's pairs' lse and D
  return area + R * (BKB + 1) * 4 + 2 * R * 8 * 4 + 2 * BKB * 4 + (tree ? BKB * 4 : 0);
}

/**
 * The largest blocks that fit the adapter's workgroup memory (with a packed tree's key ends),
 * most rows and keys first, then the longest head-dim chunk; null where the head dim is not a
 * multiple of 32 or nothing fits.
 */
export function attentionBlocking(gpu: Gpu, NH: number, NKV: number, HD: number): AttentionBlocking | null {
  if (HD % 32 !== 0 || HD > 256) return null;
  const G = NH / NKV;
  const budget = gpu.limits.maxComputeWorkgroupStorageSize;
  for (const [RI, KJ] of [
    [4, 4],
    [4, 2],
    [2, 2],
    [2, 1],
    [1, 1],
  ] as const) {
    for (let DC = HD; DC >= 16; DC /= 2) {
      if (attentionBlockedBytes(HD, RI, KJ, DC, true) > budget) continue;
      const R = 16 * RI;
      let HG = 1;
      for (let d = 1; d <= G; d++) if (G % d === 0 && R % d === 0) HG = d;
      return { RI, KJ, DC, HG, BQ: R / HG };
    }
  }
  return null;
}

/**
 * Whether the tiled forward ('forward': training and prefill) or backward takes the blocked
 * kernels at head_dim HD: tuning.attentionForward / attentionBackward 'blocks', or 'auto' on GPUs
 * (not on CPU adapters, where SwiftShader ran them at 0.6-0.7x the rows' speed), where they fit
 * (attentionBlocking).
 */
function useBlocks(gpu: Gpu, pass: 'forward' | 'backward', HD: number): boolean {
  const choice = pass === 'forward' ? tuning.attentionForward : tuning.attentionBackward;
  const wanted = choice === 'blocks' || (choice === 'auto' && !autoForCpu(gpu));
  return wanted && attentionBlocking(gpu, 1, 1, HD) !== null;
}

/** The tiled forwards' kernels (training and prefill): the blocked ones where useBlocks says so. */
export function attentionForwardBlocks(gpu: Gpu, NH: number, NKV: number, HD: number): AttentionBlocking | null {
  return useBlocks(gpu, 'forward', HD) ? attentionBlocking(gpu, NH, NKV, HD) : null;
}

/** The backward's kernels: the blocked ones where useBlocks says so. */
export function attentionBackwardBlocks(gpu: Gpu, NH: number, NKV: number, HD: number): AttentionBlocking | null {
  return useBlocks(gpu, 'backward', HD) ? attentionBlocking(gpu, NH, NKV, HD) : null;
}

/**
 * The blocked dK/dV kernel's most keys a thread (its RI, at most the geometry's): tuning.attentionDkvRows,
 * whose 'auto' is 2 on GPUs and the geometry's (4 at Qwen3-4B heads) on CPU adapters. On an NVIDIA
 * H100 (bench/results/2026-12-06-h100/attention-ab.log, Qwen3-4B heads) the backward took 1.9-2.1
 * ms at 2 keys a thread against 2.3 at 4 (T = 512), and 12.9-13.6 against 17.5-18.6 (T = 2,048).
 */
export function dkvRows(gpu: Gpu): number {
  const rows = tuning.attentionDkvRows;
  return rows === 'auto' ? (autoForCpu(gpu) ? 4 : 2) : Number(rows);
}

/** The blocked kernels' defines, and their tiling in attentionTiling's terms (params, grid). */
function blockedKernel(b: AttentionBlocking, HD: number, tree: boolean): { defines: Defines; t: AttentionTiling } {
  const t: AttentionTiling = { BQ: b.BQ, HG: b.HG, ROWS: 128, BK: 8 * b.KJ };
  return {
    t,
    defines: { ...defines(t, HD), TILED: 1, BLOCKED: 1, RI: b.RI, KJ: b.KJ, DC: b.DC, ...(tree ? { TREE: 1 } : {}) },
  };
}

/** Training forward with lse (backward.ts attentionForwardLse's arguments, sizes checked). */
export function attentionTiledLse(
  gpu: Gpu,
  out: GPUBuffer,
  lse: GPUBuffer,
  q: GPUBuffer,
  k: GPUBuffer,
  v: GPUBuffer,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  keyEnd: GPUBuffer | null = null,
): void {
  const b = attentionForwardBlocks(gpu, NH, NKV, HD);
  if (b) {
    const { defines: d, t } = blockedKernel(b, HD, keyEnd !== null);
    gpu.dispatch(
      opKernel(gpu, 'attentionForwardLse', 'attention', 'attention_blocked_lse', d),
      keyEnd
        ? bindings(ATTENTION_BINDINGS.attention_tiled_lse_tree, { out, q, k, v, lse, keyEnd })
        : bindings(ATTENTION_BINDINGS.attention_tiled_lse, { out, q, k, v, lse }),
      queryGroups(T, NH, NKV, t),
      trainingParams(T, NH, NKV, HD, t),
    );
    return;
  }
  const t = attentionTiling(gpu, NH, NKV, HD);
  gpu.dispatch(
    opKernel(
      gpu,
      'attentionForwardLse',
      'attention',
      'attention_tiled_lse',
      { ...defines(t, HD), TILED: 1, ...(keyEnd ? { TREE: 1 } : {}) },
      { ROWS: t.ROWS },
    ),
    keyEnd
      ? bindings(ATTENTION_BINDINGS.attention_tiled_lse_tree, { out, q, k, v, lse, keyEnd })
      : bindings(ATTENTION_BINDINGS.attention_tiled_lse, { out, q, k, v, lse }),
    queryGroups(T, NH, NKV, t),
    trainingParams(T, NH, NKV, HD, t),
  );
}

/**
 * The FA2 backward: a dQ pass over query tiles (also writing D = rowsum(dout * out) into rowDot),
 * then a dK/dV pass, one workgroup per tile of t.ROWS keys of a KV head walking every (query,
 * head) pair of its GQA group that attends to them. Adds into dq, dk, dv.
 */
export function attentionTiledBackward(
  gpu: Gpu,
  dq: GPUBuffer,
  dk: GPUBuffer,
  dv: GPUBuffer,
  dout: GPUBuffer,
  out: GPUBuffer,
  lse: GPUBuffer,
  q: GPUBuffer,
  k: GPUBuffer,
  v: GPUBuffer,
  rowDot: GPUBuffer,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  keyEnd: GPUBuffer | null = null,
): void {
  const dqBindings = keyEnd
    ? bindings(ATTENTION_BINDINGS.attention_tiled_dq_tree, { dq, q, k, v, dout, lse, D: rowDot, out, keyEnd })
    : bindings(ATTENTION_BINDINGS.attention_tiled_dq, { dq, q, k, v, dout, lse, D: rowDot, out });
  const dkvBindings = keyEnd
    ? bindings(ATTENTION_BINDINGS.attention_tiled_dkv_tree, { dk, q, k, v, dout, lse, D: rowDot, dv, keyEnd })
    : bindings(ATTENTION_BINDINGS.attention_tiled_dkv, { dk, q, k, v, dout, lse, D: rowDot, dv });
  // The kernels, their tiling, and the keys a dK/dV workgroup owns.
  const b = attentionBackwardBlocks(gpu, NH, NKV, HD);
  let kernels: { dq: Kernel; dkv: Kernel; t: AttentionTiling; keysPerGroup: number };
  if (b) {
    const { defines: d, t } = blockedKernel(b, HD, keyEnd !== null);
    // dK/dV's keys a thread: the geometry's or fewer (dkvRows; less memory, so it fits)
    const kb = { ...b, RI: Math.min(b.RI, dkvRows(gpu)) };
    kernels = {
      dq: opKernel(gpu, 'attentionBackward', 'attention', 'attention_blocked_dq', d),
      dkv: opKernel(
        gpu,
        'attentionBackward.dkv',
        'attention',
        'attention_blocked_dkv',
        blockedKernel(kb, HD, keyEnd !== null).defines,
      ),
      t,
      keysPerGroup: 16 * kb.RI,
    };
  } else {
    const S = backwardSplit(gpu, HD);
    const t = attentionTiling(gpu, NH, NKV, HD, S);
    const d: Defines = { ...defines(t, HD), TILED: 1, ...(S > 1 ? { SPLIT: S } : {}), ...(keyEnd ? { TREE: 1 } : {}) };
    const dkvRows = dkvThreads(gpu, t, S);
    kernels = {
      dq: opKernel(gpu, 'attentionBackward', 'attention', 'attention_tiled_dq', d, { ROWS: t.ROWS }),
      dkv: opKernel(gpu, 'attentionBackward.dkv', 'attention', 'attention_tiled_dkv', d, { ROWS: dkvRows }),
      t,
      // dkvRows / S keys each
      keysPerGroup: dkvRows / S,
    };
  }
  const params = trainingParams(T, NH, NKV, HD, kernels.t);
  gpu.dispatch(kernels.dq, dqBindings, queryGroups(T, NH, NKV, kernels.t), params);
  gpu.dispatch(kernels.dkv, dkvBindings, Math.ceil(T / kernels.keysPerGroup) * NKV, params);
}
