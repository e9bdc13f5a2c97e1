// q4 weights dequantized once per product for the tiled GEMM (tuning.gemmQ4Dequant): which
// products take it, and the scratch it costs. Pure arithmetic (no GPU import), shared by the ops
// (src/ops/forward.ts tiledProduct) and the training pass's memory formula
// (src/train/trainingPassBytes.ts `q4Dequant`), which counts the scratch.
//
// Why: the tiled GEMM that dequantizes q4 on the fly (shaders/matmul.wgsl loadB8) takes 8 bytes
// of nibbles and a 4-byte scale word per thread and R step, from 16 different rows per 32 threads,
// where the f32-weight tile loads 32 contiguous bytes per thread. A dequantization pass reads the
// nibbles once, in order, and writes the f32 values (for a 9,728 x 2,560 weight 14 MB in and
// 100 MB out: about 0.04 ms at an H100's copy rate of 2.7 TB/s); the product then runs the
// f32-weight tile. The values are the same f32 products q * s that the q4 tile forms, so the
// GEMM's result is the same bit for bit. What the NVIDIA H100 run of 2026-12-06 says is mixed:
// bench/gemm-ab.ts timed x . W^T at M 512, N 9,728, K 2,560 at 4.23 ms over q4 (in a process
// whose other run of the same kernel took 6.05 ms) against 1.15 ms over bf16 in bench ops, while
// the LoRA step's profile puts the q4 forward products, the LM head's included, at about 17
// TFLOP/s against bf16's 22 at M 512. So 'auto' leaves it off until a GPU run times 'on' against
// it (bench/profile.ts --kernels gemmQ4Dequant=on; scripts/device-run.sh does).

export type Q4DequantMode = 'auto' | 'on' | 'off';

/** 'on' takes products of at least this many rows: from two 64-row output tiles on, each weight tile is read more than once. */
export const Q4_DEQUANT_MIN_ROWS = 128;
/** 'on' leaves weights whose f32 copy would pass this many bytes on the fly (the LM head: 1.5 GB at Qwen3-4B). */
export const Q4_DEQUANT_MAX_BYTES = 128 * 2 ** 20;

/**
 * Whether the tiled GEMM over a q4 weight of N * R elements with M output rows dequantizes it
 * first: 'auto' and 'off' never (see above); 'on' where M >= Q4_DEQUANT_MIN_ROWS and the copy fits
 * Q4_DEQUANT_MAX_BYTES, on any adapter.
 */
export function q4DequantFor(mode: Q4DequantMode, M: number, N: number, R: number): boolean {
  return mode === 'on' && M >= Q4_DEQUANT_MIN_ROWS && N * R * 4 <= Q4_DEQUANT_MAX_BYTES;
}

/** Bytes of the pooled f32 copy that 'on' takes for that product (0 where it does not). */
export function q4DequantScratchBytes(M: number, N: number, R: number): number {
  return q4DequantFor('on', M, N, R) ? N * R * 4 : 0;
}
