// Token embedding: out[t, :] = table[ids[t], :] (bf16 -> f32). One thread per output element.

struct EmbedParams {
  T: u32,
  C: u32,
}

@group(0) @binding(0) var<uniform> p: EmbedParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (T, C) f32
@group(0) @binding(2) var<storage, read> ids: array<u32>;       // (T) u32
@group(0) @binding(3) var<storage, read> table: array<u32>;     // (V, C) bf16, two per u32

// bf16 element i of a packed array: element 2k is the low half of word k.
fn tableAt(i: u32) -> f32 {
  let word = table[i >> 1u];
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

@compute @workgroup_size(256)
fn embed_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                 @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * nwg.x) * 256u + lid;
  if (i >= p.T * p.C) { return; }
  let t = i / p.C;
  let c = i - t * p.C;
  out[i] = tableAt(ids[t] * p.C + c);
}
