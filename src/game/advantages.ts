// Group-relative advantages (GRPO) per round and stage. Civilians' summaries share one prompt,
// so their mean reward is an exact group baseline; the spy's prompt differs, so by default its
// summary is measured against a running mean of past spy rewards instead.

export type SpyBaseline = 'running-mean' | 'group';

export interface AdvantageConfig {
  /** Divide by the group's standard deviation (GRPO) instead of only subtracting the mean (Dr. GRPO). */
  stdNormalize: boolean;
  /** 'running-mean': the spy's summary against past spy rewards; 'group': all N summaries form one group. */
  spyBaseline: SpyBaseline;
  /** Horizon of the running mean: a plain mean over the first `spyBaselineWindow` rounds, then an EMA with alpha 1/window. */
  spyBaselineWindow: number;
}

/** Serializable state of the spy baseline (goes into checkpoints). */
export interface SpyBaselineState {
  count: number;
  mean: number;
  /** Exponentially weighted variance, for std normalisation of the spy's advantage. */
  variance: number;
}

export const INITIAL_SPY_BASELINE: SpyBaselineState = { count: 0, mean: 0, variance: 0 };

export const ADVANTAGE_FORMULAS = `\
group G (civilian summaries; votes that are trained), reward r_i:
A_i = r_i - mean_G(r)                       (stdNormalize: (r_i - mean_G(r)) / (std_G(r) + 1e-6), std with N-1 in the denominator)
spy summary, spyBaseline 'running-mean':    A_x = r_x - b, b = running mean of previous spy summary rewards
                                            (no history yet: b = mean of this round's civilian summary rewards;
                                             stdNormalize: divided by the running std once 2 rounds are seen)
running mean update: alpha = max(1 / (count + 1), 1 / spyBaselineWindow); d = r_x - b; b += alpha d; var = (1 - alpha)(var + alpha d^2)
spyBaseline 'group': the spy's summary joins the civilians' group (N summaries, one baseline).`;

const EPS = 1e-6;

function mean(xs: readonly number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length;
}

/** Sample standard deviation (N-1 denominator, as torch.std in GRPO implementations); 0 for one element. */
function std(xs: readonly number[]): number {
  if (xs.length < 2) return 0;
  const m = mean(xs);
  return Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / (xs.length - 1));
}

export function groupAdvantages(rewards: readonly number[], opts: Pick<AdvantageConfig, 'stdNormalize'>): number[] {
  if (rewards.length === 0) return [];
  const m = mean(rewards);
  const d = opts.stdNormalize ? std(rewards) + EPS : 1;
  return rewards.map((r) => (r - m) / d);
}

export function updateSpyBaseline(state: SpyBaselineState, reward: number, window: number): SpyBaselineState {
  const alpha = Math.max(1 / (state.count + 1), 1 / window);
  const d = reward - state.mean;
  return {
    count: state.count + 1,
    mean: state.mean + alpha * d,
    variance: (1 - alpha) * (state.variance + alpha * d * d),
  };
}

export interface RoundAdvantages {
  /** Per seat. */
  summary: number[];
  /** Per voter seat; null for votes that are not trained. */
  vote: (number | null)[];
  /** The baseline the spy's summary was measured against. */
  spyBaseline: number;
  /** State after this round (the spy's reward folded in). */
  nextSpyBaseline: SpyBaselineState;
}

export function roundAdvantages(
  summaryRewards: readonly number[],
  voteRewards: readonly (number | null)[],
  spySeat: number,
  cfg: AdvantageConfig,
  baseline: SpyBaselineState,
): RoundAdvantages {
  const n = summaryRewards.length;
  const summary = new Array<number>(n).fill(0);
  const rSpy = summaryRewards[spySeat]!;
  let spyBaseline: number;
  if (cfg.spyBaseline === 'group') {
    groupAdvantages(summaryRewards, cfg).forEach((a, s) => (summary[s] = a));
    spyBaseline = mean(summaryRewards);
  } else {
    const civilianSeats = summaryRewards.map((_, s) => s).filter((s) => s !== spySeat);
    const civilianRewards = civilianSeats.map((s) => summaryRewards[s]!);
    groupAdvantages(civilianRewards, cfg).forEach((a, i) => (summary[civilianSeats[i]!] = a));
    spyBaseline = baseline.count > 0 ? baseline.mean : mean(civilianRewards);
    const scale = cfg.stdNormalize && baseline.count >= 2 ? Math.sqrt(baseline.variance) + EPS : 1;
    summary[spySeat] = (rSpy - spyBaseline) / scale;
  }
  const trained = voteRewards.map((r, s) => (r === null ? -1 : s)).filter((s) => s >= 0);
  const voteAdv = groupAdvantages(
    trained.map((s) => voteRewards[s]!),
    cfg,
  );
  const vote = voteRewards.map((): number | null => null);
  trained.forEach((s, i) => (vote[s] = voteAdv[i]!));
  return { summary, vote, spyBaseline, nextSpyBaseline: updateSpyBaseline(baseline, rSpy, cfg.spyBaselineWindow) };
}
