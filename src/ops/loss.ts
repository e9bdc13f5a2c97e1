// Loss ops for LoRA training (docs/ENGINE.md, Training additions): log-softmax at the targets
// and its backward. Each checks its sizes, then encodes into gpu's pending encoder.
// Argument order (llm.c): outputs/gradients, saved tensors, inputs/weights, sizes.

import type { Gpu } from '../gpu/device.ts';
import { ELEMS_PER_WG, check, checkSize, opKernel, subgroupDefines, useSubgroups } from './common.ts';

/**
 * logp (R) f32 = logits[r, targets[r]] - lse[r] ; lse (R) f32 = logsumexp(logits[r, :]), saved
 * for the backward ; logits (R, V) f32 ; targets (R) u32 (< V, else logp[r] is NaN).
 */
export function logSoftmaxGather(
  gpu: Gpu,
  logp: GPUBuffer,
  lse: GPUBuffer,
  logits: GPUBuffer,
  targets: GPUBuffer,
  R: number,
  V: number,
): void {
  check(V >= 1, () => `logSoftmaxGather: V=${V}`);
  checkSize(logp, R * 4, 'logSoftmaxGather logp');
  checkSize(lse, R * 4, 'logSoftmaxGather lse');
  checkSize(logits, R * V * 4, 'logSoftmaxGather logits');
  checkSize(targets, R * 4, 'logSoftmaxGather targets');
  check(R * V < 2 ** 32, 'logSoftmaxGather: R*V overflows u32 indexing');
  check(logp !== lse, 'logSoftmaxGather: logp and lse must differ');
  if (R === 0) return;
  // A whole vocabulary row per workgroup; small rows need few threads (fewer tree levels).
  // Subgroup reduction when the device has `subgroups` (shaders/loss.wgsl), else a shared-memory tree.
  const WG = V >= 8192 ? 256 : 64;
  gpu.dispatch(
    opKernel(gpu, 'logSoftmaxGather', 'loss', 'log_softmax_gather', subgroupDefines(useSubgroups(gpu)), { WG }),
    [logp, lse, logits, targets],
    R,
    [R, V],
  );
}

/**
 * dlogits (R, V) f32 = dlogp[r] * (onehot(targets[r]) - exp(logits[r, v] - lse[r])), overwritten
 * (not accumulated: the logits are a fresh activation) ; dlogp, lse (R) f32 ; targets (R) u32
 */
export function logSoftmaxBackward(
  gpu: Gpu,
  dlogits: GPUBuffer,
  dlogp: GPUBuffer,
  logits: GPUBuffer,
  lse: GPUBuffer,
  targets: GPUBuffer,
  R: number,
  V: number,
): void {
  checkSize(dlogits, R * V * 4, 'logSoftmaxBackward dlogits');
  checkSize(dlogp, R * 4, 'logSoftmaxBackward dlogp');
  checkSize(logits, R * V * 4, 'logSoftmaxBackward logits');
  checkSize(lse, R * 4, 'logSoftmaxBackward lse');
  checkSize(targets, R * 4, 'logSoftmaxBackward targets');
  check(R * V < 2 ** 32, 'logSoftmaxBackward: R*V overflows u32 indexing');
  check(dlogits !== logits, 'logSoftmaxBackward: dlogits and logits must differ');
  gpu.dispatch(
    gpu.kernel('loss', 'log_softmax_backward', {}, { WG: ELEMS_PER_WG }),
    [dlogits, dlogp, logits, lse, targets],
    Math.ceil((R * V) / ELEMS_PER_WG),
    [R, V],
  );
}
