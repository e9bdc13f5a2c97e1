// How shaders/gemv.wgsl gemv_cols lays out out (M, N) = a (M, K) . w (K, N): rows of a per thread,
// workgroups, and the split of the K rows of w when too few workgroups would run. Pure arithmetic
// (no GPU import), shared by the op (src/ops/forward.ts) and the training pass's memory formula
// (src/train/trainingPassBytes.ts), which counts the splits' scratch of partial outputs.

/** Rows of x (or a) per thread of the CPU-adapter GEMV kernels: 1, 2, 4 or 8. */
export const tmaxFor = (M: number) => (M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8);

/** Workgroups below which gemv_cols splits the rows of w (2 cores or 200 GPU cores alike stay busy). */
export const COLS_MIN_WORKGROUPS = 16;
/** Fewest rows of w per split: below that the partial sums cost more than the parallelism gains. */
export const COLS_MIN_CHUNK = 256;

export interface ColsSplit {
  TMAX: number;
  zRows: number; // groups of TMAX rows of a
  groups: number; // workgroups of 64 threads x 8 columns
  kChunk: number; // rows of w per split, a multiple of 4
  splits: number;
}

export function colsSplit(M: number, N: number, K: number): ColsSplit {
  const TMAX = tmaxFor(M);
  const zRows = Math.ceil(M / TMAX);
  const groups = Math.ceil(N / 8 / 64);
  const want = Math.ceil(COLS_MIN_WORKGROUPS / (groups * zRows));
  const kChunk = Math.ceil(K / Math.max(1, Math.min(want, Math.floor(K / COLS_MIN_CHUNK))) / 4) * 4;
  return { TMAX, zRows, groups, kChunk, splits: Math.ceil(K / kChunk) };
}

/** Whether gemv_cols can take the shape: 8 output columns per thread, a read as vec4s. */
export const colsShapeFits = (N: number, K: number) => N % 8 === 0 && K % 4 === 0;

/**
 * Bytes of gemv_cols' pooled scratch of partial outputs, (splits, M, N) f32, when it splits (0
 * otherwise, and for shapes it does not take). Only CPU adapters run gemv_cols: for a GPU this
 * is an upper bound.
 */
export function colsScratchBytes(M: number, N: number, K: number): number {
  if (M === 0 || N === 0 || !colsShapeFits(N, K)) return 0;
  const { splits } = colsSplit(M, N, K);
  return splits > 1 ? splits * M * N * 4 : 0;
}

/** gemv_lanes splits K only below this many workgroups of columns (the LoRA A products: N = r). */
export const LANES_SPLIT_BELOW = 32;
/** 16-byte blocks each lane walks per slice of K (a slice is LANES_SPLIT_BLOCKS rounds of LANES blocks). */
export const LANES_SPLIT_BLOCKS = 8;
/** Most slices of K: bounds the partial outputs (slices, M, N) and the reduce's loop. */
export const LANES_SPLIT_MAX = 64;

export interface LanesSplit {
  kChunk: number; // elements of K per slice (0: one slice), whole rounds of LANES blocks
  splits: number;
}

/**
 * How shaders/gemv.wgsl gemv_lanes splits K (tuning.gemvSplitK): when ceil(N / cols) workgroups
 * are fewer than LANES_SPLIT_BELOW and each lane would walk at least two slices' worth of blocks,
 * K is cut into slices of LANES_SPLIT_BLOCKS rounds (more where LANES_SPLIT_MAX caps the count),
 * each a workgroup of its own. Depends on N, K and the lane layout only, not on the rows M (a
 * batch splits as one row would). `blockElems` is the elements of one block (4 f32,
 * 8 bf16, 32 q4).
 */
export function lanesSplit(N: number, K: number, blockElems: number, lanes: number, cols: number): LanesSplit {
  const round = lanes * blockElems; // elements of one round of the lanes over K
  const rounds = Math.ceil(K / round);
  if (Math.ceil(N / cols) >= LANES_SPLIT_BELOW || rounds < 2 * LANES_SPLIT_BLOCKS) return { kChunk: 0, splits: 1 };
  const perSlice = Math.max(LANES_SPLIT_BLOCKS, Math.ceil(rounds / LANES_SPLIT_MAX));
  return { kChunk: perSlice * round, splits: Math.ceil(rounds / perSlice) };
}

/** Most threads per column of gemv_lanes (shaders/gemv.wgsl LANES). */
export const LANES_MAX = 64;

/**
 * The most partial sums a row that matmul's `next` A product writes over N columns (K.NextAProduct:
 * one per gemv_lanes workgroup, the narrowest of which has 256 / LANES_MAX = 4 columns).
 */
export const nextAParts = (N: number): number => Math.ceil(N / (256 / LANES_MAX));

/**
 * gemv_lanes' threads per column for N columns over rows of K elements, widened from `lanes`
 * (tuning.gemvWideLanes): doubled, up to LANES_MAX, while the columns (256 / lanes per
 * workgroup) make fewer than LANES_SPLIT_BELOW workgroups and each lane would still walk at
 * least LANES_SPLIT_BLOCKS blocks. Qwen3-4B's LoRA A products in decode (N = r = 16, K = 2,560
 * f32, 640 blocks a row): 16 lanes (one workgroup a weight, 40 blocks a lane) become 64 (four
 * workgroups, 10 blocks a lane); the projections' own weights (thousands of columns) keep theirs.
 */
export function wideLanes(N: number, K: number, blockElems: number, lanes: number): number {
  const blocks = K / blockElems;
  let l = lanes;
  while (l < LANES_MAX && Math.ceil(N / (256 / l)) < LANES_SPLIT_BELOW && blocks / (2 * l) >= LANES_SPLIT_BLOCKS)
    l *= 2;
  return l;
}

/** Most threads a column that gemv_lanes' 'auto' columns a thread lead to: one NVIDIA warp. */
export const CPT_LANES_MAX = 32;

/**
 * gemv_lanes' output columns a thread (shaders/gemv.wgsl CPT, tuning.gemvCols 'auto' on GPUs) for
 * `lanes` threads a column over rows of K elements in blocks of `blockElems`, x staged
 * `chunkElems` elements of a row at a time: the most of 4 and 2 whose lanes (lanes * CPT) stay
 * within CPT_LANES_MAX and within the blocks of one chunk (of the row, if shorter), so that every
 * lane has a block of each chunk; else 1. The workgroup keeps its columns (256 / lanes): each of
 * its threads takes CPT of them with a CPT-th of the blocks each. Qwen3-4B q4 at B = 1: q/k/v and
 * gate/up (8 lanes, 80 blocks, 64 a chunk with the folded norm) take 4 over 32 lanes; o_proj and
 * down_proj (16 lanes) 2; at B = 4 the folded norm's chunks of 16 blocks leave those 2.
 */
export function colsPerThread(lanes: number, K: number, blockElems: number, chunkElems: number): number {
  const blocks = Math.min(Math.ceil(K / blockElems), Math.floor(chunkElems / blockElems));
  for (const cpt of [4, 2]) if (lanes * cpt <= CPT_LANES_MAX && lanes * cpt <= blocks) return cpt;
  return 1;
}
