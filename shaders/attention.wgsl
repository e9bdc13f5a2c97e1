// KV cache write and causal attention over the cache (GQA).
// Cache layout (S, maxT, NKV, HD) f32: one slot per sequence, positions along maxT.

// ---- kv_write: cache[slot[t], pos[t], :, :] = k[t] / v[t] ----------------------------------

struct KvWriteParams {
  T: u32,
  NKV: u32,
  HD: u32,
  maxT: u32,
}

@group(0) @binding(0) var<uniform> kw: KvWriteParams;
@group(0) @binding(1) var<storage, read_write> kwKCache: array<f32>; // (S, maxT, NKV, HD) f32
@group(0) @binding(2) var<storage, read_write> kwVCache: array<f32>; // (S, maxT, NKV, HD) f32
@group(0) @binding(3) var<storage, read> kwK: array<f32>;            // (T, NKV, HD) f32
@group(0) @binding(4) var<storage, read> kwV: array<f32>;            // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read> kwSlot: array<u32>;         // (T) u32
@group(0) @binding(6) var<storage, read> kwPos: array<u32>;          // (T) u32

@compute @workgroup_size(256)
fn kv_write(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
            @builtin(local_invocation_index) lid: u32) {
  let row = kw.NKV * kw.HD;
  let i = (wid.x + wid.y * nwg.x) * 256u + lid;
  if (i >= kw.T * row) { return; }
  let t = i / row;
  let pt = kwPos[t];
  if (pt >= kw.maxT) { return; } // past capacity: drop rather than spill into the next slot
  let dst = (kwSlot[t] * kw.maxT + pt) * row + (i - t * row);
  kwKCache[dst] = kwK[i];
  kwVCache[dst] = kwV[i];
}

// ---- attention: one workgroup per (token, head), online softmax over key blocks -------------
// Token t's query attends to positions 0..pos[t] of cache slot slot[t] (causal by position), so
// prefill (one slot, pos 0..T-1) and batched decode (one token per slot) are the same kernel.
// No (T, T, NH) score buffer: each block of BLK keys is scored, folded into a running max m,
// normalizer l and output accumulator, then discarded.

struct AttentionParams {
  T: u32,
  NH: u32,
  NKV: u32,
  HD: u32,
  maxT: u32,
  scale: f32, // 1/sqrt(HD)
}

const BLK = 64u;   // keys per block = threads per workgroup
const HDMAX = 256u;
const DPT = HDMAX / BLK; // output dims per thread

@group(0) @binding(0) var<uniform> p: AttentionParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (T, NH, HD) f32
@group(0) @binding(2) var<storage, read> q: array<f32>;         // (T, NH, HD) f32
@group(0) @binding(3) var<storage, read> kCache: array<f32>;    // (S, maxT, NKV, HD) f32
@group(0) @binding(4) var<storage, read> vCache: array<f32>;    // (S, maxT, NKV, HD) f32
@group(0) @binding(5) var<storage, read> slot: array<u32>;      // (T) u32
@group(0) @binding(6) var<storage, read> pos: array<u32>;       // (T) u32

var<workgroup> qs: array<f32, HDMAX>; // scaled query
var<workgroup> ps: array<f32, BLK>;   // scores, then probabilities, of the current block
var<workgroup> nKeysShared: u32;

@compute @workgroup_size(BLK)
fn attention_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                     @builtin(local_invocation_index) lid: u32) {
  let th = wid.x + wid.y * nwg.x; // t * NH + h
  if (th >= p.T * p.NH) { return; }
  let t = th / p.NH;
  let h = th - t * p.NH;
  let kvh = h / (p.NH / p.NKV);
  let rowStride = p.NKV * p.HD;
  let cacheBase = slot[t] * p.maxT * rowStride + kvh * p.HD; // + key * rowStride
  for (var d = lid; d < p.HD; d += BLK) { qs[d] = q[th * p.HD + d] * p.scale; }
  if (lid == 0u) { nKeysShared = min(pos[t] + 1u, p.maxT); }
  // The key count comes from a buffer; workgroupUniformLoad makes the block loop provably uniform.
  let nKeys = workgroupUniformLoad(&nKeysShared);

  var m = -3.40282346e38;
  var l = 0.0;
  var acc: array<f32, DPT>;
  for (var b0 = 0u; b0 < nKeys; b0 += BLK) {
    let j = b0 + lid;
    var s = -3.40282346e38;
    if (j < nKeys) {
      let kb = cacheBase + j * rowStride;
      var dot = 0.0;
      for (var d = 0u; d < p.HD; d++) { dot += qs[d] * kCache[kb + d]; }
      s = dot;
    }
    ps[lid] = s;
    workgroupBarrier();
    var mNew = m;
    for (var i = 0u; i < BLK; i++) { mNew = max(mNew, ps[i]); }
    workgroupBarrier(); // everyone has read the scores before they become probabilities
    ps[lid] = select(0.0, exp(s - mNew), j < nKeys);
    workgroupBarrier();
    let corr = exp(m - mNew);
    let nb = min(BLK, nKeys - b0);
    var lb = 0.0;
    for (var i = 0u; i < nb; i++) { lb += ps[i]; }
    l = l * corr + lb;
    for (var e = 0u; e < DPT; e++) {
      let d = lid + e * BLK;
      if (d < p.HD) {
        var a = acc[e] * corr;
        for (var i = 0u; i < nb; i++) { a += ps[i] * vCache[cacheBase + (b0 + i) * rowStride + d]; }
        acc[e] = a;
      }
    }
    m = mNew;
    workgroupBarrier(); // the block's probabilities are consumed before the next block overwrites them
  }
  for (var e = 0u; e < DPT; e++) {
    let d = lid + e * BLK;
    if (d < p.HD) { out[th * p.HD + d] = acc[e] / l; }
  }
}
