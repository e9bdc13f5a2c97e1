// q4 quantization while loading (docs/ENGINE.md, "q4 weights"), and dequantize_q4 (at the end):
// a whole q4 tensor back to f32 for the tiled GEMM (tuning.gemmQ4Dequant).
// Quantization: a chunk of whole rows of a bf16
// weight (N, K) -> their nibbles and f16 group scales, written at their offsets in the tensor's q4
// buffer. Bit-exact with the f64 reference (src/model/q4.ts) without any division: every rounding
// decision compares two exact f32 products.
//   scale: s = the f16 nearest to amax / 7 (ties to even). Bisection over the f16 bit patterns
//     (monotone in value) finds the largest h with 7 f16(h) <= amax; then s is h or h + 1 by
//     comparing 2 amax with 7 (f16(h) + f16(h + 1)), the doubled midpoint. 7 x (11 bits) and
//     7 x (12 bits) are exact in f32, and f16 values are built from their bits with integer
//     arithmetic (pack2x16float's rounding mode is unspecified; unpack may flush subnormals).
//   q: |q| = how many midpoints (k + 1/2) s, k = 0..7, lie below |w|, comparing 2|w| with
//     (2k + 1) s (5 x 11 bits, exact); |w| exactly on a midpoint rounds to the even neighbour.
//     Then q = clamp(sign * |q|, -8, 7); q = 0 where s = 0.
// A group whose amax is NaN, or whose scale rounds past f16 max (amax / 7 >= 65520, Inf
// included), is reported through `status`: atomicMin of (group << 1) | isNaN, the first bad
// group of the tensor (0xffffffff = none); the loader names the tensor, row and columns.

struct QuantParams {
  N: u32,     // rows of the whole tensor
  K: u32,     // last dimension, a multiple of 32
  row0: u32,  // first row of this chunk
  rows: u32,  // rows in this chunk (src holds rows * K bf16)
  slot: u32,  // this tensor's status word
}

@group(0) @binding(0) var<uniform> p: QuantParams;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;            // q4Words(N, K) u32: nibbles, then f16 scales
@group(0) @binding(2) var<storage, read_write> status: array<atomic<u32>>; // (tensors) first bad group per tensor
@group(0) @binding(3) var<storage, read> src: array<u32>;                  // (rows, K) bf16, two per word

#include "common/grid.wgsl"
#include "common/f16.wgsl"
#include "common/q4.wgsl"

const F16_INF = 0x7c00u;

// The exact value of non-negative f16 bits h <= 0x7c00; 0x7c00 stands for 2^16, the next value
// after f16 max on the unbounded grid, so rounding up from 65504 lands on it (overflow).
fn f16Value(h: u32) -> f32 { return select(f16ToF32(h), 65536.0, h == F16_INF); }

// f16 bits of the scale of a group whose max |w| has bf16 bits amaxBits (finite): 0..0x7c00.
fn scaleBits(amaxBits: u32) -> u32 {
  let amax = bitcast<f32>(amaxBits << 16u);
  var lo = 0u;       // 7 f16(lo) <= amax
  var hi = 0x7c01u;  // 7 f16(hi) > amax (past the grid)
  for (var it = 0u; it < 15u; it++) { // 0x7c01 < 2^15
    let mid = (lo + hi) >> 1u;
    if (7.0 * f16Value(mid) <= amax) { lo = mid; } else { hi = mid; }
  }
  if (lo >= F16_INF) { return F16_INF; }
  let twice = 2.0 * amax;
  let mid7 = 7.0 * (f16Value(lo) + f16Value(lo + 1u)); // adjacent f16 values: the sum is exact
  if (twice > mid7 || (twice == mid7 && (lo & 1u) == 1u)) { return lo + 1u; }
  return lo;
}

// Quantizes local group lg of the chunk (global group g); writes its 4 nibble words and returns
// its scale bits.
fn quantizeGroup(lg: u32, g: u32) -> u32 {
  var bits: array<u32, 32>;
  var amaxBits = 0u;
  for (var j = 0u; j < 16u; j++) {
    let word = src[lg * 16u + j];
    bits[2u * j] = word & 0xffffu;
    bits[2u * j + 1u] = word >> 16u;
    // |w| as bits: for non-NaN bf16 the integer order of (bits & 0x7fff) is the order of |w|.
    amaxBits = max(amaxBits, max(word & 0x7fffu, (word >> 16u) & 0x7fffu));
  }
  var h = 0u;
  if (amaxBits > 0x7f80u) {
    atomicMin(&status[p.slot], (g << 1u) | 1u); // NaN
  } else {
    h = scaleBits(amaxBits);
    if (h >= F16_INF) { atomicMin(&status[p.slot], g << 1u); h = 0u; }
  }
  let s = f16Value(h);
  for (var wj = 0u; wj < 4u; wj++) {
    var word = 0u;
    for (var e = 0u; e < 8u; e++) {
      let b = bits[wj * 8u + e];
      var nib = 8u; // q = 0 (also where s = 0)
      if (h != 0u) {
        let twiceA = 2.0 * bitcast<f32>((b & 0x7fffu) << 16u);
        var m = 0u;
        for (var k = 0u; k < 8u; k++) {
          let mid = f32(2u * k + 1u) * s;
          if (twiceA > mid || (twiceA == mid && (k & 1u) == 1u)) { m = k + 1u; }
        }
        if ((b & 0x8000u) != 0u) { nib = 8u - m; } else { nib = 8u + min(m, 7u); }
      }
      word |= nib << (4u * e);
    }
    out[g * 4u + wj] = word;
  }
  return h;
}

// One thread per scale word: the pair of global groups (2 P, 2 P + 1) it holds, of which this
// chunk owns one or both. A half whose group lies in an earlier chunk keeps what that dispatch
// wrote; a half whose group lies in a later chunk (or past the tensor) is zero for now.
@compute @workgroup_size(64)
fn quantize_q4(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
               @builtin(local_invocation_index) lid: u32) {
  let groupsPerRow = p.K / 32u;
  let g0 = p.row0 * groupsPerRow;            // first global group of the chunk
  let g1 = g0 + p.rows * groupsPerRow;       // one past the last
  let pair = (g0 >> 1u) + linearGroup(wid, nwg) * 64u + lid;
  let ge = 2u * pair;
  if (ge >= g1) { return; }
  let wi = (p.N * p.K) / 8u + pair;          // the scale word
  var word = 0u;
  if (ge >= g0) { word = quantizeGroup(ge - g0, ge); } else { word = out[wi] & 0xffffu; }
  if (ge + 1u < g1) { word |= quantizeGroup(ge + 1u - g0, ge + 1u) << 16u; }
  out[wi] = word;
}

// ---- dequantization (src/ops/quant.ts dequantizeQ4; tuning.gemmQ4Dequant) --------------------
// The f32 values q * s of a whole q4 tensor of p.N * p.K elements (p.row0, p.rows, p.slot unused),
// flat in the tensor's own order: one thread per nibble word, 8 elements, two vec4 stores. The
// products are the ones shaders/matmul.wgsl's q4 tiles form (q4Low / q4High times the f16 scale).
@group(0) @binding(1) var<storage, read_write> dq: array<vec4f>; // (N K / 4) vec4f
@group(0) @binding(2) var<storage, read> qw: array<u32>;         // q4Words(N, K) u32

@compute @workgroup_size(256)
fn dequantize_q4(th: ElementThread) {
  let words = (p.N * p.K) / 8u;
  let wi = elementIndex(th);
  if (wi >= words) { return; }
  let g = wi >> 2u; // the group of 32 elements: 4 words
  let s = f16ToF32((qw[words + (g >> 1u)] >> (16u * (g & 1u))) & 0xffffu);
  let word = qw[wi];
  dq[2u * wi] = q4Low(word) * s;
  dq[2u * wi + 1u] = q4High(word) * s;
}
