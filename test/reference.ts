// Plain-TypeScript f32 references of every op in src/model/kernels.ts (same argument order,
// arrays instead of buffers), plus bf16 helpers. Accumulation is f64 where that is free, so the
// reference is at least as accurate as the kernels it checks.

// ---- bf16 --------------------------------------------------------------------------------------

const f32buf = new Float32Array(1);
const u32buf = new Uint32Array(f32buf.buffer);

/** f32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN), like torch's .to(bfloat16). */
export function f32ToBf16(x: number): number {
  f32buf[0] = x;
  const u = u32buf[0];
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bf16ToF32(bits: number): number {
  u32buf[0] = (bits & 0xffff) << 16;
  return f32buf[0];
}

/** Rounds every value to bf16 precision (the values a packed weight really holds). */
export function roundBf16(x: Float32Array): Float32Array {
  return x.map((v) => bf16ToF32(f32ToBf16(v)));
}

/** Packs f32 values as bf16, element 2k in the low half of u32 k (safetensors byte order). */
export function packBf16(x: Float32Array): Uint32Array {
  const out = new Uint32Array(Math.ceil(x.length / 2));
  for (let i = 0; i < x.length; i++) out[i >> 1] |= f32ToBf16(x[i]) << ((i & 1) * 16);
  return out;
}

export function unpackBf16(packed: Uint32Array, n: number): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = bf16ToF32(packed[i >> 1] >>> ((i & 1) * 16));
  return out;
}

// ---- ops (weights given as already-unpacked f32 values) ------------------------------------

export function embed(out: Float32Array, ids: Uint32Array, table: Float32Array, T: number, C: number): void {
  for (let t = 0; t < T; t++) for (let c = 0; c < C; c++) out[t * C + c] = table[ids[t] * C + c];
}

export function rmsNorm(out: Float32Array, x: Float32Array, w: Float32Array, R: number, D: number, eps: number): void {
  for (let r = 0; r < R; r++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[r * D + i] ** 2;
    const scale = 1 / Math.sqrt(ss / D + eps);
    for (let i = 0; i < D; i++) out[r * D + i] = w[i] * x[r * D + i] * scale;
  }
}

export function matmul(out: Float32Array, x: Float32Array, w: Float32Array, T: number, N: number, K: number, accumulate = false): void {
  for (let t = 0; t < T; t++) {
    for (let n = 0; n < N; n++) {
      let s = 0;
      for (let k = 0; k < K; k++) s += x[t * K + k] * w[n * K + k];
      out[t * N + n] = accumulate ? out[t * N + n] + s : s;
    }
  }
}

/** inv_freq exactly as HF: 1 / theta^(arange(0, HD, 2) / HD) in f32. */
export function ropeInvFreq(HD: number, theta: number): Float32Array {
  const inv = new Float32Array(HD / 2);
  for (let i = 0; i < HD / 2; i++) inv[i] = 1 / Math.fround(theta ** Math.fround((2 * i) / HD));
  return inv;
}

/** Angle = the f32 product pos * inv_freq (as HF), then cos/sin in f64. */
export function rope(x: Float32Array, pos: Uint32Array, T: number, H: number, HD: number, theta: number): void {
  const inv = ropeInvFreq(HD, theta);
  const half = HD / 2;
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const base = (t * H + h) * HD;
      for (let i = 0; i < half; i++) {
        const angle = Math.fround(pos[t] * inv[i]);
        const c = Math.cos(angle);
        const s = Math.sin(angle);
        const a = x[base + i];
        const b = x[base + i + half];
        x[base + i] = a * c - b * s;
        x[base + i + half] = b * c + a * s;
      }
    }
  }
}

export function kvWrite(
  kCache: Float32Array, vCache: Float32Array, k: Float32Array, v: Float32Array, slot: Uint32Array, pos: Uint32Array,
  T: number, NKV: number, HD: number, maxT: number,
): void {
  const row = NKV * HD;
  for (let t = 0; t < T; t++) {
    const dst = (slot[t] * maxT + pos[t]) * row;
    for (let i = 0; i < row; i++) {
      kCache[dst + i] = k[t * row + i];
      vCache[dst + i] = v[t * row + i];
    }
  }
}

export function attention(
  out: Float32Array, q: Float32Array, kCache: Float32Array, vCache: Float32Array, slot: Uint32Array, pos: Uint32Array,
  T: number, NH: number, NKV: number, HD: number, maxT: number,
): void {
  const row = NKV * HD;
  const scale = 1 / Math.sqrt(HD);
  for (let t = 0; t < T; t++) {
    const n = pos[t] + 1;
    for (let h = 0; h < NH; h++) {
      const kvh = Math.floor(h / (NH / NKV));
      const qb = (t * NH + h) * HD;
      const scores = new Float64Array(n);
      let m = -Infinity;
      for (let j = 0; j < n; j++) {
        const kb = (slot[t] * maxT + j) * row + kvh * HD;
        let s = 0;
        for (let d = 0; d < HD; d++) s += q[qb + d] * kCache[kb + d];
        scores[j] = s * scale;
        m = Math.max(m, scores[j]);
      }
      let l = 0;
      for (let j = 0; j < n; j++) l += (scores[j] = Math.exp(scores[j] - m));
      for (let d = 0; d < HD; d++) {
        let acc = 0;
        for (let j = 0; j < n; j++) acc += scores[j] * vCache[(slot[t] * maxT + j) * row + kvh * HD + d];
        out[qb + d] = acc / l;
      }
    }
  }
}

export function siluMul(out: Float32Array, gate: Float32Array, up: Float32Array, n: number): void {
  for (let i = 0; i < n; i++) out[i] = (gate[i] / (1 + Math.exp(-gate[i]))) * up[i];
}

export function gatherRows(out: Float32Array, x: Float32Array, rows: Uint32Array, R: number, C: number): void {
  for (let r = 0; r < R; r++) for (let c = 0; c < C; c++) out[r * C + c] = x[rows[r] * C + c];
}

export function argmax(logits: Float32Array, offset: number, V: number): number {
  let best = 0;
  for (let i = 1; i < V; i++) if (logits[offset + i] > logits[offset + best]) best = i;
  return best;
}

/**
 * The distribution sample() draws from: softmax(logits / temperature), top-k (ties at the k-th
 * value all kept), then the smallest top-p nucleus, renormalized. Excluded tokens get 0.
 */
export function sampleDistribution(logits: Float32Array, temperature: number, topK: number, topP: number): Float64Array {
  const V = logits.length;
  const z = Array.from(logits, (l) => Math.fround(l / temperature));
  const order = z.map((_, i) => i).sort((a, b) => z[b] - z[a]);
  const m = z[order[0]];
  const e = z.map((v) => Math.exp(v - m));
  const kth = topK > 0 && topK < V ? z[order[topK - 1]] : -Infinity;
  let keep = order.filter((i) => z[i] >= kth);
  if (topP < 1) {
    const total = keep.reduce((s, i) => s + e[i], 0);
    let cum = 0;
    let cut = z[keep[keep.length - 1]];
    for (const i of keep) {
      cum += e[i];
      if (cum >= topP * total) {
        cut = z[i];
        break;
      }
    }
    keep = keep.filter((i) => z[i] >= cut);
  }
  const p = new Float64Array(V);
  const total = keep.reduce((s, i) => s + e[i], 0);
  for (const i of keep) p[i] = e[i] / total;
  return p;
}

// ---- comparison ----------------------------------------------------------------------------

export interface Diff {
  maxAbs: number;
  maxRef: number;
  /** maxAbs <= rel * maxRef + abs */
  ok: boolean;
  worst: number;
}

/** Max abs difference against a tolerance that scales with the reference's magnitude. */
export function compare(got: ArrayLike<number>, want: ArrayLike<number>, rel: number, abs: number): Diff {
  if (got.length !== want.length) return { maxAbs: Infinity, maxRef: 0, ok: false, worst: -1 };
  let maxAbs = 0;
  let maxRef = 0;
  let worst = -1;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i] - want[i]);
    if (!(d <= maxAbs)) {
      maxAbs = Number.isNaN(d) ? Infinity : d;
      worst = i;
    }
    maxRef = Math.max(maxRef, Math.abs(want[i]));
  }
  return { maxAbs, maxRef, ok: maxAbs <= rel * maxRef + abs, worst };
}

// ---- deterministic test data ---------------------------------------------------------------

/** Mulberry32: small seeded PRNG so every run checks the same numbers. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function randn(n: number, rand: () => number, scale = 1): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const u = Math.max(rand(), 1e-12);
    out[i] = scale * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rand());
  }
  return out;
}
