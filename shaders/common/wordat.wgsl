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
  return Word(q4Low(word) * s, q4High(word) * s);
}
#elif WEIGHTS == f32
fn unpackWord{{WI}}(wi: u32) -> Word { return bitcast<f32>(w{{WI}}[wi]); }
#endif
