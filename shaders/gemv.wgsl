// Decode GEMV over 16-byte weight blocks (src/ops/forward.ts matmul and gemm pick it on CPU
// adapters when the rows are 16-byte aligned; shaders/matmul.wgsl keeps the word-by-word kernels
// for the rest, and the GPU variants):
//   out (M, N) (+)= scale * x (M, K) . w (N, K)^T     x f32, w f32, bf16 or q4 (WEIGHTS)
// Each weight load is one vec4<u32>: 4 f32, 8 bf16 or 32 q4 nibbles (exactly one q4 scale group,
// since a row starts at n * K / 8 words with K % 32 == 0). Every weight block is unpacked once
// and multiplied into the TMAX rows of x a thread covers, in vec4 accumulators that are plain
// variables (common/gemvrows.wgsl spells out rows and columns): SwiftShader keeps indexed
// function arrays in memory, so an array of accumulators costs a memory access per FMA.
// Entries:
//   gemv_rows (CPU adapters): COLS output columns per thread, TMAX rows of x per z, no barriers.
// Measured on SwiftShader (2 cores), bf16 9728 x 2560: x staged in workgroup memory did not pay
// there (+20-45% CPU time: barriers, and its reads are per-lane gathers like storage reads);
// COLS = 4 took half the CPU time of COLS = 1 (each x read serves 4 columns).

struct GemvParams {
  M: u32,
  N: u32,
  K: u32,
  accumulate: u32, // 1: out += ..., 0: out = ...
  scale: f32,
}

@group(0) @binding(0) var<uniform> p: GemvParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (M, N)
@group(0) @binding(2) var<storage, read> a: array<vec4f>;        // x (M, K), K % 4 == 0
@group(0) @binding(3) var<storage, read> w: array<vec4u>;        // (N, K) in 16-byte blocks

#include "common/grid.wgsl"

const TMAX = {{TMAX}}u; // rows of x per thread: 1, 2, 4 or 8

// A block (16 bytes) is PARTS parts; a part is a Pair of vec4f weights, multiplied by pairDot
// into the Pair of EPP consecutive inputs that xsAt reads from vec4 xi of x.
struct Pair {
  lo: vec4f,
  hi: vec4f,
}
#if WEIGHTS == bf16
#include "common/bf16.wgsl"
const BE = 8u; // elements per block
const EPP = 8u;
const PARTS = 1u;
// Elements 0, 2, 4, 6 (low halves) and 1, 3, 5, 7 (high halves).
fn blockScale(bi: u32) -> f32 { return 1.0; }
fn part(b: vec4u, s: f32, c: u32) -> Pair {
  return Pair(bitcast<vec4f>(b << vec4u(16u)), bitcast<vec4f>(b & vec4u(0xffff0000u)));
}
// The EPP inputs from vec4 xi, split as the Pair is: even and odd elements.
fn xsAt(xi: u32) -> Pair {
  let x0 = a[xi];
  let x1 = a[xi + 1u];
  return Pair(vec4f(x0.x, x0.z, x1.x, x1.z), vec4f(x0.y, x0.w, x1.y, x1.w));
}
fn pairDot(q: Pair, x: Pair) -> vec4f { return q.lo * x.lo + q.hi * x.hi; }
#elif WEIGHTS == q4
#include "common/q4.wgsl"
const BE = 32u;
const EPP = 8u;
const PARTS = 4u;
// Block bi is scale group bi, whose f16 sits in word N*K/8 + (bi >> 1), half bi & 1, after the
// nibbles (decoded with integer arithmetic: unpack2x16float may flush subnormals).
fn blockScale(bi: u32) -> f32 {
  let si = ((p.N * p.K) >> 3u) + (bi >> 1u);
  return f16ToF32((w[si >> 2u][si & 3u] >> (16u * (bi & 1u))) & 0xffffu);
}
// Word c of a block (elements 8c..8c+7, nibble j = element 8c + j), times the block's scale s.
fn part(b: vec4u, s: f32, c: u32) -> Pair {
  let word = b[c];
  let lo = vec4i((vec4u(word, word >> 4u, word >> 8u, word >> 12u) & vec4u(0xfu))) - vec4i(8);
  let hi = vec4i((vec4u(word >> 16u, word >> 20u, word >> 24u, word >> 28u) & vec4u(0xfu))) - vec4i(8);
  return Pair(vec4f(lo) * s, vec4f(hi) * s);
}
fn xsAt(xi: u32) -> Pair { return Pair(a[xi], a[xi + 1u]); }
fn pairDot(q: Pair, x: Pair) -> vec4f { return q.lo * x.lo + q.hi * x.hi; }
#elif WEIGHTS == f32
const BE = 4u;
const EPP = 4u;
const PARTS = 1u;
fn blockScale(bi: u32) -> f32 { return 1.0; }
fn part(b: vec4u, s: f32, c: u32) -> Pair { return Pair(bitcast<vec4f>(b), vec4f(0.0)); }
fn xsAt(xi: u32) -> Pair { return Pair(a[xi], vec4f(0.0)); }
fn pairDot(q: Pair, x: Pair) -> vec4f { return q.lo * x.lo; }
#endif

fn store(o: u32, v: f32) {
  if (p.accumulate != 0u) { out[o] = out[o] + p.scale * v; } else { out[o] = p.scale * v; }
}

// ---- rows (CPU adapters) ----------------------------------------------------------------------
// Thread lid of workgroup g: columns n0 + 64 c (c < COLS) for n0 = g * 64 * COLS + lid, rows
// m0 .. m0 + TMAX - 1 of x for m0 = TMAX * z. Each read of x serves COLS columns, each unpacked
// weight block TMAX rows.
const COLS = {{COLS}}u; // 1, 2 or 4 (src/ops/forward.ts picks 4)

@compute @workgroup_size(64)
fn gemv_rows(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
             @builtin(local_invocation_index) lid: u32) {
  let n0 = linearGroup(wid, nwg) * 64u * COLS + lid;
  if (n0 >= p.N) { return; }
  let m0 = wid.z * TMAX;
  let nm = min(TMAX, p.M - m0);
  let xr = p.K / 4u; // vec4 per row of x
  let blocks = p.K / BE;
  // Columns past N read column N - 1 (never stored): no branch in the loop.
  let base0 = n0 * blocks;
#if COLS > 1
  let base1 = min(n0 + 64u, p.N - 1u) * blocks;
#endif
#if COLS > 2
  let base2 = min(n0 + 128u, p.N - 1u) * blocks;
  let base3 = min(n0 + 192u, p.N - 1u) * blocks;
#endif
#include "common/gemvrows.wgsl" (WHAT=acc, T=0)
#if TMAX > 1
#include "common/gemvrows.wgsl" (WHAT=acc, T=1)
#endif
#if TMAX > 2
#include "common/gemvrows.wgsl" (WHAT=acc, T=2)
#include "common/gemvrows.wgsl" (WHAT=acc, T=3)
#endif
#if TMAX > 4
#include "common/gemvrows.wgsl" (WHAT=acc, T=4)
#include "common/gemvrows.wgsl" (WHAT=acc, T=5)
#include "common/gemvrows.wgsl" (WHAT=acc, T=6)
#include "common/gemvrows.wgsl" (WHAT=acc, T=7)
#endif
  for (var j = 0u; j < blocks; j++) {
    let xo = j * (BE / 4u);
    let b0 = w[base0 + j];
    let s0 = blockScale(base0 + j);
#if COLS > 1
    let b1 = w[base1 + j];
    let s1 = blockScale(base1 + j);
#endif
#if COLS > 2
    let b2 = w[base2 + j];
    let s2 = blockScale(base2 + j);
    let b3 = w[base3 + j];
    let s3 = blockScale(base3 + j);
#endif
#include "common/gemvpart.wgsl" (C=0)
#if WEIGHTS == q4
#include "common/gemvpart.wgsl" (C=1)
#include "common/gemvpart.wgsl" (C=2)
#include "common/gemvpart.wgsl" (C=3)
#endif
  }
#include "common/gemvrows.wgsl" (WHAT=store, T=0)
#if TMAX > 1
#include "common/gemvrows.wgsl" (WHAT=store, T=1)
#endif
#if TMAX > 2
#include "common/gemvrows.wgsl" (WHAT=store, T=2)
#include "common/gemvrows.wgsl" (WHAT=store, T=3)
#endif
#if TMAX > 4
#include "common/gemvrows.wgsl" (WHAT=store, T=4)
#include "common/gemvrows.wgsl" (WHAT=store, T=5)
#include "common/gemvrows.wgsl" (WHAT=store, T=6)
#include "common/gemvrows.wgsl" (WHAT=store, T=7)
#endif
}
