// Reading a weight tensor of WEIGHTS format (define: f32, bf16 or q4) from `w: array<u32>`,
// declared by the including shader. EPW elements per u32 word. For q4 the including shader
// defines fn q4ScaleBase() -> u32, the word where the scales start (N*K/8 for an (N, K) tensor).
#if WEIGHTS == bf16
#include "common/bf16.wgsl"
const EPW = 2u;
fn weightAt(i: u32) -> f32 { return bf16Pick(w[i >> 1u], i); }
#elif WEIGHTS == q4
#include "common/q4.wgsl"
const EPW = 8u;
// The scale of element i: group i >> 5, two groups per scale word. Decoded from its f16 bits
// (finite, >= 0) with integer arithmetic: unpack2x16float may flush f16 subnormals to zero.
fn q4Scale(i: u32) -> f32 {
  return f16ToF32((w[q4ScaleBase() + (i >> 6u)] >> (16u * ((i >> 5u) & 1u))) & 0xffffu);
}
fn weightAt(i: u32) -> f32 { return q4Nibble(w[i >> 3u], i & 7u) * q4Scale(i); }
#elif WEIGHTS == f32
const EPW = 1u;
fn weightAt(i: u32) -> f32 { return bitcast<f32>(w[i]); }
#endif
