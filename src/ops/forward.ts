// Forward ops of the Qwen3 model (docs/ENGINE.md). Each checks its sizes, then encodes one
// dispatch into gpu's pending encoder: no GPU sync, no allocation except cached constant tables.
// Argument order (llm.c): outputs, saved tensors, inputs/weights, sizes.
import type { Gpu } from '../gpu/device.ts';
import type { Defines, Param } from '../gpu/launch.ts';
import type { DefineValue } from '../gpu/preprocess.ts';
import { f32, splitGrid } from '../gpu/launch.ts';
import { bufferSize } from '../gpu/pool.ts';
import {
  ATTENTION_BINDINGS,
  ELEMS_PER_WG,
  GEMV_MAX_T,
  autoForCpu,
  bindings,
  bf16Bytes,
  check,
  checkSize,
  checkWeight,
  distinct,
  opKernel,
  subgroupDefines,
  tuning,
  type Tuning,
  useSubgroups,
  kvPoolBytes,
  q4Words,
  weightFormat,
  type KvPaging,
  type Weight,
  type WeightFormat,
} from './common.ts';
import {
  colsPerThread,
  colsShapeFits,
  colsSplit,
  lanesSplit,
  LANES_MAX,
  nextAParts,
  tmaxFor,
  wideLanes,
} from './colsSplit.ts';
export { nextAParts } from './colsSplit.ts';
import { GEMM_TILE_M, GEMM_TILE_M_TALL, GEMM_TILE_N, splitKFor } from './splitK.ts';
import { q4DequantFor } from './q4Dequant.ts';
import { dequantizeQ4 } from './quant.ts';
import { attentionTiledPaged, attentionVariant } from './attentionTiled.ts';

/** out (T, C) f32 = table[ids] ; ids (T) u32 (< V) ; table (V, C) bf16 or q4 */
export function embed(gpu: Gpu, out: GPUBuffer, ids: GPUBuffer, table: Weight, T: number, C: number, V: number): void {
  checkSize(out, T * C * 4, 'embed out');
  checkSize(ids, T * 4, 'embed ids');
  const tb = checkWeight(table, V, C, 'embed table');
  gpu.dispatch(
    opKernel(gpu, 'embed', 'embed', 'gather_rows', { WEIGHTS: weightFormat(table) }),
    [out, ids, tb],
    Math.ceil((T * C) / ELEMS_PER_WG),
    [T, C, V],
  );
}

/**
 * out (T, C) f32 = table[ids[pick]] ; pick (T) u32, each < nIds ; ids (nIds) u32 (< V) ; table (V, C)
 * bf16 or q4. The decode step's embedding of ids sampled on the GPU (sampleRows), no readback.
 */
export function embedPicked(
  gpu: Gpu,
  out: GPUBuffer,
  ids: GPUBuffer,
  pick: GPUBuffer,
  table: Weight,
  T: number,
  C: number,
  V: number,
  nIds: number,
): void {
  checkSize(out, T * C * 4, 'embedPicked out');
  checkSize(ids, nIds * 4, 'embedPicked ids');
  checkSize(pick, T * 4, 'embedPicked pick');
  const tb = checkWeight(table, V, C, 'embedPicked table');
  distinct('embedPicked', out, ids, pick);
  gpu.dispatch(
    opKernel(gpu, 'embedPicked', 'embed', 'gather_rows', { WEIGHTS: weightFormat(table), PICK: true }),
    [out, ids, tb, pick],
    Math.ceil((T * C) / ELEMS_PER_WG),
    [T, C, V],
  );
}

/** out (R, D) f32 = w * x * rsqrt(mean(x^2) + eps) ; x (R, D) f32 ; w (D) bf16 */
export function rmsNorm(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, w: GPUBuffer, R: number, D: number, eps: number): void {
  checkSize(out, R * D * 4, 'rmsNorm out');
  checkSize(x, R * D * 4, 'rmsNorm x');
  checkSize(w, bf16Bytes(D), 'rmsNorm w');
  check(out !== x, 'rmsNorm: out and x must differ');
  const WG = D <= 512 ? 64 : 256;
  gpu.dispatch(
    opKernel(gpu, 'rmsNorm', 'rmsnorm', 'rmsnorm_forward', subgroupDefines(useSubgroups(gpu)), { WG }),
    [out, x, w],
    R,
    [R, D, f32(eps)],
  );
}

/** gemm_tiled's output tile (shaders/matmul.wgsl BM x BN; BM is TILE_M_TALL with define TM8). */
const TILE_M = GEMM_TILE_M,
  TILE_M_TALL = GEMM_TILE_M_TALL,
  TILE_N = GEMM_TILE_N;

/** Workgroup memory of gemm_tiled's TM8 tiles in f32: A (128, 5) and B (128, 5) vec4s. */
const TM8_SHARED_BYTES = 2 * 128 * 5 * 16;

/**
 * The rows of gemm_tiled's output tiles where it takes 16-byte loads (tuning.gemmTile): 128
 * (define TM8) when '128' asks for them and the device's workgroup memory holds them, else 64.
 */
export function gemmTileRows(gpu: Gpu): number {
  const tall = tuning.gemmTile === '128' && gpu.limits.maxComputeWorkgroupStorageSize >= TM8_SHARED_BYTES;
  return tall ? TILE_M_TALL : TILE_M;
}

/** GEMV lanes per output column: ~4+ weight words per lane, 64 lanes from R >= 512; tiny R gets more columns per workgroup. */
const gemvLanes = (R: number) => Math.min(64, Math.max(4, 2 ** Math.floor(Math.log2(Math.max(1, R / 8)))));

function gemvDefines(gpu: Gpu, WEIGHTS: WeightFormat, M: number, R: number) {
  return { WEIGHTS, TMAX: tmaxFor(M), LANES: gemvLanes(R), ...subgroupDefines(useSubgroups(gpu)) };
}

/** Elements per 16-byte weight block of shaders/gemv.wgsl. */
const BLOCK_ELEMS: Record<WeightFormat, number> = { f32: 4, bf16: 8, q4: 32 };

const wholeVec4Bytes = (buf: GPUBuffer) => Math.floor(bufferSize(buf) / 16) * 16;

/**
 * Whether shaders/gemv.wgsl takes out (M, N) = x (M, K) . w (N, K)^T: K a whole number of weight
 * blocks (so every row of w and x starts on 16 bytes) and both buffers bound as whole vec4
 * arrays (a q4 tensor's last scale word may end mid-vec4).
 */
function blockGemvFits(x: GPUBuffer, w: GPUBuffer, WEIGHTS: WeightFormat, M: number, N: number, K: number): boolean {
  if (K % BLOCK_ELEMS[WEIGHTS] !== 0) return false;
  const wBytes = WEIGHTS === 'q4' ? q4Words(N, K) * 4 : WEIGHTS === 'bf16' ? N * K * 2 : N * K * 4;
  return wholeVec4Bytes(w) >= Math.ceil(wBytes / 16) * 16 && wholeVec4Bytes(x) >= M * K * 4;
}

/** shaders/gemv.wgsl's defines (blockDefines): the shape's, then the group and these flags. */
type BlockDefines = Defines & {
  readonly WEIGHTS: WeightFormat;
  readonly TMAX: number;
  readonly COLS: number;
  readonly LANES?: number;
  readonly XS?: number;
};
type LanesDefines = BlockDefines & { readonly LANES: number; readonly XS: number; readonly CPT?: number };
/** blockDefines' flags: each sets its define to 1. */
const NORM_FLAG = 1,
  SILU_FLAG = 2,
  LORA_FLAG = 4,
  XEACH_FLAG = 8,
  LORAPACK_FLAG = 16,
  NEXTA_FLAG = 32,
  NEXTA2_FLAG = 64,
  PAIR_FLAG = 128;
const WEIGHT_CODES: Record<WeightFormat, number> = { f32: 0, bf16: 1, q4: 2 };
const blockDefinesMemo = new Map<number, BlockDefines>();
/** blockDefines with define UPART (its workgroup array's length), by the key without it, then by it. */
const upartDefinesMemo = new Map<number, Map<number, BlockDefines>>();
const fitsBits = (v: number, bits: number) => Number.isInteger(v) && v >= 0 && v < 2 ** bits;

/**
 * shaders/gemv.wgsl's defines as one frozen object per content, found by a number packed from the
 * values (52 bits, exact in a double), so a dispatch builds no object and the pipeline cache finds
 * its kernel by identity (src/gpu/launch.ts). A decode step makes hundreds of these calls; the
 * object spreads they replace were a sixth of its encoding (bench/decode-encode.ts). LANES and XS
 * of 0 leave their define out (gemv_rows, gemv_cols), and so does a CPT of 1 (gemv_lanes' columns
 * a thread), and a UPART of 0 (a group's u gathered from partial sums: its value the length of the
 * kernel's array for it).
 */
function blockDefines(
  WEIGHTS: WeightFormat,
  TMAX: number,
  COLS: number,
  LANES = 0,
  XS = 0,
  subgroups = false,
  GROUP = 0,
  flags = 0,
  CPT = 1,
  UPART = 0,
): BlockDefines {
  const cptCode = CPT === 1 ? 0 : CPT === 2 ? 1 : CPT === 4 ? 2 : -1;
  const packs =
    fitsBits(TMAX, 8) &&
    fitsBits(COLS, 9) &&
    fitsBits(LANES, 8) &&
    fitsBits(XS, 13) &&
    fitsBits(GROUP, 2) &&
    cptCode >= 0;
  const key = packs
    ? ((((((WEIGHT_CODES[WEIGHTS] * 256 + TMAX) * 512 + COLS) * 256 + LANES) * 8192 + XS) * 2 + (subgroups ? 1 : 0)) *
        4 +
        cptCode) *
        1024 +
      GROUP * 256 +
      (flags & 255)
    : -1;
  const hit = UPART === 0 ? blockDefinesMemo.get(key) : upartDefinesMemo.get(key)?.get(UPART);
  if (hit) return hit;
  const d: Record<string, DefineValue> = { WEIGHTS, TMAX };
  if (LANES) d.LANES = LANES;
  d.COLS = COLS;
  if (CPT !== 1) d.CPT = CPT;
  if (XS) d.XS = XS;
  if (subgroups) d.SUBGROUPS = 1;
  if (GROUP) d.GROUP = GROUP;
  if (flags & NORM_FLAG) d.NORM = 1;
  if (flags & SILU_FLAG) d.SILU = 1;
  if (flags & LORA_FLAG) d.LORA = 1;
  if (flags & XEACH_FLAG) d.XEACH = 1;
  if (flags & LORAPACK_FLAG) d.LORAPACK = 1;
  if (flags & NEXTA_FLAG) d.NEXTA = 1;
  if (flags & NEXTA2_FLAG) d.NEXTA2 = 1;
  if (flags & PAIR_FLAG) d.PAIR = 1;
  if (UPART) d.UPART = UPART;
  const out = d as BlockDefines;
  if (!packs) return out; // outside the packing: built each call, and looked up by its values
  if (UPART === 0) blockDefinesMemo.set(key, Object.freeze(out));
  else {
    let byPart = upartDefinesMemo.get(key);
    if (!byPart) upartDefinesMemo.set(key, (byPart = new Map()));
    byPart.set(UPART, Object.freeze(out));
  }
  return out;
}

/** d with the group, flags and UPART set (those of d dropped); LANES replaced (COLS 256 / LANES) when given. */
function withBlock<D extends BlockDefines>(d: D, GROUP: number, flags: number, LANES = d.LANES ?? 0, UPART = 0): D {
  const COLS = LANES === (d.LANES ?? 0) ? d.COLS : 256 / LANES;
  return blockDefines(d.WEIGHTS, d.TMAX, COLS, LANES, d.XS ?? 0, 'SUBGROUPS' in d, GROUP, flags, 1, UPART) as D;
}

/** blockDefines' flags of d (NORM, SILU, LORA, XEACH, LORAPACK, NEXTA, NEXTA2, PAIR). */
const flagsOf = (d: BlockDefines) =>
  ('NORM' in d ? NORM_FLAG : 0) |
  ('SILU' in d ? SILU_FLAG : 0) |
  ('LORA' in d ? LORA_FLAG : 0) |
  ('XEACH' in d ? XEACH_FLAG : 0) |
  ('LORAPACK' in d ? LORAPACK_FLAG : 0) |
  ('NEXTA' in d ? NEXTA_FLAG : 0) |
  ('NEXTA2' in d ? NEXTA2_FLAG : 0) |
  ('PAIR' in d ? PAIR_FLAG : 0);

/**
 * gemv_lanes' defines d (one column a thread) with CPT columns a thread (tuning.gemvCols,
 * colsPerThread): LANES times CPT lanes a column, the same COLS a workgroup, so the same grid.
 * Rows of K elements. Never for a split over K (its slices are whole rounds of d's lanes).
 */
function withColsPerThread(gpu: Gpu, d: LanesDefines, K: number): LanesDefines {
  const be = BLOCK_ELEMS[d.WEIGHTS];
  const forced = tuning.gemvCols === 'auto' ? 0 : Number(tuning.gemvCols);
  let CPT = forced || (autoForCpu(gpu) ? 1 : colsPerThread(d.LANES, K, be, (d.XS / d.TMAX) * 4));
  while (CPT > 1 && d.LANES * CPT > LANES_MAX) CPT /= 2;
  if (CPT === 1) return d;
  const GROUP = Number(d.GROUP ?? 0);
  return blockDefines(
    d.WEIGHTS,
    d.TMAX,
    d.COLS,
    d.LANES * CPT,
    d.XS,
    'SUBGROUPS' in d,
    GROUP,
    flagsOf(d),
    CPT,
    Number(d.UPART ?? 0),
  ) as LanesDefines;
}

/** gemv_lanes' threads per output column: ~8+ 16-byte blocks per lane, 4 to 16 lanes (or tuning.gemvLanes). */
const stagedLanes = (K: number, WEIGHTS: WeightFormat) =>
  tuning.gemvLanes !== 'auto'
    ? Number(tuning.gemvLanes)
    : Math.min(16, Math.max(4, 2 ** Math.floor(Math.log2(Math.max(1, K / BLOCK_ELEMS[WEIGHTS] / 8)))));

/**
 * gemv_lanes' staged x in vec4s (define XS, a power of two): 1024 (16 KB) where the device's
 * workgroup memory also holds the lane reduction's TMAX KB, else 512 (8 KB: the WebGPU default of
 * 16 KB holds it at TMAX 8). Fewer, longer chunks: fewer barriers and x loads between weight loads.
 * With a folded norm (define NORM) 512: its rstd tree over a row's chunk grows with XS, and on
 * lavapipe those pipelines took 2.7x longer to compile at 1024 (test/ops/normFold.test.ts).
 */
function stagedVec4s(gpu: Gpu, TMAX: number, norm: boolean): number {
  return !norm && 1024 * 16 + TMAX * 1024 <= gpu.limits.maxComputeWorkgroupStorageSize ? 1024 : 512;
}

/** Whether gemv_lanes widens its lanes where its columns make few workgroups (tuning.gemvWideLanes). */
const widensLanes = (gpu: Gpu) =>
  tuning.gemvWideLanes === 'on' || (tuning.gemvWideLanes === 'auto' && !autoForCpu(gpu));

/**
 * gemv_lanes' defines for M rows of x over rows of K elements. With N (the columns of each
 * weight; a group's widest) the lanes widen where those make few workgroups (wideLanes), else
 * stagedLanes alone.
 */
function lanesDefines(
  gpu: Gpu,
  WEIGHTS: WeightFormat,
  M: number,
  K: number,
  norm = false,
  N?: number,
  GROUP = 0,
  flags = 0,
  UPART = 0,
): LanesDefines {
  const staged = stagedLanes(K, WEIGHTS);
  const LANES = N !== undefined && widensLanes(gpu) ? wideLanes(N, K, BLOCK_ELEMS[WEIGHTS], staged) : staged;
  const TMAX = tmaxFor(M);
  const XS = stagedVec4s(gpu, TMAX, norm);
  return blockDefines(WEIGHTS, TMAX, 256 / LANES, LANES, XS, useSubgroups(gpu), GROUP, flags, 1, UPART) as LanesDefines;
}

/**
 * out (M, N) (+)= scale * x (M, K) . w (N, K)^T over 16-byte weight blocks (shaders/gemv.wgsl):
 * 'rows' gemv_rows (CPU adapters): COLS = 4 columns per thread, TMAX rows of x per z;
 * 'lanes' gemv_lanes (GPUs, M <= GEMV_MAX_T): LANES threads per column, 256 / LANES columns per
 * workgroup sharing x staged in workgroup memory; split over K where its columns make few
 * workgroups (tuning.gemvSplitK, lanesSplit: the LoRA A products), the slices' partial sums in a
 * pooled scratch that gemv_cols_reduce adds in order (not with a LoRA epilogue in the store).
 * With `next` ('lanes' only, never split): the next norm's LoRA A partial sums too (NextAProduct);
 * returns how many partials a row it wrote (its workgroups), 0 without `next`.
 */
function blockGemv(
  gpu: Gpu,
  op: string,
  entry: 'rows' | 'lanes',
  out: GPUBuffer,
  x: GPUBuffer,
  w: GPUBuffer,
  WEIGHTS: WeightFormat,
  M: number,
  N: number,
  K: number,
  accumulate: boolean,
  scale: number,
  lora?: LoraEpilogue,
  up?: GPUBuffer,
  norm?: FoldedNorm,
  next?: NextAProduct,
): number {
  const TMAX = tmaxFor(M);
  // gemv_rows' columns per thread: each read of x then serves COLS columns. On SwiftShader, bf16
  // 9728 x 2560: 4 took half the time of 1 at M = 1 and 4, and 0.8x the time of 2 at M = 8 (bf16 and q4).
  check(!up || entry === 'lanes', () => `${op}: a folded SwiGLU needs gemv_lanes`); // the callers check first
  check(!norm || (entry === 'lanes' && !up && !lora), () => `${op}: a folded norm needs gemv_lanes alone`);
  check(!next || (entry === 'lanes' && !norm), () => `${op}: the next A product needs gemv_lanes without a norm`);
  const lanes = entry === 'lanes' ? lanesDefines(gpu, WEIGHTS, M, K, norm !== undefined) : null;
  if (lanes && !lora && !norm && !next) {
    const split = lanesSplitProduct(gpu, op, x, w, WEIGHTS, M, N, K, up);
    if (split) {
      // The slices' partial sums added in slice order, with the scale and accumulate; recorded as
      // its own op, so that kernelVariant(gpu, op) still names the GEMV that ran.
      reducePartials(gpu, `${op}.splitK`, out, split.partials, M, N, split.splits, accumulate, scale);
      return 0;
    }
  }
  // Unsplit: a narrow product widens its lanes instead (wideLanes), as a group product does.
  const flags =
    (up ? SILU_FLAG : 0) |
    (lora ? LORA_FLAG : 0) |
    (norm ? NORM_FLAG : 0) |
    (next ? NEXTA_FLAG : 0) |
    (next && next.As.length === 2 ? NEXTA2_FLAG : 0);
  let base: BlockDefines;
  const uParts = lora?.parts ?? 0;
  check(!uParts || lanes !== null, () => `${op}: u as partial sums needs gemv_lanes`); // the callers check first
  if (lanes) {
    const LANES = widensLanes(gpu) ? wideLanes(N, K, BLOCK_ELEMS[WEIGHTS], lanes.LANES) : lanes.LANES;
    const UPART = uParts ? upartLength(TMAX, 1, lora!.r) : 0;
    base = withColsPerThread(gpu, withBlock(lanes, 0, flags, LANES, UPART), K);
  } else base = blockDefines(WEIGHTS, TMAX, 4, 0, 0, false, 0, flags);
  const columnsPerGroup = entry === 'rows' ? 64 * base.COLS : base.COLS;
  const [x0, y0] = splitGrid(Math.ceil(N / columnsPerGroup), gpu.limits.maxComputeWorkgroupsPerDimension);
  const params = [M, N, K, accumulate ? 1 : 0, f32(scale), 0, 0, 0];
  const buffers = lora
    ? up
      ? [out, x, w, lora.u, lora.B, up]
      : [out, x, w, lora.u, lora.B]
    : up
      ? [out, x, w, up]
      : norm
        ? [out, x, w, norm.w]
        : [out, x, w];
  const parts = next ? Math.ceil(N / columnsPerGroup) : 0;
  if (next) {
    checkSize(next.parts, parts * M * next.R * 4, () => `${op} next A partials`);
    buffers.push(...next.As, next.normW, next.parts);
  }
  gpu.dispatch(
    opKernel(gpu, op, 'gemv', entry === 'lanes' ? 'gemv_lanes' : 'gemv_rows', base),
    buffers,
    [x0, y0, entry === 'rows' ? Math.ceil(M / TMAX) : 1],
    lora
      ? [...params, lora.r, f32(lora.scale), ...(next ? [next.R] : []), ...(uParts ? [uParts] : [])]
      : norm
        ? [...params, f32(norm.eps)]
        : next
          ? [...params, next.R]
          : params,
  );
  return parts;
}

/**
 * blockGemv's 'lanes' product (no LoRA, norm or next) split over K, where tuning.gemvSplitK
 * 'auto' splits it on a GPU (lanesSplit: few columns, a long K; the LoRA A products): gemv_lanes
 * over the slices, each a workgroup row of its own (wid.z), into a pooled scratch of their partial
 * sums (splits, M, N) f32, returned with the count for the caller to add up and release. null
 * where it does not split (nothing dispatched).
 */
function lanesSplitProduct(
  gpu: Gpu,
  op: string,
  x: GPUBuffer,
  w: GPUBuffer,
  WEIGHTS: WeightFormat,
  M: number,
  N: number,
  K: number,
  up?: GPUBuffer,
): { partials: GPUBuffer; splits: number } | null {
  if (tuning.gemvSplitK !== 'auto' || autoForCpu(gpu) || (M * N) % 4 !== 0) return null;
  const lanes = lanesDefines(gpu, WEIGHTS, M, K);
  const base = up ? withBlock(lanes, 0, SILU_FLAG) : lanes;
  const { kChunk, splits } = lanesSplit(N, K, BLOCK_ELEMS[WEIGHTS], base.LANES, base.COLS);
  if (splits <= 1) return null;
  const [x0, y0] = splitGrid(Math.ceil(N / base.COLS), gpu.limits.maxComputeWorkgroupsPerDimension);
  const partials = gpu.createBuffer(splits * M * N * 4, `${op}.lanesPartials`);
  gpu.dispatch(
    opKernel(gpu, op, 'gemv', 'gemv_lanes', base),
    up ? [partials, x, w, up] : [partials, x, w],
    [x0, y0, splits],
    [M, N, K, 0, f32(1), kChunk, 0, M * N],
  );
  return { partials, splits };
}

/**
 * The next RMSNorm's LoRA A product begun in the GEMV that writes the residual stream (matmul's
 * `next`; shaders/gemv.wgsl NEXTA): with x the product's output (N = the hidden size), its
 * workgroups write parts (P, T, R), P = the count matmul returns, whose sum over P is
 * x (normW * .) A^T before each row's rstd; the next group's GEMV adds them up and scales them in
 * its store (matmulGroup's PackedGroupLora `parts`) instead of a dispatch of its own for u.
 */
export interface NextAProduct {
  /**
   * The next group's A matrices: stacked, (R, N) f32 (LoraAdapter.packed: q/k/v), or two of (R / 2,
   * N) each (gate's and up's own).
   */
  As: readonly GPUBuffer[];
  normW: GPUBuffer; // (N) bf16: the next RMSNorm's weights
  parts: GPUBuffer; // (P, T, R) f32 out, P <= nextAParts(N) (src/ops/colsSplit.ts)
  R: number;
}

/**
 * A LoRA branch's B product added to a projection's output: out += scale * u (T, r) . B (N, r)^T,
 * u = x A^T computed before (matmul's `lora`), or with `A`, by matmul first.
 */
export interface LoraEpilogue {
  u: GPUBuffer; // (T, r) f32
  B: GPUBuffer; // (N, r) f32
  r: number;
  scale: number;
  /**
   * The branch's A (r, K) f32 (matmul only): matmul runs u = x A^T itself, into u, or where that
   * product splits over K and the GEMV takes the branch in its store (tuning.loraAFold), as its
   * slices' partial sums, which the store adds up (shaders/gemv.wgsl UPART): no dispatch of its own
   * to add them (o_proj's and down_proj's at Qwen3-4B's widths). u is then left unwritten.
   */
  A?: GPUBuffer;
  /**
   * u as this many partial sums (parts, T, r) whose sum is x A^T (matmul only, not with A: o_proj's
   * begun in attention_combine, AttentionAProduct), which the GEMV adds up in its store; only
   * where matmulTakesParts.
   */
  parts?: number;
}

/**
 * Whether shaders/gemv.wgsl gemv_cols takes out (M, N) = a (M, K) . w (K, N), w read along its
 * rows: 8 output columns per thread (N % 8 == 0, so every row of w starts on 16 bytes), a read
 * as vec4s (K % 4 == 0), both buffers bound as whole vec4 arrays.
 */
function colsGemvFits(a: GPUBuffer, w: GPUBuffer, WEIGHTS: WeightFormat, M: number, N: number, K: number): boolean {
  if (!colsShapeFits(N, K)) return false;
  const wBytes = WEIGHTS === 'q4' ? q4Words(K, N) * 4 : WEIGHTS === 'bf16' ? N * K * 2 : N * K * 4;
  return wholeVec4Bytes(w) >= Math.ceil(wBytes / 16) * 16 && wholeVec4Bytes(a) >= M * K * 4;
}

/**
 * out (M, N) (+)= scale * a (M, K) . w (K, N) through gemv_cols (the input gradient dx = dy . W on
 * CPU adapters), splitting the K rows of w over more workgroups when the output is narrow: the
 * splits' partial outputs go to a pooled scratch buffer that gemv_cols_reduce sums in order.
 */
function gemvCols(
  gpu: Gpu,
  op: string,
  out: GPUBuffer,
  a: GPUBuffer,
  w: GPUBuffer,
  WEIGHTS: WeightFormat,
  M: number,
  N: number,
  K: number,
  accumulate: boolean,
  scale: number,
): void {
  const { TMAX, zRows, groups, kChunk, splits } = colsSplit(M, N, K);
  const [x0, y0] = splitGrid(groups, gpu.limits.maxComputeWorkgroupsPerDimension);
  const kernel = opKernel(gpu, op, 'gemv', 'gemv_cols', blockDefines(WEIGHTS, TMAX, 1));
  if (splits === 1) {
    gpu.dispatch(kernel, [out, a, w], [x0, y0, zRows], [M, N, K, accumulate ? 1 : 0, f32(scale), kChunk, zRows, 0]);
    return;
  }
  const partials = gpu.createBuffer(splits * M * N * 4, `${op}.splitPartials`); // (splits, M, N) f32
  gpu.dispatch(kernel, [partials, a, w], [x0, y0, zRows * splits], [M, N, K, 0, f32(1), kChunk, zRows, M * N]);
  reducePartials(gpu, op, out, partials, M, N, splits, accumulate, scale);
}

/**
 * out (M, N) (+)= scale * the sum of `splits` partial products (splits, M, N) f32, in split order
 * (shaders/gemv.wgsl gemv_cols_reduce: M N % 4 == 0), recorded as `record` (kernelVariant); then
 * releases the pooled partials, which is safe: later users of the recycled buffer are encoded
 * after these reads.
 */
function reducePartials(
  gpu: Gpu,
  record: string,
  out: GPUBuffer,
  partials: GPUBuffer,
  M: number,
  N: number,
  splits: number,
  accumulate: boolean,
  scale: number,
): void {
  const n4 = (M * N) / 4;
  const [r0, r1] = splitGrid(Math.ceil(n4 / 64), gpu.limits.maxComputeWorkgroupsPerDimension);
  gpu.dispatch(
    opKernel(gpu, record, 'gemv', 'gemv_cols_reduce', blockDefines('f32', 1, 1)),
    [out, partials],
    [r0, r1],
    [M, n4, splits, accumulate ? 1 : 0, f32(scale), 0, 0, 0],
  );
  gpu.releaseBuffer(partials);
}

/** matmul's and matmulGroup's variant: tuning.matmul, or for 'auto' 'blocks' on CPU adapters, 'lanes' for T <= GEMV_MAX_T on GPUs, else 'tiled'. */
function matmulVariant(gpu: Gpu, T: number): Tuning['matmul'] {
  if (tuning.matmul === 'lanes' && T > GEMV_MAX_T) return 'tiled';
  if (tuning.matmul !== 'auto') return tuning.matmul;
  return autoForCpu(gpu) ? 'blocks' : T <= GEMV_MAX_T ? 'lanes' : 'tiled';
}

/**
 * Whether matmul's tiled GEMM runs with f16 tiles (tuning.gemmF16). f16 keeps 11 mantissa bits
 * (bf16 weights convert exactly) and the range to 65504, which the forward's activations and
 * weights stay well inside; the backward products keep f32, as their gradients would underflow.
 */
export function useGemmF16(gpu: Gpu): boolean {
  if (tuning.gemmF16 === 'off') return false;
  if (tuning.gemmF16 === 'on') {
    check(gpu.features.f16, "tuning.gemmF16 'on': this device has no shader-f16");
    return true;
  }
  return gpu.features.f16 && !autoForCpu(gpu);
}

/**
 * Whether the tiled GEMM shares A through subgroup shuffles (tuning.gemmSubgroups) for a product
 * whose A is read along r (aR = 1; the row loads are then coalesced across a row's threads).
 */
export function useGemmSubgroups(gpu: Gpu, aR: number): boolean {
  if (tuning.gemmSubgroups === 'off' || aR !== 1) return false;
  if (tuning.gemmSubgroups === 'on') {
    check(gpu.features.subgroups, "tuning.gemmSubgroups 'on': this device has no subgroups");
    return true;
  }
  return gpu.features.subgroups && !autoForCpu(gpu) && gpu.info.vendor.toLowerCase() === 'intel';
}

/**
 * gemm_tiled's 16-byte loads (shaders/matmul.wgsl VEC, tuning.gemmVec4) for A(m, r) =
 * a[m * aM + r] with rows on 16 bytes (aM % 4, R % 4) and B(n, r) either element n * R + r of b
 * ('r': read along r, runs of 8 on 16 bytes: R % 8) or element r * N + n ('n', define BT: read
 * along n, N % 8), both buffers bound as whole vec4 arrays that reach their last element (a q4
 * tensor's last scale word may end mid-vec4); null where they do not fit.
 */
function vecTile(
  a: GPUBuffer,
  b: GPUBuffer,
  WEIGHTS: WeightFormat,
  M: number,
  N: number,
  R: number,
  strides: readonly number[],
): 'r' | 'n' | null {
  const [aM, aR, bN, bR] = strides as [number, number, number, number];
  if (tuning.gemmVec4 === 'off' || aR !== 1 || aM % 4 !== 0 || R % 4 !== 0) return null;
  const along = bR === 1 && bN === R && R % 8 === 0 ? 'r' : bN === 1 && bR === N && N % 8 === 0 ? 'n' : null;
  if (!along) return null;
  // b holds N * R elements either way: an (N, R) tensor read along r, an (R, N) one along n.
  const [rows, cols] = along === 'r' ? [N, R] : [R, N];
  const bBytes = WEIGHTS === 'q4' ? q4Words(rows, cols) * 4 : WEIGHTS === 'bf16' ? N * R * 2 : N * R * 4;
  const fits = wholeVec4Bytes(b) >= Math.ceil(bBytes / 16) * 16 && wholeVec4Bytes(a) >= ((M - 1) * aM + R) * 4;
  return fits ? along : null;
}

/**
 * gemm_tiled's defines: the weight format, and the f16, subgroup and 16-byte-load variants where
 * they run (SGA shares A by shuffles of its own loads, so it excludes VEC), the 16-byte loads with
 * 128-row tiles (TM8) where tuning.gemmTile takes them.
 */
function tiledDefines(gpu: Gpu, WEIGHTS: WeightFormat, f16: boolean, aR: number, vec: 'r' | 'n' | null): Defines {
  const sga = useGemmSubgroups(gpu, aR);
  const tall: Defines = gemmTileRows(gpu) === TILE_M_TALL ? { TM8: 1 } : {};
  const vecDefines: Defines = sga || !vec ? {} : vec === 'r' ? { VEC: 1, ...tall } : { VEC: 1, BT: 1, ...tall };
  return { WEIGHTS, TILED: 1, ...(f16 ? { F16: 1 } : {}), ...(sga ? { SGA: 1 } : vecDefines) };
}

/**
 * out (T, N) f32 (+)= x (T, K) f32 . w (N, K) ^T ; w bf16 or q4 (dequantized on the fly).
 * With `lora`, then out += lora.scale * lora.u . lora.B^T (a LoRA branch whose A product the
 * caller ran): in the GEMV's store where matmul takes shaders/gemv.wgsl (define LORA: decode,
 * one dispatch instead of two; within f32 rounding of the two, as the B sum's order differs),
 * else as matmulF32 after the product.
 */
export function matmul(
  gpu: Gpu,
  out: GPUBuffer,
  x: GPUBuffer,
  w: Weight,
  T: number,
  N: number,
  K: number,
  accumulate = false,
  lora?: LoraEpilogue,
  up?: GPUBuffer,
  next?: NextAProduct,
): number {
  checkSize(out, T * N * 4, 'matmul out');
  checkSize(x, T * K * 4, 'matmul x');
  const wb = checkWeight(w, N, K, 'matmul w');
  check(out !== x, 'matmul: out and x must differ');
  if (up) {
    checkSize(up, T * K * 4, 'matmul up');
    distinct('matmul', out, x, up);
  }
  check(T * Math.max(N, K) < 2 ** 32 && N * K < 2 ** 32, 'matmul: sizes overflow u32 indexing');
  if (lora) {
    check(
      Number.isInteger(lora.r) && lora.r >= 1,
      () => `matmul: LoRA rank must be a positive integer (got ${lora.r})`,
    );
    const parts = lora.parts ?? 1;
    check(
      Number.isInteger(parts) && parts >= 1 && !(lora.parts && lora.A),
      () => `matmul: LoRA partial sums must be a positive integer count, without A (got ${lora.parts})`,
    );
    checkSize(lora.u, parts * T * lora.r * 4, lora.parts ? 'matmul lora u partials' : 'matmul lora u');
    checkSize(lora.B, N * lora.r * 4, 'matmul lora B');
    distinct('matmul', out, lora.u, lora.B);
    if (lora.A) {
      checkSize(lora.A, lora.r * K * 4, 'matmul lora A');
      distinct('matmul', out, x, lora.u, lora.A, ...(up ? [up] : []));
    }
  }
  if (next) {
    check(
      Number.isInteger(next.R) && next.R >= 1,
      () => `matmul: the next A product's rows must be a positive integer (got ${next.R})`,
    );
    const nA = next.As.length;
    check(
      (nA === 1 || nA === 2) && next.R % nA === 0,
      () => `matmul: the next A product takes 1 or 2 A matrices of R / count rows (got ${nA} for R ${next.R})`,
    );
    for (let i = 0; i < nA; i++) checkSize(next.As[i], (next.R / nA) * N * 4, () => `matmul next A ${i}`);
    checkSize(next.normW, bf16Bytes(N), 'matmul next norm w');
    distinct('matmul', out, x, next.parts, ...next.As, next.normW);
  }
  if (T === 0) return 0;
  const params = [T, N, K, accumulate ? 1 : 0, K, 1, K, 1, f32(1)];
  const WEIGHTS = weightFormat(w);
  const variant = matmulVariant(gpu, T);
  // The LoRA branch in the GEMV's store (tuning.loraFold): with the fusions on, where its two
  // bindings fit.
  const fold = tuning.loraFold !== 'off' && fusions.enabled && gpu.limits.maxStorageBuffersPerShaderStage >= 5;
  const inStore = fold ? lora : undefined;
  if (up && !(variant === 'lanes' && siluFits(gpu, x, up, wb, WEIGHTS, T, N, K, inStore ? 6 : 4))) {
    let parts = 0;
    withSilu(gpu, x, up, T, K, (act) => {
      parts = matmul(gpu, out, act, w, T, N, K, accumulate, lora, undefined, next);
    });
    return parts;
  }
  const blockFits = (variant === 'blocks' || variant === 'lanes') && blockGemvFits(x, wb, WEIGHTS, T, N, K);
  // u as partial sums (lora.parts): the store adds them up (the caller asked matmulTakesParts).
  check(
    !lora?.parts || (inStore !== undefined && variant === 'lanes' && blockFits && upartFits(gpu, T, lora.r)),
    'matmul: LoRA partial sums where its GEMV does not add them up (see matmulTakesParts)',
  );
  // The branch's A product (lora.A): its slices' partial sums into the store where it splits over
  // K (loraAParts), else u whole first.
  const aParts =
    lora?.A && inStore && variant === 'lanes' && blockFits ? loraAParts(gpu, x, lora.A, T, lora.r, K, up) : null;
  if (lora?.A && !aParts) matmulF32(gpu, lora.u, x, lora.A, T, lora.r, K, false, 1, up);
  if (blockFits) {
    const entry = variant === 'blocks' ? 'rows' : 'lanes';
    // Recorded as its own op when the LoRA rides along, so kernelVariant(gpu, 'matmul') still
    // names the plain products (the LM head's).
    const op = inStore ? 'matmulLora' : 'matmul';
    // The next A product in the store (foldsNextA) where its bindings fit beside the rest.
    const bindings = 3 + (inStore ? 2 : 0) + (up ? 1 : 0) + (next ? next.As.length + 2 : 0);
    const nextIn =
      next && entry === 'lanes' && foldsNextA(gpu, T) && bindings <= gpu.limits.maxStorageBuffersPerShaderStage
        ? next
        : undefined;
    const parts = blockGemv(
      gpu,
      op,
      entry,
      out,
      x,
      wb,
      WEIGHTS,
      T,
      N,
      K,
      accumulate,
      1,
      aParts ? { ...inStore!, u: aParts.partials, parts: aParts.splits } : inStore,
      up,
      undefined,
      nextIn,
    );
    if (aParts) gpu.releaseBuffer(aParts.partials); // safe: later users are encoded after
    if (lora && !inStore) matmulF32(gpu, out, lora.u, lora.B, T, N, lora.r, true, lora.scale);
    return parts;
  }
  if (lora && variant === 'tiled' && fold) {
    // In gemm_tiled's store where its 16-byte-load tiles run (tiledProduct), else after it.
    const separate = () => matmulF32(gpu, out, lora.u, lora.B, T, N, lora.r, true, lora.scale);
    tiledProduct(gpu, 'matmulLora', out, x, wb, WEIGHTS, useGemmF16(gpu), T, N, K, [K, 1, K, 1], accumulate, 1, {
      ...lora,
      separate,
    });
    return 0;
  }
  if (lora) {
    matmul(gpu, out, x, w, T, N, K, accumulate);
    matmulF32(gpu, out, lora.u, lora.B, T, N, lora.r, true, lora.scale);
    return 0;
  }
  if (variant === 'rows' || variant === 'blocks') {
    const TMAX = tmaxFor(T);
    const [x0, y0] = splitGrid(Math.ceil(N / 64), gpu.limits.maxComputeWorkgroupsPerDimension);
    gpu.dispatch(
      opKernel(gpu, 'matmul', 'matmul', 'matmul_rows', { WEIGHTS, TMAX }),
      [out, x, wb],
      [x0, y0, Math.ceil(T / TMAX)],
      params,
    );
  } else if (variant === 'gemv' || variant === 'lanes') {
    check(T <= GEMV_MAX_T, () => `matmul: gemv variant needs T <= ${GEMV_MAX_T}`);
    gpu.dispatch(
      opKernel(gpu, 'matmul', 'matmul', 'matmul_gemv', gemvDefines(gpu, WEIGHTS, T, K)),
      [out, x, wb],
      Math.ceil(N / (256 / gemvLanes(K))),
      params,
    );
  } else {
    tiledProduct(gpu, 'matmul', out, x, wb, WEIGHTS, useGemmF16(gpu), T, N, K, [K, 1, K, 1], accumulate, 1);
  }
  return 0;
}

/**
 * matmul's LoRA A product u = x A^T (T, r) (with `up`, of silu(x) * up), for a GEMV that takes its
 * branch in the store (gemv_lanes), as the partial sums of its slices over K (lanesSplitProduct)
 * where it splits and tuning.loraAFold lets the store add them up (define UPART, whose u fits the
 * workgroup memory beside the staged x and the lane sums): null where not (nothing dispatched).
 */
function loraAParts(
  gpu: Gpu,
  x: GPUBuffer,
  A: GPUBuffer,
  T: number,
  r: number,
  K: number,
  up?: GPUBuffer,
): { partials: GPUBuffer; splits: number } | null {
  if (tuning.loraAFold === 'off' || gemmVariant(gpu, T, true) !== 'lanes') return null;
  if (up ? !siluFits(gpu, x, up, A, 'f32', T, r, K, 4) : !blockGemvFits(x, A, 'f32', T, r, K)) return null;
  if (!upartFits(gpu, T, r)) return null;
  return lanesSplitProduct(gpu, 'matmulF32', x, A, 'f32', T, r, K, up);
}

/** Whether gemv_lanes' workgroup memory holds u (T, r) (define UPART) beside the staged x and the lane sums. */
function upartFits(gpu: Gpu, T: number, r: number): boolean {
  const TMAX = tmaxFor(T);
  const bytes = (stagedVec4s(gpu, TMAX, false) * 4 + TMAX * 256 + upartLength(TMAX, 1, r)) * 4;
  return bytes <= gpu.limits.maxComputeWorkgroupStorageSize;
}

/**
 * Whether matmul over these operands takes its LoRA branch's u as partial sums (LoraEpilogue's
 * `parts`: AttentionAProduct's, tuning.loraAFold): where it runs gemv_lanes with the branch in its
 * store (decode on GPUs, K.foldsNextA) and the workgroup memory holds u.
 */
export function matmulTakesParts(
  gpu: Gpu,
  x: GPUBuffer,
  w: Weight,
  T: number,
  N: number,
  K: number,
  r: number,
): boolean {
  if (T === 0 || !foldsNextA(gpu, T) || matmulVariant(gpu, T) !== 'lanes') return false;
  if (!fusions.enabled || gpu.limits.maxStorageBuffersPerShaderStage < 5) return false; // matmul's fold
  const wb = checkWeight(w, N, K, 'matmulTakesParts w');
  return blockGemvFits(x, wb, weightFormat(w), T, N, K) && upartFits(gpu, T, r);
}

/**
 * Whether matmul may take a `next` A product (NextAProduct, tuning.loraAFold) for T rows: where
 * it runs gemv_lanes (decode on GPUs) with the norm fold and the LoRA B fold on, which the
 * consumer's store needs. matmul returns 0 where it did not (its bindings did not fit, or x or a
 * weight not whole 16-byte blocks): the caller then runs u's product itself.
 */
export function foldsNextA(gpu: Gpu, T: number): boolean {
  return tuning.loraAFold !== 'off' && tuning.loraFold !== 'off' && foldsNorm(gpu, T);
}

/**
 * Whether this device's tiled GEMMs take split-K by the 'auto' rule (src/ops/splitK.ts), the one
 * the training pass's memory formula counts (trainingPassBytes' `splitK`): 'auto' on a GPU. A
 * forced 'on' splits more than the formula counts; 'off' and CPU adapters never split.
 */
export function splitKAuto(gpu: Gpu): boolean {
  return tuning.gemmSplitK === 'auto' && !autoForCpu(gpu);
}

/**
 * Whether the tiled GEMMs over q4 weights may dequantize them first (src/ops/q4Dequant.ts):
 * tuning.gemmQ4Dequant 'on' ('auto' leaves it off). The training pass's memory formula then counts
 * the copy (trainingPassBytes' `q4Dequant`).
 */
export function q4DequantOn(): boolean {
  return tuning.gemmQ4Dequant === 'on';
}

/**
 * gemm_tiled over B in its own format, or, for a q4 weight where tuning.gemmQ4Dequant takes it
 * (src/ops/q4Dequant.ts), over a pooled f32 copy that shaders/quant.wgsl dequantize_q4 writes
 * first: the same values q * s the q4 tile forms, so the same sums. B must then be a whole q4
 * tensor read along r ((N, R): the forward x . W^T) or along n ((R, N): the input gradient dy . W).
 */
function tiledProduct(
  gpu: Gpu,
  op: string,
  out: GPUBuffer,
  a: GPUBuffer,
  b: GPUBuffer,
  WEIGHTS: WeightFormat,
  f16: boolean,
  M: number,
  N: number,
  R: number,
  strides: readonly [number, number, number, number],
  accumulate: boolean,
  scale: number,
  lora?: TiledLora,
): void {
  const [, , bN, bR] = strides;
  const shape = bN === R && bR === 1 ? [N, R] : bN === 1 && bR === N ? [R, N] : null;
  if (WEIGHTS === 'q4' && shape && shape[1]! % 32 === 0 && q4DequantFor(tuning.gemmQ4Dequant, M, N, R)) {
    const copy = gpu.createBuffer(N * R * 4, `${op}.dequant`);
    // Recorded as its own op, so that kernelVariant(gpu, op) still names the GEMM that ran.
    dequantizeQ4(gpu, copy, b, shape[0]!, shape[1]!);
    const defines = tiledDefines(gpu, 'f32', f16, strides[1], vecTile(a, copy, 'f32', M, N, R, strides));
    const fused = lora && tiledLoraFits(gpu, defines, scale) ? lora : undefined;
    gemmTiled(gpu, op, out, a, copy, defines, M, N, R, strides, accumulate, scale, fused);
    gpu.releaseBuffer(copy);
    if (lora && !fused) lora.separate();
    return;
  }
  const defines = tiledDefines(gpu, WEIGHTS, f16, strides[1], vecTile(a, b, WEIGHTS, M, N, R, strides));
  const fused = lora && tiledLoraFits(gpu, defines, scale) ? lora : undefined;
  gemmTiled(gpu, op, out, a, b, defines, M, N, R, strides, accumulate, scale, fused);
  if (lora && !fused) lora.separate();
}

/**
 * A LoRA branch for gemm_tiled's store (shaders/matmul.wgsl LORA): out += scale * u (M, r) . B^T,
 * B (N, r) for the forward x . W^T, or the branch's A (r, N) for the input gradient dy . W (BT).
 * `separate` adds it as a product of its own where the store cannot.
 */
export interface TiledLora extends LoraEpilogue {
  separate: () => void;
}

/**
 * Whether gemm_tiled adds a LoRA branch in its store: its 16-byte-load tiles (VEC; the r-major
 * and SGA tiles keep the separate product), a product of scale 1 (split over R, the reduce scales
 * the sum, the branch's term included), and 5 storage buffers a stage.
 */
function tiledLoraFits(gpu: Gpu, defines: Defines, scale: number): boolean {
  return defines.VEC === 1 && scale === 1 && gpu.limits.maxStorageBuffersPerShaderStage >= 5;
}

/**
 * gemm_tiled over an (M, N) output, sliced over R (define SPLITK, src/ops/splitK.ts,
 * tuning.gemmSplitK) when its tiles alone would make too few workgroups: the slices' partial
 * outputs go to a pooled scratch buffer that shaders/gemv.wgsl gemv_cols_reduce sums in slice
 * order into out, with the accumulate flag and the scale.
 */
function gemmTiled(
  gpu: Gpu,
  op: string,
  out: GPUBuffer,
  a: GPUBuffer,
  b: GPUBuffer,
  defines: Defines,
  M: number,
  N: number,
  R: number,
  strides: readonly number[],
  accumulate: boolean,
  scale: number,
  lora?: LoraEpilogue,
): void {
  const tileM = defines.TM8 ? TILE_M_TALL : TILE_M;
  const { slices, rSlice } = splitKFor(tuning.gemmSplitK, autoForCpu(gpu), M, N, R, tileM);
  const grid: [number, number] = [Math.ceil(N / TILE_N), Math.ceil(M / tileM)];
  // The LoRA branch (define LORA, bindings 4 and 5): its params after the split's.
  const withLora: Defines = lora ? { ...defines, LORA: 1 } : defines;
  const loraBuffers = lora ? [lora.u, lora.B] : [];
  const loraParams = lora ? [lora.r, f32(lora.scale)] : [];
  if (slices === 1) {
    const params = [M, N, R, accumulate ? 1 : 0, ...strides, f32(scale), ...loraParams];
    gpu.dispatch(opKernel(gpu, op, 'matmul', 'gemm_tiled', withLora), [out, a, b, ...loraBuffers], grid, params);
    return;
  }
  const partials = gpu.createBuffer(slices * M * N * 4, `${op}.splitK`); // (slices, M, N) f32
  gpu.dispatch(
    opKernel(gpu, op, 'matmul', 'gemm_tiled', { ...withLora, SPLITK: 1 }),
    [partials, a, b, ...loraBuffers],
    [...grid, slices],
    [M, N, R, 0, ...strides, f32(1), rSlice, ...loraParams],
  );
  // Recorded as its own op, so that kernelVariant(gpu, op) still names the GEMM that ran.
  reducePartials(gpu, `${op}.splitK`, out, partials, M, N, slices, accumulate, scale);
}

/**
 * gemm's variant for M rows: row-major A and B with few rows (the LoRA A and B products in
 * decode) take the GEMV, each column's R reduced by LANES threads, not one thread looping over R.
 * Other layouts with few rows take 'rows' on a GPU too (and when 'gemv' or 'lanes' is forced).
 */
function gemmVariant(gpu: Gpu, M: number, rowMajor: boolean): Tuning['matmul'] {
  const small = M <= GEMV_MAX_T;
  if (tuning.matmul === 'auto') return autoForCpu(gpu) ? 'blocks' : small ? (rowMajor ? 'lanes' : 'rows') : 'tiled';
  const gemvForced = tuning.matmul === 'gemv' || tuning.matmul === 'lanes';
  return gemvForced && !(small && rowMajor) ? 'rows' : tuning.matmul;
}

/**
 * out (M, N) (+)= scale * sum_r A(m, r) B(n, r) through strides (shaders/matmul.wgsl):
 * A(m, r) = a[m * aM + r * aR] f32, B(n, r) = element n * bN + r * bR of b (f32, bf16 or q4).
 * With `lora`, then its branch: in gemm_tiled's store where tiledLoraFits, else lora.separate().
 */
export function gemm(
  gpu: Gpu,
  op: string,
  out: GPUBuffer,
  a: GPUBuffer,
  b: GPUBuffer,
  WEIGHTS: WeightFormat,
  M: number,
  N: number,
  R: number,
  strides: readonly [number, number, number, number],
  accumulate: boolean,
  scale: number,
  lora?: TiledLora,
): void {
  distinct(op, out, a, b);
  check(M * Math.max(N, R) < 2 ** 32 && N * R < 2 ** 32, () => `${op}: sizes overflow u32 indexing`);
  if (M === 0 || N === 0) return;
  const params = [M, N, R, accumulate ? 1 : 0, ...strides, f32(scale)];
  const rowMajor = strides[0] === R && strides[1] === 1 && strides[2] === R && strides[3] === 1;
  const variant = gemmVariant(gpu, M, rowMajor);
  // B read along its rows (the input gradient dx = dy . W): A row-major, B(n, r) = b[r * N + n].
  const wRows = strides[0] === R && strides[1] === 1 && strides[2] === 1 && strides[3] === N;
  if (variant === 'blocks' && rowMajor && blockGemvFits(a, b, WEIGHTS, M, N, R)) {
    blockGemv(gpu, op, 'rows', out, a, b, WEIGHTS, M, N, R, accumulate, scale);
  } else if (variant === 'blocks' && wRows && colsGemvFits(a, b, WEIGHTS, M, N, R)) {
    gemvCols(gpu, op, out, a, b, WEIGHTS, M, N, R, accumulate, scale);
  } else if (variant === 'lanes' && blockGemvFits(a, b, WEIGHTS, M, N, R)) {
    blockGemv(gpu, op, 'lanes', out, a, b, WEIGHTS, M, N, R, accumulate, scale);
  } else if (variant === 'gemv' || variant === 'lanes') {
    gpu.dispatch(
      opKernel(gpu, op, 'matmul', 'matmul_gemv', gemvDefines(gpu, WEIGHTS, M, R)),
      [out, a, b],
      Math.ceil(N / (256 / gemvLanes(R))),
      params,
    );
  } else if (variant === 'tiled') {
    tiledProduct(gpu, op, out, a, b, WEIGHTS, false, M, N, R, strides, accumulate, scale, lora);
    return; // tiledProduct adds `lora`, in its store or after
  } else {
    const TMAX = tmaxFor(M);
    gpu.dispatch(
      opKernel(gpu, op, 'matmul', 'gemm_rows', { WEIGHTS, TMAX }),
      [out, a, b],
      Math.ceil((N * Math.ceil(M / TMAX)) / 64),
      params,
    );
  }
  lora?.separate();
}

/**
 * out (T, N) f32 (+)= scale * x (T, K) f32 . w (N, K) f32 ^T  (the LoRA A and B products). With
 * `up`, of silu(x) * up (foldsSilu); with `norm`, of rmsNorm(x) (FoldedNorm: inside gemv_lanes
 * where foldsNorm allows, else rmsNorm first; the packed LoRA A product of a group).
 */
export function matmulF32(
  gpu: Gpu,
  out: GPUBuffer,
  x: GPUBuffer,
  w: GPUBuffer,
  T: number,
  N: number,
  K: number,
  accumulate = false,
  scale = 1,
  up?: GPUBuffer,
  norm?: FoldedNorm,
): void {
  checkSize(out, T * N * 4, 'matmulF32 out');
  checkSize(x, T * K * 4, 'matmulF32 x');
  checkSize(w, N * K * 4, 'matmulF32 w');
  if (norm) {
    check(!up, 'matmulF32: takes a norm or an up, not both');
    checkSize(norm.w, bf16Bytes(K), 'matmulF32 norm w');
    distinct('matmulF32', out, x, w, norm.w);
    check(T * Math.max(N, K) < 2 ** 32 && N * K < 2 ** 32, 'matmulF32: sizes overflow u32 indexing');
    if (T === 0 || N === 0) return;
    if (foldsNorm(gpu, T, 1) && gemmVariant(gpu, T, true) === 'lanes' && blockGemvFits(x, w, 'f32', T, N, K))
      blockGemv(gpu, 'matmulF32', 'lanes', out, x, w, 'f32', T, N, K, accumulate, scale, undefined, undefined, norm);
    else withNormed(gpu, x, norm, T, K, (h) => matmulF32(gpu, out, h, w, T, N, K, accumulate, scale));
    return;
  }
  if (up) {
    checkSize(up, T * K * 4, 'matmulF32 up');
    distinct('matmulF32', out, x, w, up);
    check(T * Math.max(N, K) < 2 ** 32 && N * K < 2 ** 32, 'matmulF32: sizes overflow u32 indexing');
    if (T === 0 || N === 0) return;
    if (gemmVariant(gpu, T, true) === 'lanes' && siluFits(gpu, x, up, w, 'f32', T, N, K, 4))
      blockGemv(gpu, 'matmulF32', 'lanes', out, x, w, 'f32', T, N, K, accumulate, scale, undefined, up);
    else withSilu(gpu, x, up, T, K, (act) => matmulF32(gpu, out, act, w, T, N, K, accumulate, scale));
    return;
  }
  gemm(gpu, 'matmulF32', out, x, w, 'f32', T, N, K, [K, 1, K, 1], accumulate, scale);
}

/**
 * Whether down_proj's products take the SwiGLU activation inside their GEMVs (tuning.siluFold:
 * shaders/gemv.wgsl SILU): matmul's and matmulF32's `up` then run gemv_lanes over the gate and up
 * directly (decode on GPUs), and the caller runs no siluMul. Where a shape does not fit, those ops
 * still take `up`, forming the activation first themselves.
 */
export function foldsSilu(gpu: Gpu, T: number): boolean {
  return (
    tuning.siluFold !== 'off' &&
    fusions.enabled &&
    T > 0 &&
    T <= GEMV_MAX_T &&
    matmulVariant(gpu, T) === 'lanes' &&
    gemmVariant(gpu, T, true) === 'lanes'
  );
}

/** Whether gemv_lanes takes x = silu(gate) * up for this product, with `bindings` storage buffers. */
function siluFits(
  gpu: Gpu,
  gate: GPUBuffer,
  up: GPUBuffer,
  w: GPUBuffer,
  WEIGHTS: WeightFormat,
  T: number,
  N: number,
  K: number,
  bindings: number,
): boolean {
  return (
    tuning.siluFold !== 'off' &&
    fusions.enabled &&
    T <= GEMV_MAX_T &&
    bindings <= gpu.limits.maxStorageBuffersPerShaderStage &&
    blockGemvFits(gate, w, WEIGHTS, T, N, K) &&
    wholeVec4Bytes(up) >= T * K * 4
  );
}

/** run(act) with act = silu(gate) * up in a pooled buffer (a folded SwiGLU's fallback). */
function withSilu(gpu: Gpu, gate: GPUBuffer, up: GPUBuffer, T: number, K: number, run: (act: GPUBuffer) => void): void {
  const act = gpu.createBuffer(T * K * 4, 'siluAct');
  siluMul(gpu, act, gate, up, T * K);
  run(act);
  gpu.releaseBuffer(act); // safe: later users of the recycled buffer are encoded after these reads
}

// inv_freq_i = 1 / theta^(2i/HD) rounded to f32, as HF computes it; cached per (Gpu, HD, theta).
const invFreqCache = new WeakMap<Gpu, Map<string, GPUBuffer>>();

export function ropeInvFreq(HD: number, theta: number): Float32Array {
  const inv = new Float32Array(HD / 2);
  for (let i = 0; i < HD / 2; i++) inv[i] = 1 / Math.fround(theta ** Math.fround((2 * i) / HD));
  return inv;
}

export function invFreqBuffer(gpu: Gpu, HD: number, theta: number): GPUBuffer {
  let perGpu = invFreqCache.get(gpu);
  if (!perGpu) invFreqCache.set(gpu, (perGpu = new Map()));
  const key = `${HD}:${theta}`;
  let buf = perGpu.get(key);
  if (!buf) {
    buf = gpu.createBuffer((HD / 2) * 4, `ropeInvFreq.${key}`); // (HD/2) f32
    gpu.write(buf, ropeInvFreq(HD, theta));
    perGpu.set(key, buf);
  }
  return buf;
}

/** In place on x (T, H, HD) f32, HF rotate-half; pos (T) u32 */
export function rope(gpu: Gpu, x: GPUBuffer, pos: GPUBuffer, T: number, H: number, HD: number, theta: number): void {
  rotate(gpu, 'rope', 'rope_forward', x, pos, T, H, HD, theta);
}

/** rope's dispatch, shared with ropeBackward (entry rope_backward: the rotation by -angle). */
export function rotate(
  gpu: Gpu,
  op: string,
  entry: string,
  x: GPUBuffer,
  pos: GPUBuffer,
  T: number,
  H: number,
  HD: number,
  theta: number,
): void {
  check(HD % 2 === 0, () => `${op}: HD=${HD} must be even`);
  checkSize(x, T * H * HD * 4, () => `${op} x`);
  checkSize(pos, T * 4, () => `${op} pos`);
  const inv = invFreqBuffer(gpu, HD, theta);
  gpu.dispatch(gpu.kernel('rope', entry), [x, pos, inv], Math.ceil((T * H * HD) / 2 / ELEMS_PER_WG), [T, H, HD]);
}

/**
 * qOut (T, NH, HD) = rope(rmsNorm(q, qNorm)), kOut (T, NKV, HD) = rope(rmsNorm(k, kNorm)): Qwen3's
 * q/k norms and RoPE in one dispatch (shaders/rope.wgsl qk_norm_rope), bitwise equal to rmsNorm
 * on each then rope on each.
 */
export function qkNormRope(
  gpu: Gpu,
  qOut: GPUBuffer,
  kOut: GPUBuffer,
  q: GPUBuffer,
  k: GPUBuffer,
  qNorm: GPUBuffer,
  kNorm: GPUBuffer,
  pos: GPUBuffer,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  eps: number,
  theta: number,
): void {
  check(HD % 2 === 0, () => `qkNormRope: HD=${HD} must be even`);
  checkSize(qOut, T * NH * HD * 4, 'qkNormRope qOut');
  checkSize(q, T * NH * HD * 4, 'qkNormRope q');
  checkSize(kOut, T * NKV * HD * 4, 'qkNormRope kOut');
  checkSize(k, T * NKV * HD * 4, 'qkNormRope k');
  checkSize(qNorm, bf16Bytes(HD), 'qkNormRope qNorm');
  checkSize(kNorm, bf16Bytes(HD), 'qkNormRope kNorm');
  checkSize(pos, T * 4, 'qkNormRope pos');
  distinct('qkNormRope', qOut, kOut, q, k);
  const inv = invFreqBuffer(gpu, HD, theta);
  // WG 64 as rmsNorm for rows of D <= 512: the same sums in the same order.
  gpu.dispatch(
    opKernel(gpu, 'qkNormRope', 'rope', 'qk_norm_rope', subgroupDefines(useSubgroups(gpu)), { WG: 64 }),
    [qOut, kOut, q, k, qNorm, kNorm, pos, inv],
    T * (NH + NKV),
    [T, NH, NKV, HD, f32(eps)],
  );
}

function checkPaging(
  op: string,
  kv: KvPaging,
  kCache: GPUBuffer,
  vCache: GPUBuffer,
  pageTable: GPUBuffer,
  NKV: number,
  HD: number,
): number {
  check(kv.dtype === 'f32' || kv.dtype === 'f16', () => `${op}: KV dtype must be f32 or f16 (got ${String(kv.dtype)})`);
  check(
    Number.isInteger(kv.pageSize) && kv.pageSize > 0 && (kv.pageSize & (kv.pageSize - 1)) === 0,
    () => `${op}: page size ${kv.pageSize} is not a power of two`,
  );
  check(
    kv.pagesPerSlot === Math.ceil(kv.maxT / kv.pageSize),
    () => `${op}: pagesPerSlot ${kv.pagesPerSlot} != ceil(maxT ${kv.maxT} / ${kv.pageSize})`,
  );
  check(kv.dtype === 'f32' || HD % 2 === 0, () => `${op}: f16 KV needs an even HD (got ${HD})`);
  checkSize(kCache, kvPoolBytes(kv, NKV, HD), () => `${op} kCache`);
  checkSize(vCache, kvPoolBytes(kv, NKV, HD), () => `${op} vCache`);
  checkSize(pageTable, kv.pagesPerSlot * 4, () => `${op} pageTable`);
  check(kCache !== vCache, () => `${op}: kCache and vCache must differ`);
  return Math.log2(kv.pageSize);
}

/**
 * kCache, vCache (pages, P, NKV, HD) f32 or f16 (KvPaging) ; k, v (T, NKV, HD) f32 ; pageTable
 * (S, pagesPerSlot) u32 ; row t -> position pos[t] of slot slot[t], through the page table.
 * f16 rounds to nearest even and saturates at +-65504. Unmapped pages and pos >= maxT are skipped.
 */
export function kvWrite(
  gpu: Gpu,
  kCache: GPUBuffer,
  vCache: GPUBuffer,
  k: GPUBuffer,
  v: GPUBuffer,
  pageTable: GPUBuffer,
  slot: GPUBuffer,
  pos: GPUBuffer,
  T: number,
  NKV: number,
  HD: number,
  kv: KvPaging,
): void {
  checkSize(k, T * NKV * HD * 4, 'kvWrite k');
  checkSize(v, T * NKV * HD * 4, 'kvWrite v');
  const pageShift = checkPaging('kvWrite', kv, kCache, vCache, pageTable, NKV, HD);
  const words = (T * NKV * HD) / (kv.dtype === 'f16' ? 2 : 1); // one thread per cache word
  gpu.dispatch(
    gpu.kernel('attention', 'kv_write', { KV: kv.dtype }),
    bindings(ATTENTION_BINDINGS.kv_write, { kCache, vCache, k, v, pageTable, slot, pos }),
    Math.ceil(words / ELEMS_PER_WG),
    [T, NKV, HD, kv.maxT, kv.pagesPerSlot, pageShift],
  );
}

/**
 * qOut (T, NH, HD) = rope(rmsNorm(q, qNorm)); rope(rmsNorm(k, kNorm)) and v (T, NKV, HD) f32 written
 * into the paged cache kCache, vCache at position pos[t] of slot slot[t] (KvPaging, as kvWrite):
 * qkNormRope and kvWrite in one dispatch (shaders/rope.wgsl qk_norm_rope with KV), bitwise equal to
 * them. It binds 12 storage buffers; on a device with fewer per stage it runs the two kernels.
 */
export function qkNormRopeKv(
  gpu: Gpu,
  qOut: GPUBuffer,
  kCache: GPUBuffer,
  vCache: GPUBuffer,
  q: GPUBuffer,
  k: GPUBuffer,
  v: GPUBuffer,
  qNorm: GPUBuffer,
  kNorm: GPUBuffer,
  pageTable: GPUBuffer,
  slot: GPUBuffer,
  pos: GPUBuffer,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  eps: number,
  theta: number,
  kv: KvPaging,
): void {
  if (!fusions.enabled || gpu.limits.maxStorageBuffersPerShaderStage < QK_NORM_ROPE_KV_BINDINGS) {
    const kn = gpu.createBuffer(T * NKV * HD * 4, 'kNormed'); // (T, NKV, HD)
    qkNormRope(gpu, qOut, kn, q, k, qNorm, kNorm, pos, T, NH, NKV, HD, eps, theta);
    kvWrite(gpu, kCache, vCache, kn, v, pageTable, slot, pos, T, NKV, HD, kv);
    gpu.releaseBuffer(kn); // later users of the recycled buffer are encoded after kvWrite's reads
    return;
  }
  check(HD % 2 === 0, () => `qkNormRopeKv: HD=${HD} must be even`);
  checkSize(qOut, T * NH * HD * 4, 'qkNormRopeKv qOut');
  checkSize(q, T * NH * HD * 4, 'qkNormRopeKv q');
  checkSize(k, T * NKV * HD * 4, 'qkNormRopeKv k');
  checkSize(v, T * NKV * HD * 4, 'qkNormRopeKv v');
  checkSize(qNorm, bf16Bytes(HD), 'qkNormRopeKv qNorm');
  checkSize(kNorm, bf16Bytes(HD), 'qkNormRopeKv kNorm');
  checkSize(pos, T * 4, 'qkNormRopeKv pos');
  checkSize(slot, T * 4, 'qkNormRopeKv slot');
  const pageShift = checkPaging('qkNormRopeKv', kv, kCache, vCache, pageTable, NKV, HD);
  distinct('qkNormRopeKv', qOut, kCache, vCache, q, k, v, qNorm, kNorm, pageTable, slot, pos);
  const inv = invFreqBuffer(gpu, HD, theta);
  // WG 64 as qkNormRope (and rmsNorm for rows of D <= 512): the same sums in the same order.
  gpu.dispatch(
    opKernel(
      gpu,
      'qkNormRopeKv',
      'rope',
      'qk_norm_rope',
      { KV: kv.dtype, ...subgroupDefines(useSubgroups(gpu)) },
      { WG: 64 },
    ),
    [qOut, kCache, q, k, qNorm, kNorm, pos, inv, v, vCache, pageTable, slot],
    T * (NH + NKV),
    [T, NH, NKV, HD, f32(eps), kv.maxT, kv.pagesPerSlot, pageShift],
  );
}

/**
 * The decode fusions (matmulGroup, qkNormRopeKv). `enabled = false` runs the kernels they replace,
 * bitwise the same results (tests and benchmarks compare the two).
 */
export const fusions = { enabled: true };

/** Storage buffers qkNormRopeKv's fused kernel binds (shaders/rope.wgsl qk_norm_rope with KV). */
export const QK_NORM_ROPE_KV_BINDINGS = 12;

/** gemv_rows' output columns per thread (blockGemv 'rows'); any value gives each column the same sum. */
const GROUP_COLS = 4;

/**
 * outs[i] (T, Ns[i]) f32 = x (T, K) f32 . ws[i] (Ns[i], K)^T for 2 or 3 weights over one x (the
 * q/k/v and gate/up projections): one dispatch, each weight read once, each output bitwise what
 * matmul would write. It takes the GEMV variants (gemv_rows_group on CPU adapters where matmul
 * takes gemv_rows, gemv_lanes_group or matmul_gemv_group on GPUs for T <= GEMV_MAX_T), when the weights share a
 * format and 2 * count + 1 storage buffers fit the device; otherwise one matmul per weight
 * (prefill keeps the tiled GEMM). With `norm`, the product is of rmsNorm(x) (FoldedNorm). With
 * `lora`, each output also gets its LoRA branch's B product (GroupLora): in the group GEMV's store
 * where groupLoraFold allows (packed: PackedGroupLora, groupLoraPacks), else by matmulEachF32 after it (or each weight's matmul epilogue).
 */
export function matmulGroup(
  gpu: Gpu,
  outs: readonly GPUBuffer[],
  x: GPUBuffer,
  ws: readonly Weight[],
  T: number,
  Ns: readonly number[],
  K: number,
  norm?: FoldedNorm,
  lora?: AnyGroupLora,
  next?: PairAProduct,
): number {
  const wbs = groupChecks('matmulGroup', outs, x, ws.length, T, Ns, K, norm).map((_, i) =>
    checkWeight(ws[i], Ns[i], K, `matmulGroup w ${i}`),
  );
  if (lora) groupLoraChecks(lora, outs, x, T, Ns);
  if (next) {
    check(
      Number.isInteger(next.R) && next.R >= 1,
      () => `matmulGroup: the next A product's rows must be a positive integer (got ${next.R})`,
    );
    checkSize(next.A, next.R * Ns[0] * 4, 'matmulGroup next A');
    checkSize(next.parts, pairParts(Ns[0]) * T * next.R * 4, 'matmulGroup next A partials');
    distinct('matmulGroup', ...outs, x, next.A, next.parts);
  }
  if (T === 0) return 0;
  if (next) {
    check(
      lora !== undefined && 'B' in lora && lora.parts !== undefined && groupPairs(gpu, x, ws, T, Ns, K, lora.r, norm),
      'matmulGroup: the next A product only where the gate/up GEMV pairs its columns (K.groupPairs), its branches packed from partial sums',
    );
    const WEIGHTS = weightFormat(ws[0]);
    return pairGemv(gpu, outs, x, wbs, WEIGHTS, T, Ns[0], K, norm!, lora as PackedGroupLora, next);
  }
  if (lora && 'u' in lora && lora.parts !== undefined)
    check(
      groupTakesParts(gpu, x, ws, T, Ns, K, lora.r, norm, 'B' in lora),
      'matmulGroup: LoRA u as partial sums only where the group GEMV gathers them (K.groupTakesParts)',
    );
  else if (lora && 'u' in lora)
    check(
      groupLoraPacks(gpu, x, ws, T, Ns, K, norm),
      'matmulGroup: packed LoRA branches only where the group GEMV takes them in its store (K.groupLoraPacks)',
    );
  const WEIGHTS = weightFormat(ws[0]);
  const mixed = ws.some((w) => weightFormat(w) !== WEIGHTS);
  if (norm && (mixed || groupVariant(gpu, x, wbs, WEIGHTS, T, Ns, K, true) !== 'lanes')) {
    withNormed(gpu, x, norm, T, K, (h) => matmulGroup(gpu, outs, h, ws, T, Ns, K, undefined, lora));
    return 0;
  }
  // An anonymous closure: a named one gets tsx's keepNames wrapper (a defineProperty) per call.
  if (mixed) for (let i = 0; i < ws.length; i++) matmul(gpu, outs[i], x, ws[i], T, Ns[i], K, false, loraOf(lora, i));
  else {
    const folded = groupGemv(
      gpu,
      'matmulGroup',
      outs,
      x,
      wbs,
      WEIGHTS,
      T,
      Ns,
      K,
      (i) => matmul(gpu, outs[i], x, ws[i], T, Ns[i], K, false, loraOf(lora, i)),
      norm,
      lora,
    );
    if (lora && !folded && 'us' in lora) matmulEachF32(gpu, outs, lora.us, lora.Bs, T, Ns, lora.r, true, lora.scale);
  }
  return 0;
}

/**
 * down_proj's LoRA A product begun in the gate/up group GEMV (matmulGroup's `next`; shaders/
 * gemv.wgsl PAIR): each workgroup writes gate and up for the same columns, then its share of
 * u = (silu(gate) * up) A^T over them into parts (P, T, R), P the count matmulGroup returns;
 * down_proj's GEMV adds them up (matmul's `lora` with `parts`). Only where groupPairs.
 */
export interface PairAProduct {
  A: GPUBuffer; // (R, N) f32: down_proj's A (N = the MLP's width)
  parts: GPUBuffer; // (P, T, R) f32 out, P <= pairParts(N)
  R: number;
}

/** The most partial sums a row the paired gate/up GEMV writes over N columns (PairAProduct). */
export const pairParts = (N: number): number => nextAParts(N);

/**
 * gemv_lanes_group's defines with define PAIR for the gate/up group with its norm and its packed
 * branches from partial sums: an even number of columns a thread (CPT 2 or 4: half gate's, half
 * up's), CPT 2 with twice the lanes where withColsPerThread gives 1; null where that passes LANES_MAX.
 */
function pairDefines(gpu: Gpu, WEIGHTS: WeightFormat, T: number, K: number, N: number, r: number): LanesDefines | null {
  const flags = NORM_FLAG | LORA_FLAG | LORAPACK_FLAG | NEXTA_FLAG | PAIR_FLAG;
  const UPART = upartLength(tmaxFor(T), 2, r);
  const d = withColsPerThread(gpu, lanesDefines(gpu, WEIGHTS, T, K, true, N, 2, flags, UPART), K);
  if ((d.CPT ?? 1) > 1) return d;
  if (d.LANES * 2 > LANES_MAX) return null;
  return blockDefines(
    d.WEIGHTS,
    d.TMAX,
    d.COLS,
    d.LANES * 2,
    d.XS,
    'SUBGROUPS' in d,
    2,
    flags,
    2,
    UPART,
  ) as LanesDefines;
}

/**
 * Whether matmulGroup over the gate/up group takes down_proj's LoRA A product (PairAProduct,
 * tuning.loraAFold): two weights of the same rows whose group takes its packed branches as
 * partial sums (groupTakesParts) with the norm folded, and whose bindings hold down's A and the
 * partials too (10: Chrome's limit).
 */
export function groupPairs(
  gpu: Gpu,
  x: GPUBuffer,
  ws: readonly Weight[],
  T: number,
  Ns: readonly number[],
  K: number,
  r: number,
  norm?: FoldedNorm,
): boolean {
  if (ws.length !== 2 || Ns.length !== 2 || Ns[0] !== Ns[1] || !norm) return false;
  if (!groupTakesParts(gpu, x, ws, T, Ns, K, r, norm, true)) return false;
  if (2 * 2 + 2 + 2 + 2 > gpu.limits.maxStorageBuffersPerShaderStage) return false;
  return pairDefines(gpu, weightFormat(ws[0]), T, K, Ns[0], r) !== null;
}

/** matmulGroup's paired gate/up GEMV (PairAProduct); returns the partial sums a row it wrote. */
function pairGemv(
  gpu: Gpu,
  outs: readonly GPUBuffer[],
  x: GPUBuffer,
  wbs: readonly GPUBuffer[],
  WEIGHTS: WeightFormat,
  T: number,
  N: number,
  K: number,
  norm: FoldedNorm,
  lora: PackedGroupLora,
  next: PairAProduct,
): number {
  const defines = pairDefines(gpu, WEIGHTS, T, K, N, lora.r)!;
  const groups = Math.ceil(N / (defines.COLS / 2));
  const [x0, y0] = splitGrid(groups, gpu.limits.maxComputeWorkgroupsPerDimension);
  gpu.dispatch(
    opKernel(gpu, 'matmulGroup', 'gemv', 'gemv_lanes_group', defines),
    [outs[0], x, wbs[0], outs[1], wbs[1], norm.w, lora.u, lora.B, next.A, next.parts],
    [x0, y0],
    [T, N, K, 0, f32(1), 0, 0, 0, N, 0, f32(norm.eps), lora.r, f32(lora.scale), next.R, lora.parts!],
  );
  return groups;
}

/**
 * A group's LoRA branches packed (matmulGroup's, where groupLoraPacks): outs[i] += scale * u (T,
 * G r) columns [i r, (i + 1) r) . B rows [N_0 + .. + N_{i-1}, + N_i) ^T, u = x A^T over the
 * group's A matrices stacked (LoraAdapter.packed: one matmulF32). Two storage buffers, not 2 G:
 * the q/k/v group with its norm takes its branches in 10 (Chrome's limit) instead of 14.
 */
export interface PackedGroupLora {
  u: GPUBuffer; // (T, G r) f32; with `parts`, (parts, T, G r): partial sums (NextAProduct)
  B: GPUBuffer; // (N_0 + .. + N_{G-1}, r) f32
  r: number;
  scale: number;
  /**
   * u as the partial sums of the GEMV that wrote x (matmul's `next`, the count it returned), of
   * x before the norm's rstd: the group GEMV adds them up and scales them (shaders/gemv.wgsl
   * UPART). Only with a folded norm, where groupTakesParts.
   */
  parts?: number;
}

/**
 * A group's LoRA branches (matmulGroup's) whose u is the partial sums of the GEMV that wrote x
 * (NextAProduct over each weight's own A: PackedGroupLora's `parts`), each weight its own B: the
 * gate/up group, whose branches then need neither a stacked copy nor an A product of their own.
 */
export interface PartialGroupLora {
  u: GPUBuffer; // (parts, T, G r) f32: the partial sums, weight i's at columns i r
  parts: number;
  Bs: readonly GPUBuffer[]; // (Ns[i], r) f32 each
  r: number;
  scale: number;
}

/** The LoRA branches matmulGroup takes. */
export type AnyGroupLora = GroupLora | PackedGroupLora | PartialGroupLora;

/**
 * Whether matmulGroup over these operands takes its LoRA branches' u as partial sums
 * (tuning.loraAFold), packed (PackedGroupLora `parts`) or each with its own B (PartialGroupLora,
 * 2 weights): where the norm folds into gemv_lanes_group, the branches' bindings fit, and the
 * workgroup memory holds u (T, G r) beside the staged x and the lane sums.
 */
export function groupTakesParts(
  gpu: Gpu,
  x: GPUBuffer,
  ws: readonly Weight[],
  T: number,
  Ns: readonly number[],
  K: number,
  r: number,
  norm?: FoldedNorm,
  packed = true,
): boolean {
  const G = ws.length;
  if (!norm || T === 0 || G !== Ns.length || !foldsNextA(gpu, T)) return false;
  if (!packed && G !== 2) return false; // shaders/gemv.wgsl UPART without LORAPACK: 2 weights
  const wbs = sameFormatWeights(ws, Ns, K, 'groupTakesParts');
  if (!wbs || groupVariant(gpu, x, wbs, weightFormat(ws[0]), T, Ns, K, true) !== 'lanes') return false;
  // The group's own bindings and its norm's, then u's partials and one stacked B or one B a weight.
  if (2 * G + 2 + (packed ? 2 : 1 + G) > gpu.limits.maxStorageBuffersPerShaderStage) return false;
  const TMAX = tmaxFor(T);
  const bytes = (stagedVec4s(gpu, TMAX, true) * 4 + TMAX * 256 + upartLength(TMAX, ws.length, r)) * 4;
  return bytes <= gpu.limits.maxComputeWorkgroupStorageSize;
}

/** gemv_lanes_group's uw (define UPART): u (TMAX, G r). */
const upartLength = (TMAX: number, G: number, r: number) => TMAX * G * r;

/** A group's weight buffers (checked against Ns, K), or null where their formats differ (no group GEMV). */
function sameFormatWeights(ws: readonly Weight[], Ns: readonly number[], K: number, op: string): GPUBuffer[] | null {
  const WEIGHTS = weightFormat(ws[0]);
  if (ws.some((w) => weightFormat(w) !== WEIGHTS)) return null;
  return ws.map((w, i) => checkWeight(w, Ns[i], K, `${op} w ${i}`));
}

/**
 * Whether matmulGroup over these operands takes its LoRA branches packed (PackedGroupLora; the
 * caller then computes u over the stacked A matrices): where the group GEMV folds them
 * (tuning.loraFold) and one u and B per weight do not fit the device's storage buffers a stage
 * but the packed pair does (or tuning.loraFold is 'packed').
 */
export function groupLoraPacks(
  gpu: Gpu,
  x: GPUBuffer,
  ws: readonly Weight[],
  T: number,
  Ns: readonly number[],
  K: number,
  norm?: FoldedNorm,
): boolean {
  if (T === 0 || ws.length !== Ns.length) return false;
  const wbs = sameFormatWeights(ws, Ns, K, 'groupLoraPacks');
  if (!wbs) return false;
  const WEIGHTS = weightFormat(ws[0]);
  // As matmulGroup: a norm that the group GEMV cannot fold runs first, and the product is unnormed.
  const folded = norm !== undefined && groupVariant(gpu, x, wbs, WEIGHTS, T, Ns, K, true) === 'lanes';
  const variant = groupVariant(gpu, x, wbs, WEIGHTS, T, Ns, K, folded);
  return (variant === 'lanes' || variant === 'blocks') && groupLoraFold(gpu, ws.length, folded) === 'packed';
}

/**
 * The LoRA branches of a group product (matmulGroup's `lora`): outs[i] += scale * us[i] (T, r) .
 * Bs[i] (Ns[i], r)^T, each u = x A_i^T computed before (matmulGroupF32 over the A matrices).
 */
export interface GroupLora {
  us: readonly GPUBuffer[]; // (T, r) f32 each
  Bs: readonly GPUBuffer[]; // (Ns[i], r) f32 each
  r: number;
  scale: number;
}

/** Weight i's own LoRA epilogue of a group's (the products that run one weight at a time). */
function loraOf(lora: AnyGroupLora | undefined, i: number): LoraEpilogue | undefined {
  if (lora && 'u' in lora) throw new Error('matmulGroup: packed or partial LoRA branches run in the group GEMV only'); // checked first
  return lora ? { u: lora.us[i], B: lora.Bs[i], r: lora.r, scale: lora.scale } : undefined;
}

function groupLoraChecks(
  lora: AnyGroupLora,
  outs: readonly GPUBuffer[],
  x: GPUBuffer,
  T: number,
  Ns: readonly number[],
): void {
  const G = outs.length;
  check(
    Number.isInteger(lora.r) && lora.r >= 1,
    () => `matmulGroup: LoRA rank must be a positive integer (got ${lora.r})`,
  );
  if ('u' in lora) {
    const parts = lora.parts ?? 1;
    check(
      Number.isInteger(parts) && parts >= 1,
      () => `matmulGroup: LoRA u's partial sums must be a positive integer count (got ${lora.parts})`,
    );
    checkSize(lora.u, parts * T * G * lora.r * 4, () => `matmulGroup packed lora u`);
    if ('B' in lora) {
      checkSize(lora.B, Ns.reduce((n, N) => n + N, 0) * lora.r * 4, () => `matmulGroup packed lora B`);
      distinct('matmulGroup', lora.u, lora.B, x, ...outs);
      return;
    }
    check(
      lora.Bs.length === G,
      () => `matmulGroup: the LoRA branches need one B per weight (got ${lora.Bs.length} for ${G} weights)`,
    );
    for (let i = 0; i < G; i++) checkSize(lora.Bs[i], Ns[i] * lora.r * 4, () => `matmulGroup lora B ${i}`);
    distinct('matmulGroup', lora.u, x, ...outs, ...lora.Bs);
    return;
  }
  check(
    lora.us.length === G && lora.Bs.length === G,
    () =>
      `matmulGroup: the LoRA branches need one u and one B per weight (got ${lora.us.length} u, ${lora.Bs.length} B for ${G} weights)`,
  );
  for (let i = 0; i < G; i++) {
    checkSize(lora.us[i], T * lora.r * 4, () => `matmulGroup lora u ${i}`);
    checkSize(lora.Bs[i], Ns[i] * lora.r * 4, () => `matmulGroup lora B ${i}`);
  }
  for (let i = 0; i < G; i++) distinct('matmulGroup', outs[i], x, ...lora.us, ...lora.Bs);
}

/**
 * How a group product of G weights takes its LoRA branches in its GEMV's store (tuning.loraFold;
 * shaders/gemv.wgsl define LORA with GROUP), where it runs gemv_lanes_group or gemv_rows_group:
 * 'each' where 2 G more storage buffers (each weight's u and B) fit beside its own, 'packed' where
 * 2 do (LORAPACK: one u, one B; or always, tuning.loraFold 'packed'), else null.
 */
function groupLoraFold(gpu: Gpu, G: number, norm: boolean): 'each' | 'packed' | null {
  if (tuning.loraFold === 'off' || !fusions.enabled) return null;
  const own = 2 * G + 1 + (norm ? 1 : 0),
    limit = gpu.limits.maxStorageBuffersPerShaderStage;
  if (tuning.loraFold !== 'packed' && own + 2 * G <= limit) return 'each';
  return own + 2 <= limit ? 'packed' : null;
}

/**
 * matmulGroup over f32 weights: outs[i] (T, Ns[i]) = x (T, K) . ws[i] (Ns[i], K)^T, each output
 * bitwise what matmulF32 would write where that does not split K (tuning.gemvSplitK; within f32
 * rounding where it does) (the LoRA A products of the q/k/v and gate/up projections, which share
 * their input: one dispatch instead of 2 or 3). With `norm`, of rmsNorm(x).
 */
export function matmulGroupF32(
  gpu: Gpu,
  outs: readonly GPUBuffer[],
  x: GPUBuffer,
  ws: readonly GPUBuffer[],
  T: number,
  Ns: readonly number[],
  K: number,
  norm?: FoldedNorm,
): void {
  groupChecks('matmulGroupF32', outs, x, ws.length, T, Ns, K, norm).forEach((_, i) =>
    checkSize(ws[i], Ns[i] * K * 4, () => `matmulGroupF32 w ${i}`),
  );
  if (T === 0) return;
  if (norm && groupVariant(gpu, x, ws, 'f32', T, Ns, K, true) !== 'lanes') {
    withNormed(gpu, x, norm, T, K, (h) => matmulGroupF32(gpu, outs, h, ws, T, Ns, K));
    return;
  }
  groupGemv(
    gpu,
    'matmulGroupF32',
    outs,
    x,
    ws,
    'f32',
    T,
    Ns,
    K,
    (i) => matmulF32(gpu, outs[i], x, ws[i], T, Ns[i], K),
    norm,
  );
}

/**
 * outs[i] (T, Ns[i]) (+)= scale * xs[i] (T, K) . ws[i] (Ns[i], K)^T, f32, for 2 or 3 products of
 * one K, each over its own x (the LoRA B products of the q/k/v and gate/up projections, x = each
 * projection's u, K = r): one gemv_lanes_group dispatch (define XEACH) where matmulF32 would take
 * gemv_lanes and the 3 G storage buffers fit, each output bitwise what matmulF32 would write;
 * otherwise one matmulF32 per product.
 */
export function matmulEachF32(
  gpu: Gpu,
  outs: readonly GPUBuffer[],
  xs: readonly GPUBuffer[],
  ws: readonly GPUBuffer[],
  T: number,
  Ns: readonly number[],
  K: number,
  accumulate: boolean,
  scale: number,
): void {
  const G = ws.length;
  check(
    (G === 2 || G === 3) && outs.length === G && xs.length === G && Ns.length === G,
    () =>
      `matmulEachF32: needs 2 or 3 weights, one output, one x and one N each (got ${G} weights, ${outs.length} outputs, ${xs.length} xs, ${Ns.length} Ns)`,
  );
  for (let i = 0; i < G; i++) {
    checkSize(outs[i], T * Ns[i] * 4, () => `matmulEachF32 out ${i}`);
    checkSize(xs[i], T * K * 4, () => `matmulEachF32 x ${i}`);
    checkSize(ws[i], Ns[i] * K * 4, () => `matmulEachF32 w ${i}`);
    check(
      T * Math.max(Ns[i], K) < 2 ** 32 && Ns[i] * K < 2 ** 32,
      () => `matmulEachF32: weight ${i} sizes overflow u32 indexing`,
    );
  }
  distinct('matmulEachF32', ...outs);
  for (let i = 0; i < G; i++) distinct('matmulEachF32', outs[i], ...xs, ...ws);
  if (T === 0) return;
  const lanes =
    fusions.enabled &&
    T <= GEMV_MAX_T &&
    3 * G <= gpu.limits.maxStorageBuffersPerShaderStage &&
    gemmVariant(gpu, T, true) === 'lanes' &&
    ws.every((w, i) => blockGemvFits(xs[i], w, 'f32', T, Ns[i], K));
  if (!lanes) {
    for (let i = 0; i < G; i++) matmulF32(gpu, outs[i], xs[i], ws[i], T, Ns[i], K, accumulate, scale);
    return;
  }
  const defines = withColsPerThread(gpu, lanesDefines(gpu, 'f32', T, K, false, undefined, G, XEACH_FLAG), K);
  const buffers = [outs[0], xs[0], ws[0]];
  for (let i = 1; i < G; i++) buffers.push(outs[i], ws[i]);
  buffers.push(...xs.slice(1));
  const [N1, N2 = 0] = Ns.slice(1);
  const groups = Ns.reduce((n, N) => n + Math.ceil(N / defines.COLS), 0);
  const [x0, y0] = splitGrid(groups, gpu.limits.maxComputeWorkgroupsPerDimension);
  gpu.dispatch(
    opKernel(gpu, 'matmulEachF32', 'gemv', 'gemv_lanes_group', defines),
    buffers,
    [x0, y0],
    [T, Ns[0], K, accumulate ? 1 : 0, f32(scale), 0, 0, 0, N1, N2],
  );
}

/**
 * An RMSNorm folded into a group product (matmulGroup, matmulGroupF32): x is then the norm's
 * input, and the product is of rmsNorm(x, w, eps). Where the product runs gemv_lanes_group the
 * norm runs inside it (shaders/gemv.wgsl NORM: x staged times w, each sum times its row's rstd;
 * within f32 rounding of rmsNorm then the product); elsewhere rmsNorm runs first, into a pooled
 * buffer.
 */
export interface FoldedNorm {
  /** (K) bf16 */
  w: GPUBuffer;
  eps: number;
}

/**
 * Whether group products of T rows over G weights fold an RMSNorm into their GEMV
 * (tuning.normFold): where they run gemv_lanes_group (decode on GPUs) and its bindings with the
 * norm's weights fit. A caller whose other readers of the normed rows cannot take the norm (a
 * LoRA A product of one projection alone) runs rmsNorm itself instead.
 */
export function foldsNorm(gpu: Gpu, T: number, G = 3): boolean {
  return (
    tuning.normFold !== 'off' &&
    fusions.enabled &&
    T > 0 &&
    T <= GEMV_MAX_T &&
    matmulVariant(gpu, T) === 'lanes' &&
    2 * G + 2 <= gpu.limits.maxStorageBuffersPerShaderStage
  );
}

/** run(h) with h = rmsNorm(x) in a pooled buffer (a folded norm's fallback). */
function withNormed(gpu: Gpu, x: GPUBuffer, norm: FoldedNorm, T: number, K: number, run: (h: GPUBuffer) => void): void {
  const h = gpu.createBuffer(T * K * 4, 'normed');
  rmsNorm(gpu, h, x, norm.w, T, K, norm.eps);
  run(h);
  gpu.releaseBuffer(h); // safe: later users of the recycled buffer are encoded after these reads
}

/** The checks both group products share; returns one entry per weight. */
function groupChecks(
  op: string,
  outs: readonly GPUBuffer[],
  x: GPUBuffer,
  G: number,
  T: number,
  Ns: readonly number[],
  K: number,
  norm?: FoldedNorm,
): readonly number[] {
  if (norm) {
    checkSize(norm.w, bf16Bytes(K), () => `${op} norm w`);
    distinct(op, x, norm.w, ...outs);
  }
  check(
    (G === 2 || G === 3) && outs.length === G && Ns.length === G,
    () =>
      `${op}: needs 2 or 3 weights, one output and one N each (got ${G} weights, ${outs.length} outputs, ${Ns.length} Ns)`,
  );
  checkSize(x, T * K * 4, () => `${op} x`);
  for (let i = 0; i < G; i++) {
    checkSize(outs[i], T * Ns[i] * 4, () => `${op} out ${i}`);
    check(
      T * Math.max(Ns[i], K) < 2 ** 32 && Ns[i] * K < 2 ** 32,
      () => `${op}: weight ${i} sizes overflow u32 indexing`,
    );
  }
  distinct(op, x, ...outs);
  return G === 2 ? GROUP_OF_2 : GROUP_OF_3;
}
const GROUP_OF_2: readonly number[] = Object.freeze([0, 1]);
const GROUP_OF_3: readonly number[] = Object.freeze([0, 1, 2]);

/**
 * One GEMV dispatch over 2 or 3 weights of one format sharing x, or `single(i)` per weight where
 * none applies. With `lora`, true when the LoRA branches ran too (in the store, groupLoraFold, or
 * in `single`); false leaves them to the caller.
 */
function groupGemv(
  gpu: Gpu,
  op: string,
  outs: readonly GPUBuffer[],
  x: GPUBuffer,
  wbs: readonly GPUBuffer[],
  WEIGHTS: WeightFormat,
  T: number,
  Ns: readonly number[],
  K: number,
  single: (i: number) => void,
  norm?: FoldedNorm,
  lora?: AnyGroupLora,
): boolean {
  const G = wbs.length;
  const variant = groupVariant(gpu, x, wbs, WEIGHTS, T, Ns, K, norm !== undefined);
  check(!norm || variant === 'lanes', () => `${op}: a folded norm needs gemv_lanes_group`); // the callers check first
  if (variant === null) {
    for (let i = 0; i < G; i++) single(i);
    return true;
  }
  // Weight 0 is bound where matmul binds its one weight; the others follow (out1, w1, out2, w2),
  // then a folded norm's weights, then the LoRA branches' u and B of each weight.
  const buffers = [outs[0], x, wbs[0]];
  for (let i = 1; i < G; i++) buffers.push(outs[i], wbs[i]);
  if (norm) buffers.push(norm.w);
  const fold = lora !== undefined && variant !== 'gemv' ? groupLoraFold(gpu, G, norm !== undefined) : null;
  const packed = lora !== undefined && 'B' in lora;
  // u as partial sums (PackedGroupLora's `parts`, PartialGroupLora): matmulGroup checked groupTakesParts.
  const parts = lora !== undefined && 'u' in lora ? lora.parts : undefined;
  // Packed branches fold wherever any do (matmulGroup checked groupLoraPacks); one u and B per
  // weight only where they all fit; each B with u from partial sums where groupTakesParts.
  const inStore = packed ? fold !== null : parts !== undefined || fold === 'each';
  check(!packed || inStore, () => `${op}: packed LoRA branches need the group GEMV`); // matmulGroup checks first
  if (inStore) {
    if ('B' in lora!) buffers.push(lora.u, lora.B);
    else if ('u' in lora!) buffers.push(lora.u, ...lora.Bs);
    else for (let i = 0; i < G; i++) buffers.push(lora!.us[i], lora!.Bs[i]);
  }
  const flags = (norm ? NORM_FLAG : 0) | (inStore ? LORA_FLAG : 0) | (packed ? LORAPACK_FLAG : 0);
  const [N1, N2 = 0] = Ns.slice(1);
  check(
    parts === undefined || (variant === 'lanes' && norm !== undefined),
    () => `${op}: LoRA partial sums need gemv_lanes_group with its norm`,
  ); // matmulGroup checks first
  const loraParams = inStore ? [lora!.r, f32(lora!.scale), ...(parts !== undefined ? [parts] : [])] : [];
  if (variant === 'lanes') {
    const N = G === 2 ? Math.max(Ns[0], Ns[1]) : Math.max(Ns[0], Ns[1], Ns[2]);
    const UPART = parts !== undefined ? upartLength(tmaxFor(T), G, lora!.r) : 0;
    const defines = withColsPerThread(gpu, lanesDefines(gpu, WEIGHTS, T, K, norm !== undefined, N, G, flags, UPART), K);
    const groups = Ns.reduce((n, N) => n + Math.ceil(N / defines.COLS), 0);
    const [x0, y0] = splitGrid(groups, gpu.limits.maxComputeWorkgroupsPerDimension);
    gpu.dispatch(
      opKernel(gpu, op, 'gemv', 'gemv_lanes_group', defines),
      buffers,
      [x0, y0],
      [T, Ns[0], K, 0, f32(1), 0, 0, 0, N1, N2, ...(norm ? [f32(norm.eps)] : []), ...loraParams],
    );
  } else if (variant === 'blocks') {
    const TMAX = tmaxFor(T);
    const groups = Ns.reduce((n, N) => n + Math.ceil(N / (64 * GROUP_COLS)), 0);
    const [x0, y0] = splitGrid(groups, gpu.limits.maxComputeWorkgroupsPerDimension);
    gpu.dispatch(
      opKernel(gpu, op, 'gemv', 'gemv_rows_group', blockDefines(WEIGHTS, TMAX, GROUP_COLS, 0, 0, false, G, flags)),
      buffers,
      [x0, y0, Math.ceil(T / TMAX)],
      [T, Ns[0], K, 0, f32(1), 0, 0, 0, N1, N2, ...loraParams],
    );
  } else {
    const cols = 256 / gemvLanes(K);
    gpu.dispatch(
      opKernel(gpu, op, 'matmul', 'matmul_gemv_group', { ...gemvDefines(gpu, WEIGHTS, T, K), GROUP: G }),
      buffers,
      Ns.reduce((n, N) => n + Math.ceil(N / cols), 0),
      [T, Ns[0], K, 0, K, 1, K, 1, f32(1), N1, N2],
    );
  }
  return inStore;
}

/**
 * The fused kernel a group product takes, or null for one product per weight: matmul's own
 * choice (matmulVariant) when it is a GEMV that takes every weight and the bindings fit
 * ('lanes' falls back to matmul_gemv_group where a row is not whole 16-byte blocks). With `norm`
 * (a folded RMSNorm's weights bound too) only where foldsNorm allows it.
 */
function groupVariant(
  gpu: Gpu,
  x: GPUBuffer,
  wbs: readonly GPUBuffer[],
  WEIGHTS: WeightFormat,
  T: number,
  Ns: readonly number[],
  K: number,
  norm = false,
): 'blocks' | 'lanes' | 'gemv' | null {
  if (!fusions.enabled) return null;
  if (2 * wbs.length + 1 + (norm ? 1 : 0) > gpu.limits.maxStorageBuffersPerShaderStage) return null;
  const variant = matmulVariant(gpu, T);
  const fits = wbs.every((wb, i) => blockGemvFits(x, wb, WEIGHTS, T, Ns[i], K));
  if (norm && !foldsNorm(gpu, T, wbs.length)) return null;
  if (variant === 'blocks' && fits) return 'blocks';
  if (variant === 'lanes' && fits && T <= GEMV_MAX_T) return 'lanes';
  if ((variant === 'gemv' || variant === 'lanes') && T <= GEMV_MAX_T) return 'gemv';
  return null;
}

/**
 * The LoRA A product of the projection after attention (o_proj's u = out A^T) begun in
 * attention_combine (attention's `next`; shaders/attention.wgsl APART): each (token, head)
 * workgroup writes its head's share of u into parts (NH, T, r), whose sum over the NH heads is u;
 * o_proj's GEMV adds them up (matmul's `lora` with `parts`).
 */
export interface AttentionAProduct {
  A: GPUBuffer; // (r, NH HD) f32
  parts: GPUBuffer; // (NH, T, r) f32 out
  r: number;
}

/**
 * out, q (T, NH, HD) f32 ; token t attends to slot[t], positions 0..pos[t], read through the page
 * table from the cache (KvPaging; f16 is widened to f32, the math is f32); GQA h -> h / (NH/NKV).
 * With `next`, where a split decode attention's attention_combine writes out (tuning.loraAFold),
 * it begins o_proj's LoRA A product too (AttentionAProduct); returns the partial sums a row it
 * wrote (NH), 0 where it did not.
 */
export function attention(
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
  next?: AttentionAProduct,
): number {
  check(HD <= 256, () => `attention: HD=${HD} > 256`);
  check(NH % NKV === 0, () => `attention: NH=${NH} not a multiple of NKV=${NKV}`);
  checkSize(out, T * NH * HD * 4, 'attention out');
  checkSize(q, T * NH * HD * 4, 'attention q');
  if (next) {
    check(
      Number.isInteger(next.r) && next.r >= 1,
      () => `attention: the next A product's rows must be a positive integer (got ${next.r})`,
    );
    checkSize(next.A, next.r * NH * HD * 4, 'attention next A');
    checkSize(next.parts, NH * T * next.r * 4, 'attention next A partials');
    distinct('attention', out, q, next.A, next.parts);
  }
  const pageShift = checkPaging('attention', kv, kCache, vCache, pageTable, NKV, HD);
  if (attentionVariant(gpu, T, HD, 'prefill') === 'tiled') {
    attentionTiledPaged(gpu, out, q, kCache, vCache, pageTable, slot, pos, T, NH, NKV, HD, kv, pageShift);
    return 0;
  }
  // The combine takes the next A product where its two bindings fit beside its three.
  const nextIn =
    next && tuning.loraAFold !== 'off' && gpu.limits.maxStorageBuffersPerShaderStage >= 5 ? next : undefined;
  const HG = attentionHeadGroup(NH, NKV);
  const lanes = attentionLanesFor(gpu, T, NH / HG, HD, kv.dtype);
  if (lanes) {
    const buffers = { out, q, kCache, vCache, pageTable, slot, pos };
    return attentionLanesRun(gpu, buffers, T, NH, NKV, HD, kv, pageShift, HG, lanes, nextIn);
  }
  const splits = attentionSplits(gpu, T, NH / HG, kv.maxT, HG > 1 ? 128 : 256);
  const splitKeys = Math.ceil(kv.maxT / splits / ATTENTION_BLOCK) * ATTENTION_BLOCK;
  const params = [T, NH, NKV, HD, kv.maxT, f32(1 / Math.sqrt(HD)), kv.pagesPerSlot, pageShift, splitKeys, splits];
  const defines: Defines = HG > 1 ? { KV: kv.dtype, HG } : { KV: kv.dtype };
  if (splits === 1) {
    gpu.dispatch(
      opKernel(gpu, 'attention', 'attention', 'attention_forward', defines),
      bindings(ATTENTION_BINDINGS.attention_forward, { out, q, kCache, vCache, pageTable, slot, pos }),
      (T * NH) / HG,
      params,
    );
    return 0;
  }
  const partOut = gpu.createBuffer(T * NH * splits * HD * 4, 'attentionSplitOut'); // (T, NH, splits, HD)
  const partLse = gpu.createBuffer(T * NH * splits * 4, 'attentionSplitLse'); // (T, NH, splits)
  gpu.dispatch(
    opKernel(gpu, 'attention', 'attention', 'attention_split', defines),
    bindings(ATTENTION_BINDINGS.attention_split, { out: partOut, q, kCache, vCache, pageTable, slot, pos, partLse }),
    (T * NH * splits) / HG,
    params,
  );
  const parts = attentionCombine(gpu, out, partLse, partOut, T, NH, kv, params, nextIn);
  gpu.releaseBuffer(partOut);
  gpu.releaseBuffer(partLse);
  return parts;
}

/**
 * attention_combine: out from the splits' outputs and log-sum-exps; with `next`, o_proj's LoRA A
 * partial sums too (define APART). Returns how many a row it wrote: NH, or 0 without `next`.
 */
function attentionCombine(
  gpu: Gpu,
  out: GPUBuffer,
  splitLse: GPUBuffer,
  splitOut: GPUBuffer,
  T: number,
  NH: number,
  kv: KvPaging,
  params: readonly Param[],
  next?: AttentionAProduct,
): number {
  const buffers = bindings(ATTENTION_BINDINGS.attention_combine, { out, splitLse, splitOut });
  gpu.dispatch(
    gpu.kernel('attention', 'attention_combine', next ? { KV: kv.dtype, APART: 1 } : { KV: kv.dtype }),
    next ? [...buffers, next.A, next.parts] : buffers,
    T * NH,
    next ? [...params, next.r] : params,
  );
  return next ? NH : 0;
}

/**
 * attention_lanes (shaders/attention.wgsl LANES) on this adapter for head_dim HD and the cache's
 * element type: LK lanes a key, the largest power of two up to 16 that divides the row's 16-byte
 * pieces (HD / 8 in f16, HD / 4 in f32) and is at most the adapter's smallest subgroup, and VPT
 * pieces a lane. Null where it cannot run: no subgroups, an adapter that does not state its
 * smallest subgroup, or a row that is not whole pieces.
 */
export function attentionLanes(gpu: Gpu, HD: number, dtype: KvPaging['dtype']): { LK: number; VPT: number } | null {
  if (!useSubgroups(gpu) || !(gpu.info.subgroupMinSize >= 1)) return null;
  const perPiece = dtype === 'f16' ? 8 : 4;
  if (HD % perPiece !== 0) return null;
  const pieces = HD / perPiece;
  let LK = 1;
  while (LK * 2 <= Math.min(16, gpu.info.subgroupMinSize) && pieces % (LK * 2) === 0) LK *= 2;
  return { LK, VPT: pieces / LK };
}

/**
 * Whether attention() takes attention_lanes: forced by tuning.attention 'lanes' where it runs
 * (else the split kernel); under 'auto' on GPUs for decode-like calls (fewer than
 * ATTENTION_TARGET_GROUPS / 2 (token, head group) rows, where attention_split would be picked), never on CPU adapters.
 */
function attentionLanesFor(
  gpu: Gpu,
  T: number,
  rows: number,
  HD: number,
  dtype: KvPaging['dtype'],
): { LK: number; VPT: number } | null {
  if (tuning.attention !== 'lanes' && tuning.attention !== 'auto') return null;
  if (tuning.attention === 'auto' && (autoForCpu(gpu) || T * rows >= ATTENTION_TARGET_GROUPS / 2)) return null;
  return attentionLanes(gpu, HD, dtype);
}

/** attention_lanes' workgroups to aim for (256 threads each) when T * rows alone is fewer. */
const LANES_TARGET_GROUPS = 256;
/** attention_lanes: most splits of a (token, head group). */
const LANES_MAX_SPLITS = 64;
/**
 * attention_lanes: fewest keys a split (4 steps of its 16 groups at 16 lanes), so a short context
 * (up to 255 keys) is one split, which writes the output itself: no attention_combine dispatch.
 */
const LANES_MIN_KEYS = 128;

/**
 * attention() through attention_lanes, split over the key length into enough splits of at least
 * LANES_MIN_KEYS keys for ~LANES_TARGET_GROUPS workgroups (counted on kv.maxT: splits past a
 * sequence's end exit at once), combined by attention_combine; one split writes out directly.
 */
function attentionLanesRun(
  gpu: Gpu,
  b: Record<(typeof ATTENTION_BINDINGS.attention_forward)[number], GPUBuffer>,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  kv: KvPaging,
  pageShift: number,
  HG: number,
  g: { LK: number; VPT: number },
  next?: AttentionAProduct,
): number {
  const rows = NH / HG;
  const most = Math.max(1, Math.min(LANES_MAX_SPLITS, Math.floor(kv.maxT / LANES_MIN_KEYS)));
  const splits = Math.max(1, Math.min(most, Math.ceil(LANES_TARGET_GROUPS / (T * rows))));
  const splitKeys = Math.ceil(kv.maxT / splits / ATTENTION_BLOCK) * ATTENTION_BLOCK;
  const params = [T, NH, NKV, HD, kv.maxT, f32(1 / Math.sqrt(HD)), kv.pagesPerSlot, pageShift, splitKeys, splits];
  const defines: Defines = { KV: kv.dtype, LANES: true, LK: g.LK, VPT: g.VPT, ...(HG > 1 ? { HG } : {}) };
  const kernel = opKernel(gpu, 'attention', 'attention', 'attention_lanes', defines);
  const partLse = gpu.createBuffer(T * NH * splits * 4, 'attentionLanesLse'); // (T, NH, splits)
  const partOut = splits === 1 ? b.out : gpu.createBuffer(T * NH * splits * HD * 4, 'attentionLanesOut');
  gpu.dispatch(
    kernel,
    bindings(ATTENTION_BINDINGS.attention_split, { ...b, out: partOut, partLse }),
    T * rows * splits,
    params,
  );
  let parts = 0;
  if (splits > 1) {
    parts = attentionCombine(gpu, b.out, partLse, partOut, T, NH, kv, params, next);
    gpu.releaseBuffer(partOut);
  }
  gpu.releaseBuffer(partLse);
  return parts;
}

/** Keys per block of shaders/attention.wgsl (BLK); a split covers a multiple of it. */
const ATTENTION_BLOCK = 64;
/** Split-K decode attention: aim for this many workgroups in flight when T * NH alone is fewer. */
const ATTENTION_TARGET_GROUPS = 1024;

/** Most query heads one workgroup of the paged attention kernels takes (shaders/attention.wgsl HG: one vec4 of heads). */
const ATTENTION_MAX_HEAD_GROUP = 4;

/**
 * Query heads one workgroup of attention_forward / attention_split takes: the NH / NKV heads of a
 * GQA group, or its largest divisor up to ATTENTION_MAX_HEAD_GROUP (8 heads: two workgroups of 4),
 * so each key and value is read once for all of them; or 1 (tuning.attentionHeads 'one'; 'auto'
 * and 'group' take the group).
 */
export function attentionHeadGroup(NH: number, NKV: number): number {
  const G = NH / NKV;
  if (tuning.attentionHeads === 'one') return 1;
  for (let hg = Math.min(G, ATTENTION_MAX_HEAD_GROUP); hg > 1; hg--) if (G % hg === 0) return hg;
  return 1;
}

/**
 * Splits of the key range per (token, head group): 1 (one workgroup reads the whole context)
 * unless few queries meet a long context on a GPU, as in decode, where T * rows workgroups (rows:
 * head groups per token) would leave most of it idle; then enough splits of at least minKeys
 * keys for ~ATTENTION_TARGET_GROUPS workgroups (at most 32). CPU adapters keep 1 (nothing idles
 * there). tuning.attention forces it.
 */
function attentionSplits(gpu: Gpu, T: number, rows: number, maxT: number, minKeys: number): number {
  if (tuning.attention === 'single' || tuning.attention === 'tiled') return 1; // 'tiled' here: a head_dim it does not take
  // tests: splits of one block, some empty ('lanes' where attention_lanes cannot run: this kernel instead)
  if (tuning.attention === 'split' || tuning.attention === 'lanes')
    return Math.min(8, Math.max(2, Math.ceil(maxT / ATTENTION_BLOCK)));
  if (autoForCpu(gpu) || T * rows >= ATTENTION_TARGET_GROUPS / 2) return 1;
  const most = Math.max(1, Math.min(32, Math.floor(maxT / minKeys)));
  return Math.max(1, Math.min(most, Math.ceil(ATTENTION_TARGET_GROUPS / (T * rows))));
}

/** out (n) f32 = silu(gate) * up */
export function siluMul(gpu: Gpu, out: GPUBuffer, gate: GPUBuffer, up: GPUBuffer, n: number): void {
  checkSize(out, n * 4, 'siluMul out');
  checkSize(gate, n * 4, 'siluMul gate');
  checkSize(up, n * 4, 'siluMul up');
  gpu.dispatch(gpu.kernel('elementwise', 'silu_mul_forward'), [out, gate, up], Math.ceil(n / ELEMS_PER_WG), [n]);
}

/** out (R, C) f32 = x[rows[r], :] ; rows (R) u32 ; x (., C) f32 (shaders/embed.wgsl with f32 rows) */
export function gatherRows(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, rows: GPUBuffer, R: number, C: number): void {
  checkSize(out, R * C * 4, 'gatherRows out');
  checkSize(rows, R * 4, 'gatherRows rows');
  check(out !== x, 'gatherRows: out and x must differ');
  gpu.dispatch(
    gpu.kernel('embed', 'gather_rows', { WEIGHTS: 'f32' }),
    [out, rows, x],
    Math.ceil((R * C) / ELEMS_PER_WG),
    [R, C, 0],
  );
}

/**
 * out[rows[r], :] = scale[r] * src[r, :] for r < R: out (outRows, C) f32, src (R, C) f32, rows (R)
 * u32 (distinct, each < outRows; a row past it writes nothing), scale (R) f32. Rows of out not
 * named keep their contents.
 */
export function scatterRowsScaled(
  gpu: Gpu,
  out: GPUBuffer,
  src: GPUBuffer,
  rows: GPUBuffer,
  scale: GPUBuffer,
  R: number,
  C: number,
  outRows: number,
): void {
  checkSize(out, outRows * C * 4, 'scatterRowsScaled out');
  checkSize(src, R * C * 4, 'scatterRowsScaled src');
  checkSize(rows, R * 4, 'scatterRowsScaled rows');
  checkSize(scale, R * 4, 'scatterRowsScaled scale');
  check(Math.max(R, outRows) * C < 2 ** 32, 'scatterRowsScaled: sizes overflow u32 indexing');
  distinct('scatterRowsScaled', out, src, rows, scale);
  if (R === 0) return;
  gpu.dispatch(
    gpu.kernel('embed', 'scatter_rows_scaled', { WEIGHTS: 'f32', SCATTER: 1 }),
    [out, rows, src, scale],
    Math.ceil((R * C) / ELEMS_PER_WG),
    [R, C, outRows],
  );
}

export interface SampleOptions {
  /** 0 = greedy argmax. */
  temperature: number;
  /** Keep the k most likely tokens; 0 = off. */
  topK: number;
  /** Keep the smallest set with this much probability; 1 = off. */
  topP: number;
}

// Where sample() writes log-probs nobody asked for: one (B) f32 scratch per (Gpu, B).
const logpScratch = new WeakMap<Gpu, Map<number, GPUBuffer>>();

function scratchLogp(gpu: Gpu, B: number): GPUBuffer {
  let perGpu = logpScratch.get(gpu);
  if (!perGpu) logpScratch.set(gpu, (perGpu = new Map()));
  let buf = perGpu.get(B);
  if (!buf) perGpu.set(B, (buf = gpu.createBuffer(B * 4, `sampleLogpScratch.${B}`)));
  return buf;
}

// Barrier count is 32-64 bisection rounds x log2(WG); a small vocabulary needs few threads.
const sampleWorkgroup = (V: number) => (V >= 8192 ? 256 : V >= 512 ? 64 : 16);

/**
 * outIds (B) u32 ; logits (B, V) f32 ; RNG = hash(seed, step, row) ; outLogp (B) f32, when given:
 * log-prob of each id under the distribution it was drawn from (logits / temperature, cut to
 * top-k then top-p, renormalized; 0 for greedy), the exact behaviour log-prob for PPO.
 */
export function sample(
  gpu: Gpu,
  outIds: GPUBuffer,
  logits: GPUBuffer,
  B: number,
  V: number,
  opts: SampleOptions,
  seed: number,
  step: number,
  outLogp?: GPUBuffer,
): void {
  checkSize(outIds, B * 4, 'sample outIds');
  checkSize(logits, B * V * 4, 'sample logits');
  if (outLogp) checkSize(outLogp, B * 4, 'sample outLogp');
  check(opts.temperature >= 0 && opts.topK >= 0 && opts.topP > 0, () => `sample: bad options ${JSON.stringify(opts)}`);
  const lp = outLogp ?? scratchLogp(gpu, B);
  distinct('sample', outIds, logits, lp);
  const params = [
    B,
    V,
    Math.floor(opts.topK),
    seed >>> 0,
    step >>> 0,
    f32(opts.temperature),
    f32(Math.min(opts.topP, 1)),
  ];
  if (sampleChunked(gpu, V, opts)) {
    sampleInChunks(gpu, 'sample', subgroupDefines(useSubgroups(gpu)), outIds, logits, lp, B, V, params);
    return;
  }
  const WG = sampleWorkgroup(V);
  gpu.dispatch(
    opKernel(gpu, 'sample', 'sample', 'sample_forward', subgroupDefines(useSubgroups(gpu)), { WG }),
    [outIds, logits, lp],
    B,
    params,
  );
}

/** shaders/sample.wgsl CH: tokens a chunk of sample_chunks; at most SAMPLE_CHUNK_WG chunks a row. */
const SAMPLE_CHUNK = 2048;
const SAMPLE_CHUNK_WG = 256;

/**
 * Whether sample / sampleRows draw through sample_chunks + sample_pick (tuning.sampleChunks:
 * 'auto' on GPUs): greedy, or temperature without top-k and top-p, over a vocabulary of at most
 * 256 chunks.
 */
function sampleChunked(gpu: Gpu, V: number, opts: SampleOptions): boolean {
  if (tuning.sampleChunks === 'off' || Math.ceil(V / SAMPLE_CHUNK) > SAMPLE_CHUNK_WG) return false;
  if (!(opts.temperature <= 0 || ((opts.topK === 0 || opts.topK >= V) && opts.topP >= 1))) return false;
  return tuning.sampleChunks === 'on' || !autoForCpu(gpu);
}

/**
 * The chunked draw: sample_chunks over B rows x ceil(V / SAMPLE_CHUNK) chunks, then sample_pick a
 * row (bindings 1-3 as sample_forward's or sample_rows', the chunks' results at 4).
 */
function sampleInChunks(
  gpu: Gpu,
  op: string,
  defines: Defines,
  out: GPUBuffer,
  logits: GPUBuffer,
  third: GPUBuffer,
  B: number,
  V: number,
  params: readonly Param[],
): void {
  const chunks = Math.ceil(V / SAMPLE_CHUNK);
  const partials = gpu.createBuffer(B * chunks * 8, 'sampleChunks'); // (B, chunks) vec2u
  const WG = SAMPLE_CHUNK_WG;
  gpu.dispatch(gpu.kernel('sample', 'sample_chunks', defines, { WG }), [partials, logits], B * chunks, params);
  gpu.dispatch(opKernel(gpu, op, 'sample', 'sample_pick', defines, { WG }), [out, logits, third, partials], B, params);
  gpu.releaseBuffer(partials);
}

/**
 * sample() over B rows in one dispatch, each row with its own RNG inputs: rng (B, 3) u32 = (seed,
 * step, hash row) per row. Row b draws bitwise what sample(gpu, ids, rowB, 1, V, opts, seed, step)
 * draws when hash row = 0 (or row `hash row` of a sample() dispatch with that seed and step), since a
 * row's workgroup reads only its own logits. out (2B) u32: the ids, then their log-probs as f32 bits
 * (one buffer: one readback, and embedPicked reads the ids for the next step).
 */
export function sampleRows(
  gpu: Gpu,
  out: GPUBuffer,
  logits: GPUBuffer,
  rng: GPUBuffer,
  B: number,
  V: number,
  opts: SampleOptions,
): void {
  checkSize(out, 2 * B * 4, 'sampleRows out');
  checkSize(logits, B * V * 4, 'sampleRows logits');
  checkSize(rng, B * 3 * 4, 'sampleRows rng');
  check(
    opts.temperature >= 0 && opts.topK >= 0 && opts.topP > 0,
    () => `sampleRows: bad options ${JSON.stringify(opts)}`,
  );
  distinct('sampleRows', out, logits, rng);
  const defines = { ...subgroupDefines(useSubgroups(gpu)), ROW_RNG: true };
  const params = [B, V, Math.floor(opts.topK), 0, 0, f32(opts.temperature), f32(Math.min(opts.topP, 1))];
  if (sampleChunked(gpu, V, opts)) {
    sampleInChunks(gpu, 'sampleRows', defines, out, logits, rng, B, V, params); // as sample(): the same sums
    return;
  }
  const WG = sampleWorkgroup(V); // as sample(): the same WG sums in the same order
  gpu.dispatch(opKernel(gpu, 'sampleRows', 'sample', 'sample_rows', defines, { WG }), [out, logits, rng], B, params);
}
