{{ENABLE}}
// out (T, N) f32 (+)= x (T, K) f32 . w (N, K) bf16 ^T  -- every nn.Linear of the model.
// Entry points:
//   matmul_gemv  (decode, T <= TMAX <= 8): memory-bound, so each weight word is read once for all
//                T rows; LANES (<= 64) threads reduce one output row over K, 256/LANES rows per workgroup.
//   matmul_rows  (CPU adapters, any T): one thread per output row, no barriers.
//   matmul_tiled (prefill, any T): 64x64 output tile per 16x16 workgroup, 4x4 per thread, K in
//                steps of 16 through shared memory.
//   gemm_rows, gemm_tiled: the LoRA and backward products (below).
//
// matmul_gemv comes in two variants, picked by src/model/kernels.ts (subgroupDefines): with the
// device's `subgroups` feature the ENABLE define is `enable subgroups;` and the IF_SUBGROUPS /
// ELSE / END defines are comment delimiters that keep only the subgroup section below; without it
// ENABLE is empty and only the shared-memory section compiles. The other entries use neither.

struct MatmulParams {
  T: u32,
  N: u32,
  K: u32,
  accumulate: u32, // 1: out += x.w^T (residual adds), 0: out = x.w^T
}

@group(0) @binding(0) var<uniform> p: MatmulParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (T, N) f32
@group(0) @binding(2) var<storage, read> x: array<f32>;         // (T, K) f32
@group(0) @binding(3) var<storage, read> w: array<u32>;         // (N, K) bf16, two per u32

fn weightAt(i: u32) -> f32 {
  let word = w[i >> 1u];
  return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

fn store(o: u32, v: f32) {
  if (p.accumulate != 0u) { out[o] = out[o] + v; } else { out[o] = v; }
}

// ---- GEMV (small T) -------------------------------------------------------------------------

const TMAX = {{TMAX}}u; // register accumulators per thread; the TS side picks 1, 2, 4 or 8 >= T
const LANES = {{LANES}}u; // threads per output row: 64 for real K, fewer when K is tiny
const ROWS = 256u / LANES; // output rows per workgroup

var<workgroup> red: array<f32, TMAX * ROWS * LANES>; // (TMAX, ROWS, LANES)

// This lane's partial dot products for output row n (zeros past N), one per token.
fn gemvPartial(n: u32, lane: u32) -> array<f32, TMAX> {
  var acc: array<f32, TMAX>;
  if (n < p.N) {
    if ((p.K & 1u) == 0u) {
      // Even K: rows start on a word boundary; one u32 = two weights, consecutive lanes read
      // consecutive words (coalesced).
      let words = p.K / 2u;
      let wbase = n * words;
      for (var j = lane; j < words; j += LANES) {
        let pair = w[wbase + j];
        let w0 = bitcast<f32>(pair << 16u);
        let w1 = bitcast<f32>(pair & 0xffff0000u);
        for (var t = 0u; t < TMAX; t++) {
          if (t < p.T) {
            let xi = t * p.K + 2u * j;
            acc[t] += x[xi] * w0 + x[xi + 1u] * w1;
          }
        }
      }
    } else {
      let wbase = n * p.K;
      for (var k = lane; k < p.K; k += LANES) {
        let wk = weightAt(wbase + k);
        for (var t = 0u; t < TMAX; t++) {
          if (t < p.T) { acc[t] += x[t * p.K + k] * wk; }
        }
      }
    }
  }
  return acc;
}

{{IF_SUBGROUPS}}
// Subgroup reduction. A row's LANES threads are consecutive invocations (subgroups are assumed
// packed in local_invocation_index order), so a subgroupShuffleXor butterfly over
// span = min(LANES, subgroup size) lanes sums each row's partials within its subgroup, in
// registers. With LANES <= subgroup size that is the row total; otherwise each of the row's
// LANES / sgSize subgroups stores its sum and one shared-memory step adds them. sgSize is
// uniform, so the loops and branches on it keep the subgroup ops in uniform control flow.
@compute @workgroup_size(256)
fn matmul_gemv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_size) sgSize: u32, @builtin(subgroup_invocation_id) sgLane: u32) {
  let row = lid / LANES;
  let lane = lid % LANES;
  let n = (wid.x + wid.y * nwg.x) * ROWS + row;
  var acc = gemvPartial(n, lane);
  let span = min(LANES, sgSize);
  for (var m = span / 2u; m > 0u; m >>= 1u) {
    for (var t = 0u; t < TMAX; t++) { acc[t] += subgroupShuffleXor(acc[t], m); }
  }
  if (LANES <= sgSize) {
    // Every lane holds its row's totals; lane l writes tokens l, l + LANES, ...
    if (n < p.N) {
      for (var t = lane; t < p.T; t += LANES) { store(t * p.N + n, acc[t]); }
    }
  } else {
    let parts = LANES / sgSize; // subgroups per row
    if (sgLane == 0u) {
      for (var t = 0u; t < TMAX; t++) { red[(t * ROWS + row) * parts + lane / sgSize] = acc[t]; }
    }
    workgroupBarrier();
    if (n < p.N) {
      for (var t = lane; t < p.T; t += LANES) {
        var s = 0.0;
        for (var j = 0u; j < parts; j++) { s += red[(t * ROWS + row) * parts + j]; }
        store(t * p.N + n, s);
      }
    }
  }
}
{{ELSE}}
// Shared-memory tree over each row's LANES partials.
@compute @workgroup_size(256)
fn matmul_gemv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
               @builtin(local_invocation_index) lid: u32) {
  let row = lid / LANES;
  let lane = lid % LANES;
  let n = (wid.x + wid.y * nwg.x) * ROWS + row;
  let acc = gemvPartial(n, lane);
  for (var t = 0u; t < TMAX; t++) { red[(t * ROWS + row) * LANES + lane] = acc[t]; }
  workgroupBarrier();
  for (var s = LANES / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      for (var t = 0u; t < TMAX; t++) {
        let i = (t * ROWS + row) * LANES + lane;
        red[i] += red[i + s];
      }
    }
    workgroupBarrier();
  }
  // Lane l writes tokens l, l + LANES, ... of this row.
  if (n < p.N) {
    for (var t = lane; t < p.T; t += LANES) { store(t * p.N + n, red[(t * ROWS + row) * LANES]); }
  }
}
{{END}}

// ---- rows (CPU adapters, any T) -------------------------------------------------------------
// One thread per (output row, group of TMAX tokens) and no barriers: on SwiftShader-like CPU
// implementations barriers and shared memory cost far more than the strided weight reads.

@compute @workgroup_size(64)
fn matmul_rows(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
               @builtin(local_invocation_index) lid: u32) {
  let n = (wid.x + wid.y * nwg.x) * 64u + lid;
  if (n >= p.N) { return; }
  let t0 = wid.z * TMAX;
  let nt = min(TMAX, p.T - t0);
  var acc: array<f32, TMAX>;
  if ((p.K & 1u) == 0u) {
    let words = p.K / 2u;
    let wbase = n * words;
    for (var j = 0u; j < words; j++) {
      let pair = w[wbase + j];
      let w0 = bitcast<f32>(pair << 16u);
      let w1 = bitcast<f32>(pair & 0xffff0000u);
      for (var t = 0u; t < TMAX; t++) {
        if (t < nt) {
          let xi = (t0 + t) * p.K + 2u * j;
          acc[t] += x[xi] * w0 + x[xi + 1u] * w1;
        }
      }
    }
  } else {
    let wbase = n * p.K;
    for (var k = 0u; k < p.K; k++) {
      let wk = weightAt(wbase + k);
      for (var t = 0u; t < TMAX; t++) {
        if (t < nt) { acc[t] += x[(t0 + t) * p.K + k] * wk; }
      }
    }
  }
  for (var t = 0u; t < nt; t++) { store((t0 + t) * p.N + n, acc[t]); }
}

// ---- tiled (large T) ------------------------------------------------------------------------

const BM = 64u; // tokens per tile
const BN = 64u; // output features per tile
const BK = 16u; // K step

var<workgroup> xs: array<f32, BK * BM>; // (BK, BM): x tile, transposed so reads are broadcasts
var<workgroup> ws: array<f32, BK * BN>; // (BK, BN): w tile, n contiguous so reads are conflict-free

@compute @workgroup_size(16, 16)
fn matmul_tiled(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_id) lid3: vec3u,
                @builtin(local_invocation_index) lid: u32) {
  let n0 = wid.x * BN;
  let m0 = wid.y * BM;
  let tx = lid3.x; // output columns n0 + tx + 16 j
  let ty = lid3.y; // output rows m0 + 4 ty + i
  var acc: array<f32, 16>;
  for (var k0 = 0u; k0 < p.K; k0 += BK) {
    // 1024 elements of each tile, 4 per thread; a thread's loads walk along K (contiguous).
    for (var r = 0u; r < 4u; r++) {
      let e = lid + r * 256u;
      let m = e / BK;
      let k = e % BK;
      let gk = k0 + k;
      var xv = 0.0;
      if (m0 + m < p.T && gk < p.K) { xv = x[(m0 + m) * p.K + gk]; }
      xs[k * BM + m] = xv;
      var wv = 0.0;
      if (n0 + m < p.N && gk < p.K) { wv = weightAt((n0 + m) * p.K + gk); }
      ws[k * BN + m] = wv;
    }
    workgroupBarrier();
    for (var k = 0u; k < BK; k++) {
      var a: array<f32, 4>;
      var b: array<f32, 4>;
      for (var i = 0u; i < 4u; i++) { a[i] = xs[k * BM + 4u * ty + i]; }
      for (var j = 0u; j < 4u; j++) { b[j] = ws[k * BN + tx + 16u * j]; }
      for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) { acc[i * 4u + j] += a[i] * b[j]; }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let m = m0 + 4u * ty + i;
    for (var j = 0u; j < 4u; j++) {
      let n = n0 + tx + 16u * j;
      if (m < p.T && n < p.N) { store(m * p.N + n, acc[i * 4u + j]); }
    }
  }
}

// ---- gemm: the LoRA matmuls and the backward -------------------------------------------------
// out (M, N) (+)= scale * sum_r A(m, r) B(n, r), with A f32 and B f32 or bf16 read through
// strides, so one kernel serves every layout (docs/ENGINE.md, Training additions):
//   matmulF32                x . w^T     A = x (T,K)   B = w (N,K)      M=T  N=N  R=K
//   matmulBackwardInput(F32) dy . w      A = dy (T,N)  B = w^T of (N,K) M=T  N=K  R=N
//   matmulBackwardWeightF32  dy^T . x    A = dy^T      B = x^T          M=N  N=K  R=T
// Same two shapes as above: gemm_rows (CPU adapters, no barriers) and gemm_tiled (64x64 tiles).

struct GemmParams {
  M: u32,
  N: u32,
  R: u32,
  accumulate: u32, // 1: out += ..., 0: out = ...
  aM: u32,         // A(m, r) = gA[m * aM + r * aR]
  aR: u32,
  bN: u32,         // B(n, r) = element n * bN + r * bR of gB
  bR: u32,
  bBf16: u32,      // 1: gB holds bf16 pairs, 0: gB holds f32 bits
  scale: f32,
}

@group(0) @binding(0) var<uniform> g: GemmParams;
@group(0) @binding(1) var<storage, read_write> gOut: array<f32>; // (M, N) f32
@group(0) @binding(2) var<storage, read> gA: array<f32>;         // A, f32
@group(0) @binding(3) var<storage, read> gB: array<u32>;         // B, bf16 pairs or f32 bits

fn gemmB(i: u32) -> f32 {
  if (g.bBf16 != 0u) {
    let word = gB[i >> 1u];
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
  }
  return bitcast<f32>(gB[i]);
}

fn gemmStore(o: u32, v: f32) {
  if (g.accumulate != 0u) { gOut[o] = gOut[o] + g.scale * v; } else { gOut[o] = g.scale * v; }
}

// One thread per (output column n, TMAX consecutive rows m); consecutive threads take
// consecutive n, so B reads with bN = 1 are contiguous across threads.
@compute @workgroup_size(64)
fn gemm_rows(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
             @builtin(local_invocation_index) lid: u32) {
  let id = (wid.x + wid.y * nwg.x) * 64u + lid;
  let n = id % g.N;
  let m0 = (id / g.N) * TMAX;
  if (m0 >= g.M) { return; }
  let nm = min(TMAX, g.M - m0);
  var acc: array<f32, TMAX>;
  for (var r = 0u; r < g.R; r++) {
    let b = gemmB(n * g.bN + r * g.bR);
    let ai = m0 * g.aM + r * g.aR;
    for (var t = 0u; t < TMAX; t++) {
      if (t < nm) { acc[t] += gA[ai + t * g.aM] * b; }
    }
  }
  for (var t = 0u; t < nm; t++) { gemmStore((m0 + t) * g.N + n, acc[t]); }
}

// matmul_tiled with strided operands. Tile loads walk along r when it is contiguous in memory
// (stride 1), else along m / n, so global reads stay coalesced for every layout above.
@compute @workgroup_size(16, 16)
fn gemm_tiled(@builtin(workgroup_id) wid: vec3u, @builtin(local_invocation_id) lid3: vec3u,
              @builtin(local_invocation_index) lid: u32) {
  let n0 = wid.x * BN;
  let m0 = wid.y * BM;
  let tx = lid3.x; // output columns n0 + tx + 16 j
  let ty = lid3.y; // output rows m0 + 4 ty + i
  var acc: array<f32, 16>;
  for (var r0 = 0u; r0 < g.R; r0 += BK) {
    for (var i = 0u; i < 4u; i++) {
      let e = lid + i * 256u;
      var m = e / BK;
      var k = e % BK;
      if (g.aR != 1u) { m = e % BM; k = e / BM; }
      var av = 0.0;
      if (m0 + m < g.M && r0 + k < g.R) { av = gA[(m0 + m) * g.aM + (r0 + k) * g.aR]; }
      xs[k * BM + m] = av;
      var n = e / BK;
      var kb = e % BK;
      if (g.bR != 1u) { n = e % BN; kb = e / BN; }
      var bv = 0.0;
      if (n0 + n < g.N && r0 + kb < g.R) { bv = gemmB((n0 + n) * g.bN + (r0 + kb) * g.bR); }
      ws[kb * BN + n] = bv;
    }
    workgroupBarrier();
    for (var k = 0u; k < BK; k++) {
      var a: array<f32, 4>;
      var b: array<f32, 4>;
      for (var i = 0u; i < 4u; i++) { a[i] = xs[k * BM + 4u * ty + i]; }
      for (var j = 0u; j < 4u; j++) { b[j] = ws[k * BN + tx + 16u * j]; }
      for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) { acc[i * 4u + j] += a[i] * b[j]; }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let m = m0 + 4u * ty + i;
    for (var j = 0u; j < 4u; j++) {
      let n = n0 + tx + 16u * j;
      if (m < g.M && n < g.N) { gemmStore(m * g.N + n, acc[i * 4u + j]); }
    }
  }
}
