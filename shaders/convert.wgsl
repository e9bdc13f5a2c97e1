// Casts between f32 and 16-bit floats packed two per u32 (element 2k in the low half, 2k + 1 in
// the high half, as the bf16 weights): activation checkpoints of the training pass.
// FORMAT = f16 (IEEE binary16) or bf16. f32 -> 16 bits rounds to nearest, ties to even, with
// integer arithmetic: WGSL lets pack2x16float round either way and leaves out-of-range results
// indeterminate, and the training pass needs the same rounding on every adapter. Overflow gives
// +-inf (f16 past 65504), NaN stays NaN. 16 bits -> f32 is exact.

struct ConvertParams {
  n: u32, // elements
}

@group(0) @binding(0) var<uniform> p: ConvertParams;

#include "common/grid.wgsl"

#if FORMAT == f16
#include "common/f16.wgsl"
fn toHalf(x: f32) -> u32 { return f32ToF16(x); }
fn fromHalf(h: u32) -> f32 { return f16ToF32(h); }
#elif FORMAT == bf16
#include "common/bf16.wgsl"
fn toHalf(x: f32) -> u32 { return f32ToBf16(x); }
fn fromHalf(h: u32) -> f32 { return bf16Low(h); }
#endif

@group(0) @binding(1) var<storage, read_write> words: array<u32>; // (ceil(n/2)) u32
@group(0) @binding(2) var<storage, read> x: array<f32>;            // (n) f32

// One thread per output word; an odd n leaves the last high half 0.
@compute @workgroup_size(256)
fn pack_half(th: ElementThread) {
  let w = elementIndex(th);
  let i = 2u * w;
  if (i >= p.n) { return; }
  var hi = 0u;
  if (i + 1u < p.n) { hi = toHalf(x[i + 1u]); }
  words[w] = toHalf(x[i]) | (hi << 16u);
}

@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (n) f32
@group(0) @binding(2) var<storage, read> halves: array<u32>;     // (ceil(n/2)) u32

@compute @workgroup_size(256)
fn unpack_half(th: ElementThread) {
  let w = elementIndex(th);
  let i = 2u * w;
  if (i >= p.n) { return; }
  let word = halves[w];
  out[i] = fromHalf(word & 0xffffu);
  if (i + 1u < p.n) { out[i + 1u] = fromHalf(word >> 16u); }
}
