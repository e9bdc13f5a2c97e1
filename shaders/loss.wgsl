// Log-softmax at the sampled tokens and its backward, for the training losses (src/train/kernels.ts).
//   forward:  lse[r] = logsumexp(logits[r, :]),  logp[r] = logits[r, targets[r]] - lse[r]
//   backward: dlogits[r, v] = dlogp[r] * ((v == targets[r]) - exp(logits[r, v] - lse[r]))
// A target >= V has no log-prob: logp is NaN (loud) and the backward has no one-hot term.

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

// One workgroup per row. Each thread runs an online logsumexp over its strided tokens (one pass
// over the row), then a tree merges the WG (max, sum) pairs: log2(WG) + 1 barriers per row.
@compute @workgroup_size(WG)
fn log_softmax_gather(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                      @builtin(local_invocation_index) lid: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.V;
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
  redMax[lid] = m;
  redSum[lid] = s;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      let om = redMax[lid + k];
      redSum[lid] = mergeSum(redMax[lid], redSum[lid], om, redSum[lid + k]);
      redMax[lid] = max(redMax[lid], om);
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    let l = redMax[0] + log(redSum[0]);
    let t = targets[r];
    lse[r] = l;
    logp[r] = select(0x7fc00000u, bitcast<u32>(logits[base + min(t, p.V - 1u)] - l), t < p.V);
  }
}

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
