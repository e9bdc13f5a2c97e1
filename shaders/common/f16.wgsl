// f16 pairs in a u32 through the core pack2x16float / unpack2x16float (no shader-f16 needed):
// element 2k in the low half, 2k + 1 in the high half.
// Element i of a packed f16 array, given the word i >> 1 that holds it.
fn f16Pick(word: u32, i: u32) -> f32 {
  let v = unpack2x16float(word);
  return select(v.x, v.y, (i & 1u) == 1u);
}
