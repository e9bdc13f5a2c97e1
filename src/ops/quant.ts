// q4 quantization on the GPU (shaders/quant.wgsl): bf16 rows in, the q4 layout of docs/ENGINE.md
// ("q4 weights") out, bit-exact with src/model/q4.ts quantizeQ4.
import type { Gpu } from '../gpu/device.ts';
import { ELEMS_PER_WG, bf16Bytes, check, checkSize, distinct, opKernel, q4Words } from './common.ts';

/** Status word value of a tensor with no bad group. */
export const Q4_STATUS_OK = 0xffffffff;

/**
 * out (q4Words(N, K)) u32 <- rows [row0, row0 + rows) of a bf16 (N, K) weight, given in src
 * (rows, K) bf16. Chunks may come in any order of whole rows; each writes only its own nibble
 * words and scale halves. status (>= slot + 1) u32: status[slot] = min(itself, (g << 1) | isNaN)
 * for every group g whose scale is NaN or beyond f16 (decode with q4StatusGroup); initialise it
 * to Q4_STATUS_OK.
 */
export function quantizeQ4(
  gpu: Gpu,
  out: GPUBuffer,
  status: GPUBuffer,
  src: GPUBuffer,
  row0: number,
  rows: number,
  N: number,
  K: number,
  slot: number,
): void {
  check(K > 0 && K % 32 === 0, () => `quantizeQ4: K = ${K} is not a multiple of 32`);
  check(
    Number.isInteger(row0) && Number.isInteger(rows) && row0 >= 0 && rows >= 0 && row0 + rows <= N,
    () => `quantizeQ4: rows [${row0}, ${row0 + rows}) outside (0, ${N})`,
  );
  check(N * K < 2 ** 32, 'quantizeQ4: sizes overflow u32 indexing');
  checkSize(out, q4Words(N, K) * 4, 'quantizeQ4 out');
  checkSize(status, (slot + 1) * 4, 'quantizeQ4 status');
  checkSize(src, bf16Bytes(rows * K), 'quantizeQ4 src');
  distinct('quantizeQ4', out, status, src);
  if (rows === 0) return;
  const g0 = (row0 * K) / 32,
    g1 = ((row0 + rows) * K) / 32;
  const pairs = Math.floor((g1 - 1) / 2) - Math.floor(g0 / 2) + 1; // scale words touched
  gpu.dispatch(opKernel(gpu, 'quantizeQ4', 'quant', 'quantize_q4'), [out, status, src], Math.ceil(pairs / 64), [
    N,
    K,
    row0,
    rows,
    slot,
  ]);
}

/**
 * out (N K) f32 = the values q * s of a q4 (N, K) tensor w (q4Words(N, K) u32), flat in its order:
 * the same f32 products the q4 GEMM kernels form on the fly (tuning.gemmQ4Dequant). Only the
 * element count matters (a q4 tensor is flat: groups of 32 consecutive elements).
 */
export function dequantizeQ4(gpu: Gpu, out: GPUBuffer, w: GPUBuffer, N: number, K: number): void {
  check(K > 0 && K % 32 === 0, () => `dequantizeQ4: K = ${K} is not a multiple of 32`);
  check(N * K < 2 ** 32, 'dequantizeQ4: sizes overflow u32 indexing');
  checkSize(out, N * K * 4, 'dequantizeQ4 out');
  checkSize(w, q4Words(N, K) * 4, 'dequantizeQ4 w');
  distinct('dequantizeQ4', out, w);
  if (N === 0) return;
  gpu.dispatch(
    opKernel(gpu, 'dequantizeQ4', 'quant', 'dequantize_q4'),
    [out, w],
    Math.ceil((N * K) / 8 / ELEMS_PER_WG),
    [N, K, 0, 0, 0],
  );
}

/** The first bad group of a status word: its row, first column, and why; null when none. */
export function q4StatusGroup(word: number, K: number): { row: number; col: number; nan: boolean } | null {
  if (word === Q4_STATUS_OK) return null;
  const g = word >>> 1,
    perRow = K / 32;
  return { row: Math.floor(g / perRow), col: (g % perRow) * 32, nan: (word & 1) === 1 };
}
