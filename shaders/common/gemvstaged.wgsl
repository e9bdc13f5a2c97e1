// The partial dot products of shaders/gemv.wgsl gemv_lanes' CPT columns a thread for the weight
// w{{WI}} of {{WN}} rows, a template:
//   #include "common/gemvstaged.wgsl" (WI=suffix, WN=rows, AT=offset + )
// The includer defines n0 (this thread's first column; the others are CSTEP apart), col, lane and
// lid. Ends with common/gemvlanes.wgsl once per column, which reduces the column's partials
// (accs[t * CPT + r] for column r) and stores them AT elements further on (gemvlanes' AT). Holds
// workgroup barriers: include it in uniform control flow.
// x is staged KCV vec4s per row at a time (rows past M as zeros); within a chunk lane l takes
// blocks l, l + LANES, ... of its column's row, so a column's LANES lanes read LANES neighbouring
// 16-byte blocks per step, LU steps' loads issued together (gemv.wgsl LU). Columns past {{WN}}
// read the last row (never stored): every thread reaches every barrier. With define NORM, x is
// staged times the norm's weights and each sum scaled by its row's rstd at the end (gemv.wgsl
// normScales). With define SILU, x is silu(a) * aUp (gemv.wgsl siluTimes). With define PAIR
// (gemv_lanes_group over 2 weights), a thread's first HC = CPT / 2 columns are w's and the others
// the same columns of w1, stored to out and out1.
// Split over K (p.kChunk > 0, gemv_lanes only, never with NORM: src/ops/colsSplit.ts lanesSplit):
// workgroup z takes elements [z kChunk, (z + 1) kChunk) of each row, kChunk a whole number of
// LANES-block rounds, so block j still falls to lane j % LANES; common/gemvlanes.wgsl stores its
// partial sums p.splitStride * z further on, for gemv_cols_reduce to add in split order.
  let blocks = p.K / BE;
  var wbase: array<u32, CPT>;
#ifdef PAIR
  // Columns n0 + h CSTEP of w (slots h < HC) and the same columns of w1 (slots HC + h; gemv.wgsl PAIR).
  for (var r = 0u; r < CPT; r++) { wbase[r] = min(n0 + (r % HC) * CSTEP, {{WN}} - 1u) * blocks; }
#else
  for (var r = 0u; r < CPT; r++) { wbase[r] = min(n0 + r * CSTEP, {{WN}} - 1u) * blocks; }
#endif
  let xr = p.K / 4u; // vec4 per row of x
  var accs: array<f32, TMAX * CPT>;
  for (var i = 0u; i < TMAX * CPT; i++) { accs[i] = 0.0; }
#ifdef NORM
  var ss: array<f32, SH>; // sums of squares of the x this thread stages (gemv.wgsl normScales)
#endif
  let kv0 = wid.z * (p.kChunk / 4u); // this split's first vec4 of a row
  let kv1 = select(xr, min(xr, kv0 + p.kChunk / 4u), p.kChunk != 0u); // and its end
  for (var c0 = kv0; c0 < kv1; c0 += KCV) {
    workgroupBarrier(); // the previous chunk's reads are done
    for (var h = 0u; h < XS / 256u; h++) {
      let i = lid + 256u * h;
      let t = i / KCV;
      let v = c0 + i % KCV;
      var xv = vec4f(0.0);
      if (t < p.M && v < kv1) {
#if defined(XEACH)
        xv = a{{WI}}[t * xr + v]; // each weight its own x (gemv.wgsl XEACH)
#elif defined(SILU)
        xv = siluTimes(a[t * xr + v], aUp[t * xr + v]); // x = silu(gate) * up (gemv.wgsl SILU)
#else
        xv = a[t * xr + v];
#endif
#ifdef NORM
        ss[h] += dot(xv, xv);
        xv *= normWeights(v);
#endif
      }
      xs[swizzled(i)] = xv; // shaders/gemv.wgsl swizzled: bank-conflict-free reads
    }
    workgroupBarrier();
    let jb = c0 / (BE / 4u); // the chunk's first block (KCV is a whole number of blocks)
    let je = min(kv1 / (BE / 4u), jb + KCV / (BE / 4u));
    // LU blocks a step of each of the CPT columns, all LU * CPT loads issued before any is used
    // (gemv.wgsl LU). A lane past the chunk's end loads its last block again (clamped; cached) and
    // skips the sums.
    for (var j0 = jb + lane; j0 < je; j0 += LANES * LU) {
      var wb: array<vec4u, LU * CPT>;
      var ws: array<f32, LU * CPT>;
      for (var u = 0u; u < LU; u++) {
        let jl = min(j0 + u * LANES, je - 1u);
        for (var r = 0u; r < CPT; r++) {
#ifdef PAIR
          if (r < HC) {
            wb[u * CPT + r] = w[wbase[r] + jl];
            ws[u * CPT + r] = blockScale(wbase[r] + jl);
          } else {
            wb[u * CPT + r] = w1[wbase[r] + jl];
            ws[u * CPT + r] = blockScale1(wbase[r] + jl);
          }
#else
          wb[u * CPT + r] = w{{WI}}[wbase[r] + jl];
          ws[u * CPT + r] = blockScale{{WI}}(wbase[r] + jl);
#endif
        }
      }
      for (var u = 0u; u < LU; u++) {
        let j = j0 + u * LANES;
        if (j < je) {
          let xo = (j - jb) * (BE / 4u);
          // The block's sums over its PARTS parts of unscaled weights, then times its scale once
          // per row (q4: 4 parts; bf16 and f32 have one part and a scale of 1, so accs gets the
          // same sums). Each part's x is read from workgroup memory once for the CPT columns (the
          // point of CPT: a column's x reads cost CPT times fewer). Zeroed explicitly: a var
          // declared in a loop without an initializer kept the previous iteration's value on
          // SwiftShader and lavapipe (shaders/matmul.wgsl F16 says the same).
          var blk: array<f32, TMAX * CPT>;
          for (var i = 0u; i < TMAX * CPT; i++) { blk[i] = 0.0; }
          for (var c = 0u; c < PARTS; c++) {
            var q: array<Pair, CPT>;
            for (var r = 0u; r < CPT; r++) { q[r] = part(wb[u * CPT + r], 1.0, c); }
            for (var t = 0u; t < TMAX; t++) {
              let xv = stagedAt(t * KCV + xo + c * (EPP / 4u));
              for (var r = 0u; r < CPT; r++) { blk[t * CPT + r] += dot(pairDot(q[r], xv), vec4f(1.0)); }
            }
          }
          for (var t = 0u; t < TMAX; t++) {
            for (var r = 0u; r < CPT; r++) { accs[t * CPT + r] += ws[u * CPT + r] * blk[t * CPT + r]; }
          }
        }
      }
    }
  }
#ifdef NORM
  let rs = normScales(ss, lid);
#ifdef UPART
  rowScale = rs; // the LoRA branches' u is of the unnormed partials (gemv.wgsl UPART)
#endif
  for (var t = 0u; t < TMAX; t++) {
    for (var r = 0u; r < CPT; r++) { accs[t * CPT + r] *= rs[t]; }
  }
#endif
  // Each column's lane partials summed and stored (common/gemvlanes.wgsl, which inherits WI, WN
  // and AT; R makes the include a template, expanded again each time). Its workgroup memory is
  // reused column after column, hence the barrier between them.
#ifdef PAIR
  // w's columns, then w1's (gemv.wgsl PAIR)
  for (var r = 0u; r < HC; r++) {
    let n = n0 + r * CSTEP;
    var acc: array<f32, TMAX>;
    for (var t = 0u; t < TMAX; t++) { acc[t] = accs[t * CPT + r]; }
#include "common/gemvlanes.wgsl" (R=r)
    workgroupBarrier();
  }
  for (var r = HC; r < CPT; r++) {
    let n = n0 + (r - HC) * CSTEP;
    var acc: array<f32, TMAX>;
    for (var t = 0u; t < TMAX; t++) { acc[t] = accs[t * CPT + r]; }
#include "common/gemvlanes.wgsl" (R=r, WI=1, WN=p.N1)
    workgroupBarrier();
  }
#else
  for (var r = 0u; r < CPT; r++) {
    let n = n0 + r * CSTEP;
    var acc: array<f32, TMAX>;
    for (var t = 0u; t < TMAX; t++) { acc[t] = accs[t * CPT + r]; }
#include "common/gemvlanes.wgsl" (R=r)
    if (CPT > 1u) { workgroupBarrier(); }
  }
#endif
