enable subgroups;

// RMSNorm forward and backward (shaders/rmsnorm.wgsl) with subgroup reductions, used when the
// device has the `subgroups` feature (src/model/kernels.ts). Same bindings, params and results;
// only the row reduction differs: subgroupAdd inside each subgroup, one shared-memory step across
// subgroups (2 barriers per row instead of log2(WG) + 1).
// A separate file because rmsnorm.wgsl must keep compiling with only the WG define and no extension.
//
// Subgroup id = lid / subgroup_size: assumes a 1-D workgroup is packed into subgroups in
// local_invocation_index order, as GPUs do (test/subgroups.test.ts checks the results).
// subgroup_size (a power of two, 4..128) comes from the builtin and is never assumed.

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

// One partial per subgroup (at most WG / 4 are used).
var<workgroup> partial: array<f32, WG>;
var<workgroup> partial2: array<vec2f, WG>;

fn weightAt(i: u32) -> f32 {
  let word = w[i >> 1u];
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

// Sum of v over the workgroup, returned to every invocation. sgSize is uniform, so both
// subgroupAdd calls sit in uniform control flow.
fn rowSum(lid: u32, sgSize: u32, sgLane: u32, v: f32) -> f32 {
  let s = subgroupAdd(v);
  if (sgLane == 0u) { partial[lid / sgSize] = s; }
  workgroupBarrier();
  var t = 0.0;
  for (var i = sgLane; i < (WG + sgSize - 1u) / sgSize; i += sgSize) { t += partial[i]; }
  return subgroupAdd(t); // every subgroup reduces the same partials in the same lanes
}

fn rowSum2(lid: u32, sgSize: u32, sgLane: u32, v: vec2f) -> vec2f {
  let s = subgroupAdd(v);
  if (sgLane == 0u) { partial2[lid / sgSize] = s; }
  workgroupBarrier();
  var t = vec2f(0.0);
  for (var i = sgLane; i < (WG + sgSize - 1u) / sgSize; i += sgSize) { t += partial2[i]; }
  return subgroupAdd(t);
}

@compute @workgroup_size(WG)
fn rmsnorm_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_size) sgSize: u32, @builtin(subgroup_invocation_id) sgLane: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.D;
  var ss = 0.0;
  for (var i = lid; i < p.D; i += WG) {
    let v = x[base + i];
    ss += v * v;
  }
  let scale = inverseSqrt(rowSum(lid, sgSize, sgLane, ss) / f32(p.D) + p.eps);
  for (var i = lid; i < p.D; i += WG) {
    out[base + i] = weightAt(i) * (x[base + i] * scale);
  }
}

// Backward, weights frozen (no dw): dx += w dy rstd - x rstd^3 mean(w dy x), as in rmsnorm.wgsl.

@group(0) @binding(1) var<storage, read_write> dx: array<f32>; // (R, D) f32
@group(0) @binding(4) var<storage, read> dy: array<f32>;       // (R, D) f32

@compute @workgroup_size(WG)
fn rmsnorm_backward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                    @builtin(local_invocation_index) lid: u32,
                    @builtin(subgroup_size) sgSize: u32, @builtin(subgroup_invocation_id) sgLane: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= p.R) { return; } // uniform: the whole workgroup leaves together
  let base = r * p.D;
  var s = vec2f(0.0);
  for (var i = lid; i < p.D; i += WG) {
    let v = x[base + i];
    s += vec2f(v * v, weightAt(i) * dy[base + i] * v);
  }
  let tot = rowSum2(lid, sgSize, sgLane, s);
  let rstd = inverseSqrt(tot.x / f32(p.D) + p.eps);
  let c = rstd * rstd * rstd * (tot.y / f32(p.D));
  for (var i = lid; i < p.D; i += WG) {
    dx[base + i] = dx[base + i] + (weightAt(i) * dy[base + i] * rstd - x[base + i] * c);
  }
}
