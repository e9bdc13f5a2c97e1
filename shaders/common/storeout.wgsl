// store{{WI}}(o, v): out{{WI}}[o] (+)= p.scale * v as p.accumulate says, a template:
//   #include "common/storeout.wgsl" (WI=suffix)   (out, or out1, out2 of a kernel over several weights)
#ifdef LORA
// With define LORA (shaders/gemv.wgsl): the LoRA branch's B product (common/loraterm.wgsl) added
// after the sum is stored, as a separate product accumulating into out would add it.
fn store{{WI}}(o: u32, v: f32) {
  var y = p.scale * v;
  if (p.accumulate != 0u) { y = out{{WI}}[o] + y; }
  out{{WI}}[o] = y + loraTerm{{WI}}(o);
}
#else
fn store{{WI}}(o: u32, v: f32) {
  if (p.accumulate != 0u) { out{{WI}}[o] = out{{WI}}[o] + p.scale * v; } else { out{{WI}}[o] = p.scale * v; }
}
#endif
