// bf16 -> f32: a bf16 value is the high half of the f32 with the same bits. Arrays of bf16 are
// packed two per u32 as in the safetensors bytes (element 2k low, 2k + 1 high).
fn bf16Low(word: u32) -> f32 { return bitcast<f32>(word << 16u); }
fn bf16High(word: u32) -> f32 { return bitcast<f32>(word & 0xffff0000u); }
// Element i of a packed bf16 array, given the word i >> 1 that holds it.
fn bf16Pick(word: u32, i: u32) -> f32 { return select(bf16Low(word), bf16High(word), (i & 1u) == 1u); }

// The bf16 bits of x, rounded to nearest, ties to even (overflow to +-inf); NaN stays a quiet NaN.
fn f32ToBf16(x: f32) -> u32 {
  let u = bitcast<u32>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { return ((u >> 16u) | 0x40u) & 0xffffu; }
  return ((u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u) & 0xffffu;
}
