// Learning-rate schedules and the global grad-norm clip factor (pure TS).

/** The shape of the learning rate over steps; the peak lr itself lives in the optimizer settings. */
export type LrSchedule =
  /** The peak lr throughout, after an optional linear warmup. */
  | { kind: 'constant'; warmup?: number }
  /** Linear warmup to lr over `warmup` steps, then a half cosine from lr down to minLr at `total`. */
  | { kind: 'cosine'; warmup: number; total: number; minLr: number };

/** The learning rate of 1-based optimizer step `step` for peak `lr`; steps past `total` stay at minLr. */
export function learningRate(lr: number, schedule: LrSchedule, step: number): number {
  if (!Number.isInteger(step) || step < 1) throw new RangeError(`learningRate: step ${step} must be an integer >= 1`);
  const warmup = schedule.warmup ?? 0;
  if (!Number.isInteger(warmup) || warmup < 0) throw new RangeError(`learningRate: warmup ${warmup}`);
  if (step <= warmup) return (lr * step) / warmup; // reaches lr exactly at step = warmup
  if (schedule.kind === 'constant') return lr;
  const { minLr, total } = schedule;
  if (!(total >= warmup)) throw new RangeError(`learningRate: total ${total} < warmup ${warmup}`);
  if (total === warmup) return minLr;
  const progress = Math.min(1, (step - warmup) / (total - warmup)); // 0 right after warmup, 1 at total
  return minLr + 0.5 * (lr - minLr) * (1 + Math.cos(Math.PI * progress));
}

/**
 * Factor to multiply every gradient by so the global L2 norm is at most maxNorm (as
 * torch.nn.utils.clip_grad_norm_): min(1, maxNorm / (norm + 1e-6)). A non-finite norm throws:
 * the caller skips the step rather than scale NaN/Inf gradients into the weights.
 */
export function clipScale(norm: number, maxNorm: number): number {
  if (!Number.isFinite(norm)) throw new RangeError(`clipScale: gradient norm is ${norm}; skip this step`);
  if (!(maxNorm > 0)) throw new RangeError(`clipScale: maxNorm ${maxNorm} must be > 0`);
  return Math.min(1, maxNorm / (norm + 1e-6));
}
