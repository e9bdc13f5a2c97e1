{{ENABLE}}
// Token sampling, one workgroup per row of logits (B, V); only the ids leave the GPU.
//   temperature <= 0: argmax, lowest index on ties.
//   otherwise: softmax(logits / temperature) restricted to the top-k tokens (topK 0 = off), then
//   to the smallest nucleus with mass >= topP (topP >= 1 = off), renormalized, one draw.
// Both cut-offs are thresholds on the logit, found by bisection over the 32-bit order-preserving
// key of the f32 value: 32 rounds of a parallel count (top-k) or mass sum (top-p) over the row.
// Tokens tied with the threshold are all kept (HF's sort would keep an arbitrary subset).
// Thread j owns tokens j, j+WG, j+2WG, ...; the draw walks threads' masses in order, then the
// chosen thread's tokens: a fixed order over the kept set, so the draw is exact and reproducible.
// RNG: counter-based hash of (seed, step, row), so the same inputs give the same ids.
//
// The workgroup reductions come in two variants, picked by src/model/kernels.ts (subgroupDefines):
// with the device's `subgroups` feature the ENABLE define is `enable subgroups;` and the
// IF_SUBGROUPS / ELSE / END defines are comment delimiters that keep only the subgroup section
// (subgroupAdd / subgroupMax, then one shared-memory step across subgroups); without it only the
// shared-memory tree section compiles. Both sections define the entry point and the same helpers
// (sumF, sumU, maxF, argmaxIndex); the row's algorithm, sampleRow, is shared.

struct SampleParams {
  B: u32,
  V: u32,
  topK: u32,
  seed: u32,
  step: u32,
  temperature: f32,
  topP: f32,
}

const WG = {{WG}}u;

@group(0) @binding(0) var<uniform> p: SampleParams;
@group(0) @binding(1) var<storage, read_write> outIds: array<u32>; // (B) u32
@group(0) @binding(2) var<storage, read> logits: array<f32>;       // (B, V) f32

var<workgroup> redF: array<f32, WG>;
var<workgroup> redU: array<u32, WG>;
var<workgroup> redU2: array<u32, WG>; // subgroup argmax: the index next to the key in redU

const LOWEST = -3.40282346e38; // -FLT_MAX (an -inf literal is rejected by const evaluation)
const NONE = 0xffffffffu;      // no token

// Monotone map f32 -> u32: a < b  <=>  key(a) < key(b) (for non-NaN values).
fn orderedKey(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn pcg(v: u32) -> u32 {
  let s = v * 747796405u + 2891336453u;
  let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
  return (w >> 22u) ^ w;
}

// Uniform in [0, 1) with 24 random bits.
fn uniform01(seed: u32, step: u32, row: u32) -> f32 {
  let h = pcg(pcg(pcg(seed) + step) + row);
  return f32(h >> 8u) * (1.0 / 16777216.0);
}

{{IF_SUBGROUPS}}
// Subgroup reductions. Subgroup id = lid / sgSize: assumes the workgroup is packed into subgroups
// in local_invocation_index order, as GPUs do. Each subgroup's lane 0 stores its subgroup's result,
// then every subgroup reduces those partials in the same lanes, so all invocations get the same
// value. sgSize is uniform, so every subgroup op here sits in uniform control flow. The trailing
// barrier keeps the next call from overwriting partials that are still being read.
fn sumF(lid: u32, sgSize: u32, sgLane: u32, v: f32) -> f32 {
  let s = subgroupAdd(v);
  if (sgLane == 0u) { redF[lid / sgSize] = s; }
  workgroupBarrier();
  var t = 0.0;
  for (var j = sgLane; j < (WG + sgSize - 1u) / sgSize; j += sgSize) { t += redF[j]; }
  let r = subgroupAdd(t);
  workgroupBarrier();
  return r;
}

fn sumU(lid: u32, sgSize: u32, sgLane: u32, v: u32) -> u32 {
  let s = subgroupAdd(v);
  if (sgLane == 0u) { redU[lid / sgSize] = s; }
  workgroupBarrier();
  var t = 0u;
  for (var j = sgLane; j < (WG + sgSize - 1u) / sgSize; j += sgSize) { t += redU[j]; }
  let r = subgroupAdd(t);
  workgroupBarrier();
  return r;
}

fn maxF(lid: u32, sgSize: u32, sgLane: u32, v: f32) -> f32 {
  let s = subgroupMax(v);
  if (sgLane == 0u) { redF[lid / sgSize] = s; }
  workgroupBarrier();
  var t = LOWEST;
  for (var j = sgLane; j < (WG + sgSize - 1u) / sgSize; j += sgSize) { t = max(t, redF[j]); }
  let r = subgroupMax(t);
  workgroupBarrier();
  return r;
}

// Index of the largest v, lowest index on ties; i = NONE marks a thread without tokens. Compares
// order-preserving keys (u32 max/min are exact), with -0 taken as +0 so they tie as in the float
// comparison; a thread without tokens gets key 0, below every real value including -inf.
fn argmaxIndex(lid: u32, sgSize: u32, sgLane: u32, v: f32, i: u32) -> u32 {
  let key = select(0u, orderedKey(select(v, 0.0, v == 0.0)), i != NONE);
  let k = subgroupMax(key);
  let ki = subgroupMin(select(NONE, i, key == k));
  if (sgLane == 0u) {
    redU[lid / sgSize] = k;
    redU2[lid / sgSize] = ki;
  }
  workgroupBarrier();
  var bk = 0u;
  var bi = NONE;
  for (var j = sgLane; j < (WG + sgSize - 1u) / sgSize; j += sgSize) {
    let ok = redU[j];
    let oi = redU2[j];
    if (ok > bk || (ok == bk && oi < bi)) {
      bk = ok;
      bi = oi;
    }
  }
  let mk = subgroupMax(bk);
  let r = subgroupMin(select(NONE, bi, bk == mk));
  workgroupBarrier();
  return r;
}

@compute @workgroup_size(WG)
fn sample_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                  @builtin(local_invocation_index) lid: u32,
                  @builtin(subgroup_size) sgSize: u32, @builtin(subgroup_invocation_id) sgLane: u32) {
  sampleRow(wid.x + wid.y * nwg.x, lid, sgSize, sgLane);
}
{{ELSE}}
fn sumF(lid: u32, sgSize: u32, sgLane: u32, v: f32) -> f32 {
  redF[lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { redF[lid] += redF[lid + s]; }
    workgroupBarrier();
  }
  let r = workgroupUniformLoad(&redF[0]);
  workgroupBarrier(); // nobody refills redF before everyone has read the total
  return r;
}

fn sumU(lid: u32, sgSize: u32, sgLane: u32, v: u32) -> u32 {
  redU[lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { redU[lid] += redU[lid + s]; }
    workgroupBarrier();
  }
  let r = workgroupUniformLoad(&redU[0]);
  workgroupBarrier();
  return r;
}

fn maxF(lid: u32, sgSize: u32, sgLane: u32, v: f32) -> f32 {
  redF[lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { redF[lid] = max(redF[lid], redF[lid + s]); }
    workgroupBarrier();
  }
  let r = workgroupUniformLoad(&redF[0]);
  workgroupBarrier();
  return r;
}

// Index of the largest v, lowest index on ties; i = NONE marks a thread without tokens. The
// result is meaningful in invocation 0.
fn argmaxIndex(lid: u32, sgSize: u32, sgLane: u32, v: f32, i: u32) -> u32 {
  redF[lid] = v;
  redU[lid] = i;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      let ov = redF[lid + s];
      let oi = redU[lid + s];
      let mv = redF[lid];
      let mi = redU[lid];
      if (oi != 0xffffffffu && (mi == 0xffffffffu || ov > mv || (ov == mv && oi < mi))) {
        redF[lid] = ov;
        redU[lid] = oi;
      }
    }
    workgroupBarrier();
  }
  return redU[0];
}

@compute @workgroup_size(WG)
fn sample_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                  @builtin(local_invocation_index) lid: u32) {
  sampleRow(wid.x + wid.y * nwg.x, lid, 0u, 0u);
}
{{END}}

// One row per workgroup; sgSize and sgLane are the subgroup builtins (0 in the tree variant).
fn sampleRow(row: u32, lid: u32, sgSize: u32, sgLane: u32) {
  if (row >= p.B) { return; }
  let base = row * p.V;

  if (p.temperature <= 0.0) {
    // Greedy. Each thread scans its tokens in increasing order, so strict > keeps the lowest index.
    var bestV = LOWEST;
    var bestI = 0xffffffffu;
    for (var i = lid; i < p.V; i += WG) {
      let v = logits[base + i];
      if (bestI == 0xffffffffu || v > bestV) { bestV = v; bestI = i; }
    }
    let best = argmaxIndex(lid, sgSize, sgLane, bestV, bestI);
    if (lid == 0u) { outIds[row] = best; }
    return;
  }

  // 1. Row max of z = logits / temperature, for a stable exp.
  var mx = LOWEST;
  for (var i = lid; i < p.V; i += WG) { mx = max(mx, logits[base + i] / p.temperature); }
  mx = maxF(lid, sgSize, sgLane, mx);

  // 2. Top-k: the largest key u with count(key(z) >= u) >= topK, i.e. the k-th largest logit.
  var kLo = 0u;
  if (p.topK > 0u && p.topK < p.V) {
    var lo = 0u;
    var hi = 0xffffffffu;
    for (var it = 0u; it < 32u; it++) {
      let d = hi - lo;
      let mid = lo + (d >> 1u) + (d & 1u); // ceil midpoint without overflow
      var c = 0u;
      for (var i = lid; i < p.V; i += WG) {
        if (orderedKey(logits[base + i] / p.temperature) >= mid) { c++; }
      }
      if (sumU(lid, sgSize, sgLane, c) >= p.topK) { lo = mid; } else { hi = mid - 1u; }
    }
    kLo = lo;
  }

  // 3. Top-p on the top-k-renormalized distribution: the largest key u >= kLo whose mass
  //    sum_{key >= u} exp(z - mx) is still >= topP * (mass of the top-k set).
  var thr = kLo;
  if (p.topP < 1.0) {
    var total = 0.0;
    for (var i = lid; i < p.V; i += WG) {
      let z = logits[base + i] / p.temperature;
      if (orderedKey(z) >= kLo) { total += exp(z - mx); }
    }
    let want = p.topP * sumF(lid, sgSize, sgLane, total);
    var lo = kLo;
    var hi = orderedKey(mx);
    for (var it = 0u; it < 32u; it++) {
      let d = hi - lo;
      let mid = lo + (d >> 1u) + (d & 1u);
      var s = 0.0;
      for (var i = lid; i < p.V; i += WG) {
        let z = logits[base + i] / p.temperature;
        if (orderedKey(z) >= mid) { s += exp(z - mx); }
      }
      if (sumF(lid, sgSize, sgLane, s) >= want) { lo = mid; } else { hi = mid - 1u; }
    }
    thr = lo;
  }

  // 4. Draw: each thread's kept mass, then thread 0 walks threads and the chosen thread's tokens.
  var own = 0.0;
  for (var i = lid; i < p.V; i += WG) {
    let z = logits[base + i] / p.temperature;
    if (orderedKey(z) >= thr) { own += exp(z - mx); }
  }
  redF[lid] = own;
  workgroupBarrier();
  if (lid == 0u) {
    var total = 0.0;
    for (var j = 0u; j < WG; j++) { total += redF[j]; }
    let r = uniform01(p.seed, p.step, row) * total;
    var before = 0.0;
    var chosen = 0xffffffffu;
    var last = 0u;
    var beforeLast = 0.0;
    for (var j = 0u; j < WG; j++) {
      let mj = redF[j];
      if (mj > 0.0) {
        last = j;
        beforeLast = before;
        if (before + mj > r) { chosen = j; break; }
      }
      before += mj;
    }
    if (chosen == 0xffffffffu) { chosen = last; before = beforeLast; } // r rounded past the total
    var cum = before;
    var pick = 0xffffffffu;
    var lastKept = 0u;
    for (var i = chosen; i < p.V; i += WG) {
      let z = logits[base + i] / p.temperature;
      if (orderedKey(z) >= thr) {
        lastKept = i;
        cum += exp(z - mx);
        if (cum > r) { pick = i; break; }
      }
    }
    outIds[row] = select(pick, lastKept, pick == 0xffffffffu);
  }
}
