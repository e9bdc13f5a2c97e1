// The end of shaders/matmul.wgsl matmul_gemv for the weight w{{WI}} of {{WN}} rows, a template:
//   #include "common/gemvlanes.wgsl" (WI=suffix, WN=rows, AT=offset + )
// Reduces each column's LANES partials acc (of column n, lane `lane`, slot `col` of the
// workgroup's 256 / LANES; red holds TMAX * 256 floats) and stores the sums through store{{WI}},
// AT elements further on (empty, or gemv_lanes' split over K: `wid.z * p.splitStride + `,
// common/gemvstaged.wgsl). Holds workgroup barriers: include it in uniform control flow.
#ifdef SUBGROUPS
  // A column's LANES threads are consecutive invocations (subgroups packed in
  // local_invocation_index order), so a subgroupShuffleXor butterfly over span = min(LANES,
  // subgroup size) lanes sums the partials in registers; the first lane of each span stores its
  // sum and one shared-memory step adds the LANES / span sums of a column.
  let span = min(LANES, sgSize);
  for (var m = span / 2u; m > 0u; m >>= 1u) {
    for (var t = 0u; t < TMAX; t++) { acc[t] += subgroupShuffleXor(acc[t], m); }
  }
  let parts = LANES / span;
  if (lane % span == 0u) {
    for (var t = 0u; t < TMAX; t++) { red[(t * (256u / LANES) + col) * LANES + lane / span] = acc[t]; }
  }
  workgroupBarrier();
  if (n < {{WN}}) {
    for (var t = lane; t < p.M; t += LANES) {
      var s = 0.0;
      for (var j = 0u; j < parts; j++) { s += red[(t * (256u / LANES) + col) * LANES + j]; }
      store{{WI}}({{AT}}t * {{WN}} + n, s);
    }
  }
#else
  // Shared-memory tree over each column's LANES partials.
  for (var t = 0u; t < TMAX; t++) { red[(t * (256u / LANES) + col) * LANES + lane] = acc[t]; }
  workgroupBarrier();
  for (var s = LANES / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      for (var t = 0u; t < TMAX; t++) {
        let i = (t * (256u / LANES) + col) * LANES + lane;
        red[i] += red[i + s];
      }
    }
    workgroupBarrier();
  }
  // Lane l writes rows l, l + LANES, ... of this column.
  if (n < {{WN}}) {
    for (var t = lane; t < p.M; t += LANES) { store{{WI}}({{AT}}t * {{WN}} + n, red[(t * (256u / LANES) + col) * LANES]); }
  }
#endif
