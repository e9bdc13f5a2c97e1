// Backward ops of the Qwen3 model and LoRA (docs/ENGINE.md, Training additions). Each adds into
// its gradient buffers (zeroing is the caller's gpu.clear). Argument order (llm.c): gradients,
// saved tensors, inputs/weights, sizes.
import type { Gpu } from '../gpu/device.ts';
import { f32 } from '../gpu/launch.ts';
import {
  ATTENTION_BINDINGS,
  ELEMS_PER_WG,
  bf16Bytes,
  bindings,
  check,
  checkSize,
  checkWeight,
  distinct,
  opKernel,
  subgroupDefines,
  tuning,
  useSubgroups,
  weightFormat,
  type Weight,
} from './common.ts';
import {
  attentionTiledBackward,
  attentionTiledLse,
  attentionVariant,
  treeAttentionSupported,
} from './attentionTiled.ts';
import { fusions, gemm, rotate, type LoraEpilogue } from './forward.ts';

/** dx (R, D) += d/dx of rmsNorm given dy (R, D) ; x (R, D) f32 ; w (D) bf16 frozen (no dw) */
export function rmsNormBackward(
  gpu: Gpu,
  dx: GPUBuffer,
  dy: GPUBuffer,
  x: GPUBuffer,
  w: GPUBuffer,
  R: number,
  D: number,
  eps: number,
): void {
  checkSize(dx, R * D * 4, 'rmsNormBackward dx');
  checkSize(dy, R * D * 4, 'rmsNormBackward dy');
  checkSize(x, R * D * 4, 'rmsNormBackward x');
  checkSize(w, bf16Bytes(D), 'rmsNormBackward w');
  distinct('rmsNormBackward', dx, dy, x);
  const WG = D <= 512 ? 64 : 256;
  gpu.dispatch(
    opKernel(gpu, 'rmsNormBackward', 'rmsnorm', 'rmsnorm_backward', subgroupDefines(useSubgroups(gpu)), { WG }),
    [dx, x, w, dy],
    R,
    [R, D, f32(eps)],
  );
}

/** dx (T, K) f32 (+)= dy (T, N) f32 . w (N, K) ; w bf16 or q4 (dequantized on the fly) */
export function matmulBackwardInput(
  gpu: Gpu,
  dx: GPUBuffer,
  dy: GPUBuffer,
  w: Weight,
  T: number,
  N: number,
  K: number,
  accumulate = true,
  lora?: LoraEpilogue,
): void {
  checkSize(dx, T * K * 4, 'matmulBackwardInput dx');
  checkSize(dy, T * N * 4, 'matmulBackwardInput dy');
  const wb = checkWeight(w, N, K, 'matmulBackwardInput w');
  if (!lora) {
    gemm(gpu, 'matmulBackwardInput', dx, dy, wb, weightFormat(w), T, K, N, [N, 1, 1, K], accumulate, 1);
    return;
  }
  // The LoRA branch's part, dx += scale * du (T, r) . A (r, K) (lora.u = du, lora.B = the A
  // matrix): in gemm_tiled's store (tuning.loraFold; shaders/matmul.wgsl LORA with BT), else after.
  check(
    Number.isInteger(lora.r) && lora.r >= 1,
    () => `matmulBackwardInput: LoRA rank must be a positive integer (got ${lora.r})`,
  );
  checkSize(lora.u, T * lora.r * 4, 'matmulBackwardInput lora du');
  checkSize(lora.B, lora.r * K * 4, 'matmulBackwardInput lora A');
  distinct('matmulBackwardInput', dx, lora.u, lora.B);
  const separate = () => matmulBackwardInputF32(gpu, dx, lora.u, lora.B, T, lora.r, K, true, lora.scale);
  const fold = tuning.loraFold !== 'off' && fusions.enabled;
  const op = fold ? 'matmulBackwardInputLora' : 'matmulBackwardInput';
  gemm(
    gpu,
    op,
    dx,
    dy,
    wb,
    weightFormat(w),
    T,
    K,
    N,
    [N, 1, 1, K],
    accumulate,
    1,
    fold ? { ...lora, separate } : undefined,
  );
  if (!fold) separate();
}

/** dx (T, K) f32 (+)= scale * dy (T, N) f32 . w (N, K) f32 */
export function matmulBackwardInputF32(
  gpu: Gpu,
  dx: GPUBuffer,
  dy: GPUBuffer,
  w: GPUBuffer,
  T: number,
  N: number,
  K: number,
  accumulate = true,
  scale = 1,
): void {
  checkSize(dx, T * K * 4, 'matmulBackwardInputF32 dx');
  checkSize(dy, T * N * 4, 'matmulBackwardInputF32 dy');
  checkSize(w, N * K * 4, 'matmulBackwardInputF32 w');
  gemm(gpu, 'matmulBackwardInputF32', dx, dy, w, 'f32', T, K, N, [N, 1, 1, K], accumulate, scale);
}

/** dw (N, K) f32 += scale * dy^T (N, T) . x (T, K) ; the reduction runs over T */
export function matmulBackwardWeightF32(
  gpu: Gpu,
  dw: GPUBuffer,
  dy: GPUBuffer,
  x: GPUBuffer,
  T: number,
  N: number,
  K: number,
  scale = 1,
): void {
  checkSize(dw, N * K * 4, 'matmulBackwardWeightF32 dw');
  checkSize(dy, T * N * 4, 'matmulBackwardWeightF32 dy');
  checkSize(x, T * K * 4, 'matmulBackwardWeightF32 x');
  gemm(gpu, 'matmulBackwardWeightF32', dw, dy, x, 'f32', N, K, T, [1, N, 1, K], true, scale);
}

/** In place on dx (T, H, HD) f32: the transpose of rope, a rotation by -angle ; pos (T) u32 */
export function ropeBackward(
  gpu: Gpu,
  dx: GPUBuffer,
  pos: GPUBuffer,
  T: number,
  H: number,
  HD: number,
  theta: number,
): void {
  rotate(gpu, 'ropeBackward', 'rope_backward', dx, pos, T, H, HD, theta);
}

/** A tree's keyEnd buffer: T u32, and a GPU whose tiled kernels take it. */
function checkTree(gpu: Gpu, op: string, keyEnd: GPUBuffer, T: number, HD: number): void {
  checkSize(keyEnd, T * 4, () => `${op} keyEnd`);
  check(
    treeAttentionSupported(gpu, HD),
    () =>
      `${op}: a packed prefix tree (keyEnd) needs the tiled kernels (head_dim ${HD}) and 9 storage buffers per stage (this GPU: ${gpu.limits.maxStorageBuffersPerShaderStage})`,
  );
}

function checkTrainingAttention(op: string, T: number, NH: number, NKV: number, HD: number): void {
  check(HD <= 256, () => `${op}: HD=${HD} > 256`);
  check(NH % NKV === 0, () => `${op}: NH=${NH} not a multiple of NKV=${NKV}`);
  check(T * NH * HD < 2 ** 32, () => `${op}: sizes overflow u32 indexing`);
}

/**
 * Training path, one causal sequence (positions 0..T-1), no cache: out, q (T, NH, HD) f32 ;
 * k, v (T, NKV, HD) f32 ; lse (T, NH) f32 = log sum_j exp(q.k_j / sqrt(HD)), saved for the backward.
 * keyEnd (T) u32, a packed prefix tree (src/train/packing.ts): key j is visible to queries t with
 * j <= t < keyEnd[j] instead of every t >= j; it takes the tiled kernels (treeAttentionSupported).
 */
export function attentionForwardLse(
  gpu: Gpu,
  out: GPUBuffer,
  lse: GPUBuffer,
  q: GPUBuffer,
  k: GPUBuffer,
  v: GPUBuffer,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  keyEnd: GPUBuffer | null = null,
): void {
  checkTrainingAttention('attentionForwardLse', T, NH, NKV, HD);
  checkSize(out, T * NH * HD * 4, 'attentionForwardLse out');
  checkSize(lse, T * NH * 4, 'attentionForwardLse lse');
  checkSize(q, T * NH * HD * 4, 'attentionForwardLse q');
  checkSize(k, T * NKV * HD * 4, 'attentionForwardLse k');
  checkSize(v, T * NKV * HD * 4, 'attentionForwardLse v');
  if (keyEnd) checkTree(gpu, 'attentionForwardLse', keyEnd, T, HD);
  distinct('attentionForwardLse', out, lse, q, k, v, ...(keyEnd ? [keyEnd] : []));
  if (keyEnd || attentionVariant(gpu, T, HD, 'training') === 'tiled') {
    attentionTiledLse(gpu, out, lse, q, k, v, T, NH, NKV, HD, keyEnd);
    return;
  }
  gpu.dispatch(
    opKernel(gpu, 'attentionForwardLse', 'attention', 'attention_forward_lse'),
    bindings(ATTENTION_BINDINGS.attention_forward_lse, { out, q, k, v, lse }),
    T * NH,
    [T, NH, NKV, HD, T, f32(1 / Math.sqrt(HD))],
  );
}

/**
 * dq (T, NH, HD), dk, dv (T, NKV, HD) += gradients of attentionForwardLse given dout (T, NH, HD);
 * saved out (T, NH, HD) and lse (T, NH); probabilities are recomputed, never stored (T x T).
 * Encodes two dispatches and uses a pooled (T, NH) scratch buffer for D = rowsum(dout * out).
 */
export function attentionBackward(
  gpu: Gpu,
  dq: GPUBuffer,
  dk: GPUBuffer,
  dv: GPUBuffer,
  dout: GPUBuffer,
  out: GPUBuffer,
  lse: GPUBuffer,
  q: GPUBuffer,
  k: GPUBuffer,
  v: GPUBuffer,
  T: number,
  NH: number,
  NKV: number,
  HD: number,
  keyEnd: GPUBuffer | null = null,
): void {
  checkTrainingAttention('attentionBackward', T, NH, NKV, HD);
  if (keyEnd) checkTree(gpu, 'attentionBackward', keyEnd, T, HD);
  for (const [buf, n, what] of [
    [dq, NH, 'dq'],
    [dk, NKV, 'dk'],
    [dv, NKV, 'dv'],
    [dout, NH, 'dout'],
    [out, NH, 'out'],
    [q, NH, 'q'],
    [k, NKV, 'k'],
    [v, NKV, 'v'],
  ] as const)
    checkSize(buf, T * n * HD * 4, () => `attentionBackward ${what}`);
  checkSize(lse, T * NH * 4, 'attentionBackward lse');
  distinct('attentionBackward', dq, dk, dv, dout, out, lse, q, k, v, ...(keyEnd ? [keyEnd] : []));
  if (T === 0) return;
  const params = [T, NH, NKV, HD, T, f32(1 / Math.sqrt(HD))];
  const rowDot = gpu.createBuffer(T * NH * 4, 'attentionBackward.D'); // (T, NH) f32
  if (keyEnd || attentionVariant(gpu, T, HD, 'training') === 'tiled') {
    attentionTiledBackward(gpu, dq, dk, dv, dout, out, lse, q, k, v, rowDot, T, NH, NKV, HD, keyEnd);
    gpu.releaseBuffer(rowDot);
    return;
  }
  gpu.dispatch(
    opKernel(gpu, 'attentionBackward', 'attention', 'attention_backward_dq'),
    bindings(ATTENTION_BINDINGS.attention_backward_dq, { dq, q, k, v, dout, lse, D: rowDot, out }),
    T * NH,
    params,
  );
  gpu.dispatch(
    opKernel(gpu, 'attentionBackward.dkv', 'attention', 'attention_backward_dkv'),
    bindings(ATTENTION_BINDINGS.attention_backward_dkv, { dk, q, k, v, dout, lse, D: rowDot, dv }),
    T * NKV,
    params,
  );
  gpu.releaseBuffer(rowDot); // safe: later users of the recycled buffer are encoded after these reads
}

/** dgate, dup (n) f32 += gradients of out = silu(gate) * up given dout (n) f32 */
export function siluMulBackward(
  gpu: Gpu,
  dgate: GPUBuffer,
  dup: GPUBuffer,
  dout: GPUBuffer,
  gate: GPUBuffer,
  up: GPUBuffer,
  n: number,
): void {
  for (const [buf, what] of [
    [dgate, 'dgate'],
    [dup, 'dup'],
    [dout, 'dout'],
    [gate, 'gate'],
    [up, 'up'],
  ] as const) {
    checkSize(buf, n * 4, () => `siluMulBackward ${what}`);
  }
  distinct('siluMulBackward', dgate, dup, dout, gate, up);
  gpu.dispatch(
    gpu.kernel('elementwise', 'silu_mul_backward'),
    [dgate, gate, up, dup, dout],
    Math.ceil(n / ELEMS_PER_WG),
    [n],
  );
}

/** out (n) f32 += a (n) f32 */
export function add(gpu: Gpu, out: GPUBuffer, a: GPUBuffer, n: number): void {
  checkSize(out, n * 4, 'add out');
  checkSize(a, n * 4, 'add a');
  distinct('add', out, a);
  gpu.dispatch(gpu.kernel('elementwise', 'add_inplace'), [out, a], Math.ceil(n / ELEMS_PER_WG), [n]);
}
