// The linear workgroup id of a 1-D count split over an (x, y) grid (src/gpu/launch.ts splitGrid);
// callers skip ids past their count.
fn linearGroup(wid: vec3u, nwg: vec3u) -> u32 { return wid.x + wid.y * nwg.x; }

// An invocation of a one-thread-per-element dispatch (256-thread workgroups over a split grid).
struct ElementThread {
  @builtin(workgroup_id) wid: vec3u,
  @builtin(num_workgroups) nwg: vec3u,
  @builtin(local_invocation_index) lid: u32,
}
fn elementIndex(th: ElementThread) -> u32 { return linearGroup(th.wid, th.nwg) * 256u + th.lid; }
