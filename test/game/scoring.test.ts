// Votes, rewards and advantages against numbers worked out by hand.
import { describe, expect, it } from 'vitest';
import {
  groupAdvantages,
  INITIAL_SPY_BASELINE,
  roundAdvantages,
  updateSpyBaseline,
  type AdvantageConfig,
} from '../../src/game/advantages.ts';
import { DEFAULT_CONFIG } from '../../src/game/config.ts';
import { computeRewards, summaryFormat, type FormatFlags } from '../../src/game/rewards.ts';
import { Rng } from '../../src/game/rng.ts';
import { castVotes, renormalize, type Vote } from '../../src/game/votes.ts';

const ln = Math.log;
const OK: FormatFlags = { empty: false, multiParagraph: false, truncated: false };

/** A vote with an explicit distribution (candidates: every other seat, ascending). */
function vote(voter: number, n: number, chosen: number, probs?: number[]): Vote {
  const candidates = Array.from({ length: n }, (_, s) => s).filter((s) => s !== voter);
  const p = probs ?? candidates.map((c) => (c === chosen ? 1 : 0));
  return { voter, candidates, probs: p, chosen, logprob: ln(p[candidates.indexOf(chosen)]!) };
}

describe('castVotes', () => {
  it('renormalises over the eligible labels and takes the argmax with its exact log-prob', () => {
    // Full-vocabulary log-probs of 0.2, 0.1, 0.1 -> renormalised 0.5, 0.25, 0.25.
    const [v] = castVotes([[ln(0.2), ln(0.1), ln(0.1)]], [[1, 2, 3]], { choice: 'argmax' });
    expect(v!.voter).toBe(0);
    expect(v!.probs[0]).toBeCloseTo(0.5, 12);
    expect(v!.probs[1]).toBeCloseTo(0.25, 12);
    expect(v!.chosen).toBe(1);
    expect(v!.logprob).toBeCloseTo(ln(0.5), 12);
  });

  it('breaks exact ties toward the candidate listed first (the lowest label)', () => {
    const votes = castVotes(
      [
        [ln(0.1), ln(0.3), ln(0.3)],
        [ln(0.25), ln(0.25), ln(0.25)],
      ],
      [
        [3, 1, 2],
        [2, 0, 3],
      ],
      { choice: 'argmax' },
    );
    expect(votes[0]!.chosen).toBe(1);
    expect(votes[0]!.logprob).toBeCloseTo(ln(3 / 7), 12);
    expect(votes[1]!.chosen).toBe(2);
    expect(votes[1]!.logprob).toBeCloseTo(ln(1 / 3), 12);
  });

  it('samples from the distribution with the rng, reproducibly', () => {
    const lp = Array.from({ length: 2000 }, () => [ln(0.6), ln(0.3), ln(0.1)]);
    const el = lp.map(() => [5001, 5002, 5003]); // seats no voter index reaches
    const a = castVotes(lp, el, { choice: 'sample', rng: Rng.fromSeed(1) });
    expect(a.length).toBe(2000);
    const freq = [5001, 5002, 5003].map((s) => a.filter((v) => v.chosen === s).length / 2000);
    expect(freq[0]).toBeCloseTo(0.6, 1);
    expect(freq[2]).toBeCloseTo(0.1, 1);
    const b = castVotes(lp, el, { choice: 'sample', rng: Rng.fromSeed(1) });
    expect(b.map((v) => v.chosen)).toEqual(a.map((v) => v.chosen));
    for (const v of a) expect(v.logprob).toBeCloseTo(ln(v.probs[v.candidates.indexOf(v.chosen)]!), 12);
    expect(() => castVotes(lp, el, { choice: 'sample' })).toThrow(/rng/);
  });

  it('handles labels with no mass, and rejects malformed input', () => {
    expect(renormalize([-Infinity, -Infinity])).toEqual([-ln(2), -ln(2)]);
    const [v] = castVotes([[-Infinity, ln(0.01)]], [[1, 2]], { choice: 'argmax' });
    expect(v!.chosen).toBe(2);
    expect(v!.probs).toEqual([0, 1]);
    expect(() => castVotes([[0, 0]], [[0, 1]], { choice: 'argmax' })).toThrow(/itself/);
    expect(() => castVotes([[0]], [[1, 2]], { choice: 'argmax' })).toThrow(/candidates/);
    expect(() => castVotes([[NaN, 0]], [[1, 2]], { choice: 'argmax' })).toThrow(/finite/);
  });
});

describe('rewards (defaults)', () => {
  // N = 4, spy at seat 2. Votes: 0 -> 2, 1 -> 2, 2 -> 0, 3 -> 1.
  const votes = [vote(0, 4, 2), vote(1, 4, 2), vote(2, 4, 0), vote(3, 4, 1)];
  const formats = [OK, OK, OK, { ...OK, truncated: true }];

  it('summaries earn 1 - share of the other voters naming their author, minus format penalties', () => {
    const r = computeRewards(votes, 2, formats, DEFAULT_CONFIG.rewards);
    expect(r.suspicion).toEqual([1 / 3, 1 / 3, 2 / 3, 0]);
    expect(r.formatPenalty).toEqual([0, 0, 0, 0.5]);
    expect(r.summary[0]).toBeCloseTo(2 / 3, 12);
    expect(r.summary[1]).toBeCloseTo(2 / 3, 12);
    expect(r.summary[2]).toBeCloseTo(1 / 3, 12);
    expect(r.summary[3]).toBeCloseTo(0.5, 12); // 1 - 0 - 0.5
  });

  it('civilians earn 1 for naming the spy; the spy vote is untrained by default', () => {
    const r = computeRewards(votes, 2, formats, DEFAULT_CONFIG.rewards);
    expect(r.vote).toEqual([1, 1, null, 0]);
    expect(r.expectedVote).toEqual([1, 1, null, 0]);
  });

  it('the spy vote, when weighted, earns the share of civilians voting like it', () => {
    const r = computeRewards(votes, 2, formats, { ...DEFAULT_CONFIG.rewards, spyVote: 1 });
    expect(r.vote[2]).toBeCloseTo(0, 12); // spy named seat 0; no civilian did
    const r2 = computeRewards([vote(0, 4, 2), vote(1, 4, 3), vote(2, 4, 3), vote(3, 4, 1)], 2, formats, {
      ...DEFAULT_CONFIG.rewards,
      spyVote: 2,
    });
    expect(r2.vote[2]).toBeCloseTo((2 * 1) / 3, 12);
  });

  it('expected values use the vote distributions', () => {
    // Seat 0's distribution over [1, 2, 3] is 0.2, 0.5, 0.3; others as before.
    const soft = [
      vote(0, 4, 2, [0.2, 0.5, 0.3]),
      vote(1, 4, 2, [0.1, 0.8, 0.1]),
      vote(2, 4, 0),
      vote(3, 4, 1, [0.3, 0.1, 0.6]),
    ];
    const r = computeRewards(soft, 2, [OK, OK, OK, OK], { ...DEFAULT_CONFIG.rewards, useExpectedVotes: true });
    // expected suspicion of seat 2 = (0.5 + 0.8 + 0.6) / 3; of seat 0 = (0 + 0.1 + 1 + 0.3) / 3.
    expect(r.expectedSuspicion[2]).toBeCloseTo(1.9 / 3, 12);
    expect(r.expectedSuspicion[0]).toBeCloseTo(1.4 / 3, 12);
    expect(r.summary[2]).toBeCloseTo(1 - 1.9 / 3, 12);
    expect(r.vote).toEqual([0.5, 0.8, null, 0.6]);
    expect(r.suspicion[2]).toBeCloseTo(2 / 3, 12); // the cast votes are still recorded
  });

  it('format flags: empty, multi-paragraph, truncated', () => {
    expect(summaryFormat('  \n ', false)).toEqual({ empty: true, multiParagraph: false, truncated: false });
    expect(summaryFormat('One.\n\nTwo.', false)).toEqual({ empty: false, multiParagraph: true, truncated: false });
    expect(summaryFormat('- a\n- b', true)).toEqual({ empty: false, multiParagraph: true, truncated: true });
    expect(summaryFormat(' One paragraph. \n', false)).toEqual(OK);
    const r = computeRewards(
      votes,
      2,
      [{ empty: true, multiParagraph: false, truncated: true }, { ...OK, multiParagraph: true }, OK, OK],
      DEFAULT_CONFIG.rewards,
    );
    expect(r.formatPenalty).toEqual([1.5, 0.5, 0, 0]);
  });
});

describe('advantages', () => {
  const cfg: AdvantageConfig = DEFAULT_CONFIG.advantages;

  it('group-relative, optionally std-normalised', () => {
    expect(groupAdvantages([1, 1, 0], { stdNormalize: false }).map((x) => +x.toFixed(12))).toEqual([
      +(1 / 3).toFixed(12),
      +(1 / 3).toFixed(12),
      +(-2 / 3).toFixed(12),
    ]);
    const s = groupAdvantages([1, 1, 0], { stdNormalize: true }); // sample std = sqrt(1/3)
    expect(s[0]).toBeCloseTo(1 / 3 / (Math.sqrt(1 / 3) + 1e-6), 9);
    expect(s[2]).toBeCloseTo(-2 / 3 / (Math.sqrt(1 / 3) + 1e-6), 9);
    expect(groupAdvantages([0.5, 0.5], { stdNormalize: true })).toEqual([0, 0]);
    expect(groupAdvantages([], { stdNormalize: false })).toEqual([]);
  });

  it('civilian summaries against their group mean, the spy against its running mean', () => {
    // Rewards from the hand example above: [2/3, 2/3, 1/3, 0.5], spy seat 2; votes [1, 1, null, 0].
    const a = roundAdvantages([2 / 3, 2 / 3, 1 / 3, 0.5], [1, 1, null, 0], 2, cfg, INITIAL_SPY_BASELINE);
    const civMean = (2 / 3 + 2 / 3 + 0.5) / 3; // 0.6111...
    expect(a.summary[0]).toBeCloseTo(2 / 3 - civMean, 12);
    expect(a.summary[3]).toBeCloseTo(0.5 - civMean, 12);
    expect(a.spyBaseline).toBeCloseTo(civMean, 12); // no spy history yet
    expect(a.summary[2]).toBeCloseTo(1 / 3 - civMean, 12);
    expect(a.vote[0]).toBeCloseTo(1 / 3, 12);
    expect(a.vote[2]).toBeNull();
    expect(a.vote[3]).toBeCloseTo(-2 / 3, 12);
    expect(a.nextSpyBaseline).toEqual({ count: 1, mean: 1 / 3, variance: 0 });

    // Next round the spy earns 1: baseline is 1/3, advantage 2/3; state mean (1/3 + 1)/2, variance 1/9.
    const b = roundAdvantages([1, 0, 1, 0], [0, 1, null, 1], 2, cfg, a.nextSpyBaseline);
    expect(b.spyBaseline).toBeCloseTo(1 / 3, 12);
    expect(b.summary[2]).toBeCloseTo(2 / 3, 12);
    expect(b.nextSpyBaseline.mean).toBeCloseTo(2 / 3, 12);
    expect(b.nextSpyBaseline.variance).toBeCloseTo(1 / 9, 12);
  });

  it('the running mean becomes an EMA with alpha 1/window', () => {
    let s = INITIAL_SPY_BASELINE;
    for (let i = 0; i < 4; i++) s = updateSpyBaseline(s, 1, 4);
    expect(s.mean).toBeCloseTo(1, 12);
    s = updateSpyBaseline(s, 0, 4); // alpha = max(1/5, 1/4) = 1/4
    expect(s.mean).toBeCloseTo(0.75, 12);
    expect(s.variance).toBeCloseTo(0.75 * 0.25, 12);
  });

  it("spyBaseline 'group' puts all N summaries in one group", () => {
    const a = roundAdvantages([1, 0, 0, 1], [1, 0, null, 1], 2, { ...cfg, spyBaseline: 'group' }, INITIAL_SPY_BASELINE);
    expect(a.summary).toEqual([0.5, -0.5, -0.5, 0.5]);
    expect(a.spyBaseline).toBe(0.5);
  });
});
