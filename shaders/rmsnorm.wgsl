// RMSNorm (Qwen3RMSNorm): out = w * (x * rsqrt(mean(x^2) + eps)). One workgroup per row.

struct RmsNormParams {
  R: u32,
  D: u32,
  eps: f32,
}

const WG = {{WG}}u; // threads per row: 64 for head-dim rows, 256 for hidden rows

@group(0) @binding(0) var<uniform> p: RmsNormParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (R, D) f32
@group(0) @binding(2) var<storage, read> x: array<f32>;         // (R, D) f32
@group(0) @binding(3) var<storage, read> w: array<u32>;         // (D) bf16, two per u32

var<workgroup> partial: array<f32, WG>;

fn weightAt(i: u32) -> f32 {
  let word = w[i >> 1u];
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

@compute @workgroup_size(WG)
fn rmsnorm_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                   @builtin(local_invocation_index) lid: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.D;
  var ss = 0.0;
  for (var i = lid; i < p.D; i += WG) {
    let v = x[base + i];
    ss += v * v;
  }
  partial[lid] = ss;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { partial[lid] += partial[lid + s]; }
    workgroupBarrier();
  }
  let scale = inverseSqrt(partial[0] / f32(p.D) + p.eps);
  for (var i = lid; i < p.D; i += WG) {
    out[base + i] = weightAt(i) * (x[base + i] * scale);
  }
}

// Backward, weights frozen (no dw). With rstd = rsqrt(mean(x^2) + eps):
//   dx += w dy rstd - x rstd^3 mean(w dy x)
// rstd is recomputed from x (one more pass over the row) instead of being saved.
// Bindings reuse x (2) and w (3) of the forward; dx and dy are the backward's own.

@group(0) @binding(1) var<storage, read_write> dx: array<f32>; // (R, D) f32
@group(0) @binding(4) var<storage, read> dy: array<f32>;       // (R, D) f32

var<workgroup> partial2: array<vec2f, WG>; // (sum x^2, sum w dy x) per thread

@compute @workgroup_size(WG)
fn rmsnorm_backward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                    @builtin(local_invocation_index) lid: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.D;
  var s = vec2f(0.0);
  for (var i = lid; i < p.D; i += WG) {
    let v = x[base + i];
    s += vec2f(v * v, weightAt(i) * dy[base + i] * v);
  }
  partial2[lid] = s;
  workgroupBarrier();
  for (var h = WG / 2u; h > 0u; h >>= 1u) {
    if (lid < h) { partial2[lid] += partial2[lid + h]; }
    workgroupBarrier();
  }
  let tot = partial2[0];
  let rstd = inverseSqrt(tot.x / f32(p.D) + p.eps);
  let c = rstd * rstd * rstd * (tot.y / f32(p.D));
  for (var i = lid; i < p.D; i += WG) {
    dx[base + i] = dx[base + i] + (weightAt(i) * dy[base + i] * rstd - x[base + i] * c);
  }
}
