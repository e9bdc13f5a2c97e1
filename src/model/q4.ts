// Q4 weights: 4-bit integers with one f16 scale per group of 32 along the input dimension
// (symmetric, no zero point). Pure data, no GPU: the CPU reference quantizer and the packer for
// the GPU layout, checked byte for byte against scripts/golden_q4.py (an independent PyTorch/numpy
// implementation) in test/model/q4.test.ts.
//
// Format, for a bf16 weight (N, K) with K % 32 == 0, per row and group of 32 consecutive k:
//   amax = max |w|;  s = the f16 nearest to amax / 7 (ties to even, subnormals kept, may be 0);
//   q = clamp(roundHalfEven(w / s), -8, 7), q = 0 where s = 0;  dequantized w' = q * s (exact in f32).
// GPU layout, one u32 buffer: element i = n*K + k is the nibble q + 8 at word i >> 3, bits
// 4*(i & 7); from word N*K/8 on, the f16 bits of group g = i >> 5, two per word (even g low half).
//
// f64 arithmetic is exact here. The points where a rounding decision flips (f16 midpoints for s,
// half-integers for q) are f64 numbers, and f64 division is correctly rounded, hence monotone: it
// can move a value across or onto such a point only by landing on it, which needs the exact
// value within 2^-53 (relative) of it. amax has 8 significant bits, so amax / 7 is either exact or
// carries 1/7's endless binary expansion, >= 2^-15 (relative) from any f16 midpoint; w (8 bits) /
// s (11 bits) is either exactly a half-integer or >= 2^-20 from one, with |w / s| < 16.

export const Q4_GROUP = 32;

const F16_INF = 0x7c00;
const F16_NAN = 0x7e00;
const F16_OVERFLOW = 65520; // the midpoint between 65504 (f16 max) and 2^16: ties to even go to Inf

/** Round half to even (x within +-2^52). */
function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  return d > 0.5 || (d === 0.5 && f % 2 !== 0) ? f + 1 : f;
}

/** Bits of the f16 nearest to x (any JS number, rounded once): ties to even, subnormals,
 *  overflow to +-Inf, NaN to a quiet NaN. */
export function f32ToF16Bits(x: number): number {
  if (Number.isNaN(x)) return F16_NAN;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  const a = Math.abs(x);
  if (a >= F16_OVERFLOW) return sign | F16_INF;
  if (a < 2 ** -14) return sign | roundHalfEven(a * 2 ** 24); // subnormal; 1024 carries into the smallest normal
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a)
    e--; // log2 can be off by one next to a power of two
  else if (2 ** (e + 1) <= a) e++;
  const m = roundHalfEven(a * 2 ** (10 - e)); // 1024..2048 (exact scaling); 2048 carries into the exponent
  return sign | (((e + 15) << 10) + m - 1024);
}

/** The value of f16 bits (exact). */
export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m ? NaN : sign * Infinity;
  return sign * (1024 + m) * 2 ** (e - 25);
}

function checkShape(N: number, K: number, name: string): void {
  if (!Number.isSafeInteger(N) || !Number.isSafeInteger(K) || N <= 0 || K <= 0)
    throw new RangeError(`q4: ${name}: bad shape (${N}, ${K})`);
  if (K % Q4_GROUP !== 0) throw new RangeError(`q4: ${name}: last dimension ${K} is not a multiple of ${Q4_GROUP}`);
}

/** Word offset of the scales in the packed buffer of an (N, K) weight (= N*K/8). */
export function q4ScaleOffsetWords(N: number, K: number): number {
  checkShape(N, K, `(${N}, ${K})`);
  return (N * K) / 8;
}

/** Total u32 words of the packed buffer: N*K/8 nibble words + ceil(N*K/64) scale words. */
export function q4Words(N: number, K: number): number {
  return q4ScaleOffsetWords(N, K) + Math.ceil((N * K) / 64);
}

let bf16Table: Float64Array | undefined; // all 65536 bf16 values, built once
function bf16Values(): Float64Array {
  if (!bf16Table) {
    const f = new Float32Array(65536);
    const u = new Uint32Array(f.buffer);
    for (let b = 0; b < 65536; b++) u[b] = b << 16;
    bf16Table = Float64Array.from(f);
  }
  return bf16Table;
}

/** Packs a bf16 weight (N, K) (row-major bit patterns) into the q4 layout above. Throws a
 *  RangeError naming the tensor for K % 32 != 0, a length mismatch, NaN, or a group whose scale
 *  overflows f16 (amax >= 7 * 65520). */
export function quantizeQ4(bf16: Uint16Array, N: number, K: number, name: string): Uint32Array {
  checkShape(N, K, name);
  if (bf16.length !== N * K)
    throw new RangeError(`q4: ${name}: ${bf16.length} elements, shape (${N}, ${K}) needs ${N * K}`);
  const value = bf16Values();
  const out = new Uint32Array(q4Words(N, K));
  const scale0 = q4ScaleOffsetWords(N, K);
  const groupsPerRow = K / Q4_GROUP;
  for (let g = 0, i0 = 0; i0 < bf16.length; g++, i0 += Q4_GROUP) {
    let amax = 0;
    for (let i = i0; i < i0 + Q4_GROUP; i++) amax = Math.max(amax, Math.abs(value[bf16[i]!]!));
    const where = `row ${Math.floor(g / groupsPerRow)}, columns ${(g % groupsPerRow) * Q4_GROUP}..${(g % groupsPerRow) * Q4_GROUP + Q4_GROUP - 1}`;
    if (Number.isNaN(amax)) throw new RangeError(`q4: ${name}: NaN at ${where}`);
    const sBits = f32ToF16Bits(amax / 7);
    if (sBits === F16_INF)
      throw new RangeError(
        `q4: ${name}: max |w| = ${amax} at ${where} needs a scale beyond f16 (amax / 7 >= ${F16_OVERFLOW})`,
      );
    out[scale0 + (g >> 1)] |= sBits << (16 * (g & 1));
    const s = f16BitsToF32(sBits);
    for (let i = i0; i < i0 + Q4_GROUP; i++) {
      const q = s === 0 ? 0 : Math.min(7, Math.max(-8, roundHalfEven(value[bf16[i]!]! / s)));
      out[i >> 3] |= (q + 8) << (4 * (i & 7));
    }
  }
  return out;
}

/** q * s for every element of a packed (N, K) weight, row-major f32 (exact). */
export function dequantizeQ4(packed: Uint32Array, N: number, K: number): Float32Array {
  const words = q4Words(N, K);
  if (packed.length !== words)
    throw new RangeError(`q4: packed (${N}, ${K}) needs ${words} words, got ${packed.length}`);
  const scale0 = q4ScaleOffsetWords(N, K);
  const out = new Float32Array(N * K);
  for (let g = 0, i0 = 0; i0 < out.length; g++, i0 += Q4_GROUP) {
    const s = f16BitsToF32((packed[scale0 + (g >> 1)]! >>> (16 * (g & 1))) & 0xffff);
    for (let i = i0; i < i0 + Q4_GROUP; i++) out[i] = (((packed[i >> 3]! >>> (4 * (i & 7))) & 15) - 8) * s;
  }
  return out;
}

/** How far logits `b` (R, V) drift from reference logits `a` (R, V): maxAbs = max |a - b|,
 *  maxRel = maxAbs / max |a|, meanKl = mean over rows of KL(softmax(a) || softmax(b)), in f64. */
export function logitDrift(
  a: Float32Array,
  b: Float32Array,
  V: number,
): { maxAbs: number; maxRel: number; meanKl: number } {
  if (a.length !== b.length || V <= 0 || a.length % V !== 0)
    throw new RangeError(`logitDrift: lengths ${a.length}, ${b.length} with V = ${V}`);
  const R = a.length / V;
  let maxAbs = 0,
    maxRef = 0,
    kl = 0;
  for (let r = 0; r < R; r++) {
    const ar = a.subarray(r * V, (r + 1) * V),
      br = b.subarray(r * V, (r + 1) * V);
    const lseA = logSumExp(ar),
      lseB = logSumExp(br);
    let klRow = 0;
    for (let v = 0; v < V; v++) {
      maxAbs = Math.max(maxAbs, Math.abs(ar[v]! - br[v]!));
      maxRef = Math.max(maxRef, Math.abs(ar[v]!));
      const la = ar[v]! - lseA;
      klRow += Math.exp(la) * (la - (br[v]! - lseB));
    }
    kl += klRow;
  }
  return { maxAbs, maxRel: maxAbs / maxRef, meanKl: R ? kl / R : 0 };
}

function logSumExp(x: Float32Array): number {
  let m = -Infinity;
  for (let i = 0; i < x.length; i++) m = Math.max(m, x[i]!);
  let s = 0;
  for (let i = 0; i < x.length; i++) s += Math.exp(x[i]! - m);
  return m + Math.log(s);
}
