// q4 weights dequantized once per product for the tiled GEMM (tuning.gemmQ4Dequant): which
// products take it, and the scratch it costs. Pure arithmetic (no GPU import), shared by the ops
// (src/ops/forward.ts gemmTiled) and the memory formulas (src/train/trainingPassBytes.ts,
// src/train/memory.ts), which count the scratch.
//
// Why (measured on an NVIDIA H100, bench/results/2026-12-06-h100, one run): the tiled GEMM that
// dequantizes q4 on the fly took 4.23 ms for x . W^T at M 512, N 9,728, K 2,560 (gemm-ab.ts,
// 6.0 TFLOP/s), where the same GEMM over bf16 weights took 1.15 ms (22.3 TFLOP/s, bench ops). Its B
// tile takes 8 bytes of nibbles and a 4-byte scale word per thread and R step, from 16 different
// rows per 32 threads; the q4 products were 92 of the 119 ms of a 4-layer LoRA step there. A
// dequantization pass that reads the nibbles once, in order, and writes the f32 values (14 MB in,
// 100 MB out for that weight: about 0.04 ms at the copy rate of 2.7 TB/s) lets the product run
// the f32-weight tile, which loads 32 contiguous bytes per thread. The values are the same f32
// products q * s that the on-the-fly tile forms, so the GEMM's result is the same bit for bit.
// Not yet timed end to end (no GPU lent since): bench/gemm-ab.ts --kernels and the device run's
// profile A/B measure it.

export type Q4DequantMode = 'auto' | 'on' | 'off';

/** 'auto' takes products of at least this many rows: from two 64-row output tiles on, each weight tile is read more than once. */
export const Q4_DEQUANT_MIN_ROWS = 128;
/** 'auto' (and 'on') leave weights whose f32 copy would pass this many bytes on the fly (the LM head: 1.5 GB at Qwen3-4B). */
export const Q4_DEQUANT_MAX_BYTES = 128 * 2 ** 20;

/**
 * Whether the tiled GEMM over a q4 weight of N * R elements with M output rows dequantizes it
 * first: 'off' never; 'on' wherever the copy fits Q4_DEQUANT_MAX_BYTES (tests); 'auto' where it
 * fits and M >= Q4_DEQUANT_MIN_ROWS, on GPUs (`cpu` false: CPU adapters run other kernels).
 */
export function q4DequantFor(mode: Q4DequantMode, cpu: boolean, M: number, N: number, R: number): boolean {
  if (mode === 'off' || (mode === 'auto' && cpu) || N * R * 4 > Q4_DEQUANT_MAX_BYTES) return false;
  return mode === 'on' || M >= Q4_DEQUANT_MIN_ROWS;
}

/** Bytes of the pooled f32 copy that 'auto' takes on a GPU for that product (0 where it does not). */
export function q4DequantScratchBytes(M: number, N: number, R: number): number {
  return q4DequantFor('auto', false, M, N, R) ? N * R * 4 : 0;
}
