// Row gather: out[r, :] = x[rows[r], :] (e.g. the last token of each sequence before the LM head).

struct GatherParams {
  R: u32,
  C: u32,
}

@group(0) @binding(0) var<uniform> p: GatherParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (R, C) f32
@group(0) @binding(2) var<storage, read> x: array<f32>;         // (T, C) f32
@group(0) @binding(3) var<storage, read> rows: array<u32>;      // (R) u32, each < T

#include "common/grid.wgsl"

@compute @workgroup_size(256)
fn gather_rows_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                       @builtin(local_invocation_index) lid: u32) {
  let i = linearGroup(wid, nwg) * 256u + lid;
  if (i >= p.R * p.C) { return; }
  let r = i / p.C;
  let c = i - r * p.C;
  out[i] = x[rows[r] * p.C + c];
}
