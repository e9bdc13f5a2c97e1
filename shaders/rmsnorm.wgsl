#ifdef SUBGROUPS
enable subgroups;
#endif
// RMSNorm (Qwen3RMSNorm): out = w * (x * rsqrt(mean(x^2) + eps)), and its backward (weights
// frozen). One workgroup per row; the row sums go through common/reduce.wgsl, with subgroups when
// the device has them (define SUBGROUPS), else a shared-memory tree.

struct RmsNormParams {
  R: u32,
  D: u32,
  eps: f32,
}

override WG: u32 = 64; // threads per row: 64 for head-dim rows, 256 for hidden rows

@group(0) @binding(0) var<uniform> p: RmsNormParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (R, D) f32
@group(0) @binding(2) var<storage, read> x: array<f32>;         // (R, D) f32
@group(0) @binding(3) var<storage, read> w: array<u32>;         // (D) bf16, two per u32

#include "common/bf16.wgsl"
#include "common/grid.wgsl"

var<workgroup> partial: array<f32, WG>;
var<workgroup> partial2: array<vec2f, WG>;
#include "common/reduce.wgsl" (NAME=rowSum, T=f32, OP=Add, IDENTITY=0.0, SCRATCH=partial)
#include "common/reduce.wgsl" (NAME=rowSum2, T=vec2f, OP=Add, IDENTITY=vec2f(0.0), SCRATCH=partial2)

fn weightAt(i: u32) -> f32 { return bf16Pick(w[i >> 1u], i); }

@compute @workgroup_size(WG)
fn rmsnorm_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  let r = linearGroup(wid, nwg);
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.D;
  var ss = 0.0;
  for (var i = l.lid; i < p.D; i += WG) {
    let v = x[base + i];
    ss += v * v;
  }
  let scale = inverseSqrt(rowSum(ss, l) / f32(p.D) + p.eps);
  for (var i = l.lid; i < p.D; i += WG) {
    out[base + i] = weightAt(i) * (x[base + i] * scale);
  }
}

// Backward, weights frozen (no dw). With rstd = rsqrt(mean(x^2) + eps):
//   dx += w dy rstd - x rstd^3 mean(w dy x)
// rstd is recomputed from x (one more pass over the row) instead of being saved.
// Bindings reuse x (2) and w (3) of the forward; dx and dy are the backward's own.

@group(0) @binding(1) var<storage, read_write> dx: array<f32>; // (R, D) f32
@group(0) @binding(4) var<storage, read> dy: array<f32>;       // (R, D) f32

@compute @workgroup_size(WG)
fn rmsnorm_backward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  let r = linearGroup(wid, nwg);
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.D;
  var s = vec2f(0.0);
  for (var i = l.lid; i < p.D; i += WG) {
    let v = x[base + i];
    s += vec2f(v * v, weightAt(i) * dy[base + i] * v); // (sum x^2, sum w dy x)
  }
  let tot = rowSum2(s, l);
  let rstd = inverseSqrt(tot.x / f32(p.D) + p.eps);
  let c = rstd * rstd * rstd * (tot.y / f32(p.D));
  for (var i = l.lid; i < p.D; i += WG) {
    dx[base + i] = dx[base + i] + (weightAt(i) * dy[base + i] * rstd - x[base + i] * c);
  }
}
