// Element reads of a weight binding w{{WI}} in the WEIGHTS format, a template:
//   #include "common/weightat.wgsl" (WI=suffix)
// common/weights.wgsl instantiates it on w (WI empty); a kernel over several weights (matmul.wgsl
// matmul_gemv_group) on w1, w2, ... For q4 the includer defines fn q4ScaleBase{{WI}}() -> u32.
#if WEIGHTS == bf16
fn weightAt{{WI}}(i: u32) -> f32 { return bf16Pick(w{{WI}}[i >> 1u], i); }
#elif WEIGHTS == q4
// The scale of element i: group i >> 5, two groups per scale word. Decoded from its f16 bits
// (finite, >= 0) with integer arithmetic: unpack2x16float may flush f16 subnormals to zero.
fn q4Scale{{WI}}(i: u32) -> f32 {
  return f16ToF32((w{{WI}}[q4ScaleBase{{WI}}() + (i >> 6u)] >> (16u * ((i >> 5u) & 1u))) & 0xffffu);
}
fn weightAt{{WI}}(i: u32) -> f32 { return q4Nibble(w{{WI}}[i >> 3u], i & 7u) * q4Scale{{WI}}(i); }
#elif WEIGHTS == f32
fn weightAt{{WI}}(i: u32) -> f32 { return bitcast<f32>(w{{WI}}[i]); }
#endif
