// Optimizer ops (docs/ENGINE.md, Training additions): the global grad norm and AdamW. One cached
// scratch buffer per Gpu for the sum-of-squares partials; otherwise no allocation.

import type { Gpu } from '../gpu/device.ts';
import { f32 } from '../gpu/launch.ts';
import { ELEMS_PER_WG, check, checkSize } from './common.ts';

// ---- 2. global grad norm -------------------------------------------------------------------

/** Workgroups (= partials) of the first stage; each covers >= 16 elements per thread. */
const SUMSQ_MAX_PARTIALS = 256;
const SUMSQ_MIN_PER_WG = 256 * 16;

const partialsCache = new WeakMap<Gpu, GPUBuffer>();

function partialsBuffer(gpu: Gpu): GPUBuffer {
  let buf = partialsCache.get(gpu);
  if (!buf) {
    buf = gpu.createBuffer(SUMSQ_MAX_PARTIALS * 4, 'sumSquares.partials'); // (P) f32 scratch
    partialsCache.set(gpu, buf);
  }
  return buf;
}

/**
 * out[outIndex] += sum(x^2) ; out (M) f32 ; x (n) f32. If x holds a NaN or Inf (or the sum
 * overflows), out[outIndex] becomes NaN and stays NaN through later calls: the caller checks
 * the total for finiteness before clipping and skips the step.
 */
export function sumSquares(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, n: number, outIndex: number): void {
  check(Number.isInteger(outIndex) && outIndex >= 0, () => `sumSquares: outIndex ${outIndex}`);
  checkSize(out, (outIndex + 1) * 4, 'sumSquares out');
  checkSize(x, n * 4, 'sumSquares x');
  check(out !== x, 'sumSquares: out and x must differ');
  check(n < 2 ** 32 - SUMSQ_MAX_PARTIALS * 256, 'sumSquares: n overflows u32 indexing');
  if (n === 0) return;
  const P = Math.min(SUMSQ_MAX_PARTIALS, Math.ceil(n / SUMSQ_MIN_PER_WG));
  const partials = partialsBuffer(gpu);
  // Dispatches in one pass are ordered, so later calls may reuse the scratch buffer.
  gpu.dispatch(gpu.kernel('optim', 'sum_squares_partial'), [partials, x], [P], [n, P]);
  gpu.dispatch(gpu.kernel('optim', 'sum_squares_finish'), [out, partials], [1], [P, outIndex]);
}

// ---- 3. AdamW ------------------------------------------------------------------------------

export interface AdamWHyper {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
  /** 1-based step count (bias correction uses beta^step). */
  step: number;
  /** Multiplies the raw gradient: grad-norm clip factor times 1/accumulation steps. */
  gradScale: number;
}

/**
 * One torch.optim.AdamW step in place: param, m, v (n) f32 ; grad (n) f32 (read only; zeroing is
 * the caller's gpu.clear). param *= 1 - lr*wd, then param -= lr * mhat / (sqrt(vhat) + eps).
 */
export function adamw(
  gpu: Gpu,
  param: GPUBuffer,
  grad: GPUBuffer,
  m: GPUBuffer,
  v: GPUBuffer,
  n: number,
  hp: AdamWHyper,
): void {
  for (const [name, buf] of [
    ['param', param],
    ['grad', grad],
    ['m', m],
    ['v', v],
  ] as const)
    checkSize(buf, n * 4, () => `adamw ${name}`);
  check(new Set([param, grad, m, v]).size === 4, 'adamw: param, grad, m and v must be four buffers');
  check(Number.isInteger(hp.step) && hp.step >= 1, () => `adamw: step ${hp.step} must be an integer >= 1`);
  check(
    hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1,
    () => `adamw: betas ${hp.beta1}, ${hp.beta2} outside [0, 1)`,
  );
  check(
    hp.lr >= 0 && hp.eps > 0 && hp.weightDecay >= 0,
    () => `adamw: bad lr ${hp.lr}, eps ${hp.eps} or weightDecay ${hp.weightDecay}`,
  );
  check(Number.isFinite(hp.gradScale), () => `adamw: gradScale ${hp.gradScale} is not finite`);
  if (n === 0) return;
  // Host-side f64 like PyTorch's Python scalars; (1 - beta) in f64 keeps 1 - 0.999 exact to f32.
  const bias1 = 1 - hp.beta1 ** hp.step;
  const bias2 = 1 - hp.beta2 ** hp.step;
  gpu.dispatch(gpu.kernel('optim', 'adamw_step'), [param, m, v, grad], Math.ceil(n / ELEMS_PER_WG), [
    n,
    f32(hp.beta1),
    f32(1 - hp.beta1),
    f32(hp.beta2),
    f32(1 - hp.beta2),
    f32(hp.eps),
    f32(1 - hp.lr * hp.weightDecay),
    f32(hp.lr / bias1),
    f32(Math.sqrt(bias2)),
    f32(hp.gradScale),
  ]);
}
