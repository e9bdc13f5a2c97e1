// The LoRA branch of weight w{{WI}} ({{WN}} rows) of shaders/gemv.wgsl (define LORA), a template:
//   #include "common/loraterm.wgsl" (WI=suffix, WN=rows, AT=binding)
// binds loraU{{WI}} (M, loraR) at AT and loraB{{WI}} ({{WN}}, loraR) at AT + 1, and defines
// loraTerm{{WI}}(o) for output o = t {{WN}} + n: p.loraScale * sum_j u[t, j] B[n, j], which
// store{{WI}} (common/storeout.wgsl) adds. With BJ (shaders/matmul.wgsl gemm_tiled's input
// gradient, BT): B[n, j] is loraB[j BJ + n], the branch's A (loraR, BJ) read across its rows.
// With UPART (shaders/gemv.wgsl gemv_lanes, one weight): loraU holds u's partial sums, and the
// sum reads u from uw, where gatherU added them up.
#ifdef BAT
// Or, u from a producer's partial sums (gemv.wgsl UPART without LORAPACK), each weight its own B:
//   #include "common/loraterm.wgsl" (WI=suffix, WN=rows, BAT=binding, US=row stride, UO=column)
// binds loraB{{WI}} ({{WN}}, loraR) at BAT and sums over uw (M, US) from column UO, times the
// row's rstd.
@group(0) @binding({{BAT}}) var<storage, read> loraB{{WI}}: array<f32>;

fn loraTerm{{WI}}(o: u32) -> f32 {
  let t = o / {{WN}};
  let n = o - t * {{WN}};
  let u0 = t * ({{US}}) + {{UO}};
  var s = 0.0;
  for (var j = 0u; j < p.loraR; j++) { s += uw[u0 + j] * loraB{{WI}}[n * p.loraR + j]; }
  return p.loraScale * (rowScale[t] * s);
}
#elif defined(AT)
@group(0) @binding({{AT}}) var<storage, read> loraU{{WI}}: array<f32>;
@group(0) @binding({{AT}} + 1) var<storage, read> loraB{{WI}}: array<f32>;

fn loraTerm{{WI}}(o: u32) -> f32 {
  let t = o / {{WN}};
  let n = o - t * {{WN}};
  var s = 0.0;
#ifdef BJ
  for (var j = 0u; j < p.loraR; j++) { s += loraU{{WI}}[t * p.loraR + j] * loraB{{WI}}[j * ({{BJ}}) + n]; }
#elif defined(UPART)
  // u summed from its A product's partials into uw (gemv.wgsl UPART, one weight)
  for (var j = 0u; j < p.loraR; j++) { s += uw[t * p.loraR + j] * loraB{{WI}}[n * p.loraR + j]; }
#else
  for (var j = 0u; j < p.loraR; j++) { s += loraU{{WI}}[t * p.loraR + j] * loraB{{WI}}[n * p.loraR + j]; }
#endif
  return p.loraScale * s;
}
#else
// Or, a group's branches packed (define LORAPACK), without AT:
//   #include "common/loraterm.wgsl" (WI=suffix, WN=rows, US=row stride, UO=column, BO=row)
// the same sum over the kernel's shared loraU (M, US) from column UO and loraB from row BO (with
// define UPART, over uw: u gathered from partial sums, times the row's rstd).
fn loraTerm{{WI}}(o: u32) -> f32 {
  let t = o / {{WN}};
  let n = o - t * {{WN}};
  let u0 = t * ({{US}}) + {{UO}};
  let b0 = ({{BO}} + n) * p.loraR;
  var s = 0.0;
#ifdef UPART
  // u summed from a producer's partials into uw, of the row before its rstd (gemv.wgsl UPART).
  for (var j = 0u; j < p.loraR; j++) { s += uw[u0 + j] * loraB[b0 + j]; }
  return p.loraScale * (rowScale[t] * s);
#else
  for (var j = 0u; j < p.loraR; j++) { s += loraU[u0 + j] * loraB[b0 + j]; }
  return p.loraScale * s;
#endif
}
#endif
