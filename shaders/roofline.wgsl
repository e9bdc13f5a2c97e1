// The two roofline probes of the benchmark (bench/roofline.ts): a plain copy, which measures the
// bandwidth a kernel can reach (bytes read + written per second), and a chain of FMAs on
// registers, which measures the f32 rate (2 FLOPs per FMA). Neither does anything useful.

struct RooflineParams {
  n: u32,     // copy: vec4 words to copy; fma: threads that store a result
  iters: u32, // fma: loop trips, each 8 independent vec4 FMAs (64 FLOPs)
}

@group(0) @binding(0) var<uniform> p: RooflineParams;

#include "common/grid.wgsl"

@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>; // (n) 16-byte words
@group(0) @binding(2) var<storage, read> src: array<vec4<u32>>;       // (n) 16-byte words

// One 16-byte load and store per thread: the widest plain access WGSL has.
@compute @workgroup_size(256)
fn copy_vec4(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.n) { return; }
  dst[i] = src[i];
}

@group(0) @binding(1) var<storage, read_write> sink: array<vec4<f32>>; // (n) f32x4

// Eight independent accumulators hide the FMA latency; the seed depends on the thread so the
// compiler cannot fold the loop, and every accumulator reaches the store.
@compute @workgroup_size(256)
fn fma_chain(th: ElementThread) {
  let i = elementIndex(th);
  let s = f32(i & 255u) * 1e-3;
  var a0 = vec4f(s, s + 0.1, s + 0.2, s + 0.3);
  var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
  var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
  let m = vec4f(0.9999);
  let c = vec4f(1e-4);
  for (var k = 0u; k < p.iters; k++) {
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
    a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
  }
  if (i < p.n) { sink[i] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7; }
}
