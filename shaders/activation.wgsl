// SwiGLU activation of the Qwen3 MLP: out = silu(gate) * up, elementwise.

struct SiluMulParams {
  n: u32,
}

@group(0) @binding(0) var<uniform> p: SiluMulParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (n) f32
@group(0) @binding(2) var<storage, read> gate: array<f32>;      // (n) f32
@group(0) @binding(3) var<storage, read> up: array<f32>;        // (n) f32

@compute @workgroup_size(256)
fn silu_mul_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                    @builtin(local_invocation_index) lid: u32) {
  let i = (wid.x + wid.y * nwg.x) * 256u + lid;
  if (i >= p.n) { return; }
  let g = gate[i];
  // g / (1 + e^-g): for g << 0 the exp overflows to inf and the result is -0, the right limit.
  out[i] = g / (1.0 + exp(-g)) * up[i];
}
