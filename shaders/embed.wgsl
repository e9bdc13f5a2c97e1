// Token embedding: out[t, :] = table[ids[t], :] as f32, the table in the WEIGHTS format (bf16 or
// q4, common/weights.wgsl). One thread per output element.

struct EmbedParams {
  T: u32,
  C: u32,
  V: u32,
}

@group(0) @binding(0) var<uniform> p: EmbedParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (T, C) f32
@group(0) @binding(2) var<storage, read> ids: array<u32>;       // (T) u32
@group(0) @binding(3) var<storage, read> w: array<u32>;         // (V, C) table, WEIGHTS format

#include "common/grid.wgsl"
fn q4ScaleBase() -> u32 { return (p.V * p.C) >> 3u; }
#include "common/weights.wgsl"

@compute @workgroup_size(256)
fn embed_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                 @builtin(local_invocation_index) lid: u32) {
  let i = linearGroup(wid, nwg) * 256u + lid;
  if (i >= p.T * p.C) { return; }
  let t = i / p.C;
  let c = i - t * p.C;
  out[i] = weightAt(ids[t] * p.C + c);
}
