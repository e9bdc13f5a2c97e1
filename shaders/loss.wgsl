{{ENABLE}}
// Log-softmax at the sampled tokens and its backward, for the training losses (src/train/kernels.ts).
//   forward:  lse[r] = logsumexp(logits[r, :]),  logp[r] = logits[r, targets[r]] - lse[r]
//   backward: dlogits[r, v] = dlogp[r] * ((v == targets[r]) - exp(logits[r, v] - lse[r]))
// A target >= V has no log-prob: logp is NaN (loud) and the backward has no one-hot term.
//
// log_softmax_gather comes in two variants, picked by src/train/kernels.ts (subgroupDefines): with
// the device's `subgroups` feature the ENABLE define is `enable subgroups;` and the IF_SUBGROUPS /
// ELSE / END defines are comment delimiters that keep only the subgroup section below; without it
// only the shared-memory tree section compiles. log_softmax_backward uses neither.

struct GatherParams {
  R: u32,
  V: u32,
}

const WG = {{WG}}u;
const LOWEST = -3.40282346e38; // -FLT_MAX (an -inf literal is rejected by const evaluation)

@group(0) @binding(0) var<uniform> p: GatherParams;
@group(0) @binding(1) var<storage, read_write> logp: array<u32>; // (R) f32, as bits so NaN can be stored
@group(0) @binding(2) var<storage, read_write> lse: array<f32>;  // (R) f32, saved for the backward
@group(0) @binding(3) var<storage, read> logits: array<f32>;     // (R, V) f32
@group(0) @binding(4) var<storage, read> targets: array<u32>;    // (R) u32

var<workgroup> redMax: array<f32, WG>;
var<workgroup> redSum: array<f32, WG>;

// Online logsumexp state (max m, sum s of exp(x - m)); merging two is exact up to rounding.
fn mergeSum(m: f32, s: f32, om: f32, os: f32) -> f32 {
  let mx = max(m, om);
  return s * exp(m - mx) + os * exp(om - mx);
}

// This thread's online logsumexp state (max, sum of exp(x - max)) over tokens lid, lid + WG, ...
fn lseLocal(base: u32, lid: u32) -> vec2f {
  var m = LOWEST;
  var s = 0.0;
  for (var i = lid; i < p.V; i += WG) {
    let x = logits[base + i];
    if (x > m) {
      s = s * exp(m - x) + 1.0;
      m = x;
    } else {
      s += exp(x - m);
    }
  }
  return vec2f(m, s);
}

fn writeRow(r: u32, base: u32, m: f32, s: f32) {
  let l = m + log(s);
  let t = targets[r];
  lse[r] = l;
  logp[r] = select(0x7fc00000u, bitcast<u32>(logits[base + min(t, p.V - 1u)] - l), t < p.V);
}

{{IF_SUBGROUPS}}
// One workgroup per row. Each subgroup merges its threads' states with subgroupMax and
// subgroupAdd; lane 0 stores the subgroup's (max, sum); every subgroup then merges those partials
// the same way (subgroup id = lid / sgSize: subgroups assumed packed in local_invocation_index
// order, as GPUs do). One barrier per row.
@compute @workgroup_size(WG)
fn log_softmax_gather(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                      @builtin(local_invocation_index) lid: u32,
                      @builtin(subgroup_size) sgSize: u32, @builtin(subgroup_invocation_id) sgLane: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.V;
  let own = lseLocal(base, lid);
  let gm = subgroupMax(own.x);
  let gs = subgroupAdd(own.y * exp(own.x - gm));
  if (sgLane == 0u) {
    redMax[lid / sgSize] = gm;
    redSum[lid / sgSize] = gs;
  }
  workgroupBarrier();
  let parts = (WG + sgSize - 1u) / sgSize;
  var m = LOWEST;
  for (var j = sgLane; j < parts; j += sgSize) { m = max(m, redMax[j]); }
  let mx = subgroupMax(m);
  var s = 0.0;
  for (var j = sgLane; j < parts; j += sgSize) { s += redSum[j] * exp(redMax[j] - mx); }
  let total = subgroupAdd(s);
  if (lid == 0u) { writeRow(r, base, mx, total); }
}
{{ELSE}}
// One workgroup per row. Each thread runs an online logsumexp over its strided tokens (one pass
// over the row), then a tree merges the WG (max, sum) pairs: log2(WG) + 1 barriers per row.
@compute @workgroup_size(WG)
fn log_softmax_gather(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                      @builtin(local_invocation_index) lid: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.V;
  let own = lseLocal(base, lid);
  redMax[lid] = own.x;
  redSum[lid] = own.y;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      let om = redMax[lid + k];
      redSum[lid] = mergeSum(redMax[lid], redSum[lid], om, redSum[lid + k]);
      redMax[lid] = max(redMax[lid], om);
    }
    workgroupBarrier();
  }
  if (lid == 0u) { writeRow(r, base, redMax[0], redSum[0]); }
}
{{END}}

struct BackwardParams {
  R: u32,
  V: u32,
}

// Same bindings as the forward's under other names: both entries share one module scope.
@group(0) @binding(0) var<uniform> q: BackwardParams;
@group(0) @binding(1) var<storage, read_write> dlogits: array<f32>; // (R, V) f32, overwritten
@group(0) @binding(2) var<storage, read> dlogp: array<f32>;         // (R) f32
@group(0) @binding(3) var<storage, read> logitsIn: array<f32>;      // (R, V) f32
@group(0) @binding(4) var<storage, read> lseIn: array<f32>;         // (R) f32
@group(0) @binding(5) var<storage, read> targetsIn: array<u32>;     // (R) u32

// One thread per element of (R, V).
@compute @workgroup_size(WG)
fn log_softmax_backward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                        @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * nwg.x) * WG + lid;
  if (i >= q.R * q.V) { return; }
  let r = i / q.V;
  let v = i - r * q.V;
  let onehot = select(0.0, 1.0, v == targetsIn[r]);
  dlogits[i] = dlogp[r] * (onehot - exp(logitsIn[i] - lseIn[r]));
}
