#ifdef SUBGROUPS
enable subgroups;
#endif
// Rotary position embedding, Hugging Face rotate-half layout, in place on x (T, H, HD):
//   for i < HD/2: (x_i, x_{i+HD/2}) <- (x_i cos - x_{i+HD/2} sin, x_{i+HD/2} cos + x_i sin)
//   angle = f32(pos) * inv_freq_i, the same f32 product HF computes; inv_freq comes from the CPU.
// sin/cos are our own: WGSL only promises 2^-11 absolute error for the builtins, and only on
// [-pi, pi], while angles reach pos (~4e4 rad). We reduce mod pi/2 in three parts (Cody-Waite)
// and evaluate Cephes' single-precision polynomials: ~1e-6 absolute error up to pos ~1e5.

struct RopeParams {
  T: u32,
  H: u32,
  HD: u32,
}

@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;    // (T, H, HD) f32, in place
@group(0) @binding(2) var<storage, read> pos: array<u32>;        // (T) u32
@group(0) @binding(3) var<storage, read> invFreq: array<f32>;    // (HD/2) f32

// (cos a, sin a) for a >= 0.
fn cosSin(a: f32) -> vec2f {
  let k = round(a * 0.63661977236758134);
  // pi/2 = 1.5703125 + 4.837512969970703125e-4 + 7.54978995489188216e-8; k * 1.5703125 is exact.
  let r = ((a - k * 1.5703125) - k * 4.837512969970703125e-4) - k * 7.54978995489188216e-8;
  let z = r * r;
  let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
  let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
  switch (u32(k) & 3u) {
    case 0u: { return vec2f(c, s); }
    case 1u: { return vec2f(-s, c); }
    case 2u: { return vec2f(-c, -s); }
    default: { return vec2f(s, -c); }
  }
}

// Rotates pair i (row i / (HD/2), element i % (HD/2)) by +angle (sign 1) or -angle (sign -1).
fn rotatePair(i: u32, sign: f32) {
  let half = p.HD / 2u;
  let j = i % half;
  let th = i / half; // t * H + h
  let t = th / p.H;
  let cs = cosSin(f32(pos[t]) * invFreq[j]);
  let sn = sign * cs.y;
  let base = th * p.HD;
  let a = x[base + j];
  let b = x[base + j + half];
  x[base + j] = a * cs.x - b * sn;
  x[base + j + half] = b * cs.x + a * sn;
}

#include "common/grid.wgsl"

@compute @workgroup_size(256)
fn rope_forward(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.T * p.H * (p.HD / 2u)) { return; }
  rotatePair(i, 1.0);
}

// Backward, in place on dx (bound as x): the rotation is orthogonal, so its transpose is the
// rotation by -angle.
@compute @workgroup_size(256)
fn rope_backward(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.T * p.H * (p.HD / 2u)) { return; }
  rotatePair(i, -1.0);
}

// ---- qk_norm_rope: Qwen3's q_norm / k_norm then RoPE, in one dispatch (the inference forward) --
// One workgroup per (token, head) of q (NH heads) and k (NKV heads): the row's RMSNorm as
// shaders/rmsnorm.wgsl computes it (same per-thread sums, same reduction, out = w * (x * scale)),
// then the rotation as rope_forward, so the result is bitwise that of rmsNorm + rmsNorm + rope +
// rope, in one dispatch instead of four.
// With KV defined (f32 | f16) the k rows, and the v rows of the same KV heads, go straight into
// the paged cache (docs/ENGINE.md, "KV cache") at position pos[t] of slot slot[t], bitwise as
// shaders/attention.wgsl kv_write writes them (unmapped pages and pos >= maxT skipped), so the
// kv_write dispatch and the normed-k buffer disappear. 12 storage bindings.

struct QkParams {
  T: u32,
  NH: u32,
  NKV: u32,
  HD: u32,
  eps: f32,
#ifdef KV
  maxT: u32,
  pagesPerSlot: u32,
  pageShift: u32, // log2 of the page size
#endif
}

override WG: u32 = 64; // threads per row, as rmsnorm_forward for head-dim rows

#ifdef KV
#include "common/kvword.wgsl"
#endif

@group(0) @binding(0) var<uniform> qk: QkParams;
@group(0) @binding(1) var<storage, read_write> qOut: array<f32>; // (T, NH, HD) f32
#ifdef KV
@group(0) @binding(2) var<storage, read_write> kCache: array<KvWord>; // (pages, P, NKV, HD) KV
#else
@group(0) @binding(2) var<storage, read_write> kOut: array<f32>; // (T, NKV, HD) f32
#endif
@group(0) @binding(3) var<storage, read> qIn: array<f32>;        // (T, NH, HD) f32
@group(0) @binding(4) var<storage, read> kIn: array<f32>;        // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read> qNormW: array<u32>;     // (HD) bf16 pairs
@group(0) @binding(6) var<storage, read> kNormW: array<u32>;     // (HD) bf16 pairs
@group(0) @binding(7) var<storage, read> qkPos: array<u32>;      // (T) u32
@group(0) @binding(8) var<storage, read> qkInvFreq: array<f32>;  // (HD/2) f32
#ifdef KV
@group(0) @binding(9) var<storage, read> vIn: array<f32>;              // (T, NKV, HD) f32
@group(0) @binding(10) var<storage, read_write> vCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(11) var<storage, read> kvPageTable: array<u32>;     // (S, pagesPerSlot) u32
@group(0) @binding(12) var<storage, read> kvSlot: array<u32>;          // (T) u32

// The first cache word of KV head kvh of token t (kv_write's address), or UNMAPPED.
fn kvRowWord(t: u32, kvh: u32) -> u32 {
  let pt = qkPos[t];
  if (pt >= qk.maxT) { return UNMAPPED; } // past capacity: drop rather than spill into another page
  let page = kvPageTable[kvSlot[t] * qk.pagesPerSlot + (pt >> qk.pageShift)];
  if (page == UNMAPPED) { return UNMAPPED; }
  return (((page << qk.pageShift) + (pt & ((1u << qk.pageShift) - 1u))) * qk.NKV + kvh) * (qk.HD / KV_PER_WORD);
}
#endif

#include "common/bf16.wgsl"
var<workgroup> partial: array<f32, WG>;
#include "common/reduce.wgsl" (NAME=rowSum, T=f32, OP=Add, IDENTITY=0.0, SCRATCH=partial)

// Element i of row `base` of q (isQ) or k, and its norm weight.
fn qkIn(isQ: bool, i: u32) -> f32 { if (isQ) { return qIn[i]; } return kIn[i]; }
fn qkNormW(isQ: bool, i: u32) -> f32 { if (isQ) { return bf16Pick(qNormW[i >> 1u], i); } return bf16Pick(kNormW[i >> 1u], i); }

// Pair j of the row at base normed (times scale and the norm weight) and rotated: elements j and
// j + HD/2.
fn normRotated(isQ: bool, base: u32, t: u32, j: u32, scale: f32) -> vec2f {
  let half = qk.HD / 2u;
  let a = qkNormW(isQ, j) * (qkIn(isQ, base + j) * scale);
  let b = qkNormW(isQ, j + half) * (qkIn(isQ, base + j + half) * scale);
  let cs = cosSin(f32(qkPos[t]) * qkInvFreq[j]);
  return vec2f(a * cs.x - b * cs.y, b * cs.x + a * cs.y);
}

#if defined(KV) && KV == f16
// Element i of the normed, rotated k row at base (from its pair, as the f32 path computes it).
fn kRotated(base: u32, t: u32, i: u32, scale: f32) -> f32 {
  let half = qk.HD / 2u;
  if (i < half) { return normRotated(false, base, t, i, scale).x; }
  return normRotated(false, base, t, i - half, scale).y;
}
#endif

@compute @workgroup_size(WG)
fn qk_norm_rope(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  let H = qk.NH + qk.NKV;
  let r = linearGroup(wid, nwg); // t * (NH + NKV) + head slot
  if (r >= qk.T * H) { return; } // uniform: the whole workgroup leaves together
  let t = r / H;
  let hs = r - t * H;
  let isQ = hs < qk.NH;
  let base = select((t * qk.NKV + hs - qk.NH) * qk.HD, (t * qk.NH + hs) * qk.HD, isQ);
  var ss = 0.0;
  for (var i = l.lid; i < qk.HD; i += WG) {
    let v = qkIn(isQ, base + i);
    ss += v * v;
  }
  let scale = inverseSqrt(rowSum(ss, l) / f32(qk.HD) + qk.eps);
  let half = qk.HD / 2u;
#ifdef KV
  if (!isQ) {
    let dst = kvRowWord(t, hs - qk.NH);
    if (dst == UNMAPPED) { return; }
#if KV == f16
    // One thread per cache word, both halves (as kv_write): elements 2m and 2m + 1.
    for (var m = l.lid; m < half; m += WG) {
      kCache[dst + m] = packKv(kRotated(base, t, 2u * m, scale), kRotated(base, t, 2u * m + 1u, scale));
      vCache[dst + m] = packKv(vIn[base + 2u * m], vIn[base + 2u * m + 1u]);
    }
#else
    for (var j = l.lid; j < half; j += WG) {
      let rk = normRotated(false, base, t, j, scale);
      kCache[dst + j] = rk.x;
      kCache[dst + j + half] = rk.y;
      vCache[dst + j] = vIn[base + j];
      vCache[dst + j + half] = vIn[base + j + half];
    }
#endif
    return;
  }
#endif
  for (var j = l.lid; j < half; j += WG) {
    let rq = normRotated(isQ, base, t, j, scale);
    if (isQ) {
      qOut[base + j] = rq.x;
      qOut[base + j + half] = rq.y;
    } else {
#ifndef KV
      kOut[base + j] = rq.x;
      kOut[base + j + half] = rq.y;
#endif
    }
  }
}
