// The bindings of shaders/gemv.wgsl define NEXTA (the next group's LoRA A partial sums), a template:
//   #include "common/nexta.wgsl" (AT=first binding)
// nextA (nextR, N) f32 at AT; with define NEXTA2, nextA and nextA1 of nextR / 2 rows each at AT and
// AT + 1; then the next norm's weights and the partial sums.
@group(0) @binding({{AT}}) var<storage, read> nextA: array<f32>;
#ifdef NEXTA2
@group(0) @binding({{AT}} + 1) var<storage, read> nextA1: array<f32>;
@group(0) @binding({{AT}} + 2) var<storage, read> nextNormW: array<u32>; // (N) bf16, two per u32
@group(0) @binding({{AT}} + 3) var<storage, read_write> nextParts: array<f32>; // (groups, M, nextR)
#else
@group(0) @binding({{AT}} + 1) var<storage, read> nextNormW: array<u32>; // (N) bf16, two per u32
@group(0) @binding({{AT}} + 2) var<storage, read_write> nextParts: array<f32>; // (groups, M, nextR)
#endif
