// Casts between f32 and 16-bit floats packed two per u32 (shaders/convert.wgsl): the training
// pass keeps its activation checkpoints this way. Rounding is to nearest, ties to even, on every
// adapter (no shader-f16 needed); f16 overflows to +-inf past 65504, bf16 has f32's range.
import type { Gpu } from '../gpu/device.ts';
import { ELEMS_PER_WG, check, checkSize, distinct } from './common.ts';

export type HalfFormat = 'f16' | 'bf16';

/** Bytes of n 16-bit values packed two per u32. */
export const halfBytes = (n: number) => Math.ceil(n / 2) * 4;

function checkFormat(op: string, format: HalfFormat): void {
  check(format === 'f16' || format === 'bf16', () => `${op}: format must be 'f16' or 'bf16' (got ${String(format)})`);
}

/** out (ceil(n/2)) u32 = x (n) f32 rounded to `format`, element 2k in the low half of word k */
export function packHalf(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, n: number, format: HalfFormat): void {
  checkFormat('packHalf', format);
  checkSize(out, halfBytes(n), 'packHalf out');
  checkSize(x, n * 4, 'packHalf x');
  distinct('packHalf', out, x);
  if (n === 0) return;
  gpu.dispatch(
    gpu.kernel('convert', 'pack_half', { FORMAT: format }),
    [out, x],
    Math.ceil(Math.ceil(n / 2) / ELEMS_PER_WG),
    [n],
  );
}

/** out (n) f32 = the `format` values packed in x (ceil(n/2)) u32 (exact) */
export function unpackHalf(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, n: number, format: HalfFormat): void {
  checkFormat('unpackHalf', format);
  checkSize(out, n * 4, 'unpackHalf out');
  checkSize(x, halfBytes(n), 'unpackHalf x');
  distinct('unpackHalf', out, x);
  if (n === 0) return;
  gpu.dispatch(
    gpu.kernel('convert', 'unpack_half', { FORMAT: format }),
    [out, x],
    Math.ceil(Math.ceil(n / 2) / ELEMS_PER_WG),
    [n],
  );
}
