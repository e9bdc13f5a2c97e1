// The invocation's place in its workgroup, with the subgroup builtins when the SUBGROUPS variant
// is built (the device has the `subgroups` feature). Used by common/reduce.wgsl.
struct Lanes {
  @builtin(local_invocation_index) lid: u32,
#ifdef SUBGROUPS
  @builtin(subgroup_size) sgSize: u32,
  @builtin(subgroup_invocation_id) sgLane: u32,
#endif
}
