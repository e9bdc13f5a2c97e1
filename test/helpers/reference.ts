// Plain-TypeScript f32 references of every op in src/ops (forward and backward) (same argument order,
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

/** f32 for comparisons with kernels, f64 for finite differences (test/ops/backward.test.ts). */
export type Vec = Float32Array | Float64Array;

export function embed(out: Float32Array, ids: Uint32Array, table: Float32Array, T: number, C: number): void {
  for (let t = 0; t < T; t++) for (let c = 0; c < C; c++) out[t * C + c] = table[ids[t] * C + c];
}

export function rmsNorm(out: Vec, x: Vec, w: Vec, R: number, D: number, eps: number): void {
  for (let r = 0; r < R; r++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[r * D + i] ** 2;
    const scale = 1 / Math.sqrt(ss / D + eps);
    for (let i = 0; i < D; i++) out[r * D + i] = w[i] * x[r * D + i] * scale;
  }
}

export function matmul(out: Vec, x: Vec, w: Vec, T: number, N: number, K: number, accumulate = false): void {
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

/** Rotates each (i, i + HD/2) pair by `sign` x angle; angle = the f32 product pos * inv_freq (as HF), cos/sin in f64. */
function rotateHalf(x: Vec, pos: Uint32Array, T: number, H: number, HD: number, theta: number, sign: 1 | -1): void {
  const inv = ropeInvFreq(HD, theta);
  const half = HD / 2;
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < H; h++) {
      const base = (t * H + h) * HD;
      for (let i = 0; i < half; i++) {
        const angle = Math.fround(pos[t] * inv[i]);
        const c = Math.cos(angle);
        const s = sign * Math.sin(angle);
        const a = x[base + i];
        const b = x[base + i + half];
        x[base + i] = a * c - b * s;
        x[base + i + half] = b * c + a * s;
      }
    }
  }
}

export function rope(x: Vec, pos: Uint32Array, T: number, H: number, HD: number, theta: number): void {
  rotateHalf(x, pos, T, H, HD, theta, 1);
}

export function kvWrite(
  kCache: Float32Array,
  vCache: Float32Array,
  k: Float32Array,
  v: Float32Array,
  slot: Uint32Array,
  pos: Uint32Array,
  T: number,
  NKV: number,
  HD: number,
  maxT: number,
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
  out: Float32Array,
  q: Float32Array,
  kCache: Float32Array,
  vCache: Float32Array,
  slot: Uint32Array,
  pos: Uint32Array,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  maxT: number,
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
      for (let j = 0; j < n; j++) l += scores[j] = Math.exp(scores[j] - m);
      for (let d = 0; d < HD; d++) {
        let acc = 0;
        for (let j = 0; j < n; j++) acc += scores[j] * vCache[(slot[t] * maxT + j) * row + kvh * HD + d];
        out[qb + d] = acc / l;
      }
    }
  }
}

export function siluMul(out: Vec, gate: Vec, up: Vec, n: number): void {
  for (let i = 0; i < n; i++) out[i] = (gate[i] / (1 + Math.exp(-gate[i]))) * up[i];
}

// ---- training: LoRA matmuls, backward ops, attention with lse (f64 accumulation) -------------
// Each backward adds into its gradient arrays, like the kernels.

export function matmulF32(
  out: Vec,
  x: Vec,
  w: Vec,
  T: number,
  N: number,
  K: number,
  accumulate = false,
  scale = 1,
): void {
  for (let t = 0; t < T; t++) {
    for (let n = 0; n < N; n++) {
      let s = 0;
      for (let k = 0; k < K; k++) s += x[t * K + k] * w[n * K + k];
      out[t * N + n] = (accumulate ? out[t * N + n] : 0) + scale * s;
    }
  }
}

/** dx (T, K) (+)= scale * dy (T, N) . w (N, K): matmulBackwardInput (bf16 w unpacked) and ...F32. */
export function matmulBackwardInput(
  dx: Vec,
  dy: Vec,
  w: Vec,
  T: number,
  N: number,
  K: number,
  accumulate = true,
  scale = 1,
): void {
  for (let t = 0; t < T; t++) {
    for (let k = 0; k < K; k++) {
      let s = 0;
      for (let n = 0; n < N; n++) s += dy[t * N + n] * w[n * K + k];
      dx[t * K + k] = (accumulate ? dx[t * K + k] : 0) + scale * s;
    }
  }
}

/** dw (N, K) += scale * dy^T (N, T) . x (T, K) */
export function matmulBackwardWeight(dw: Vec, dy: Vec, x: Vec, T: number, N: number, K: number, scale = 1): void {
  for (let n = 0; n < N; n++) {
    for (let k = 0; k < K; k++) {
      let s = 0;
      for (let t = 0; t < T; t++) s += dy[t * N + n] * x[t * K + k];
      dw[n * K + k] += scale * s;
    }
  }
}

/** dx (R, D) += w dy rstd - x rstd^3 mean(w dy x) */
export function rmsNormBackward(dx: Vec, dy: Vec, x: Vec, w: Vec, R: number, D: number, eps: number): void {
  for (let r = 0; r < R; r++) {
    let ss = 0;
    let wdyx = 0;
    for (let i = 0; i < D; i++) {
      ss += x[r * D + i] ** 2;
      wdyx += w[i] * dy[r * D + i] * x[r * D + i];
    }
    const rstd = 1 / Math.sqrt(ss / D + eps);
    const c = rstd ** 3 * (wdyx / D);
    for (let i = 0; i < D; i++) dx[r * D + i] += w[i] * dy[r * D + i] * rstd - x[r * D + i] * c;
  }
}

/** In place on dx (T, H, HD): rotation by -angle (the transpose of rope). */
export function ropeBackward(dx: Vec, pos: Uint32Array, T: number, H: number, HD: number, theta: number): void {
  rotateHalf(dx, pos, T, H, HD, theta, -1);
}

/** Whether query t sees key j: causal, and with a packed tree's keyEnd only while t < keyEnd[j]. */
const sees = (t: number, j: number, keyEnd?: ArrayLike<number>) => j <= t && (!keyEnd || t < keyEnd[j]!);

/**
 * One causal sequence, no cache: q (T, NH, HD), k/v (T, NKV, HD); lse (T, NH) of the scaled scores.
 * keyEnd: a packed prefix tree, key j seen by queries j <= t < keyEnd[j] only.
 */
export function attentionForwardLse(
  out: Vec,
  lse: Vec,
  q: Vec,
  k: Vec,
  v: Vec,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  keyEnd?: ArrayLike<number>,
): void {
  const scale = 1 / Math.sqrt(HD);
  const G = NH / NKV;
  const p = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    for (let h = 0; h < NH; h++) {
      const qb = (t * NH + h) * HD;
      const kvh = Math.floor(h / G);
      let m = -Infinity;
      for (let j = 0; j <= t; j++) {
        let s = 0;
        for (let d = 0; d < HD; d++) s += q[qb + d] * k[(j * NKV + kvh) * HD + d];
        p[j] = sees(t, j, keyEnd) ? s * scale : -Infinity;
        m = Math.max(m, p[j]);
      }
      let l = 0;
      for (let j = 0; j <= t; j++) l += p[j] = Math.exp(p[j] - m);
      lse[t * NH + h] = m + Math.log(l);
      for (let d = 0; d < HD; d++) {
        let acc = 0;
        for (let j = 0; j <= t; j++) acc += p[j] * v[(j * NKV + kvh) * HD + d];
        out[qb + d] = acc / l;
      }
    }
  }
}

/**
 * dq, dk, dv += gradients of attentionForwardLse given dout, from the saved out and lse:
 * P = exp(scale q.k - lse), dS = P (dout.v - dout.out); dq = scale dS k, dk = scale dS^T q, dv = P^T dout.
 */
export function attentionBackward(
  dq: Vec,
  dk: Vec,
  dv: Vec,
  dout: Vec,
  out: Vec,
  lse: Vec,
  q: Vec,
  k: Vec,
  v: Vec,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  keyEnd?: ArrayLike<number>,
): void {
  const scale = 1 / Math.sqrt(HD);
  const G = NH / NKV;
  for (let i = 0; i < T; i++) {
    for (let h = 0; h < NH; h++) {
      const qb = (i * NH + h) * HD;
      const kvh = Math.floor(h / G);
      let D = 0;
      for (let d = 0; d < HD; d++) D += dout[qb + d] * out[qb + d];
      for (let j = 0; j <= i; j++) {
        if (!sees(i, j, keyEnd)) continue;
        const kb = (j * NKV + kvh) * HD;
        let s = 0;
        let dp = 0;
        for (let d = 0; d < HD; d++) {
          s += q[qb + d] * k[kb + d];
          dp += dout[qb + d] * v[kb + d];
        }
        const P = Math.exp(s * scale - lse[i * NH + h]);
        const dS = P * (dp - D);
        for (let d = 0; d < HD; d++) {
          dq[qb + d] += scale * dS * k[kb + d];
          dk[kb + d] += scale * dS * q[qb + d];
          dv[kb + d] += P * dout[qb + d];
        }
      }
    }
  }
}

/** dgate += dout up silu'(gate), dup += dout silu(gate); silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). */
export function siluMulBackward(dgate: Vec, dup: Vec, dout: Vec, gate: Vec, up: Vec, n: number): void {
  for (let i = 0; i < n; i++) {
    const g = gate[i];
    const s = 1 / (1 + Math.exp(-g));
    dgate[i] += dout[i] * up[i] * s * (1 + g * (1 - s));
    dup[i] += dout[i] * g * s;
  }
}

export function add(out: Vec, a: Vec, n: number): void {
  for (let i = 0; i < n; i++) out[i] += a[i];
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
export function sampleDistribution(
  logits: Float32Array,
  temperature: number,
  topK: number,
  topP: number,
): Float64Array {
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
