// f16 (IEEE binary16) <-> f32. Arrays of f16 are packed two per u32: element 2k in the low half,
// 2k + 1 in the high half. Conversions that must be exact on every adapter use integer
// arithmetic: WGSL lets pack2x16float round either way (and leaves values past f16 max
// indeterminate), and unpack2x16float may flush f16 subnormals to zero.

// The f16 bits of x, rounded to nearest, ties to even; past f16 max (>= 65520) +-inf; NaN 0x7e00
// (one quiet NaN: adapters differ in the sign of the NaNs they produce).
fn f32ToF16(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let sign = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return 0x7e00u; }         // NaN
  if (a >= 0x477ff000u) { return sign | 0x7c00u; } // rounds past 65504
  var q: u32;
  var rem: u32;
  var half: u32;
  if (a < 0x38800000u) { // below 2^-14: an f16 subnormal, round(|x| * 2^24)
    let e = a >> 23u;
    if (e < 102u) { return sign; } // below 2^-25 (f32 subnormals too): rounds to 0
    let shift = 126u - e; // 14..24
    let m = (a & 0x7fffffu) | 0x800000u;
    q = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else { // rebias the exponent (127 -> 15), drop 13 mantissa bits; a carry moves into the exponent
    let v = a - 0x38000000u;
    q = v >> 13u;
    rem = v & 0x1fffu;
    half = 0x1000u;
  }
  return sign | (q + select(0u, 1u, rem > half || (rem == half && (q & 1u) == 1u)));
}

// The exact f32 value of f16 bits h (subnormals, +-inf and NaN included).
fn f16ToF32(h: u32) -> f32 {
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0u) { return bitcast<f32>(sign | bitcast<u32>(ldexp(f32(m), -24))); } // m * 2^-24: normal in f32
  if (e == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// Element i of a packed f16 array, given the word i >> 1 that holds it (unpack2x16float: fast,
// may flush subnormals below 6.1e-5 to zero; for cached activations, not for exact data).
fn f16Pick(word: u32, i: u32) -> f32 {
  let v = unpack2x16float(word);
  return select(v.x, v.y, (i & 1u) == 1u);
}
