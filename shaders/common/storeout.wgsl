// store{{WI}}(o, v): out{{WI}}[o] (+)= p.scale * v as p.accumulate says, a template:
//   #include "common/storeout.wgsl" (WI=suffix)   (out, or out1, out2 of a kernel over several weights)
fn store{{WI}}(o: u32, v: f32) {
  if (p.accumulate != 0u) { out{{WI}}[o] = out{{WI}}[o] + p.scale * v; } else { out{{WI}}[o] = p.scale * v; }
}
