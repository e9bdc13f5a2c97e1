// Elementwise ops, one thread per element: the SwiGLU activation of the Qwen3 MLP,
// out = silu(gate) * up, with its backward, and the residual-add gradient out += a.

struct ElementwiseParams {
  n: u32,
}

@group(0) @binding(0) var<uniform> p: ElementwiseParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (n) f32
@group(0) @binding(2) var<storage, read> gate: array<f32>;      // (n) f32
@group(0) @binding(3) var<storage, read> up: array<f32>;        // (n) f32

#include "common/grid.wgsl"

@compute @workgroup_size(256)
fn silu_mul_forward(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.n) { return; }
  let g = gate[i];
  // g / (1 + e^-g): for g << 0 the exp overflows to inf and the result is -0, the right limit.
  out[i] = g / (1.0 + exp(-g)) * up[i];
}

// Backward: with s = sigmoid(g), silu(g) = g s and silu'(g) = s (1 + g (1 - s)):
//   dgate += dout * up * silu'(gate),  dup += dout * silu(gate)
// Bindings reuse gate (2) and up (3) of the forward.

@group(0) @binding(1) var<storage, read_write> dgate: array<f32>; // (n) f32
@group(0) @binding(4) var<storage, read_write> dup: array<f32>;   // (n) f32
@group(0) @binding(5) var<storage, read> dout: array<f32>;        // (n) f32

@compute @workgroup_size(256)
fn silu_mul_backward(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.n) { return; }
  let g = gate[i];
  let s = 1.0 / (1.0 + exp(-g)); // g << 0: exp overflows to inf, s = 0, both terms -> 0
  let d = dout[i];
  dgate[i] = dgate[i] + d * up[i] * (s * (1.0 + g * (1.0 - s)));
  dup[i] = dup[i] + d * (g * s);
}

// out += a (the gradient of a residual add); out is binding 1 as in the forward.

@group(0) @binding(2) var<storage, read> a: array<f32>; // (n) f32

@compute @workgroup_size(256)
fn add_inplace(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.n) { return; }
  out[i] = out[i] + a[i];
}
