// Split-K for the tiled GEMM (shaders/matmul.wgsl gemm_tiled, define SPLITK): how many slices of
// R a product takes. Pure arithmetic (no GPU import), shared by the ops (src/ops/forward.ts gemm
// and matmul) and the training pass's memory formula (src/train/trainingPassBytes.ts), which
// counts the slices' scratch of partial outputs.
//
// Why (measured on an NVIDIA H200, bench/results/2026-12-04-h200/round.log): a 64 x 128 output
// tile per workgroup leaves a narrow or short product with a handful of workgroups for a GPU of
// 132 multiprocessors. The LoRA A products (N = r = 16) made 8 workgroups at T = 512 and took
// ~200-230 us each, 22 of a 512-token prefill's 68 ms; the LM head's input gradient over 64-row
// chunks (M = 64, N = 2,560, R = 151,936) makes 20. Slicing R gives each slice its own workgroups,
// at the cost of writing (slices, M, N) partial outputs and one pass that sums them.

/** The tiled GEMM's output tile (shaders/matmul.wgsl BM x BN) and its R step (BK); BM is 128 with define TM8. */
export const GEMM_TILE_M = 64;
export const GEMM_TILE_M_TALL = 128;
export const GEMM_TILE_N = 128;
export const GEMM_TILE_K = 16;

/** 'auto' slices products whose tiles make fewer workgroups than this... */
export const SPLITK_MIN_GROUPS = 128;
/** ...into enough slices for about this many workgroups... */
export const SPLITK_TARGET_GROUPS = 256;
/** ...each slice at least this much of R (8 steps of the tile loop), at most SPLITK_MAX_SLICES slices... */
export const SPLITK_MIN_SLICE = 128;
export const SPLITK_MAX_SLICES = 64;
/** ...and their partial outputs at most this many bytes. */
export const SPLITK_MAX_SCRATCH = 32 * 2 ** 20;

export type SplitKMode = 'auto' | 'on' | 'off';

export interface SplitK {
  /** Slices of R (1: no split). */
  slices: number;
  /** R per slice, a multiple of GEMM_TILE_K (R itself when slices is 1). */
  rSlice: number;
}

/**
 * The split of an (M, N) output over R, in output tiles of tileM x GEMM_TILE_N: `mode` 'off'
 * never splits; 'auto' splits where the tiles make fewer than SPLITK_MIN_GROUPS workgroups (and `cpu` is false: CPU adapters run other
 * kernels, and their few cores are busy anyway); 'on' (tests) splits wherever two slices of at
 * least GEMM_TILE_K fit. Only outputs of whole vec4s (M N % 4 == 0: gemv_cols_reduce sums vec4s).
 */
export function splitKFor(
  mode: SplitKMode,
  cpu: boolean,
  M: number,
  N: number,
  R: number,
  tileM: number = GEMM_TILE_M,
): SplitK {
  const none = { slices: 1, rSlice: R };
  if (mode === 'off' || (mode === 'auto' && cpu) || (M * N) % 4 !== 0 || M * N === 0) return none;
  const groups = Math.ceil(N / GEMM_TILE_N) * Math.ceil(M / tileM);
  if (mode === 'auto' && groups >= SPLITK_MIN_GROUPS) return none;
  const minSlice = mode === 'on' ? GEMM_TILE_K : SPLITK_MIN_SLICE;
  const most = Math.min(SPLITK_MAX_SLICES, Math.floor(R / minSlice), Math.floor(SPLITK_MAX_SCRATCH / (M * N * 4)));
  const want = Math.min(most, Math.max(mode === 'on' ? 2 : 1, Math.ceil(SPLITK_TARGET_GROUPS / groups)));
  if (want < 2) return none;
  const rSlice = Math.ceil(R / want / GEMM_TILE_K) * GEMM_TILE_K;
  const slices = Math.ceil(R / rSlice);
  return slices < 2 ? none : { slices, rSlice };
}

/**
 * Bytes of the pooled scratch of partial outputs, (slices, M, N) f32, that 'auto' takes on a GPU
 * with output tiles of tileM rows (0 when it does not split).
 */
export function splitKScratchBytes(M: number, N: number, R: number, tileM: number = GEMM_TILE_M): number {
  const { slices } = splitKFor('auto', false, M, N, R, tileM);
  return slices > 1 ? slices * M * N * 4 : 0;
}
