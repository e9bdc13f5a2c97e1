// q4 weights (docs/ENGINE.md, "q4 weights"): for a (N, K) tensor, words [0, N*K/8) hold the
// nibbles q + 8 of flat element i = n*K + k in word i >> 3, bits 4 (i & 7)..+3; the f16 scale
// of group g = i >> 5 follows at word N*K/8 + (g >> 1), halves as in f16.wgsl. w = q * s.
#include "common/f16.wgsl"

// The signed q (-8..7) of nibble j (0..7) of a word, as f32.
fn q4Nibble(word: u32, j: u32) -> f32 { return f32(i32((word >> (4u * j)) & 0xfu) - 8); }
