// Row gather: out[r, :] = table[rows[r], :] as f32, the table in the WEIGHTS format
// (common/weights.wgsl): the token embedding (bf16 or q4, rows = token ids) and the pick of the
// rows that reach the LM head (f32 activations). One thread per output element.
// PICK: the row of output r is rows[pick[r]], so a decode step embeds the ids the previous
// step sampled on the GPU (pick: which sampled row feeds each token) with no readback.

struct GatherParams {
  R: u32, // output rows
  C: u32, // row length
  V: u32, // table rows (sizes the q4 scales)
}

@group(0) @binding(0) var<uniform> p: GatherParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (R, C) f32
@group(0) @binding(2) var<storage, read> rows: array<u32>;      // (R) u32, each < V
@group(0) @binding(3) var<storage, read> w: array<u32>;         // (V, C) table, WEIGHTS format
#ifdef PICK
@group(0) @binding(4) var<storage, read> pick: array<u32>;      // (R) u32, indices into rows
fn rowOf(r: u32) -> u32 { return rows[pick[r]]; }
#else
fn rowOf(r: u32) -> u32 { return rows[r]; }
#endif

#include "common/grid.wgsl"
fn q4ScaleBase() -> u32 { return (p.V * p.C) >> 3u; }
#include "common/weights.wgsl"

@compute @workgroup_size(256)
fn gather_rows(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.R * p.C) { return; }
  let r = i / p.C;
  out[i] = weightAt(rowOf(r) * p.C + (i - r * p.C));
}

#ifdef SCATTER
// Row scatter with a scale a row (define SCATTER, WEIGHTS f32; src/ops/forward.ts scatterRowsScaled):
// out[rows[r], :] = scale[r] * w[r, :], out (p.V, C): the LM head's input gradient, kept per
// target row by the forward, into the residual stream's rows (src/train/trainingPass.ts). A row
// index past p.V writes nothing. Rows not named keep their contents.
@group(0) @binding(4) var<storage, read> scale: array<f32>; // (R) f32

@compute @workgroup_size(256)
fn scatter_rows_scaled(th: ElementThread) {
  let i = elementIndex(th);
  if (i >= p.R * p.C) { return; }
  let r = i / p.C;
  let row = rows[r];
  if (row >= p.V) { return; }
  out[row * p.C + (i - r * p.C)] = scale[r] * weightAt(i);
}
#endif
