// The linear workgroup id of a 1-D count split over an (x, y) grid (src/gpu/launch.ts splitGrid);
// callers skip ids past their count.
fn linearGroup(wid: vec3u, nwg: vec3u) -> u32 { return wid.x + wid.y * nwg.x; }
