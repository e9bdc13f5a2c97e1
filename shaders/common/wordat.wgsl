// unpackWord{{WI}}(wi): word wi of the weight binding w{{WI}} decoded into a Word (common/words.wgsl),
// a template: #include "common/wordat.wgsl" (WI=suffix); see common/weightat.wgsl for WI.
#if WEIGHTS == bf16
fn unpackWord{{WI}}(wi: u32) -> Word {
  let word = w{{WI}}[wi];
  return Word(bf16Low(word), bf16High(word));
}
#elif WEIGHTS == q4
fn unpackWord{{WI}}(wi: u32) -> Word {
  let word = w{{WI}}[wi];
  let s = q4Scale{{WI}}(wi << 3u); // the 8 elements of a word share one group (32 = 4 words)
  let nib = vec4u(word, word >> 4u, word >> 8u, word >> 12u) & vec4u(0xfu);
  let lo = (vec4f(vec4i(nib) - vec4i(8))) * s;
  let hi = (vec4f(vec4i((vec4u(word >> 16u, word >> 20u, word >> 24u, word >> 28u) & vec4u(0xfu))) - vec4i(8))) * s;
  return Word(lo, hi);
}
#elif WEIGHTS == f32
fn unpackWord{{WI}}(wi: u32) -> Word { return bitcast<f32>(w{{WI}}[wi]); }
#endif
