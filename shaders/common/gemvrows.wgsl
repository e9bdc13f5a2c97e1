// The unrolled rows and columns of shaders/gemv.wgsl gemv_rows, a template:
//   #include "common/gemvrows.wgsl" (WHAT=acc|fma|store, T=row), inside common/gemvblocks.wgsl (WI, WN)
// Accumulator acc{T}_{c} holds row m0 + T of x times column n0 + 64 c, c < COLS. Everything is
// spelt out, never looped over: SwiftShader keeps indexed function arrays in memory, and a loop
// inside the block loop, even of one trip, costs it about 3x (per-lane loop masks).
#if WHAT == acc
let x{{T}} = min(m0 + {{T}}u, p.M - 1u) * xr; // rows past M read row M - 1, never stored
var acc{{T}}_0 = vec4f(0.0);
#if COLS > 1
var acc{{T}}_1 = vec4f(0.0);
#endif
#if COLS > 2
var acc{{T}}_2 = vec4f(0.0);
var acc{{T}}_3 = vec4f(0.0);
#endif
#elif WHAT == fma
{
  let xv = xsAt(x{{T}} + xc); // one read of x for the COLS columns
  acc{{T}}_0 += pairDot(q0, xv);
#if COLS > 1
  acc{{T}}_1 += pairDot(q1, xv);
#endif
#if COLS > 2
  acc{{T}}_2 += pairDot(q2, xv);
  acc{{T}}_3 += pairDot(q3, xv);
#endif
}
#else
if ({{T}}u < nm) {
  let o = (m0 + {{T}}u) * {{WN}} + n0;
  store{{WI}}(o, dot(acc{{T}}_0, vec4f(1.0)));
#if COLS > 1
  if (n0 + 64u < {{WN}}) { store{{WI}}(o + 64u, dot(acc{{T}}_1, vec4f(1.0))); }
#endif
#if COLS > 2
  if (n0 + 128u < {{WN}}) { store{{WI}}(o + 128u, dot(acc{{T}}_2, vec4f(1.0))); }
  if (n0 + 192u < {{WN}}) { store{{WI}}(o + 192u, dot(acc{{T}}_3, vec4f(1.0))); }
#endif
}
#endif
