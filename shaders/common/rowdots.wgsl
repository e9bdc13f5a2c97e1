// rowDots{{WI}}: shaders/matmul.wgsl's row dot products over the weight binding w{{WI}}, a template:
//   #include "common/rowdots.wgsl" (WI=suffix)   (see common/weightat.wgsl for WI)
// This thread's dot products of B's row n (row-major, stride R) with TMAX rows of A from m0:
// word by word when R is a multiple of EPW, element by element otherwise. `first`, `step`: the
// words (elements) of the row this thread takes.
fn rowDots{{WI}}(n: u32, m0: u32, nm: u32, first: u32, step: u32) -> array<f32, TMAX> {
  var acc: array<f32, TMAX>;
  if (p.R % EPW == 0u) {
    let words = p.R / EPW;
    let wbase = n * words;
    for (var j = first; j < words; j += step) {
      let wv = unpackWord{{WI}}(wbase + j);
      for (var t = 0u; t < TMAX; t++) {
        if (t < nm) {
          let ai = (m0 + t) * p.R + EPW * j;
          acc[t] += wordDot(wv, ai);
        }
      }
    }
  } else {
    let wbase = n * p.R;
    for (var k = first; k < p.R; k += step) {
      let wk = weightAt{{WI}}(wbase + k);
      for (var t = 0u; t < TMAX; t++) {
        if (t < nm) { acc[t] += a[(m0 + t) * p.R + k] * wk; }
      }
    }
  }
  return acc;
}
