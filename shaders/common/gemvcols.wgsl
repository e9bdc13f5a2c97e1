// The unrolled rows of shaders/gemv.wgsl gemv_cols, a template:
//   #include "common/gemvcols.wgsl" (WHAT=acc|fma|store, T=row)
// Accumulators lo{T}, hi{T} hold row m0 + T of a times the thread's 8 output columns (split as
// colPart splits them). Spelt out, never looped over: see common/gemvrows.wgsl.
#if WHAT == acc
let x{{T}} = min(m0 + {{T}}u, p.M - 1u) * xr; // rows past M read row M - 1, never stored
var lo{{T}} = vec4f(0.0);
var hi{{T}} = vec4f(0.0);
#elif WHAT == fma
{
  let xv = a[x{{T}} + xk]; // a at rows k .. k + 3 of w
  lo{{T}} += q0.lo * xv.x + q1.lo * xv.y + q2.lo * xv.z + q3.lo * xv.w;
  hi{{T}} += q0.hi * xv.x + q1.hi * xv.y + q2.hi * xv.z + q3.hi * xv.w;
}
#else
if ({{T}}u < nm) {
  colStore(ob + (m0 + {{T}}u) * p.N, Pair(lo{{T}}, hi{{T}}));
}
#endif
