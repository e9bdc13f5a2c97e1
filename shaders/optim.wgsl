// Optimizer kernels for the LoRA parameters (src/train/kernels.ts): the squared norm of a
// gradient tensor (for the global grad-norm clip) and the AdamW step. All f32.

const WG = 256u;
const NAN_BITS = 0x7fc00000u;

// Exponent all ones: Inf or NaN. Tested and stored as bits, since WGSL lets compilers assume
// float values are finite (x != x may fold to false; a NaN constant does not compile).
fn nonFinite(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u;
}

// ---- sum of squares: two stages, partials[P] in a scratch buffer, then one thread adds -------

struct PartialParams {
  n: u32,
  P: u32, // workgroups in the grid-stride loop = partials written
}

@group(0) @binding(0) var<uniform> pp: PartialParams;
@group(0) @binding(1) var<storage, read_write> partials: array<u32>; // (P) f32 bits; NaN if non-finite
@group(0) @binding(2) var<storage, read> x: array<f32>;              // (n) f32

var<workgroup> redSum: array<f32, WG>;
var<workgroup> redBad: array<u32, WG>;

#include "common/grid.wgsl"

@compute @workgroup_size(WG)
fn sum_squares_partial(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_index) lid: u32) {
  let g = wid.x;
  var ss = 0.0;
  var bad = 0u;
  for (var i = g * WG + lid; i < pp.n; i += pp.P * WG) {
    let v = x[i];
    ss += v * v;
    bad |= select(0u, 1u, nonFinite(v));
  }
  redSum[lid] = ss;
  redBad[lid] = bad;
  workgroupBarrier();
  for (var k = WG / 2u; k > 0u; k >>= 1u) {
    if (lid < k) {
      redSum[lid] += redSum[lid + k];
      redBad[lid] |= redBad[lid + k];
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    partials[g] = select(bitcast<u32>(redSum[0]), NAN_BITS, redBad[0] != 0u);
  }
}

struct FinishParams {
  P: u32,
  outIndex: u32,
}

@group(0) @binding(0) var<uniform> fp: FinishParams;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;   // (M) f32 bits; out[outIndex] += total
@group(0) @binding(2) var<storage, read> partialsIn: array<u32>;  // (P) f32 bits

@compute @workgroup_size(1)
fn sum_squares_finish() {
  var total = 0.0;
  var bad = false;
  for (var i = 0u; i < fp.P; i++) {
    let s = bitcast<f32>(partialsIn[i]);
    bad = bad || nonFinite(s);
    total += s;
  }
  let prev = bitcast<f32>(out[fp.outIndex]);
  let sum = prev + total;
  // Once non-finite, out[outIndex] stays NaN through later accumulations (overflow included).
  bad = bad || nonFinite(prev) || nonFinite(sum);
  out[fp.outIndex] = select(bitcast<u32>(sum), NAN_BITS, bad);
}

// ---- AdamW (torch.optim.AdamW): decoupled decay first, then the bias-corrected Adam step ----
//   g = grad * gradScale
//   param *= 1 - lr * weightDecay
//   m = beta1 * m + (1 - beta1) * g ;  v = beta2 * v + (1 - beta2) * g^2
//   param -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// Step-dependent scalars come from the host in f64 (as PyTorch computes them in Python floats).

struct AdamWParams {
  n: u32,
  beta1: f32,
  oneMinusBeta1: f32,
  beta2: f32,
  oneMinusBeta2: f32,
  eps: f32,
  decay: f32,         // 1 - lr * weightDecay
  stepSize: f32,      // lr / (1 - beta1^t)
  sqrtBias2: f32,     // sqrt(1 - beta2^t)
  gradScale: f32,
}

@group(0) @binding(0) var<uniform> ap: AdamWParams;
@group(0) @binding(1) var<storage, read_write> param: array<f32>; // (n) f32
@group(0) @binding(2) var<storage, read_write> m: array<f32>;     // (n) f32 first moment
@group(0) @binding(3) var<storage, read_write> v: array<f32>;     // (n) f32 second moment
@group(0) @binding(4) var<storage, read> grad: array<f32>;        // (n) f32

@compute @workgroup_size(WG)
fn adamw_step(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
              @builtin(local_invocation_index) lid: u32) {
  let i = linearGroup(wid, nwg) * WG + lid;
  if (i >= ap.n) { return; }
  let g = grad[i] * ap.gradScale;
  let mi = ap.beta1 * m[i] + ap.oneMinusBeta1 * g;
  let vi = ap.beta2 * v[i] + ap.oneMinusBeta2 * (g * g);
  m[i] = mi;
  v[i] = vi;
  let denom = sqrt(vi) / ap.sqrtBias2 + ap.eps;
  param[i] = param[i] * ap.decay - ap.stepSize * (mi / denom);
}
