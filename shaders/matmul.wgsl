#if defined(SUBGROUPS) || defined(SGA)
enable subgroups;
#endif
#ifdef F16
enable f16;
#endif
// Matrix products, one params struct and one set of bindings for every entry:
//   out (M, N) (+)= scale * sum_r A(m, r) B(n, r)
//   A(m, r) = a[m * aM + r * aR] f32 ; B(n, r) = element n * bN + r * bR of the weight w, whose
//   format is the WEIGHTS define (f32, bf16 or q4; common/weights.wgsl).
// The products of the model (docs/ENGINE.md):
//   matmul (every nn.Linear)  x . w^T   A = x (T,K)   B = w (N,K)       M=T  N=N  R=K
//   matmulF32 (LoRA)          x . w^T   same, w f32
//   matmulBackwardInput(F32)  dy . w    A = dy (T,N)  B = w^T of (N,K)  M=T  N=K  R=N
//   matmulBackwardWeightF32   dy^T . x  A = dy^T      B = x^T           M=N  N=K  R=T
// Entry points:
//   matmul_gemv (decode, M <= TMAX <= 8, row-major B): memory-bound, so each weight word is read
//               once for all M rows; LANES (<= 64) threads reduce one output column over R,
//               256/LANES columns per workgroup. Subgroup or shared-memory reduction (SUBGROUPS).
//   matmul_gemv_group (define GROUP = 2 or 3): matmul_gemv over several weights sharing A (the
//               fused q/k/v and gate/up projections), one dispatch, each output its own binding.
//   matmul_rows (CPU adapters, row-major B): one thread per output column, TMAX rows, no barriers.
//   gemm_rows   (CPU adapters, any strides): one thread per (column, TMAX rows), no barriers.
//   (CPU adapters take shaders/gemv.wgsl gemv_rows instead of matmul_rows / row-major gemm_rows
//   when the rows are 16-byte aligned.)
//   gemm_tiled  (prefill, backward; any strides): 64x128 output tile per 16x16 workgroup, 4x8 per
//               thread in registers, R in steps of 16 through padded shared memory holding vec4s
//               (3 vec4 shared reads per 32 FMAs), the next step's loads in flight during the
//               FMAs. Define F16 (shader-f16; the forward
//               matmul only): the tiles hold f16, each R step's 16 products per output are
//               summed as packed vec4<f16> FMAs and that partial is added to the f32 accumulator.
//               Define SGA (subgroups; A read along r): no A tile, A shared by subgroupShuffle.
//               Define SPLITK (src/ops/splitK.ts): slices of R over wid.z, partial outputs summed
//               by shaders/gemv.wgsl gemv_cols_reduce (see sliceRange). With VEC (16-byte loads):
//               define TM8, 128 x 128 tiles, 8 x 8 a thread; define LORA, a LoRA branch added in
//               the store (see both below).

struct GemmParams {
  M: u32,
  N: u32,
  R: u32,
  accumulate: u32, // 1: out += ..., 0: out = ...
  aM: u32,
  aR: u32,
  bN: u32,
  bR: u32,
  scale: f32,
#ifdef GROUP
  // matmul_gemv_group only: the rows of weights 1 and 2 (N is weight 0's)
  N1: u32,
  N2: u32,
#endif
#ifdef SPLITK
  // gemm_tiled with define SPLITK: the R of one slice (a multiple of BK); see sliceRange
  rSlice: u32,
#endif
#ifdef LORA
  // gemm_tiled with define LORA (VEC): a LoRA branch's rank-loraR product added in the store
  loraR: u32,
  loraScale: f32,
#endif
}

@group(0) @binding(0) var<uniform> p: GemmParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (M, N) f32
#ifdef VEC
@group(0) @binding(2) var<storage, read> a: array<vec4f>;       // A, f32, 16 bytes per read
@group(0) @binding(3) var<storage, read> w: array<vec4u>;       // B, WEIGHTS format, 16 bytes
#else
@group(0) @binding(2) var<storage, read> a: array<f32>;         // A, f32
@group(0) @binding(3) var<storage, read> w: array<u32>;         // B, WEIGHTS format
#endif
#ifdef GROUP
// matmul_gemv_group: GROUP (2 or 3) row-major weights over the same A; weight 0 is out and w above.
@group(0) @binding(4) var<storage, read_write> out1: array<f32>; // (M, N1)
@group(0) @binding(5) var<storage, read> w1: array<u32>;         // (N1, R), WEIGHTS format
#if GROUP > 2
@group(0) @binding(6) var<storage, read_write> out2: array<f32>; // (M, N2)
@group(0) @binding(7) var<storage, read> w2: array<u32>;         // (N2, R), WEIGHTS format
#endif
#endif

#include "common/grid.wgsl"
fn q4ScaleBase() -> u32 { return (p.N * p.R) >> 3u; } // B holds N*R elements whatever its strides
#ifdef VEC
#include "common/bf16.wgsl"
#include "common/q4.wgsl"
#else
fn wordInput(i: u32) -> f32 { return a[i]; }
#include "common/weights.wgsl"
#include "common/words.wgsl"
#endif

#ifdef LORA
// Define LORA (gemm_tiled with VEC; src/ops/forward.ts tiledProduct's `lora`, tuning.loraFold): a
// LoRA branch's rank-loraR product added to each output as it is stored, instead of a second
// product that reads and writes the whole output again:
//  - the forward x . W^T: out += loraScale * u (M, loraR) . B (N, loraR)^T, u = x . A^T;
//  - the input gradient (BT) dy . W: dx += loraScale * du (M, loraR) . A (loraR, N), du = s dy . B.
// u at binding 4, B (or A) at 5. Split over R (SPLITK), only slice 0 adds it (sliceStore); the
// reduce then scales it with the rest, so the TS side fuses only products of scale 1.
#ifdef BT
#include "common/loraterm.wgsl" (WI=, WN=p.N, AT=4, BJ=p.N)
#else
#include "common/loraterm.wgsl" (WI=, WN=p.N, AT=4)
#endif
#endif
#include "common/storeout.wgsl" (WI=)
#ifdef GROUP
fn q4ScaleBase1() -> u32 { return (p.N1 * p.R) >> 3u; }
#include "common/weightat.wgsl" (WI=1)
#include "common/wordat.wgsl" (WI=1)
#include "common/storeout.wgsl" (WI=1)
#if GROUP > 2
fn q4ScaleBase2() -> u32 { return (p.N2 * p.R) >> 3u; }
#include "common/weightat.wgsl" (WI=2)
#include "common/wordat.wgsl" (WI=2)
#include "common/storeout.wgsl" (WI=2)
#endif
#endif

#ifdef TMAX
const TMAX = {{TMAX}}u; // register accumulators per thread: 1, 2, 4 or 8 >= the rows it covers

#include "common/rowdots.wgsl" (WI=)
#ifdef GROUP
#include "common/rowdots.wgsl" (WI=1)
#if GROUP > 2
#include "common/rowdots.wgsl" (WI=2)
#endif
#endif
#endif

#ifdef LANES
// ---- GEMV (small M) ---------------------------------------------------------------------------
const LANES = {{LANES}}u; // threads per output column: 64 for real R, fewer when R is tiny
const COLS = 256u / LANES; // output columns per workgroup

var<workgroup> red: array<f32, TMAX * COLS * LANES>; // (TMAX, COLS, LANES)

@compute @workgroup_size(256)
fn matmul_gemv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
#ifdef SUBGROUPS
               @builtin(subgroup_size) sgSize: u32, // a direct builtin: uniform for the analysis
#endif
               @builtin(local_invocation_index) lid: u32) {
  let col = lid / LANES;
  let lane = lid % LANES;
  let n = linearGroup(wid, nwg) * COLS + col;
  var acc: array<f32, TMAX>;
  if (n < p.N) { acc = rowDots(n, 0u, p.M, lane, LANES); }
#include "common/gemvlanes.wgsl" (WI=, WN=p.N, AT=)
}

#ifdef GROUP
// matmul_gemv over 2 or 3 weights in one dispatch (matmulGroup: q/k/v, gate/up): workgroups
// [0, g0) take weight 0's columns exactly as matmul_gemv would, the next ceil(N1 / COLS) weight
// 1's, the rest weight 2's, so every column is the same sum in the same order. The branch is
// uniform per workgroup (barriers inside are fine); WGSL cannot index bindings, so each weight's
// body is rowDots and common/gemvlanes.wgsl instantiated on its binding.
@compute @workgroup_size(256)
fn matmul_gemv_group(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
#ifdef SUBGROUPS
                     @builtin(subgroup_size) sgSize: u32,
#endif
                     @builtin(local_invocation_index) lid: u32) {
  let col = lid / LANES;
  let lane = lid % LANES;
  let g = linearGroup(wid, nwg);
  let g0 = (p.N + COLS - 1u) / COLS;
  let g1 = g0 + (p.N1 + COLS - 1u) / COLS;
  var acc: array<f32, TMAX>;
  if (g < g0) {
    let n = g * COLS + col;
    if (n < p.N) { acc = rowDots(n, 0u, p.M, lane, LANES); }
#include "common/gemvlanes.wgsl" (WI=, WN=p.N, AT=)
#if GROUP > 2
  } else if (g >= g1) {
    let n = (g - g1) * COLS + col; // ids past the grid's count: n >= N2
    if (n < p.N2) { acc = rowDots2(n, 0u, p.M, lane, LANES); }
#include "common/gemvlanes.wgsl" (WI=2, WN=p.N2, AT=)
#endif
  } else {
    let n = (g - g0) * COLS + col;
    if (n < p.N1) { acc = rowDots1(n, 0u, p.M, lane, LANES); }
#include "common/gemvlanes.wgsl" (WI=1, WN=p.N1, AT=)
  }
}
#endif
#endif

#ifdef TMAX
// ---- rows (CPU adapters) ----------------------------------------------------------------------
// No barriers: on SwiftShader-like CPU implementations barriers and shared memory cost far more
// than the strided weight reads.

// Row-major B (the model's Linear weights): one thread per output column n, TMAX rows of A each
// (z of the grid), streaming B's row n word by word.
@compute @workgroup_size(64)
fn matmul_rows(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
               @builtin(local_invocation_index) lid: u32) {
  let n = linearGroup(wid, nwg) * 64u + lid;
  if (n >= p.N) { return; }
  let m0 = wid.z * TMAX;
  let nm = min(TMAX, p.M - m0);
  let acc = rowDots(n, m0, nm, 0u, 1u);
  for (var t = 0u; t < nm; t++) { store((m0 + t) * p.N + n, acc[t]); }
}

// Any strides: one thread per (column n, TMAX consecutive rows m); consecutive threads take
// consecutive n, so B reads with bN = 1 are contiguous across threads.
@compute @workgroup_size(64)
fn gemm_rows(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
             @builtin(local_invocation_index) lid: u32) {
  let id = linearGroup(wid, nwg) * 64u + lid;
  let n = id % p.N;
  let m0 = (id / p.N) * TMAX;
  if (m0 >= p.M) { return; }
  let nm = min(TMAX, p.M - m0);
  var acc: array<f32, TMAX>;
  for (var r = 0u; r < p.R; r++) {
    let b = weightAt(n * p.bN + r * p.bR);
    let ai = m0 * p.aM + r * p.aR;
    for (var t = 0u; t < TMAX; t++) {
      if (t < nm) { acc[t] += a[ai + t * p.aM] * b; }
    }
  }
  for (var t = 0u; t < nm; t++) { store((m0 + t) * p.N + n, acc[t]); }
}
#endif

#ifdef TILED
// ---- tiled (large M) --------------------------------------------------------------------------
// A 64 x 128 output tile per 16x16 workgroup, 4 x 8 outputs per thread in registers (rows
// 4 ty + i, columns 4 tx + q and 64 + 4 tx + q), R in steps of 16 through shared memory. Both tiles
// hold vec4s along their output dimension, so each step of r costs a thread 3 vec4 shared reads
// (its 4 rows of A, its 2 x 4 columns of B) for 32 FMAs, and every shared store is one whole
// vec4 of one thread (no two threads write parts of one vector). The K loop is double-buffered
// through registers: each thread reads its part of the next R step from global memory before it
// multiplies the current one out of shared memory, so the loads are in flight during the FMAs.
#ifdef TM8
const BM = 128u; // rows per tile: define TM8 (with VEC), 8 rows per thread
#else
const BM = 64u;  // rows per tile
#endif
const BN = 128u; // columns per tile
const BK = 16u;  // R step
const TN = 8u;   // columns per thread: two vec4s, 64 apart
const AP = BM / 4u + 1u; // padded pitch (vec4s) of the A tile: one vec4 of padding keeps the
const BP = BN / 4u + 1u; // stores walking r conflict-free; the same for B
const B_LOADS = BN * BK / 4u / 256u; // vec4s of the B tile a thread moves per step: 2 (A: 1)

// Split-K (define SPLITK; src/ops/splitK.ts): when the output tiles alone make too few workgroups
// (the LoRA A products, N = r; the LM head's input gradient over 64-row chunks, R = vocab), slice
// z = wid.z of the grid takes R from z rSlice to rEnd and stores its partial (M, N) product, as
// is (the TS side passes accumulate 0 and scale 1), at z M N of out: a scratch buffer that
// shaders/gemv.wgsl gemv_cols_reduce then sums in slice order into the real output. Without
// SPLITK one slice covers all of R. Every guard on r below is against the slice's end, rEnd.
// R from .x to .y for slice z (uniform: from the params and the workgroup id).
fn sliceRange(z: u32) -> vec2u {
#ifdef SPLITK
  return vec2u(z * p.rSlice, min(p.R, (z + 1u) * p.rSlice));
#else
  return vec2u(0u, p.R);
#endif
}
fn sliceOut(z: u32) -> u32 {
#ifdef SPLITK
  return z * p.M * p.N;
#else
  return 0u;
#endif
}
#ifdef LORA
// Output (m, n) of slice z: through store (which adds the LoRA term) in slice 0, as the plain
// partial sum (the params' accumulate 0 and scale 1) in the others.
fn sliceStore(z: u32, m: u32, n: u32, v: f32) {
  if (z == 0u) { store(m * p.N + n, v); } else { out[sliceOut(z) + m * p.N + n] = v; }
}
#endif

#ifdef F16
// f16 operands: half the shared memory and its traffic, and packed f16 math in the inner loop.
// Only the forward matmul takes it: activations and weights are O(1) there, while the backward's
// gradients would underflow f16 (no loss scaling here).
alias TE = f16;
#else
alias TE = f32;
#endif

#ifdef VEC
// Define VEC (tuning.gemmVec4; A read along r with 16-byte aligned rows): 16-byte global loads.
// The A tile holds vec4s along r (4 values of r of one row per vec4), the layout its loads come
// in: per step a thread loads one vec4 of A (row lid / 4, r 4 (lid % 4)..+3). B comes in runs of
// 8 elements (one vec4u of bf16, one word of q4 with its scale, two vec4s of f32), one per thread:
//  - read along r (the forward matmul x . W^T and the LoRA forward): the B tile holds vec4s along
//    r too; a thread loads column lid / 2, r 8 (lid % 2)..+7. Outputs: rows ty + 16 i, columns
//    tx + 16 j (i < 4, j < 8), so the stores of 16 neighbouring threads are contiguous.
//  - define BT, read along n (B(n, r) = b[r * N + n]: the input gradient dy . W and its LoRA
//    part): the B tile holds vec4s along n, as in the r-major tiles below; a thread loads r
//    lid / 16, columns 8 (lid % 16)..+7. Outputs: rows ty + 16 i, columns 4 tx + 64 h + q.
// Each thread stores whole vectors it loaded itself, so no transpose is needed. Each 4 values of
// r cost a thread 4 + 8 vec4 shared reads for 4 x 32 FMAs (the same 3 reads per 32 FMAs as the
// r-major tiles), as 8 vector x 4x4-matrix products.
const KP = BK / 4u + 1u; // padded pitch (vec4s) of a row of a tile along r: the 16 threads
                         // reading 16 columns at one r hit distinct banks
var<workgroup> as_: array<vec4<TE>, BM * KP>; // (BM, BK / 4): A tile, 4 values of r per vec4
#ifdef BT
var<workgroup> bs: array<vec4<TE>, BK * BP>;  // (BK, BN / 4): B tile, 4 columns per vec4
#else
var<workgroup> bs: array<vec4<TE>, BN * KP>;  // (BN, BK / 4): B tile, 4 values of r per vec4
#endif

// Element e of B, e % 8 == 0, and the 7 after it, as two vec4s.
fn loadB8(e: u32) -> array<vec4<TE>, 2> {
#if WEIGHTS == bf16
  let q = w[e >> 3u];
  return array(vec4<TE>(vec4f(bf16Low(q.x), bf16High(q.x), bf16Low(q.y), bf16High(q.y))),
               vec4<TE>(vec4f(bf16Low(q.z), bf16High(q.z), bf16Low(q.w), bf16High(q.w))));
#elif WEIGHTS == q4
  let wi = e >> 3u;
  let word = w[wi >> 2u][wi & 3u];
  let si = q4ScaleBase() + (e >> 6u); // the 8 share one group of 32
  let s = f16ToF32((w[si >> 2u][si & 3u] >> (16u * ((e >> 5u) & 1u))) & 0xffffu);
  return array(vec4<TE>(q4Low(word) * s), vec4<TE>(q4High(word) * s));
#elif WEIGHTS == f32
  return array(vec4<TE>(bitcast<vec4f>(w[e >> 2u])), vec4<TE>(bitcast<vec4f>(w[(e >> 2u) + 1u])));
#endif
}

// This thread's share of the R step from r0: its vec4 of A and its 8 values of B, zero past the
// edges. The TS side checks that a run never crosses one: R % 4 == 0 and aM % 4 == 0 for A; for
// B, R % 8 == 0 and bN == R (along r) or N % 8 == 0 and bR == N (BT).
struct Step { a: vec4<TE>, b: array<vec4<TE>, 2> }
fn loadStep(m0: u32, n0: u32, r0: u32, lid: u32, rEnd: u32) -> Step {
  var st = Step(vec4<TE>(), array(vec4<TE>(), vec4<TE>()));
  let m = m0 + (lid >> 2u);
  let ra = r0 + 4u * (lid & 3u);
  if (m < p.M && ra < rEnd) { st.a = vec4<TE>(a[(m * p.aM + ra) >> 2u]); }
#ifdef BT
  let n = n0 + 8u * (lid & 15u);
  let rb = r0 + (lid >> 4u);
  if (n < p.N && rb < rEnd) { st.b = loadB8(n + rb * p.bR); }
#else
  let n = n0 + (lid >> 1u);
  let rb = r0 + 8u * (lid & 1u);
  if (n < p.N && rb < rEnd) { st.b = loadB8(n * p.bN + rb); }
#endif
  return st;
}

#ifdef TM8
// Define TM8 (tuning.gemmTile '128'; with VEC only): a 128 x 128 output tile, 8 x 8 outputs per
// thread. The rows 64..127 of the tile repeat the first 64's work: a thread loads a second vec4 of
// A (row 64 + lid / 4) and keeps a second set of accumulators (rows 64 + ty + 16 i), reusing the
// B columns it read for the first set. Each 4 values of r then cost 8 + 8 vec4 shared reads for
// 4 x 64 FMAs (against 4 + 8 for 4 x 32), and each weight element of B is loaded (and for q4
// dequantized) once per 128 rows of A, not 64. Shared memory doubles for A: 20 KiB in f32 with
// BK = 16 (the TS side checks maxComputeWorkgroupStorageSize).
fn loadA2(m0: u32, r0: u32, lid: u32, rEnd: u32) -> vec4<TE> {
  let m = m0 + 64u + (lid >> 2u);
  let ra = r0 + 4u * (lid & 3u);
  if (m < p.M && ra < rEnd) { return vec4<TE>(a[(m * p.aM + ra) >> 2u]); }
  return vec4<TE>();
}
#endif

// Where this thread's run of B goes in the tile (the second vec4 follows the first).
fn bSlot(lid: u32) -> u32 {
#ifdef BT
  return (lid >> 4u) * BP + 2u * (lid & 15u);
#else
  return (lid >> 1u) * KP + 2u * (lid & 1u);
#endif
}

// This thread's 4 columns h (< 2) of B at r0 + 4 k .. + 3 as a matrix, and the product of a row's
// vec4 av (the same 4 values of r) with it: the 4 columns' partial dot products.
#ifdef BT
fn bCols(k: u32, tx: u32, h: u32) -> mat4x4<TE> { // column c: the 4 columns at r0 + 4 k + c
  let c = tx + 16u * h;
  return mat4x4<TE>(bs[4u * k * BP + c], bs[(4u * k + 1u) * BP + c], bs[(4u * k + 2u) * BP + c], bs[(4u * k + 3u) * BP + c]);
}
fn rowTimes(av: vec4<TE>, b: mat4x4<TE>) -> vec4<TE> { return b * av; }
fn outColumn(tx: u32, j: u32) -> u32 { return 4u * tx + 64u * (j >> 2u) + (j & 3u); }
#else
fn bCols(k: u32, tx: u32, h: u32) -> mat4x4<TE> { // column q: output column tx + 64 h + 16 q along r
  let c = tx + 64u * h;
  return mat4x4<TE>(bs[c * KP + k], bs[(c + 16u) * KP + k], bs[(c + 32u) * KP + k], bs[(c + 48u) * KP + k]);
}
fn rowTimes(av: vec4<TE>, b: mat4x4<TE>) -> vec4<TE> { return av * b; }
fn outColumn(tx: u32, j: u32) -> u32 { return tx + 16u * j; }
#endif

@compute @workgroup_size(16, 16)
fn gemm_tiled(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_id) lid3: vec3u,
              @builtin(local_invocation_index) lid: u32) {
  let n0 = wid.x * BN;
  let m0 = wid.y * BM;
  let tx = lid3.x;
  let ty = lid3.y;
  var acc: array<vec4f, 8>; // row ty + 16 i, output columns outColumn(tx, 4 h + (0..3)): acc[2 i + h]
  let rs = sliceRange(wid.z);
  let rStart = rs.x;
  let rEnd = rs.y;
  let o0 = sliceOut(wid.z);
  var next = loadStep(m0, n0, rStart, lid, rEnd);
#ifdef TM8
  var acc2: array<vec4f, 8>; // as acc, for row 64 + ty + 16 i
  var nextA2 = loadA2(m0, rStart, lid, rEnd);
#endif
  for (var r0 = rStart; r0 < rEnd; r0 += BK) {
    as_[(lid >> 2u) * KP + (lid & 3u)] = next.a;
#ifdef TM8
    as_[(64u + (lid >> 2u)) * KP + (lid & 3u)] = nextA2;
#endif
    bs[bSlot(lid)] = next.b[0];
    bs[bSlot(lid) + 1u] = next.b[1];
    workgroupBarrier();
    if (r0 + BK < rEnd) { next = loadStep(m0, n0, r0 + BK, lid, rEnd); } // in flight during the FMAs
#ifdef TM8
    if (r0 + BK < rEnd) { nextA2 = loadA2(m0, r0 + BK, lid, rEnd); }
#endif
#ifdef F16
    // Each output's 16 products of this step summed in f16, then added to the f32 accumulator.
    // Zeroed explicitly (see the r-major variant: lavapipe kept a loop-local var's old value).
    var part: array<vec4<f16>, 8>;
    for (var j = 0u; j < 8u; j++) { part[j] = vec4<f16>(); }
#ifdef TM8
    var part2: array<vec4<f16>, 8>;
    for (var j = 0u; j < 8u; j++) { part2[j] = vec4<f16>(); }
#endif
#endif
    for (var k = 0u; k < BK / 4u; k++) {
      let b0 = bCols(k, tx, 0u);
      let b1 = bCols(k, tx, 1u);
      for (var i = 0u; i < 4u; i++) {
        let av = as_[(ty + 16u * i) * KP + k]; // row ty + 16 i at r0 + 4 k .. + 3
#ifdef F16
        part[2u * i] += rowTimes(av, b0);
        part[2u * i + 1u] += rowTimes(av, b1);
#else
        acc[2u * i] += rowTimes(av, b0);
        acc[2u * i + 1u] += rowTimes(av, b1);
#endif
      }
#ifdef TM8
      for (var i = 0u; i < 4u; i++) {
        let av = as_[(64u + ty + 16u * i) * KP + k]; // row 64 + ty + 16 i
#ifdef F16
        part2[2u * i] += rowTimes(av, b0);
        part2[2u * i + 1u] += rowTimes(av, b1);
#else
        acc2[2u * i] += rowTimes(av, b0);
        acc2[2u * i + 1u] += rowTimes(av, b1);
#endif
      }
#endif
    }
#ifdef F16
    for (var j = 0u; j < 8u; j++) { acc[j] += vec4f(part[j]); }
#ifdef TM8
    for (var j = 0u; j < 8u; j++) { acc2[j] += vec4f(part2[j]); }
#endif
#endif
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let m = m0 + ty + 16u * i;
    for (var j = 0u; j < 8u; j++) {
      let n = n0 + outColumn(tx, j);
#ifdef LORA
      if (m < p.M && n < p.N) { sliceStore(wid.z, m, n, acc[2u * i + (j >> 2u)][j & 3u]); }
#else
      if (m < p.M && n < p.N) { store(o0 + m * p.N + n, acc[2u * i + (j >> 2u)][j & 3u]); }
#endif
    }
  }
#ifdef TM8
  for (var i = 0u; i < 4u; i++) {
    let m = m0 + 64u + ty + 16u * i;
    for (var j = 0u; j < 8u; j++) {
      let n = n0 + outColumn(tx, j);
#ifdef LORA
      if (m < p.M && n < p.N) { sliceStore(wid.z, m, n, acc2[2u * i + (j >> 2u)][j & 3u]); }
#else
      if (m < p.M && n < p.N) { store(o0 + m * p.N + n, acc2[2u * i + (j >> 2u)][j & 3u]); }
#endif
    }
  }
#endif
}
#else
#ifndef SGA
var<workgroup> as_: array<vec4<TE>, BK * AP>; // (BK, BM / 4): A tile, r-major, 4 rows per vec4
#endif
var<workgroup> bs: array<vec4<TE>, BK * BP>;  // (BK, BN / 4): B tile, r-major, 4 columns per vec4

// vec4 e (0..BM*BK/4) of a tile step as (4-row group, r): walking r when r is contiguous in memory
// (stride 1), else walking the rows, so global reads stay coalesced for every layout above.
fn tileA(e: u32) -> vec2u { if (p.aR == 1u) { return vec2u(e / BK, e % BK); } return vec2u(e % (BM / 4u), e / (BM / 4u)); }
fn tileB(e: u32) -> vec2u { if (p.bR == 1u) { return vec2u(e / BK, e % BK); } return vec2u(e % (BN / 4u), e / (BN / 4u)); }
// Rows 4 g .. 4 g + 3 of A (from m0) at r, zero past the edges.
fn loadA(m0: u32, g: u32, r: u32, rEnd: u32) -> vec4<TE> {
  var v = vec4<TE>();
  if (r < rEnd) {
    for (var q = 0u; q < 4u; q++) {
      let m = m0 + 4u * g + q;
      if (m < p.M) { v[q] = TE(a[m * p.aM + r * p.aR]); }
    }
  }
  return v;
}
// Columns 4 g .. 4 g + 3 of B (from n0) at r, zero past the edges.
fn loadB(n0: u32, g: u32, r: u32, rEnd: u32) -> vec4<TE> {
  var v = vec4<TE>();
  if (r < rEnd) {
    for (var q = 0u; q < 4u; q++) {
      let n = n0 + 4u * g + q;
      if (n < p.N) { v[q] = TE(weightAt(n * p.bN + r * p.bR)); }
    }
  }
  return v;
}

#ifdef SGA
// Define SGA (subgroups; tuning.gemmSubgroups): no A tile in shared memory. The 16 threads of a
// row (ty) share their 4 rows of A: each holds the vec4 of those rows at C = 16 / W values of r
// (W = min(subgroup size, 16): r = r0 + c W + tx % W) and the row reads each r's vec4 from the
// lane holding it with subgroupShuffle. Subgroups must be packed in local_invocation_index order
// (as common/reduce.wgsl assumes; test/gpu checks it), so a row's 16 threads share a subgroup (or
// with W < 16, each W of them do); smaller subgroups load A C times over (cache hits). The loop
// over c has a constant bound, so aNow[c] indexes a register, and its guard is uniform.
fn loadRowsA(m0: u32, ty: u32, tx: u32, r0: u32, W: u32, rEnd: u32) -> array<vec4<TE>, 4> {
  var v: array<vec4<TE>, 4>;
  for (var c = 0u; c < 4u; c++) {
    v[c] = vec4<TE>();
    if (c * W < BK) { v[c] = loadA(m0, ty, r0 + c * W + tx % W, rEnd); }
  }
  return v;
}
#endif

@compute @workgroup_size(16, 16)
fn gemm_tiled(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_id) lid3: vec3u,
#ifdef SGA
              @builtin(subgroup_size) sgSize: u32, @builtin(subgroup_invocation_id) sgLane: u32,
#endif
              @builtin(local_invocation_index) lid: u32) {
  let n0 = wid.x * BN;
  let m0 = wid.y * BM;
  let tx = lid3.x;
  let ty = lid3.y;
  var acc: array<vec4f, 2u * 4u>; // row i, columns 4 tx + 64 h + (0..3): acc[2 i + h]
  let rs = sliceRange(wid.z);
  let rStart = rs.x;
  let rEnd = rs.y;
  let o0 = sliceOut(wid.z);
  var eb: array<vec2u, B_LOADS>; // this thread's share of each step: B_LOADS vec4s of B
  for (var i = 0u; i < B_LOADS; i++) { eb[i] = tileB(lid + i * 256u); }
  var rb: array<vec4<TE>, B_LOADS>; // the next step, in flight
  for (var i = 0u; i < B_LOADS; i++) { rb[i] = loadB(n0, eb[i].x, rStart + eb[i].y, rEnd); }
#ifdef SGA
  let W = min(sgSize, BK);
  let base = sgLane - tx % W; // the lane holding r = r0 + c W (+ kk at lane base + kk)
  var aNext = loadRowsA(m0, ty, tx, rStart, W, rEnd);
#else
  let W = BK; // the loops over (c, kk) below: one pass of c, kk = k
  let ea = tileA(lid); // and one vec4 of A
  var ra = loadA(m0, ea.x, rStart + ea.y, rEnd);
#endif
  for (var r0 = rStart; r0 < rEnd; r0 += BK) {
#ifdef SGA
    let aNow = aNext;
#else
    as_[ea.y * AP + ea.x] = ra;
#endif
    for (var i = 0u; i < B_LOADS; i++) { bs[eb[i].y * BP + eb[i].x] = rb[i]; }
    workgroupBarrier();
    let r1 = r0 + BK;
    if (r1 < rEnd) {
#ifdef SGA
      aNext = loadRowsA(m0, ty, tx, r1, W, rEnd);
#else
      ra = loadA(m0, ea.x, r1 + ea.y, rEnd);
#endif
      for (var i = 0u; i < B_LOADS; i++) { rb[i] = loadB(n0, eb[i].x, r1 + eb[i].y, rEnd); }
    }
#ifdef F16
    // Each output's 16 products of this step, summed in f16. Zeroed explicitly: a var declared in
    // a loop without an initializer kept the previous iteration's value on lavapipe (Mesa 25.0, Dawn).
    var part: array<vec4<f16>, 2u * 4u>;
    for (var j = 0u; j < 8u; j++) { part[j] = vec4<f16>(); }
    for (var c = 0u; c < 4u; c++) {
      if (c * W >= BK) { break; }
      for (var kk = 0u; kk < W; kk++) {
        let k = c * W + kk;
#ifdef SGA
        let av = subgroupShuffle(aNow[c], base + kk); // rows 4 ty .. 4 ty + 3 at r0 + k
#else
        let av = as_[k * AP + ty];
#endif
        let b0 = bs[k * BP + tx];
        let b1 = bs[k * BP + 16u + tx];
        for (var i = 0u; i < 4u; i++) {
          part[2u * i] = fma(vec4<f16>(av[i]), b0, part[2u * i]);
          part[2u * i + 1u] = fma(vec4<f16>(av[i]), b1, part[2u * i + 1u]);
        }
      }
    }
    for (var j = 0u; j < 8u; j++) { acc[j] += vec4f(part[j]); }
#else
    for (var c = 0u; c < 4u; c++) {
      if (c * W >= BK) { break; }
      for (var kk = 0u; kk < W; kk++) {
        let k = c * W + kk;
#ifdef SGA
        let av = subgroupShuffle(aNow[c], base + kk); // rows 4 ty .. 4 ty + 3 at r0 + k
#else
        let av = as_[k * AP + ty];
#endif
        let b0 = bs[k * BP + tx];
        let b1 = bs[k * BP + 16u + tx];
        for (var i = 0u; i < 4u; i++) {
          acc[2u * i] = fma(vec4f(av[i]), b0, acc[2u * i]);
          acc[2u * i + 1u] = fma(vec4f(av[i]), b1, acc[2u * i + 1u]);
        }
      }
    }
#endif
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let m = m0 + 4u * ty + i;
    for (var h = 0u; h < 2u; h++) {
      for (var q = 0u; q < 4u; q++) {
        let n = n0 + 64u * h + 4u * tx + q;
        if (m < p.M && n < p.N) { store(o0 + m * p.N + n, acc[2u * i + h][q]); }
      }
    }
  }
}
#endif
#endif
