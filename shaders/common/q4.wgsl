// q4 weights (docs/ENGINE.md, "q4 weights"): for a (N, K) tensor, words [0, N*K/8) hold the
// nibbles q + 8 of flat element i = n*K + k in word i >> 3, bits 4 (i & 7)..+3; the f16 scale
// of group g = i >> 5 follows at word N*K/8 + (g >> 1), halves as in f16.wgsl. w = q * s.
#include "common/f16.wgsl"

// The signed q (-8..7) of nibbles as f32, exactly, with no integer-to-float conversion (a quarter
// of the FMA rate on GPUs): a nibble n put in the low mantissa bits of 2^23 (0x4b000000) is the
// float 2^23 + n, and one subtraction of 2^23 + 8 leaves n - 8 (all integers below 2^24: exact).
// On SwiftShader, q4 gemv_rows 1.13x by this alone (bench/shader-ab.ts).
fn q4Values(n: vec4u) -> vec4f { return bitcast<vec4f>(n | vec4u(0x4b000000u)) - vec4f(8388616.0); }
// Nibbles 0-3 and 4-7 of a word (element j in bits 4 j..4 j + 3).
fn q4Low(word: u32) -> vec4f {
  return q4Values(vec4u(word, word >> 4u, word >> 8u, word >> 12u) & vec4u(0xfu));
}
fn q4High(word: u32) -> vec4f {
  return q4Values(vec4u(word >> 16u, word >> 20u, word >> 24u, word >> 28u) & vec4u(0xfu));
}
// The signed q (-8..7) of nibble j (0..7) of a word, as f32.
fn q4Nibble(word: u32, j: u32) -> f32 {
  return bitcast<f32>(((word >> (4u * j)) & 0xfu) | 0x4b000000u) - 8388616.0;
}
