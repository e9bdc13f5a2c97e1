// Votes from label log-probs. Each voter's distribution is the model's next-token distribution
// renormalised over the other players' label tokens, so every vote is valid and its
// log-probability (the policy-gradient term of a vote) is exact.
import type { Rng } from './rng.ts';

export type VoteChoice = 'argmax' | 'sample';

export interface Vote {
  voter: number;
  /** Eligible suspects (seats), in the order the voter saw them (ascending label). */
  candidates: number[];
  /** Vote distribution over `candidates`, summing to 1. */
  probs: number[];
  /** The seat voted for. */
  chosen: number;
  /** log probs[chosen index]: the renormalised log-probability of the vote. */
  logprob: number;
}

/** log-sum-exp; -Infinity entries contribute nothing. */
function logSumExp(xs: readonly number[]): number {
  const m = Math.max(...xs);
  if (m === -Infinity) return -Infinity;
  let s = 0;
  for (const x of xs) s += Math.exp(x - m);
  return m + Math.log(s);
}

/** log-softmax over the given log-probs; all -Infinity (the model gives no label any mass) becomes uniform. */
export function renormalize(logprobs: readonly number[]): number[] {
  for (const x of logprobs)
    if (Number.isNaN(x) || x === Infinity) throw new RangeError(`vote log-prob must be finite or -Infinity, got ${x}`);
  const lse = logSumExp(logprobs);
  if (lse === -Infinity) return logprobs.map(() => -Math.log(logprobs.length));
  return logprobs.map((x) => x - lse);
}

/**
 * labelLogprobs[v][i] = the model's log-prob of voter v's candidate i (eligible[v][i], a seat).
 * 'sample' (the default) draws from the distribution with `rng` (one draw per voter, in order):
 * the vote is a sample of the policy and `logprob` its exact log-probability, so training it is
 * the policy gradient. 'argmax' is greedy: it takes the most probable candidate (exact ties go to
 * the candidate listed first, i.e. the lowest "Player k" label, a seeded-random seat because
 * labels are reshuffled every round); trained as a sample, it is a biased heuristic.
 */
export function castVotes(
  labelLogprobs: readonly (readonly number[])[],
  eligible: readonly (readonly number[])[],
  opts: { choice: VoteChoice; rng?: Rng },
): Vote[] {
  if (labelLogprobs.length !== eligible.length)
    throw new RangeError(`${labelLogprobs.length} voters' log-probs for ${eligible.length} voters' candidates`);
  if (opts.choice === 'sample' && !opts.rng) throw new RangeError("castVotes: choice 'sample' needs an rng");
  return labelLogprobs.map((lp, voter) => {
    const candidates = [...eligible[voter]!];
    if (candidates.length === 0) throw new RangeError(`voter ${voter} has no candidates`);
    if (lp.length !== candidates.length)
      throw new RangeError(`voter ${voter}: ${lp.length} log-probs for ${candidates.length} candidates`);
    if (candidates.includes(voter)) throw new RangeError(`voter ${voter} cannot vote for itself`);
    const logp = renormalize(lp);
    const probs = logp.map(Math.exp);
    let idx = 0;
    if (opts.choice === 'argmax') {
      for (let i = 1; i < logp.length; i++) if (logp[i]! > logp[idx]!) idx = i;
    } else {
      const u = opts.rng!.next();
      let acc = 0;
      idx = probs.length - 1; // rounding can leave sum(probs) a hair under 1
      for (let i = 0; i < probs.length; i++) {
        acc += probs[i]!;
        if (u < acc && probs[i]! > 0) {
          idx = i;
          break;
        }
      }
      while (probs[idx] === 0 && idx > 0) idx--; // never pick a zero-probability candidate
    }
    return { voter, candidates, probs, chosen: candidates[idx]!, logprob: logp[idx]! };
  });
}
