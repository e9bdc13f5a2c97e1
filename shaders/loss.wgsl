#ifdef SUBGROUPS
enable subgroups;
#endif
// Log-softmax at the sampled tokens and its backward, for the training losses (src/ops/loss.ts).
//   forward:  lse[r] = logsumexp(logits[r, :]),  logp[r] = logits[r, targets[r]] - lse[r]
//   backward: dlogits[r, v] = dlogp[r] * ((v == targets[r]) - exp(logits[r, v] - lse[r]))
// A target >= V has no log-prob: logp is NaN (loud) and the backward has no one-hot term.
// The row reductions are common/reduce.wgsl's: subgroup ops when the device has them (define
// SUBGROUPS), else a shared-memory tree.

struct GatherParams {
  R: u32,
  V: u32,
}

override WG: u32 = 256;
const LOWEST = -3.40282346e38; // -FLT_MAX (an -inf literal is rejected by const evaluation)

@group(0) @binding(0) var<uniform> p: GatherParams;
@group(0) @binding(1) var<storage, read_write> logp: array<u32>; // (R) f32, as bits so NaN can be stored
@group(0) @binding(2) var<storage, read_write> lse: array<f32>;  // (R) f32, saved for the backward
@group(0) @binding(3) var<storage, read> logits: array<f32>;     // (R, V) f32
@group(0) @binding(4) var<storage, read> targets: array<u32>;    // (R) u32

#include "common/grid.wgsl"

var<workgroup> red: array<f32, WG>;
#include "common/reduce.wgsl" (NAME=maxF, T=f32, OP=Max, IDENTITY=LOWEST, SCRATCH=red)
#include "common/reduce.wgsl" (NAME=sumF, T=f32, OP=Add, IDENTITY=0.0, SCRATCH=red)

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

// One workgroup per row: each thread runs an online logsumexp over its strided tokens (one pass
// over the row), then two workgroup reductions (common/reduce.wgsl) merge the (max, sum) states.
@compute @workgroup_size(WG)
fn log_softmax_gather(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  let r = linearGroup(wid, nwg);
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.V;
  let own = lseLocal(base, l.lid);
  let mx = maxF(own.x, l);
  let total = sumF(own.y * exp(own.x - mx), l);
  if (l.lid == 0u) { writeRow(r, base, mx, total); }
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
  let i = linearGroup(wid, nwg) * WG + lid;
  if (i >= q.R * q.V) { return; }
  let r = i / q.V;
  let v = i - r * q.V;
  let onehot = select(0.0, 1.0, v == targetsIn[r]);
  dlogits[i] = dlogp[r] * (onehot - exp(logitsIn[i] - lseIn[r]));
}
