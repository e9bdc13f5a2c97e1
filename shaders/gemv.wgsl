#ifdef SUBGROUPS
enable subgroups;
#endif
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
//   gemv_rows_group (define GROUP = 2 or 3): gemv_rows over several weights sharing x (the fused
//   q/k/v and gate/up projections), one dispatch, each output its own binding; the per-weight
//   bodies are common/gemvblocks.wgsl instantiated on each binding (WI, WN).
//   gemv_lanes (GPUs, define LANES): LANES threads per output column walk its row in 16-byte
//   blocks, COLS = 256 / LANES columns per workgroup share x, staged chunk by chunk in workgroup
//   memory; a subgroup (or shared-memory) reduction per column. gemv_lanes_group: the same over
//   2 or 3 weights (GROUP), as gemv_rows_group. Define NORM: the RMSNorm before the product
//   folded in (x the residual stream; see normScales). Define LORA (one weight and no norm, or a
//   group): a LoRA branch's B product added in the store (loraTerm). Define XEACH (gemv_lanes_group, no NORM):
//   each weight multiplies its own x (a, a1, a2). Define SILU (gemv_lanes, no norm): x is
//   silu(a) * aUp, formed as it is staged (siluTimes). Defines NEXTA / UPART: a LoRA A product
//   begun in the GEMV before its consumer / its partial sums added up in the consumer; PAIR
//   (gemv_lanes_group over gate and up): columns paired, beginning down_proj's A product.
// Measured on SwiftShader (2 cores), bf16 9728 x 2560: x staged in workgroup memory did not pay
// there (+20-45% CPU time: barriers, and its reads are per-lane gathers like storage reads);
// COLS = 4 took half the CPU time of COLS = 1 (each x read serves 4 columns).

struct GemvParams {
  M: u32,
  N: u32,
  K: u32,
  accumulate: u32, // 1: out += ..., 0: out = ...
  scale: f32,
  // gemv_cols only (0 for gemv_rows):
  kChunk: u32, // rows of w per split (a multiple of 4)
  zRows: u32, // groups of TMAX rows of x: wid.z = split * zRows + group
  splitStride: u32, // elements between two splits' partial outputs (0: one split)
#ifdef GROUP
  // gemv_rows_group only: the rows of weights 1 and 2 (N is weight 0's)
  N1: u32,
  N2: u32,
#endif
#ifdef NORM
  eps: f32, // gemv_lanes with the RMSNorm folded in
#endif
#ifdef LORA
  // The LoRA branch loraScale * u (M, loraR) . B (N, loraR)^T added in store (each weight's).
  loraR: u32,
  loraScale: f32,
#endif
#ifdef NEXTA
  nextR: u32, // gemv_lanes with define NEXTA: rows of nextA
#endif
#ifdef UPART
  uParts: u32, // define UPART: the partial sums of each u
#endif
}

@group(0) @binding(0) var<uniform> p: GemvParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (M, N)
@group(0) @binding(2) var<storage, read> a: array<vec4f>;        // x (M, K), K % 4 == 0
@group(0) @binding(3) var<storage, read> w: array<vec4u>;        // (N, K) in 16-byte blocks
#ifdef GROUP
// gemv_rows_group: GROUP (2 or 3) weights over the same x; weight 0 is out and w above.
@group(0) @binding(4) var<storage, read_write> out1: array<f32>; // (M, N1)
@group(0) @binding(5) var<storage, read> w1: array<vec4u>;        // (N1, K)
#if GROUP > 2
@group(0) @binding(6) var<storage, read_write> out2: array<f32>; // (M, N2)
@group(0) @binding(7) var<storage, read> w2: array<vec4u>;        // (N2, K)
#endif
#endif

#ifdef XEACH
// gemv_lanes_group with each weight its own x (define XEACH, no NORM: the LoRA B products of a
// q/k/v or gate/up group, x = u of each projection, K = r): x of weights 1 and 2 bind after the
// weights.
#if GROUP > 2
@group(0) @binding(8) var<storage, read> a1: array<vec4f>; // (M, K)
@group(0) @binding(9) var<storage, read> a2: array<vec4f>; // (M, K)
#else
@group(0) @binding(6) var<storage, read> a1: array<vec4f>; // (M, K)
#endif
#endif

#ifdef NORM
// gemv_lanes with the RMSNorm folded in (define NORM, below): x is the residual stream, normed
// inside the GEMV. normW follows the weights' bindings.
#if defined(GROUP) && GROUP > 2
@group(0) @binding(8) var<storage, read> normW: array<u32>; // (K) bf16, two per u32
#elif defined(GROUP)
@group(0) @binding(6) var<storage, read> normW: array<u32>;
#else
@group(0) @binding(4) var<storage, read> normW: array<u32>;
#endif
#endif

#ifdef LORA
// The LoRA branch of the product (define LORA, no norm with one weight: src/ops/forward.ts
// matmul's `lora`; a group's q/k/v or gate/up branches, with or without the norm: matmulGroup's):
// u = x A^T was computed before, and each stored output adds its B product, r multiply-adds
// (loraTerm, common/storeout.wgsl), instead of a dispatch accumulating into out. u (M, loraR) and
// B (N, loraR) bind at 4 and 5 for one weight; a group binds each weight's pair after its weights
// and norm: loraU, loraB, loraU1, loraB1 (, loraU2, loraB2).
#ifdef LORAPACK
// A group's branches packed (define LORAPACK with LORA and GROUP: matmulGroup's PackedGroupLora,
// for devices whose storage buffers a stage hold 2 bindings more, not 2 GROUP: Chrome's 10 with the
// q/k/v group and its norm): one u (M, GROUP loraR), weight i's at columns i loraR, and one B
// (N + N1 (+ N2), loraR), weight i's rows after the rows of the weights before it, bound after
// the weights and the norm.
#if GROUP > 2 && defined(NORM)
@group(0) @binding(9) var<storage, read> loraU: array<f32>;
@group(0) @binding(10) var<storage, read> loraB: array<f32>;
#elif GROUP > 2
@group(0) @binding(8) var<storage, read> loraU: array<f32>;
@group(0) @binding(9) var<storage, read> loraB: array<f32>;
#elif defined(NORM)
@group(0) @binding(7) var<storage, read> loraU: array<f32>;
@group(0) @binding(8) var<storage, read> loraB: array<f32>;
#else
@group(0) @binding(6) var<storage, read> loraU: array<f32>;
@group(0) @binding(7) var<storage, read> loraB: array<f32>;
#endif
#if GROUP > 2
#include "common/loraterm.wgsl" (WI=, WN=p.N, US=3u * p.loraR, UO=0u, BO=0u)
#include "common/loraterm.wgsl" (WI=1, WN=p.N1, US=3u * p.loraR, UO=p.loraR, BO=p.N)
#include "common/loraterm.wgsl" (WI=2, WN=p.N2, US=3u * p.loraR, UO=2u * p.loraR, BO=p.N + p.N1)
#else
#include "common/loraterm.wgsl" (WI=, WN=p.N, US=2u * p.loraR, UO=0u, BO=0u)
#include "common/loraterm.wgsl" (WI=1, WN=p.N1, US=2u * p.loraR, UO=p.loraR, BO=p.N)
#endif
#elif !defined(GROUP)
#include "common/loraterm.wgsl" (WI=, WN=p.N, AT=4)
#elif defined(UPART)
// Each branch's own B with u from partial sums (define UPART without LORAPACK: the gate/up group
// with its norm, matmulGroup's PartialGroupLora): the partials bind where u would, then B and B1.
@group(0) @binding(7) var<storage, read> loraU: array<f32>;
#include "common/loraterm.wgsl" (WI=, WN=p.N, BAT=8, US=2u * p.loraR, UO=0u)
#include "common/loraterm.wgsl" (WI=1, WN=p.N1, BAT=9, US=2u * p.loraR, UO=p.loraR)
#elif GROUP > 2
#ifdef NORM
#include "common/loraterm.wgsl" (WI=, WN=p.N, AT=9)
#include "common/loraterm.wgsl" (WI=1, WN=p.N1, AT=11)
#include "common/loraterm.wgsl" (WI=2, WN=p.N2, AT=13)
#else
#include "common/loraterm.wgsl" (WI=, WN=p.N, AT=8)
#include "common/loraterm.wgsl" (WI=1, WN=p.N1, AT=10)
#include "common/loraterm.wgsl" (WI=2, WN=p.N2, AT=12)
#endif
#else
#ifdef NORM
#include "common/loraterm.wgsl" (WI=, WN=p.N, AT=7)
#include "common/loraterm.wgsl" (WI=1, WN=p.N1, AT=9)
#else
#include "common/loraterm.wgsl" (WI=, WN=p.N, AT=6)
#include "common/loraterm.wgsl" (WI=1, WN=p.N1, AT=8)
#endif
#endif
#endif

#ifdef SILU
// The SwiGLU activation folded into the product (define SILU, gemv_lanes only, no norm: down_proj
// and its LoRA A product in decode, src/ops/forward.ts matmul's and matmulF32's `up`): a is the
// gate, and x = silu(gate) * up is formed as it is staged, the expression of shaders/
// elementwise.wgsl silu_mul_forward per component (bitwise the separate kernel's x). up binds
// after the LoRA branch's two buffers, else right after the weights.
#ifdef LORA
@group(0) @binding(6) var<storage, read> aUp: array<vec4f>; // (M, K)
#else
@group(0) @binding(4) var<storage, read> aUp: array<vec4f>; // (M, K)
#endif

// silu(g) * u, g / (1 + e^-g) * u as silu_mul_forward writes it.
fn siluTimes(g: vec4f, u: vec4f) -> vec4f {
  return g / (1.0 + exp(-g)) * u;
}
#endif

#ifdef NEXTA
// The next RMSNorm's LoRA A product started in the GEMV that writes the residual stream (define
// NEXTA, gemv_lanes over one weight, unsplit: down_proj's, whose out is x for the next layer's
// q/k/v group, and o_proj's, whose out is x for its layer's gate/up group; src/ops/forward.ts
// matmul's `next`). After its stores, workgroup g adds up over its own columns n of out the
// products A[i, n] nextNormW[n] out[t, n] into nextParts (groups, M, nextR) at (g, t, i), A the
// next group's A matrices stacked (nextA), or with define NEXTA2 two of nextR / 2 rows each
// (nextA, nextA1: gate's and up's own): the sum over g is u = x A^T of the normed x before the
// row's rstd, which the consumer (define UPART) adds up and scales. One dispatch fewer a layer: the
// A product's own. Bound after the weights and the LoRA branch's and SwiGLU's buffers
// (common/nexta.wgsl).
#ifdef PAIR
// With define PAIR (gemv_lanes_group over gate and up, NORM, LORAPACK): down_proj's LoRA A product
// over silu(out) * out1 instead, no norm; nextA (nextR, N) and the partial sums after the packed
// branch's two (pairPartials).
@group(0) @binding(9) var<storage, read> nextA: array<f32>;
@group(0) @binding(10) var<storage, read_write> nextParts: array<f32>; // (groups, M, nextR)
#elif defined(LORA) && defined(SILU)
#include "common/nexta.wgsl" (AT=7)
#elif defined(LORA)
#include "common/nexta.wgsl" (AT=6)
#elif defined(SILU)
#include "common/nexta.wgsl" (AT=5)
#else
#include "common/nexta.wgsl" (AT=4)
#endif
#endif

#ifdef UPART
// LoRA branches whose u comes as partial sums (define UPART), loraU (p.uParts, M, UG loraR), each u
// the sum of its p.uParts partials (gatherU, into uw at the kernel's start):
// - a group's (gemv_lanes_group with NORM; packed, LORAPACK, or each its own B), the partials a
//   producer's (its define NEXTA) over x before the norm: times the row's rstd in the store
//   (rowScale, the folded norm's; common/loraterm.wgsl);
// - one weight's (gemv_lanes, no norm: o_proj, down_proj), the partials its A product's slices
//   over K (src/ops/forward.ts matmul's `lora.A`), so no dispatch adds them up first.
#ifdef GROUP
const UG = {{GROUP}}u; // u's columns a row: UG loraR
#else
const UG = 1u;
#endif
var<workgroup> uw: array<f32, {{UPART}}>; // TMAX UG loraR: u (M, UG loraR)
var<private> rowScale: array<f32, TMAX>;

// uw = the sums of loraU's p.uParts partials, four running sums a thread (independent loads).
fn gatherU(lid: u32) {
  let n = p.M * UG * p.loraR;
  for (var i = lid; i < n; i += 256u) {
    var s = vec4f(0.0);
    var g = 0u;
    for (; g + 4u <= p.uParts; g += 4u) {
      s += vec4f(loraU[g * n + i], loraU[(g + 1u) * n + i], loraU[(g + 2u) * n + i], loraU[(g + 3u) * n + i]);
    }
    for (; g < p.uParts; g++) { s.x += loraU[g * n + i]; }
    uw[i] = (s.x + s.y) + (s.z + s.w);
  }
}
#endif

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
fn part(b: vec4u, s: f32, c: u32) -> Pair {
  return Pair(bitcast<vec4f>(b << vec4u(16u)), bitcast<vec4f>(b & vec4u(0xffff0000u)));
}
// The EPP inputs of vec4s x0, x1, split as the Pair is: even and odd elements.
fn pairOf(x0: vec4f, x1: vec4f) -> Pair { return Pair(vec4f(x0.x, x0.z, x1.x, x1.z), vec4f(x0.y, x0.w, x1.y, x1.w)); }
// The EPP inputs from vec4 xi of x (from vec4 i of the staged chunk: stagedAt, gemv_lanes).
fn xsAt(xi: u32) -> Pair { return pairOf(a[xi], a[xi + 1u]); }
#ifdef LANES
fn stagedAt(i: u32) -> Pair { return pairOf(xs[swizzled(i)], xs[swizzled(i + 1u)]); }
#endif
fn pairDot(q: Pair, x: Pair) -> vec4f { return q.lo * x.lo + q.hi * x.hi; }
#elif WEIGHTS == q4
#include "common/q4.wgsl"
const BE = 32u;
const EPP = 8u;
const PARTS = 4u;
// Word c of a block (elements 8c..8c+7, nibble j = element 8c + j), times the block's scale s.
fn part(b: vec4u, s: f32, c: u32) -> Pair {
  let word = b[c];
  return Pair(q4Low(word) * s, q4High(word) * s);
}
fn xsAt(xi: u32) -> Pair { return Pair(a[xi], a[xi + 1u]); }
#ifdef LANES
fn stagedAt(i: u32) -> Pair { return Pair(xs[swizzled(i)], xs[swizzled(i + 1u)]); }
#endif
fn pairDot(q: Pair, x: Pair) -> vec4f { return q.lo * x.lo + q.hi * x.hi; }
#elif WEIGHTS == f32
const BE = 4u;
const EPP = 4u;
const PARTS = 1u;
fn part(b: vec4u, s: f32, c: u32) -> Pair { return Pair(bitcast<vec4f>(b), vec4f(0.0)); }
fn xsAt(xi: u32) -> Pair { return Pair(a[xi], vec4f(0.0)); }
#ifdef LANES
fn stagedAt(i: u32) -> Pair { return Pair(xs[swizzled(i)], vec4f(0.0)); }
#endif
fn pairDot(q: Pair, x: Pair) -> vec4f { return q.lo * x.lo; }
#endif

// blockScale(bi) (the f16 scale of q4 block bi, 1 otherwise) and store(o, v) of w and out.
#include "common/gemvweight.wgsl" (WI=, WN=p.N)
#include "common/storeout.wgsl" (WI=)
#ifdef GROUP
#include "common/gemvweight.wgsl" (WI=1, WN=p.N1)
#include "common/storeout.wgsl" (WI=1)
#if GROUP > 2
#include "common/gemvweight.wgsl" (WI=2, WN=p.N2)
#include "common/storeout.wgsl" (WI=2)
#endif
#endif

// gemv_rows: output columns per thread, 1, 2 or 4 (src/ops/forward.ts picks 4); gemv_lanes:
// output columns per workgroup, 256 / LANES.
const COLS = {{COLS}}u;

// ---- rows (CPU adapters) ----------------------------------------------------------------------
// Thread lid of workgroup g: columns n0 + 64 c (c < COLS) for n0 = g * 64 * COLS + lid, rows
// m0 .. m0 + TMAX - 1 of x for m0 = TMAX * z. Each read of x serves COLS columns, each unpacked
// weight block TMAX rows.

@compute @workgroup_size(64)
fn gemv_rows(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
             @builtin(local_invocation_index) lid: u32) {
  let n0 = linearGroup(wid, nwg) * 64u * COLS + lid;
#include "common/gemvblocks.wgsl" (WI=, WN=p.N)
}

#ifdef GROUP
// ---- rows over 2 or 3 weights in one dispatch (matmulGroup: q/k/v, gate/up) -------------------
// Workgroups [0, g0) take weight 0's columns as gemv_rows would, the next ceil(N1 / (64 COLS))
// weight 1's, the rest weight 2's: each column is the same sum in the same order as gemv_rows',
// and the branch is uniform per workgroup. WGSL cannot index bindings, so each weight's body is
// common/gemvblocks.wgsl instantiated on its binding.
fn groupsOf(n: u32) -> u32 { return (n + 64u * COLS - 1u) / (64u * COLS); }

@compute @workgroup_size(64)
fn gemv_rows_group(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                   @builtin(local_invocation_index) lid: u32) {
  let g = linearGroup(wid, nwg);
  let g0 = groupsOf(p.N);
  if (g < g0) {
    let n0 = g * 64u * COLS + lid;
#include "common/gemvblocks.wgsl" (WI=, WN=p.N)
#if GROUP > 2
  } else if (g >= g0 + groupsOf(p.N1)) {
    let n0 = (g - g0 - groupsOf(p.N1)) * 64u * COLS + lid; // ids past the grid's count: n0 >= N2
#include "common/gemvblocks.wgsl" (WI=2, WN=p.N2)
#endif
  } else {
    let n0 = (g - g0) * 64u * COLS + lid;
#include "common/gemvblocks.wgsl" (WI=1, WN=p.N1)
  }
}
#endif

#ifdef LANES
// ---- lanes (GPUs) -----------------------------------------------------------------------------
// Thread lid: column n = g * COLS + lid / LANES of workgroup g, lane lid % LANES; all M <= TMAX
// rows of x at once. Each weight block is read once (16 bytes) and multiplied into every row;
// the workgroup's COLS columns share one staged copy of x (common/gemvstaged.wgsl), so x crosses
// from global memory once per workgroup, not once per column.
const LANES = {{LANES}}u; // threads per output column (a power of two, <= 64)
// Output columns a thread (define CPT: 1, 2 or 4; src/ops/colsSplit.ts colsPerThread): columns n0,
// n0 + CSTEP, ... of the workgroup's COLS = CPT * 256 / LANES. Each part of x read from workgroup
// memory then serves CPT columns' weights: at LANES = 8 and one column a thread, a q4 block's 16
// bytes cost 128 bytes of x reads a row of x (512 at B = 4), more than workgroup memory serves
// per byte of an HBM GPU's weights (about 10 bytes a clock an SM on the H100 against 128 of
// workgroup memory). The same sums in the same order for each column as one column a thread at
// the same LANES: bitwise the same results.
#ifdef CPT
const CPT = {{CPT}}u;
#else
const CPT = 1u;
#endif
const CSTEP = COLS / CPT; // = 256 / LANES: the slots of a workgroup's threads
// vec4s of staged x, KCV per row for TMAX rows: 1024 (16 KB) where the device's workgroup memory
// holds it beside the reduction's TMAX KB and no norm is folded, else 512 (src/ops/forward.ts
// stagedVec4s). Each chunk costs two barriers and a global load of x before its weights: the
// larger chunk halves them (Qwen3-4B's down_proj at B = 4: 10 chunks instead of 19).
const XS = {{XS}}u;
const KCV = XS / TMAX; // whole 16-byte blocks of every format (BE <= 32 elements = 8 vec4s)
// Weight blocks a lane loads before it uses any (common/gemvstaged.wgsl): a loop of one load and
// its FMAs leaves each thread one 16-byte read in flight, and the bytes in flight (threads x 16)
// then cap the bandwidth where few workgroups run (o_proj and down_proj at 4B: 160 of them, about
// 41K threads, 0.65 MB in flight against the several MB an HBM GPU needs). The same sums in the
// same order as one block a step: bitwise the same results.
// With CPT columns a thread, LU * CPT loads a step (4 in all: as many registers as one column's).
const LU = max(1u, 4u / CPT);
var<workgroup> xs: array<vec4f, XS>;
// Staged vec4 i lives at xs[swizzled(i)]: the low 3 bits of i XORed with the next 3, a
// permutation within each aligned group of 8 (no padding, no extra memory). A 16-byte load is
// served 8 threads at a time, and unswizzled, a q4 column's 8 lanes (block l is vec4s 8 l ..
// 8 l + 7) would all read the same 4 of the 32 four-byte banks, 8 ways serialized; bf16's (2 l,
// 2 l + 1) 2 ways. Swizzled, the 8 lanes of a load hit 8 different 4-bank groups (lanes l read
// vec4 8 l + 2 c + d at 8 l + ((2 c + d) ^ l)): one pass. KCV and the chunk offsets are
// multiples of 64, so the pattern is the same for every row and chunk; the staging stores of 8
// consecutive vec4s stay in one group of 8, conflict-free too.
fn swizzled(i: u32) -> u32 { return i ^ ((i >> 3u) & 7u); }
var<workgroup> red: array<f32, TMAX * 256>; // (TMAX, 256 / LANES, LANES), common/gemvlanes.wgsl
#ifdef NORM
// The folded RMSNorm (define NORM): out = rstd * sum_k w_k (normW_k x_k), rstd = rsqrt(mean(x^2) +
// eps) of the row, so x crosses from memory once, as without the norm: it is staged as normW * x,
// and the sums of squares come from the same loads. Thread lid stages vec4s lid + 256 h (h < SH)
// of every chunk, and a vec4's row is its index / KCV, the same in every chunk: each thread keeps
// SH sums, and after the K loop a tree within each row's KCV sums gives each row's total (in xs,
// free by then: workgroup memory stays at 8 KB + TMAX KB). Not bitwise rmsnorm_forward then the
// product (the norm's scale multiplies the dot product, not each x): within f32 rounding of it
// (test/ops/normFold.test.ts).
const SH = XS / 256u; // staged vec4s per thread per chunk
#include "common/bf16.wgsl"

// normW at vec4 v of a row (elements 4 v .. 4 v + 3).
fn normWeights(v: u32) -> vec4f {
  let w0 = normW[2u * v];
  let w1 = normW[2u * v + 1u];
  return vec4f(bf16Low(w0), bf16High(w0), bf16Low(w1), bf16High(w1));
}

// rstd of each row from every thread's sums of squares ss[h] (of staged vec4 lid + 256 h).
// Holds barriers: call it in uniform control flow.
fn normScales(ss: array<f32, SH>, lid: u32) -> array<f32, TMAX> {
  workgroupBarrier(); // the last chunk's reads of xs are done
  // Whole-vector stores only, one thread per vec4 (as in shaders/matmul.wgsl gemm_tiled).
  for (var h = 0u; h < SH; h++) { xs[lid + 256u * h] = vec4f(ss[h], 0.0, 0.0, 0.0); }
  for (var s = KCV / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    for (var h = 0u; h < SH; h++) {
      let i = lid + 256u * h;
      if (i % KCV < s) { xs[i] = xs[i] + xs[i + s]; }
    }
  }
  workgroupBarrier();
  var rs: array<f32, TMAX>;
  for (var t = 0u; t < TMAX; t++) { rs[t] = inverseSqrt(xs[t * KCV].x / f32(p.K) + p.eps); }
  return rs;
}
#endif

#if defined(NEXTA) && !defined(PAIR)
// Row i, column n of the next group's stacked A (nextA, or nextA and nextA1 with NEXTA2).
fn nextAAt(i: u32, n: u32) -> f32 {
#ifdef NEXTA2
  let h = p.nextR / 2u;
  if (i >= h) { return nextA1[(i - h) * p.N + n]; }
#endif
  return nextA[i * p.N + n];
}

// nextNormW at element n.
fn nextNormAt(n: u32) -> f32 {
  let w = nextNormW[n >> 1u];
  return select(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u), (n & 1u) == 1u);
}

// Workgroup g's partial sums of the next A product over its columns [g COLS, g COLS + COLS) of
// out, once they are stored (define NEXTA, above): the sums of nextValue (common/colpartials.wgsl).
fn nextValue(t: u32, i: u32, n: u32) -> f32 {
  return nextAAt(i, n) * (nextNormAt(n) * out[t * p.N + n]);
}
#include "common/colpartials.wgsl" (NAME=nextPartials, W=COLS, VAL=nextValue)
#endif

#ifdef PAIR
// ---- gate and up paired (define PAIR with GROUP 2, NORM, LORA, LORAPACK, NEXTA) ---------------
// gemv_lanes_group over the MLP's gate and up where down_proj's LoRA A product begins here: each
// thread's CPT columns are HC of gate (w, out) and the same HC of up (w1, out1), so workgroup g
// writes gate and up for the same PCOLS columns [g PCOLS, g PCOLS + PCOLS), and after its stores
// adds up over them sum_n nextA[i, n] silu(out[t, n]) out1[t, n] into nextParts at (g, t, i):
// down_proj's u = (silu(gate) * up) A^T as partial sums, which down_proj's GEMV adds up (UPART).
// One dispatch fewer a layer: that A product's own. Each column the same sums in the same order as
// gemv_lanes_group's at the same LANES and CPT.
const HC = CPT / 2u; // columns of each weight a thread (CPT 2 or 4)
const PCOLS = HC * CSTEP; // columns of each weight a workgroup

// silu(g) * u, as shaders/gemv.wgsl siluTimes and elementwise.wgsl silu_mul_forward write it
fn siluTimes1(g: f32, u: f32) -> f32 {
  return g / (1.0 + exp(-g)) * u;
}

// Workgroup g's partial sums over its PCOLS columns of out and out1, once they are stored: the
// sums of pairValue (common/colpartials.wgsl), as nextPartials.
fn pairValue(t: u32, i: u32, n: u32) -> f32 {
  return nextA[i * p.N + n] * siluTimes1(out[t * p.N + n], out1[t * p.N1 + n]);
}
#include "common/colpartials.wgsl" (NAME=pairPartials, W=PCOLS, VAL=pairValue)
#endif

@compute @workgroup_size(256)
fn gemv_lanes(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
#ifdef SUBGROUPS
              @builtin(subgroup_size) sgSize: u32,
#endif
              @builtin(local_invocation_index) lid: u32) {
  let col = lid / LANES;
  let lane = lid % LANES;
  let n0 = linearGroup(wid, nwg) * COLS + col;
  if (linearGroup(wid, nwg) * COLS >= p.N) { return; } // a whole workgroup past N (uniform)
#ifdef UPART
  gatherU(lid); // read in the store, many barriers on
#endif
#include "common/gemvstaged.wgsl" (WI=, WN=p.N, AT=wid.z * p.splitStride + )
#if defined(NEXTA) && !defined(PAIR)
  nextPartials(linearGroup(wid, nwg), lid);
#endif
}

#ifdef GROUP
// gemv_lanes over 2 or 3 weights in one dispatch: workgroups [0, g0) take weight 0's columns
// exactly as gemv_lanes would, the next ceil(N1 / COLS) weight 1's, the rest weight 2's (uniform
// branches per workgroup; each column the same sum in the same order).
@compute @workgroup_size(256)
fn gemv_lanes_group(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
#ifdef SUBGROUPS
                    @builtin(subgroup_size) sgSize: u32,
#endif
                    @builtin(local_invocation_index) lid: u32) {
  let col = lid / LANES;
  let lane = lid % LANES;
  let g = linearGroup(wid, nwg);
#ifdef PAIR
  if (g * PCOLS >= p.N) { return; } // past the grid's count (uniform)
#ifdef UPART
  gatherU(lid); // read in the stores, many barriers on
#endif
  let n0 = g * PCOLS + col;
#include "common/gemvstaged.wgsl" (WI=, WN=p.N, AT=wid.z * p.splitStride + )
  pairPartials(g, lid);
#else
  let g0 = (p.N + COLS - 1u) / COLS;
  let g1 = g0 + (p.N1 + COLS - 1u) / COLS;
#ifdef UPART
  gatherU(lid); // read in the stores, many barriers on
#endif
  if (g < g0) {
    let n0 = g * COLS + col;
#include "common/gemvstaged.wgsl" (WI=, WN=p.N, AT=wid.z * p.splitStride + )
#if GROUP > 2
  } else if (g >= g1) {
    if ((g - g1) * COLS >= p.N2) { return; } // past the grid's count (uniform)
    let n0 = (g - g1) * COLS + col;
#include "common/gemvstaged.wgsl" (WI=2, WN=p.N2, AT=wid.z * p.splitStride + )
#endif
  } else {
    let n0 = (g - g0) * COLS + col;
#include "common/gemvstaged.wgsl" (WI=1, WN=p.N1, AT=wid.z * p.splitStride + )
  }
#endif
}
#endif
#endif

// ---- cols (CPU adapters): the input gradient through a weight ---------------------------------
//   out (M, N) (+)= scale * a (M, K) . w (K, N)     w: K rows of N elements (a weight (N', K') read
//                                                   along its rows: dx = dy . W, N = K', K = N')
// Thread lid of workgroup g owns 8 consecutive output columns 8 j, j = g * 64 + lid (one bf16
// block, one q4 word of one scale group, two f32 vec4s) for rows m0 .. m0 + TMAX - 1 of a, and
// walks rows k of w four at a time: four weight loads, then one vec4 of each row of a, so each
// load is 16 bytes (bf16, f32) and neighbouring threads read neighbouring words. Where that
// leaves too few workgroups (narrow outputs: a LoRA B, the LM head of a small model), the rows of w
// are split into p.kChunk pieces (wid.z = split * zRows + group) whose partial outputs, splitStride
// apart, gemv_cols_reduce sums in split order. Needs N % 8 == 0 and K % 4 == 0.
#if WEIGHTS == bf16
// Row k, columns 8 j .. 8 j + 7: lo the even columns, hi the odd ones (as part() splits a block).
fn colPart(k: u32, j: u32) -> Pair { return part(w[k * (p.N >> 3u) + j], 1.0, 0u); }
// Back in column order: lo columns 8 j .. 8 j + 3, hi 8 j + 4 .. 8 j + 7.
fn colOrder(c: Pair) -> Pair {
  return Pair(vec4f(c.lo.x, c.hi.x, c.lo.y, c.hi.y), vec4f(c.lo.z, c.hi.z, c.lo.w, c.hi.w));
}
#else
#if WEIGHTS == q4
// Word k N / 8 + j holds columns 8 j .. 8 j + 7 of row k, in scale group (k N + 8 j) / 32.
fn colPart(k: u32, j: u32) -> Pair {
  let wi = k * (p.N >> 3u) + j;
  return part(vec4u(w[wi >> 2u][wi & 3u], 0u, 0u, 0u), blockScale((k * p.N + 8u * j) >> 5u), 0u);
}
#else
fn colPart(k: u32, j: u32) -> Pair {
  let i = k * (p.N >> 2u) + 2u * j;
  return Pair(bitcast<vec4f>(w[i]), bitcast<vec4f>(w[i + 1u]));
}
#endif
fn colOrder(c: Pair) -> Pair { return c; } // already lo columns 8 j .. 8 j + 3, hi 8 j + 4 .. 8 j + 7
#endif
fn colStore(o: u32, acc: Pair) {
  let c = colOrder(acc);
  store(o, c.lo.x);
  store(o + 1u, c.lo.y);
  store(o + 2u, c.lo.z);
  store(o + 3u, c.lo.w);
  store(o + 4u, c.hi.x);
  store(o + 5u, c.hi.y);
  store(o + 6u, c.hi.z);
  store(o + 7u, c.hi.w);
}

@compute @workgroup_size(64)
fn gemv_cols(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
             @builtin(local_invocation_index) lid: u32) {
  let j = linearGroup(wid, nwg) * 64u + lid;
  if (j * 8u >= p.N) { return; }
  let m0 = (wid.z % p.zRows) * TMAX;
  let split = wid.z / p.zRows;
  let nm = min(TMAX, p.M - m0);
  let k0 = split * p.kChunk;
  let k1 = min(p.K, k0 + p.kChunk);
  let xr = p.K / 4u; // vec4 per row of a
#include "common/gemvcols.wgsl" (WHAT=acc, T=0)
#if TMAX > 1
#include "common/gemvcols.wgsl" (WHAT=acc, T=1)
#endif
#if TMAX > 2
#include "common/gemvcols.wgsl" (WHAT=acc, T=2)
#include "common/gemvcols.wgsl" (WHAT=acc, T=3)
#endif
#if TMAX > 4
#include "common/gemvcols.wgsl" (WHAT=acc, T=4)
#include "common/gemvcols.wgsl" (WHAT=acc, T=5)
#include "common/gemvcols.wgsl" (WHAT=acc, T=6)
#include "common/gemvcols.wgsl" (WHAT=acc, T=7)
#endif
  for (var k = k0; k < k1; k += 4u) {
    let q0 = colPart(k, j);
    let q1 = colPart(k + 1u, j);
    let q2 = colPart(k + 2u, j);
    let q3 = colPart(k + 3u, j);
    let xk = k >> 2u;
#include "common/gemvcols.wgsl" (WHAT=fma, T=0)
#if TMAX > 1
#include "common/gemvcols.wgsl" (WHAT=fma, T=1)
#endif
#if TMAX > 2
#include "common/gemvcols.wgsl" (WHAT=fma, T=2)
#include "common/gemvcols.wgsl" (WHAT=fma, T=3)
#endif
#if TMAX > 4
#include "common/gemvcols.wgsl" (WHAT=fma, T=4)
#include "common/gemvcols.wgsl" (WHAT=fma, T=5)
#include "common/gemvcols.wgsl" (WHAT=fma, T=6)
#include "common/gemvcols.wgsl" (WHAT=fma, T=7)
#endif
  }
  let ob = split * p.splitStride + 8u * j;
#include "common/gemvcols.wgsl" (WHAT=store, T=0)
#if TMAX > 1
#include "common/gemvcols.wgsl" (WHAT=store, T=1)
#endif
#if TMAX > 2
#include "common/gemvcols.wgsl" (WHAT=store, T=2)
#include "common/gemvcols.wgsl" (WHAT=store, T=3)
#endif
#if TMAX > 4
#include "common/gemvcols.wgsl" (WHAT=store, T=4)
#include "common/gemvcols.wgsl" (WHAT=store, T=5)
#include "common/gemvcols.wgsl" (WHAT=store, T=6)
#include "common/gemvcols.wgsl" (WHAT=store, T=7)
#endif
}

// out (M, N) (+)= scale * the sum of gemv_cols' p.K partial outputs (bound as a), in split order;
// p.N here is M * N / 4 (vec4s per partial).
@compute @workgroup_size(64)
fn gemv_cols_reduce(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                    @builtin(local_invocation_index) lid: u32) {
  let i = linearGroup(wid, nwg) * 64u + lid;
  if (i >= p.N) { return; }
  var s = a[i];
  for (var sp = 1u; sp < p.K; sp++) { s += a[sp * p.N + i]; }
  store(4u * i, s.x);
  store(4u * i + 1u, s.y);
  store(4u * i + 2u, s.z);
  store(4u * i + 3u, s.w);
}
