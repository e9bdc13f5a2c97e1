// KV cache write and causal attention over the cache (GQA), then the training-path attention.
// Two modules from this file: with KV defined (f32 | f16) the cache entries kv_write and
// attention_forward; without it the training entries (attention_forward_lse, attention_backward_*),
// which read k and v (T, NKV, HD) f32 directly. attendKeys (the online softmax) serves both.
//
// Paged cache (docs/ENGINE.md, "KV cache"): per layer one K pool and one V pool of physical pages
// of P = 2^pageShift tokens, (pages, P, NKV, HD), f32 or, with KV == f16, f16 pairs in u32
// (element 2k in the low half). The page table (S, pagesPerSlot) u32 maps token position pos of
// slot s to pool row table[s * pagesPerSlot + pos / P] * P + pos % P; slots sharing a prefix map
// the same pages. Unmapped entries hold 0xffffffff.

#include "common/grid.wgsl"

#if defined(KV) && KV == f16
#include "common/f16.wgsl"
alias KvWord = u32; // two f16 elements
const KV_PER_WORD = 2u;
#else
alias KvWord = f32;
const KV_PER_WORD = 1u;
#endif

const UNMAPPED = 0xffffffffu;

#if defined(KV)
// ---- kv_write: cache[slot[t], pos[t], :, :] = k[t] / v[t] (rounded to f16 when KV == f16) ----
// One thread per cache word: in f16 a thread packs both halves of its u32, so no two threads
// ever write halves of one word.

struct KvWriteParams {
  T: u32,
  NKV: u32,
  HD: u32,
  maxT: u32,
  pagesPerSlot: u32,
  pageShift: u32,
}

@group(0) @binding(0) var<uniform> kw: KvWriteParams;
@group(0) @binding(1) var<storage, read_write> kwKCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(2) var<storage, read_write> kwVCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(3) var<storage, read> kwK: array<f32>;            // (T, NKV, HD) f32
@group(0) @binding(4) var<storage, read> kwV: array<f32>;            // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read> kwPageTable: array<u32>;    // (S, pagesPerSlot) u32
@group(0) @binding(6) var<storage, read> kwSlot: array<u32>;         // (T) u32
@group(0) @binding(7) var<storage, read> kwPos: array<u32>;          // (T) u32

#if KV == f16
// f16 bits of x, saturated at +-65504 instead of inf (a cached key or value never becomes inf).
fn f16Bits(x: f32) -> u32 {
  let h = f32ToF16(x);
  return select(h, (h & 0x8000u) | 0x7bffu, (h & 0x7fffu) == 0x7c00u);
}

// Elements 2k (low half) and 2k + 1 (high half) of one cache word.
fn packKv(lo: f32, hi: f32) -> u32 { return f16Bits(lo) | (f16Bits(hi) << 16u); }
#endif

@compute @workgroup_size(256)
fn kv_write(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
            @builtin(local_invocation_index) lid: u32) {
  let row = kw.NKV * kw.HD / KV_PER_WORD; // words per token
  let i = linearGroup(wid, nwg) * 256u + lid; // word index in (T, row)
  if (i >= kw.T * row) { return; }
  let t = i / row;
  let pt = kwPos[t];
  if (pt >= kw.maxT) { return; } // past capacity: drop rather than spill into another page
  let page = kwPageTable[kwSlot[t] * kw.pagesPerSlot + (pt >> kw.pageShift)];
  if (page == UNMAPPED) { return; }
  let dst = ((page << kw.pageShift) + (pt & ((1u << kw.pageShift) - 1u))) * row + (i - t * row);
#if KV == f16
  kwKCache[dst] = packKv(kwK[2u * i], kwK[2u * i + 1u]);
  kwVCache[dst] = packKv(kwV[2u * i], kwV[2u * i + 1u]);
#else
  kwKCache[dst] = kwK[i];
  kwVCache[dst] = kwV[i];
#endif
}
#endif

// ---- attention: one workgroup per (token, head), online softmax over key blocks -------------
// Token t's query attends to positions 0..pos[t] of cache slot slot[t] (causal by position), so
// prefill (one slot, pos 0..T-1) and batched decode (one token per slot) are the same kernel.
// No (T, T, NH) score buffer: each block of BLK keys is scored, folded into a running max m,
// normalizer l and output accumulator, then discarded. K and V are read back to f32 and all
// arithmetic is f32 whatever the cache's element type.

struct AttentionParams {
  T: u32,
  NH: u32,
  NKV: u32,
  HD: u32,
  maxT: u32,
  scale: f32, // 1/sqrt(HD)
#if defined(KV)
  pagesPerSlot: u32,
  pageShift: u32,
  splitKeys: u32, // attention_split: keys per split (a multiple of BLK)
  splits: u32,    // attention_split / attention_combine: splits per (token, head)
#endif
}

const BLK = 64u;   // keys per block = threads per workgroup
const HDMAX = 256u;
const DPT = HDMAX / BLK; // output dims per thread

@group(0) @binding(0) var<uniform> p: AttentionParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (T, NH, HD) f32
@group(0) @binding(2) var<storage, read> q: array<f32>;         // (T, NH, HD) f32
#if defined(KV)
@group(0) @binding(3) var<storage, read> kCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(4) var<storage, read> vCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(5) var<storage, read> pageTable: array<u32>; // (S, pagesPerSlot) u32
@group(0) @binding(6) var<storage, read> slot: array<u32>;      // (T) u32
@group(0) @binding(7) var<storage, read> pos: array<u32>;       // (T) u32
@group(0) @binding(8) var<storage, read_write> partLse: array<f32>; // split: (T, NH, splits) f32
// attention_combine's inputs (its bindings 1..3; the numbers are free in that entry point)
@group(0) @binding(2) var<storage, read> splitLse: array<f32>; // (T, NH, splits) f32
@group(0) @binding(3) var<storage, read> splitOut: array<f32>; // (T, NH, splits, HD) f32
#else
@group(0) @binding(3) var<storage, read> kCache: array<f32>;    // training: k (T, NKV, HD) f32
@group(0) @binding(4) var<storage, read> vCache: array<f32>;    // training: v (T, NKV, HD) f32
#endif

var<workgroup> qs: array<f32, HDMAX>; // scaled query
var<workgroup> ps: array<f32, BLK>;   // scores, then probabilities, of the current block
var<workgroup> keyAt: array<u32, BLK>; // element index of each key's head in the current block
var<workgroup> nKeysShared: u32;

#if defined(KV)
var<private> tableRow: u32; // slot * pagesPerSlot of the query's sequence

// Element index of key j's KV head at kvBase (= kvh * HD) in the paged pool.
fn keyIndex(kvBase: u32, j: u32) -> u32 {
  let page = pageTable[tableRow + (j >> p.pageShift)];
  return ((page << p.pageShift) + (j & ((1u << p.pageShift) - 1u))) * p.NKV * p.HD + kvBase;
}

// The query row th = t * NH + h into qs; returns its key count (positions 0..pos[t]). Sets tableRow.
fn loadQuery(th: u32, lid: u32) -> u32 {
  let t = th / p.NH;
  tableRow = slot[t] * p.pagesPerSlot;
  for (var d = lid; d < p.HD; d += BLK) { qs[d] = q[th * p.HD + d] * p.scale; }
  if (lid == 0u) { nKeysShared = min(pos[t] + 1u, p.maxT); }
  // The key count comes from a buffer; workgroupUniformLoad makes the block loop provably uniform.
  return workgroupUniformLoad(&nKeysShared);
}

fn kvHeadBase(th: u32) -> u32 { return ((th % p.NH) / (p.NH / p.NKV)) * p.HD; }

@compute @workgroup_size(BLK)
fn attention_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                     @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg); // t * NH + h
  if (th >= p.T * p.NH) { return; }
  let nKeys = loadQuery(th, lid);
  attendKeys(th, kvHeadBase(th), 0u, nKeys, lid);
}

// ---- split-K decode attention (flash-decoding) ------------------------------------------------
// A long context read by one workgroup per (token, head) leaves most of a GPU idle in decode
// (T * NH workgroups). attention_split gives each (token, head) `splits` workgroups, split c
// attending to keys [c * splitKeys, (c + 1) * splitKeys) and writing its normalized output and
// log-sum-exp to the split buffers (out bound to the split outputs, partLse); attention_combine weighs the splits by
// exp(lse_c - max lse). A split past the sequence's end writes lse = -FLT_MAX (weight 0).
@compute @workgroup_size(BLK)
fn attention_split(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                   @builtin(local_invocation_index) lid: u32) {
  let g = linearGroup(wid, nwg); // (t * NH + h) * splits + c
  if (g >= p.T * p.NH * p.splits) { return; }
  let th = g / p.splits;
  let nKeys = loadQuery(th, lid);
  let first = (g - th * p.splits) * p.splitKeys;
  let end = min(first + p.splitKeys, nKeys);
  if (first >= end) {
    for (var d = lid; d < p.HD; d += BLK) { out[g * p.HD + d] = 0.0; }
    if (lid == 0u) { partLse[g] = -3.40282346e38; }
    return;
  }
  let lse = attendKeys(g, kvHeadBase(th), first, end, lid);
  if (lid == 0u) { partLse[g] = lse; }
}

@compute @workgroup_size(BLK)
fn attention_combine(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                     @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg);
  if (th >= p.T * p.NH) { return; }
  let g0 = th * p.splits;
  var mx = -3.40282346e38;
  for (var c = 0u; c < p.splits; c++) { mx = max(mx, splitLse[g0 + c]); }
  var den = 0.0;
  for (var c = 0u; c < p.splits; c++) { den += exp(splitLse[g0 + c] - mx); }
  for (var d = lid; d < p.HD; d += BLK) {
    var o = 0.0;
    for (var c = 0u; c < p.splits; c++) { o += exp(splitLse[g0 + c] - mx) * splitOut[(g0 + c) * p.HD + d]; }
    out[th * p.HD + d] = o / den;
  }
}
#else
// Element index of key j's KV head at kvBase (= kvh * HD) in k/v (T, NKV, HD).
fn keyIndex(kvBase: u32, j: u32) -> u32 { return kvBase + j * p.NKV * p.HD; }
#endif

// q . k for the scaled query in qs and the key whose head starts at element kb (even in f16).
fn keyDot(kb: u32) -> f32 {
  var dot = 0.0;
#if defined(KV) && KV == f16
  for (var d = 0u; d < p.HD; d += 2u) {
    let kk = unpack2x16float(kCache[(kb + d) >> 1u]);
    dot += qs[d] * kk.x;
    dot += qs[d + 1u] * kk.y;
  }
#else
  for (var d = 0u; d < p.HD; d++) { dot += qs[d] * kCache[kb + d]; }
#endif
  return dot;
}

// Value element i of the cache (or of v on the training path), as f32.
fn valueAt(i: u32) -> f32 {
#if defined(KV) && KV == f16
  return f16Pick(vCache[i >> 1u], i);
#else
  return vCache[i];
#endif
}

// Query row (scaled, already in qs) against keys/values first <= j < end of KV head kvBase
// (keyIndex): writes out[row] and returns the log-sum-exp of the scaled scores.
fn attendKeys(row: u32, kvBase: u32, first: u32, end: u32, lid: u32) -> f32 {
  var m = -3.40282346e38;
  var l = 0.0;
  var acc: array<f32, DPT>;
  for (var b0 = first; b0 < end; b0 += BLK) {
    let j = b0 + lid;
    var s = -3.40282346e38;
    if (j < end) {
      let kb = keyIndex(kvBase, j);
      keyAt[lid] = kb;
      s = keyDot(kb);
    }
    ps[lid] = s;
    workgroupBarrier();
    var mNew = m;
    for (var i = 0u; i < BLK; i++) { mNew = max(mNew, ps[i]); }
    workgroupBarrier(); // everyone has read the scores before they become probabilities
    ps[lid] = select(0.0, exp(s - mNew), j < end);
    workgroupBarrier();
    let corr = exp(m - mNew);
    let nb = min(BLK, end - b0);
    var lb = 0.0;
    for (var i = 0u; i < nb; i++) { lb += ps[i]; }
    l = l * corr + lb;
    for (var e = 0u; e < DPT; e++) {
      let d = lid + e * BLK;
      if (d < p.HD) {
        var a = acc[e] * corr;
        for (var i = 0u; i < nb; i++) { a += ps[i] * valueAt(keyAt[i] + d); }
        acc[e] = a;
      }
    }
    m = mNew;
    workgroupBarrier(); // the block's probabilities are consumed before the next block overwrites them
  }
  for (var e = 0u; e < DPT; e++) {
    let d = lid + e * BLK;
    if (d < p.HD) { out[row * p.HD + d] = acc[e] / l; }
  }
  return m + log(l);
}

#if !defined(KV)
// ---- training path (module without KV): one causal sequence at positions 0..T-1, no cache ----
// k and v (T, NKV, HD) f32 are bound as kCache / vCache, so the kernels below share q, the params
// and attendKeys with attention_forward.

@group(0) @binding(5) var<storage, read_write> lse: array<f32>; // (T, NH) f32

// As attention_forward, also saving lse = log sum_j exp(scale q.k_j) for the backward.
@compute @workgroup_size(BLK)
fn attention_forward_lse(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                         @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg); // t * NH + h
  if (th >= p.T * p.NH) { return; }
  let t = th / p.NH;
  let kvh = (th - t * p.NH) / (p.NH / p.NKV);
  for (var d = lid; d < p.HD; d += BLK) { qs[d] = q[th * p.HD + d] * p.scale; }
  workgroupBarrier();
  let m = attendKeys(th, kvh * p.HD, 0u, t + 1u, lid);
  if (lid == 0u) { lse[th] = m; }
}

// Backward (FlashAttention-2 recurrences, probabilities recomputed from lse, no T x T buffer):
//   P_ij = exp(scale q_i.k_j - lse_i), dP_ij = dout_i.v_j, D_i = dout_i.out_i,
//   dS_ij = P_ij (dP_ij - D_i),
//   dq_i += scale sum_j dS_ij k_j,  dk_j += scale sum_i dS_ij q_i,  dv_j += sum_i P_ij dout_i
// (i over queries >= j and over the query heads sharing j's KV head). Two kernels, no atomics:
// attention_backward_dq (one workgroup per query row; also writes D) then
// attention_backward_dkv (one workgroup per key row and KV head; reads D).

@group(0) @binding(1) var<storage, read_write> dq: array<f32>;    // (T, NH, HD) f32
@group(0) @binding(1) var<storage, read_write> dk: array<f32>;    // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read> dout: array<f32>;        // (T, NH, HD) f32
@group(0) @binding(6) var<storage, read> lseIn: array<f32>;       // (T, NH) f32
@group(0) @binding(7) var<storage, read_write> rowDot: array<f32>; // (T, NH) f32: D, written by _dq
@group(0) @binding(7) var<storage, read> rowDotIn: array<f32>;    // (T, NH) f32: D, read by _dkv
@group(0) @binding(8) var<storage, read> outSaved: array<f32>;    // (T, NH, HD) f32
@group(0) @binding(8) var<storage, read_write> dv: array<f32>;    // (T, NKV, HD) f32

var<workgroup> os: array<f32, HDMAX>; // dout_i (dq) or v_j (dkv)
var<workgroup> dss: array<f32, BLK>;  // dS of the current block
var<workgroup> rows: array<u32, BLK>; // query row (t * NH + h) of each pair in the block (dkv)

@compute @workgroup_size(BLK)
fn attention_backward_dq(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                         @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg); // i * NH + h
  if (th >= p.T * p.NH) { return; }
  let i = th / p.NH;
  let kvBase = ((th - i * p.NH) / (p.NH / p.NKV)) * p.HD;
  let rowStride = p.NKV * p.HD;
  for (var d = lid; d < p.HD; d += BLK) {
    qs[d] = q[th * p.HD + d] * p.scale;
    os[d] = dout[th * p.HD + d];
  }
  workgroupBarrier();
  var di = 0.0; // every thread sums the same row: HD reads, no extra barrier
  for (var d = 0u; d < p.HD; d++) { di += os[d] * outSaved[th * p.HD + d]; }
  if (lid == 0u) { rowDot[th] = di; }
  let lseI = lseIn[th];
  let nKeys = i + 1u;
  var acc: array<f32, DPT>;
  for (var b0 = 0u; b0 < nKeys; b0 += BLK) {
    let j = b0 + lid;
    var ds = 0.0;
    if (j < nKeys) {
      let kb = kvBase + j * rowStride;
      var s = 0.0;
      var dp = 0.0;
      for (var d = 0u; d < p.HD; d++) {
        s += qs[d] * kCache[kb + d];
        dp += os[d] * vCache[kb + d];
      }
      ds = exp(s - lseI) * (dp - di);
    }
    dss[lid] = ds;
    workgroupBarrier();
    let nb = min(BLK, nKeys - b0);
    for (var e = 0u; e < DPT; e++) {
      let d = lid + e * BLK;
      if (d < p.HD) {
        var a = acc[e];
        for (var u = 0u; u < nb; u++) { a += dss[u] * kCache[kvBase + (b0 + u) * rowStride + d]; }
        acc[e] = a;
      }
    }
    workgroupBarrier(); // the block's dS is consumed before the next block overwrites it
  }
  for (var e = 0u; e < DPT; e++) {
    let d = lid + e * BLK;
    if (d < p.HD) { dq[th * p.HD + d] = dq[th * p.HD + d] + p.scale * acc[e]; }
  }
}

@compute @workgroup_size(BLK)
fn attention_backward_dkv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                          @builtin(local_invocation_index) lid: u32) {
  let jk = linearGroup(wid, nwg); // j * NKV + kvh
  if (jk >= p.T * p.NKV) { return; }
  let j = jk / p.NKV;
  let kvh = jk - j * p.NKV;
  let G = p.NH / p.NKV; // query heads per KV head
  for (var d = lid; d < p.HD; d += BLK) {
    qs[d] = kCache[jk * p.HD + d] * p.scale; // scaled k_j
    os[d] = vCache[jk * p.HD + d];
  }
  workgroupBarrier();
  // Pairs (query i >= j, head h of the group), e = (i - j) * G + (h - kvh * G).
  let nPairs = (p.T - j) * G;
  var accK: array<f32, DPT>;
  var accV: array<f32, DPT>;
  for (var b0 = 0u; b0 < nPairs; b0 += BLK) {
    let e = b0 + lid;
    var pij = 0.0;
    var ds = 0.0;
    var th = 0u;
    if (e < nPairs) {
      th = (j + e / G) * p.NH + kvh * G + e % G;
      let qb = th * p.HD;
      var s = 0.0;
      var dp = 0.0;
      for (var d = 0u; d < p.HD; d++) {
        s += q[qb + d] * qs[d];
        dp += dout[qb + d] * os[d];
      }
      pij = exp(s - lseIn[th]);
      ds = pij * (dp - rowDotIn[th]);
    }
    ps[lid] = pij;
    dss[lid] = ds;
    rows[lid] = th;
    workgroupBarrier();
    let nb = min(BLK, nPairs - b0);
    for (var c = 0u; c < DPT; c++) {
      let d = lid + c * BLK;
      if (d < p.HD) {
        var ak = accK[c];
        var av = accV[c];
        for (var u = 0u; u < nb; u++) {
          let qb = rows[u] * p.HD + d;
          ak += dss[u] * q[qb];
          av += ps[u] * dout[qb];
        }
        accK[c] = ak;
        accV[c] = av;
      }
    }
    workgroupBarrier(); // the block is consumed before the next one overwrites it
  }
  for (var c = 0u; c < DPT; c++) {
    let d = lid + c * BLK;
    if (d < p.HD) {
      let o = jk * p.HD + d;
      dk[o] = dk[o] + p.scale * accK[c];
      dv[o] = dv[o] + accV[c];
    }
  }
}
#endif
