// The partial sums of a LoRA A product begun in shaders/gemv.wgsl's gemv_lanes(_group) after its
// stores (defines NEXTA and PAIR), a template:
//   #include "common/colpartials.wgsl" (NAME=function, W=columns a workgroup, VAL=value function)
// defines NAME(g, lid): workgroup g's sums over its columns n of [g W, g W + W) (to p.N) of
// VAL(t, i, n), for each row t of x and row i of the A product (p.nextR rows), into nextParts at
// (g, t, i). VAL reads only what this workgroup stored (storageBarrier), so nothing waits across
// workgroups. Each (t, i) by P threads, P the most (a power of two) that fit 256 threads and the
// columns, their sums added in red. Holds barriers: call it in uniform control flow.
fn {{NAME}}(g: u32, lid: u32) {
  storageBarrier(); // this workgroup's stores are visible to all its threads
  workgroupBarrier(); // and red's last reads are done
  let c0 = g * {{W}};
  let nc = min({{W}}, p.N - c0);
  let pairs = p.M * p.nextR;
  var P = 1u;
  while (P * 2u * pairs <= 256u && P * 2u <= nc) { P *= 2u; }
  let per = 256u / P; // pairs a round
  let q0 = lid / P;
  let sl = lid % P;
  for (var base = 0u; base < pairs; base += per) {
    let q = base + q0;
    var s = 0.0;
    if (q < pairs) {
      let t = q / p.nextR;
      let i = q - t * p.nextR;
      for (var c = sl; c < nc; c += P) { s += {{VAL}}(t, i, c0 + c); }
    }
    red[lid] = s;
    workgroupBarrier();
    if (q < pairs && sl == 0u) {
      var tot = 0.0;
      for (var j = 0u; j < P; j++) { tot += red[lid + j]; }
      nextParts[g * pairs + q] = tot;
    }
    workgroupBarrier();
  }
}
