// Word by word over a weight tensor read through common/weights.wgsl (include that first):
// unpackWord(wi) decodes word wi (EPW elements) once into a Word, a vector type, so no array has
// to live in memory (SwiftShader keeps function-scope arrays in memory and pays for every
// access); wordDot(v, i) is its dot product with EPW inputs from element i, read through the
// including shader's fn wordInput(i: u32) -> f32.
#if WEIGHTS == bf16
alias Word = vec2f;
fn wordDot(v: Word, i: u32) -> f32 { return dot(v, vec2f(wordInput(i), wordInput(i + 1u))); }
#elif WEIGHTS == q4
struct Word { lo: vec4f, hi: vec4f } // elements 0..3 and 4..7
fn wordDot(v: Word, i: u32) -> f32 {
  let x0 = vec4f(wordInput(i), wordInput(i + 1u), wordInput(i + 2u), wordInput(i + 3u));
  let x1 = vec4f(wordInput(i + 4u), wordInput(i + 5u), wordInput(i + 6u), wordInput(i + 7u));
  return dot(v.lo, x0) + dot(v.hi, x1);
}
#elif WEIGHTS == f32
alias Word = f32;
fn wordDot(v: Word, i: u32) -> f32 { return v * wordInput(i); }
#endif
#include "common/wordat.wgsl" (WI=)
