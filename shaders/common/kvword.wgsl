// Words of the paged KV cache (docs/ENGINE.md, "KV cache") for the KV define (f32 | f16; f32 words
// when undefined): f32, or two f16 per u32 (element 2k in the low half), written rounded to nearest
// even in integer arithmetic (pack2x16float's rounding is unspecified) and saturated at +-65504.
// Shared by shaders/attention.wgsl kv_write and shaders/rope.wgsl qk_norm_rope, so both round alike.
#if defined(KV) && KV == f16
#include "common/f16.wgsl"
alias KvWord = u32; // two f16 elements
const KV_PER_WORD = 2u;
// f16 bits of x, saturated at +-65504 instead of inf (a cached key or value never becomes inf).
fn f16Bits(x: f32) -> u32 {
  let h = f32ToF16(x);
  return select(h, (h & 0x8000u) | 0x7bffu, (h & 0x7fffu) == 0x7c00u);
}
// Elements 2k (low half) and 2k + 1 (high half) of one cache word.
fn packKv(lo: f32, hi: f32) -> u32 { return f16Bits(lo) | (f16Bits(hi) << 16u); }
#else
alias KvWord = f32;
const KV_PER_WORD = 1u;
#endif
const UNMAPPED = 0xffffffffu; // a page-table entry with no page
