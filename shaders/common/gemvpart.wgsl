// Part C of the COLS weight blocks b0.. (scales s0..) into every row of shaders/gemv.wgsl
// gemv_rows, a template: #include "common/gemvpart.wgsl" (C=part). See common/gemvrows.wgsl.
{
  let q0 = part(b0, s0, {{C}}u);
#if COLS > 1
  let q1 = part(b1, s1, {{C}}u);
#endif
#if COLS > 2
  let q2 = part(b2, s2, {{C}}u);
  let q3 = part(b3, s3, {{C}}u);
#endif
  let xc = xo + {{C}}u * (EPP / 4u);
#include "common/gemvrows.wgsl" (WHAT=fma, T=0)
#if TMAX > 1
#include "common/gemvrows.wgsl" (WHAT=fma, T=1)
#endif
#if TMAX > 2
#include "common/gemvrows.wgsl" (WHAT=fma, T=2)
#include "common/gemvrows.wgsl" (WHAT=fma, T=3)
#endif
#if TMAX > 4
#include "common/gemvrows.wgsl" (WHAT=fma, T=4)
#include "common/gemvrows.wgsl" (WHAT=fma, T=5)
#include "common/gemvrows.wgsl" (WHAT=fma, T=6)
#include "common/gemvrows.wgsl" (WHAT=fma, T=7)
#endif
}
