// Rewards of one round, from the votes alone: no labels, no reward model, no judge.
import type { Vote } from './votes.ts';

export interface RewardConfig {
  /** A civilian voter's reward for naming the spy. */
  catchSpy: number;
  /** Weight of a summary's 1 - suspicion. */
  evadeSuspicion: number;
  /** Weight of the spy's vote reward (share of civilians voting like the spy); 0 = the spy's vote is not trained. */
  spyVote: number;
  /** Use probabilities instead of the cast votes (lower variance, no longer the game's outcome). */
  useExpectedVotes: boolean;
  /** Subtracted from an empty (whitespace-only) summary. */
  emptyPenalty: number;
  /** Subtracted from a summary with a line break (more than one paragraph, or a list). */
  multiParagraphPenalty: number;
  /** Subtracted from a summary cut by summaryMaxTokens before it ended. */
  truncatedPenalty: number;
}

/** The formulas, for the README ("How SpyRL works here"). */
export const REWARD_FORMULAS = `\
N players, seat s, spy seat x; voter v casts c_v (a seat other than v) with distribution p_v.
suspicion(s)          = #{v != s : c_v = s} / (N - 1)           (expected: sum_{v != s} p_v(s) / (N - 1))
summary reward R_s    = evadeSuspicion * (1 - suspicion(s)) - format(s)
format(s)             = emptyPenalty * [empty] + multiParagraphPenalty * [line break] + truncatedPenalty * [truncated]
civilian vote reward  = catchSpy * [c_v = x]                    (expected: catchSpy * p_v(x))
spy vote reward       = spyVote * #{civilians v : c_v = c_x} / (N - 1), only when spyVote > 0 (else the spy's vote is not trained)`;

export interface FormatFlags {
  empty: boolean;
  multiParagraph: boolean;
  truncated: boolean;
}

export function summaryFormat(text: string, truncated: boolean): FormatFlags {
  const t = text.trim();
  return { empty: t === '', multiParagraph: /\n/.test(t), truncated };
}

export function formatPenalty(f: FormatFlags, cfg: RewardConfig): number {
  return (
    (f.empty ? cfg.emptyPenalty : 0) +
    (f.multiParagraph ? cfg.multiParagraphPenalty : 0) +
    (f.truncated ? cfg.truncatedPenalty : 0)
  );
}

export interface RoundRewards {
  /** Per seat: share of the other N-1 voters that named it. */
  suspicion: number[];
  /** Per seat: mean probability the other N-1 voters gave it. */
  expectedSuspicion: number[];
  format: FormatFlags[];
  formatPenalty: number[];
  /** Per seat: the summary's reward. */
  summary: number[];
  /** Per voter seat: the vote's reward; null for a vote that is not trained (the spy's, by default). */
  vote: (number | null)[];
  /** Per voter seat: the vote reward's expectation under the voter's distribution (null as above). */
  expectedVote: (number | null)[];
}

function probOf(v: Vote, seat: number): number {
  const i = v.candidates.indexOf(seat);
  return i < 0 ? 0 : v.probs[i]!;
}

/** votes[seat] is seat's own vote; formats[seat] its summary's format flags. */
export function computeRewards(
  votes: readonly Vote[],
  spySeat: number,
  formats: readonly FormatFlags[],
  cfg: RewardConfig,
): RoundRewards {
  const n = votes.length;
  if (formats.length !== n) throw new RangeError(`${formats.length} summaries for ${n} votes`);
  votes.forEach((v, seat) => {
    if (v.voter !== seat) throw new RangeError(`votes[${seat}] is voter ${v.voter}'s vote: pass votes in seat order`);
  });
  const others = n - 1;
  const suspicion = votes.map((_, s) => votes.filter((v) => v.voter !== s && v.chosen === s).length / others);
  const expectedSuspicion = votes.map(
    (_, s) => votes.reduce((acc, v) => acc + (v.voter === s ? 0 : probOf(v, s)), 0) / others,
  );
  const penalties = formats.map((f) => formatPenalty(f, cfg));
  const susp = cfg.useExpectedVotes ? expectedSuspicion : suspicion;
  const summary = susp.map((x, s) => cfg.evadeSuspicion * (1 - x) - penalties[s]!);

  const civilians = votes.filter((v) => v.voter !== spySeat);
  const spyVote = votes[spySeat]!;
  const expectedVote = votes.map((v): number | null => {
    if (v.voter !== spySeat) return cfg.catchSpy * probOf(v, spySeat);
    if (cfg.spyVote === 0) return null;
    return (
      (cfg.spyVote *
        spyVote.candidates.reduce(
          (acc, c, i) => acc + spyVote.probs[i]! * civilians.reduce((a, w) => a + probOf(w, c), 0),
          0,
        )) /
      others
    );
  });
  const castVote = votes.map((v): number | null => {
    if (v.voter !== spySeat) return v.chosen === spySeat ? cfg.catchSpy : 0;
    if (cfg.spyVote === 0) return null;
    return (cfg.spyVote * civilians.filter((w) => w.chosen === spyVote.chosen).length) / others;
  });
  return {
    suspicion,
    expectedSuspicion,
    format: formats.map((f) => ({ ...f })),
    formatPenalty: penalties,
    summary,
    vote: cfg.useExpectedVotes ? expectedVote : castVote,
    expectedVote,
  };
}
