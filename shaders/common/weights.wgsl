// Reading a weight tensor of WEIGHTS format (define: f32, bf16 or q4) from `w: array<u32>`,
// declared by the including shader. EPW elements per u32 word. For q4 the including shader
// defines fn q4ScaleBase() -> u32, the word where the scales start (N*K/8 for an (N, K) tensor).
#if WEIGHTS == bf16
#include "common/bf16.wgsl"
const EPW = 2u;
#elif WEIGHTS == q4
#include "common/q4.wgsl"
const EPW = 8u;
#elif WEIGHTS == f32
const EPW = 1u;
#endif
#include "common/weightat.wgsl" (WI=)
