// blockScale{{WI}}(bi): the scale of 16-byte block bi of weight w{{WI}} ({{WN}}, p.K) of
// shaders/gemv.wgsl (1 unless q4), a template: #include "common/gemvweight.wgsl" (WI=suffix, WN=rows).
// WI is empty for the single weight of gemv_rows (w), 1 and 2 for the others of gemv_rows_group.
#if WEIGHTS == q4
// Block bi is scale group bi, whose f16 sits in word N*K/8 + (bi >> 1), half bi & 1, after the
// nibbles (decoded with integer arithmetic: unpack2x16float may flush subnormals).
fn blockScale{{WI}}(bi: u32) -> f32 {
  let si = (({{WN}} * p.K) >> 3u) + (bi >> 1u);
  return f16ToF32((w{{WI}}[si >> 2u][si & 3u] >> (16u * (bi & 1u))) & 0xffffu);
}
#else
fn blockScale{{WI}}(bi: u32) -> f32 { return 1.0; }
#endif
