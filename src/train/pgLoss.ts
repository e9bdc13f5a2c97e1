// Policy-gradient losses on per-token log-probs, and their gradient d loss / d logp (pure TS).
// The GPU side computes logp = log softmax(logits)[target] (logSoftmaxGather); the trainer reads
// logp back, calls one of these, uploads `dlogp` and runs logSoftmaxBackward into the LM head.
//
// Sequences are concatenated: token t of the batch belongs to the sequence that seqLens puts it in.
// All math is f64; dlogp is f64 too (convert with Float32Array.from for the upload).

export type PgAggregation =
  /** Mean over all tokens of all sequences (long answers weigh more; DAPO, Dr. GRPO). */
  | 'token-mean'
  /** Mean over tokens within each sequence, then over sequences (GRPO paper). */
  | 'sequence-mean';

export interface PpoLossOptions {
  /** Lower clip range: the ratio is clipped to [1 - clipEps, 1 + clipEpsHigh]. Default 0.2 (PPO). */
  clipEps?: number;
  /** Upper clip range; defaults to clipEps (DAPO's "clip-higher" raises it, e.g. 0.28). */
  clipEpsHigh?: number;
  /** Weight of the k3 KL estimate to the reference policy; 0 = no KL term. Needs refLogp. */
  klBeta?: number;
  /** Default 'token-mean'. */
  aggregation?: PgAggregation;
}

export interface PpoBatch {
  logp: ArrayLike<number>; // (T) current policy log-probs of the sampled tokens
  oldLogp: ArrayLike<number>; // (T) log-probs under the policy that sampled them
  advantages: ArrayLike<number>; // (T) per-token advantages A_t
  refLogp?: ArrayLike<number>; // (T) reference-policy log-probs, for the KL term and stat
  seqLens: readonly number[]; // tokens per sequence, each >= 1, sum = T
}

export interface PgStats {
  /** Fraction of tokens whose clipped term is the active one (zero gradient), over all tokens. */
  clipFraction: number;
  /** Mean of exp(logp - oldLogp) over all tokens. */
  meanRatio: number;
  /** Mean k3 estimate of KL(policy || reference) over all tokens; 0 without refLogp. */
  kl: number;
}

export interface PgLossResult {
  loss: number;
  dlogp: Float64Array; // (T) d loss / d logp[t]
  stats: PgStats;
}

/** One token's clipped surrogate, -min(r A, clip(r, lo, hi) A), and its derivative in r. */
export function ppoClipTerm(
  ratio: number,
  advantage: number,
  lo: number,
  hi: number,
): { loss: number; dRatio: number; clipped: boolean } {
  const unclipped = ratio * advantage;
  const clippedObj = Math.min(Math.max(ratio, lo), hi) * advantage;
  // The clipped term wins only strictly outside [lo, hi] on the side where it is smaller; at the
  // edges both terms are equal and the gradient is the unclipped one (as torch's min and clamp give).
  if (clippedObj < unclipped) return { loss: -clippedObj, dRatio: 0, clipped: true };
  return { loss: -unclipped, dRatio: -advantage, clipped: false };
}

/**
 * k3 estimator of KL(policy || ref) at a sampled token (Schulman, "Approximating KL Divergence"):
 * exp(ref - logp) - (ref - logp) - 1 >= 0, and its derivative in logp, 1 - exp(ref - logp).
 */
export function klK3(logp: number, refLogp: number): { value: number; dlogp: number } {
  const d = refLogp - logp;
  const em1 = Math.expm1(d); // exp(d) - 1 without cancellation for small d
  return { value: em1 - d, dlogp: -em1 };
}

/** One token's PPO term, loss_t = -min(r A, clip(r) A) + klBeta * k3, and d loss_t / d logp. */
export interface PpoTokenTerm {
  loss: number;
  dlogp: number;
  ratio: number;
  clipped: boolean;
  /** The k3 estimate at this token; 0 without a reference log-prob. */
  kl: number;
}

/**
 * The per-token term of ppoLoss, on its own: the loss is a weighted sum of these, so a trainer
 * can take each sequence's dlogp right after that sequence's forward (no separate pass).
 */
export function ppoTokenTerm(
  logp: number,
  oldLogp: number,
  advantage: number,
  refLogp: number | undefined,
  lo: number,
  hi: number,
  klBeta: number,
): PpoTokenTerm {
  const ratio = Math.exp(logp - oldLogp);
  const pg = ppoClipTerm(ratio, advantage, lo, hi);
  let loss = pg.loss;
  let dlogp = pg.dRatio * ratio; // dr/dlogp = r
  let kl = 0;
  if (refLogp !== undefined) {
    const k = klK3(logp, refLogp);
    kl = k.value;
    loss += klBeta * k.value;
    dlogp += klBeta * k.dlogp;
  }
  return { loss, dlogp, ratio, clipped: pg.clipped, kl };
}

/** Per-token weights of the aggregation: loss = sum_t w_t * loss_t. */
function aggregationWeights(seqLens: readonly number[], T: number, aggregation: PgAggregation): Float64Array {
  const w = new Float64Array(T);
  if (aggregation === 'token-mean') return w.fill(1 / T);
  let t = 0;
  for (const len of seqLens) {
    w.fill(1 / (seqLens.length * len), t, t + len);
    t += len;
  }
  return w;
}

function checkBatch(T: number, seqLens: readonly number[], arrays: [string, ArrayLike<number> | undefined][]): void {
  if (T === 0) throw new RangeError('policy-gradient loss: empty batch');
  let sum = 0;
  for (const len of seqLens) {
    if (!Number.isInteger(len) || len < 1) throw new RangeError(`policy-gradient loss: sequence length ${len}`);
    sum += len;
  }
  if (sum !== T) throw new RangeError(`policy-gradient loss: seqLens sum to ${sum}, logp has ${T} tokens`);
  for (const [name, a] of arrays) {
    if (a && a.length !== T)
      throw new RangeError(`policy-gradient loss: ${name} has ${a.length} tokens, logp has ${T}`);
  }
}

/**
 * PPO clipped policy-gradient loss, optionally plus klBeta * k3 KL to the reference policy:
 * loss_t = -min(r_t A_t, clip(r_t, 1 - eps, 1 + epsHigh) A_t) + klBeta * k3_t, r_t = exp(logp_t - old_t),
 * aggregated by `aggregation`. Stats are plain token means whatever the aggregation.
 */
export function ppoLoss(batch: PpoBatch, opts: PpoLossOptions = {}): PgLossResult {
  const { logp, oldLogp, advantages, refLogp, seqLens } = batch;
  const T = logp.length;
  checkBatch(T, seqLens, [
    ['oldLogp', oldLogp],
    ['advantages', advantages],
    ['refLogp', refLogp],
  ]);
  const clipEps = opts.clipEps ?? 0.2;
  const clipEpsHigh = opts.clipEpsHigh ?? clipEps;
  const klBeta = opts.klBeta ?? 0;
  if (!(clipEps >= 0 && clipEpsHigh >= 0 && klBeta >= 0)) {
    throw new RangeError(`ppoLoss: clipEps ${clipEps}, clipEpsHigh ${clipEpsHigh} and klBeta ${klBeta} must be >= 0`);
  }
  if (klBeta > 0 && !refLogp) throw new RangeError('ppoLoss: klBeta > 0 needs refLogp');

  const w = aggregationWeights(seqLens, T, opts.aggregation ?? 'token-mean');
  const dlogp = new Float64Array(T);
  let loss = 0;
  let clipped = 0;
  let ratioSum = 0;
  let klSum = 0;
  for (let t = 0; t < T; t++) {
    const term = ppoTokenTerm(logp[t], oldLogp[t], advantages[t], refLogp?.[t], 1 - clipEps, 1 + clipEpsHigh, klBeta);
    klSum += term.kl;
    loss += w[t] * term.loss;
    dlogp[t] = w[t] * term.dlogp;
    if (term.clipped) clipped++;
    ratioSum += term.ratio;
  }
  return { loss, dlogp, stats: { clipFraction: clipped / T, meanRatio: ratioSum / T, kl: klSum / T } };
}

/** Next-token cross-entropy (supervised fine-tuning): loss = -mean(logp), dlogp = -1/T. */
export function crossEntropyLoss(logp: ArrayLike<number>): { loss: number; dlogp: Float64Array } {
  const T = logp.length;
  if (T === 0) throw new RangeError('crossEntropyLoss: empty batch');
  let sum = 0;
  for (let t = 0; t < T; t++) sum += logp[t];
  return { loss: -sum / T, dlogp: new Float64Array(T).fill(-1 / T) };
}
