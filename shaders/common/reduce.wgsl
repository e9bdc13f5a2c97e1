// A workgroup-wide reduction, included as a template:
//   #include "common/reduce.wgsl" (NAME=sumF, T=f32, OP=Add, IDENTITY=0.0, SCRATCH=redF)
// defines fn NAME(v: T, l: Lanes) -> T, the OP (Add, Max or Min) of v over the workgroup, returned
// to every invocation. SCRATCH is a var<workgroup> array<T, WG>; WG is the including shader's
// workgroup size (an override). With SUBGROUPS: subgroup{{OP}}, lane 0 of each subgroup stores
// its result, every subgroup reduces those partials in the same lanes (subgroup id = lid / sgSize:
// subgroups packed in local_invocation_index order, as GPUs do; sgSize is uniform, so every
// subgroup op sits in uniform control flow). Without: a shared-memory tree, log2(WG) barriers.
// The trailing barrier keeps the next call from refilling SCRATCH while it is still being read.
#include "common/lanes.wgsl"

fn {{NAME}}(v: {{T}}, l: Lanes) -> {{T}} {
#ifdef SUBGROUPS
  let own = subgroup{{OP}}(v);
  if (l.sgLane == 0u) { {{SCRATCH}}[l.lid / l.sgSize] = own; }
  workgroupBarrier();
  var acc: {{T}} = {{IDENTITY}};
  for (var j = l.sgLane; j < (WG + l.sgSize - 1u) / l.sgSize; j += l.sgSize) {
#if OP == Add
    acc += {{SCRATCH}}[j];
#elif OP == Max
    acc = max(acc, {{SCRATCH}}[j]);
#else
    acc = min(acc, {{SCRATCH}}[j]);
#endif
  }
  let total = subgroup{{OP}}(acc);
#else
  {{SCRATCH}}[l.lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (l.lid < s) {
#if OP == Add
      {{SCRATCH}}[l.lid] += {{SCRATCH}}[l.lid + s];
#elif OP == Max
      {{SCRATCH}}[l.lid] = max({{SCRATCH}}[l.lid], {{SCRATCH}}[l.lid + s]);
#else
      {{SCRATCH}}[l.lid] = min({{SCRATCH}}[l.lid], {{SCRATCH}}[l.lid + s]);
#endif
    }
    workgroupBarrier();
  }
  let total = workgroupUniformLoad(&{{SCRATCH}}[0]);
#endif
  workgroupBarrier();
  return total;
}
