// One thread's columns of shaders/gemv.wgsl gemv_rows for the weight w{{WI}} of {{WN}} rows, a
// template: #include "common/gemvblocks.wgsl" (WI=suffix, WN=rows); the includer defines n0 (see
// common/gemvweight.wgsl for WI). Stores through store{{WI}}.
  if (n0 >= {{WN}}) { return; }
  let m0 = wid.z * TMAX;
  let nm = min(TMAX, p.M - m0);
  let xr = p.K / 4u; // vec4 per row of x
  let blocks = p.K / BE;
  // Columns past N read column N - 1 (never stored): no branch in the loop.
  let base0 = n0 * blocks;
#if COLS > 1
  let base1 = min(n0 + 64u, {{WN}} - 1u) * blocks;
#endif
#if COLS > 2
  let base2 = min(n0 + 128u, {{WN}} - 1u) * blocks;
  let base3 = min(n0 + 192u, {{WN}} - 1u) * blocks;
#endif
#include "common/gemvrows.wgsl" (WHAT=acc, T=0)
#if TMAX > 1
#include "common/gemvrows.wgsl" (WHAT=acc, T=1)
#endif
#if TMAX > 2
#include "common/gemvrows.wgsl" (WHAT=acc, T=2)
#include "common/gemvrows.wgsl" (WHAT=acc, T=3)
#endif
#if TMAX > 4
#include "common/gemvrows.wgsl" (WHAT=acc, T=4)
#include "common/gemvrows.wgsl" (WHAT=acc, T=5)
#include "common/gemvrows.wgsl" (WHAT=acc, T=6)
#include "common/gemvrows.wgsl" (WHAT=acc, T=7)
#endif
  for (var j = 0u; j < blocks; j++) {
    let xo = j * (BE / 4u);
    let b0 = w{{WI}}[base0 + j];
    let s0 = blockScale{{WI}}(base0 + j);
#if COLS > 1
    let b1 = w{{WI}}[base1 + j];
    let s1 = blockScale{{WI}}(base1 + j);
#endif
#if COLS > 2
    let b2 = w{{WI}}[base2 + j];
    let s2 = blockScale{{WI}}(base2 + j);
    let b3 = w{{WI}}[base3 + j];
    let s3 = blockScale{{WI}}(base3 + j);
#endif
#include "common/gemvpart.wgsl" (C=0)
#if WEIGHTS == q4
#include "common/gemvpart.wgsl" (C=1)
#include "common/gemvpart.wgsl" (C=2)
#include "common/gemvpart.wgsl" (C=3)
#endif
  }
#include "common/gemvrows.wgsl" (WHAT=store, T=0)
#if TMAX > 1
#include "common/gemvrows.wgsl" (WHAT=store, T=1)
#endif
#if TMAX > 2
#include "common/gemvrows.wgsl" (WHAT=store, T=2)
#include "common/gemvrows.wgsl" (WHAT=store, T=3)
#endif
#if TMAX > 4
#include "common/gemvrows.wgsl" (WHAT=store, T=4)
#include "common/gemvrows.wgsl" (WHAT=store, T=5)
#include "common/gemvrows.wgsl" (WHAT=store, T=6)
#include "common/gemvrows.wgsl" (WHAT=store, T=7)
#endif
