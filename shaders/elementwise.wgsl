// Elementwise helpers for the backward: out += a (gradient of a residual add).

struct AddParams {
  n: u32,
}

@group(0) @binding(0) var<uniform> p: AddParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (n) f32
@group(0) @binding(2) var<storage, read> a: array<f32>;         // (n) f32

#include "common/grid.wgsl"

@compute @workgroup_size(256)
fn add_inplace(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
               @builtin(local_invocation_index) lid: u32) {
  let i = linearGroup(wid, nwg) * 256u + lid;
  if (i >= p.n) { return; }
  out[i] = out[i] + a[i];
}
