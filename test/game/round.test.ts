import { beforeAll, describe, expect, it } from 'vitest';
import { INITIAL_SPY_BASELINE, type SpyBaselineState } from '../../src/game/advantages.ts';
import { validateConfig, type SpyRLConfigInput } from '../../src/game/config.ts';
import type { SpyDocument } from '../../src/game/documents.ts';
import { loadGovReportNode } from '../../src/game/govreport.node.ts';
import { labelTokenIds } from '../../src/game/prompts.ts';
import { playRound, roundRng, runLogLine, type Policy, type RoundRecord } from '../../src/game/round.ts';
import { normalizeText } from '../../src/game/text.ts';
import { IM_END, type Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { qwen3Tokenizer, scriptedPolicy, type ScriptOptions } from '../helpers/game.ts';

let tok: Qwen3Tokenizer;
let gao: SpyDocument;
beforeAll(async () => {
  tok = await qwen3Tokenizer();
  gao = (await loadGovReportNode()).train[0]!;
});

async function play(
  doc: SpyDocument,
  over: SpyRLConfigInput = {},
  round = 0,
  script: ScriptOptions = {},
  baseline: SpyBaselineState = INITIAL_SPY_BASELINE,
) {
  const config = validateConfig({ docTokenBudget: 512, voteChoice: 'argmax', ...over }); // the scripted votes below are checked as argmax
  const policy = scriptedPolicy(tok, script);
  const result = await playRound(
    { config, tokenizer: tok, document: doc, round, rng: roundRng(config.seed, round), spyBaseline: baseline },
    policy,
  );
  return { ...result, policy, config };
}

/** Round 0 of the GAO report under `config`, with the clock `now` (left out: no timings). */
function clocked(config: ReturnType<typeof validateConfig>, policy: Policy, now?: () => number) {
  const ctx = {
    config,
    tokenizer: tok,
    document: gao,
    round: 0,
    rng: roundRng(0, 0),
    spyBaseline: INITIAL_SPY_BASELINE,
  };
  return playRound({ ...ctx, now }, policy);
}

const ln = Math.log;

describe('playRound with a scripted policy', () => {
  it('plays a full round: masked copy, batched summaries, votes, rewards, advantages, samples', async () => {
    const { record: r, samples, policy, spyBaseline } = await play(gao);
    const spy = r.spySeat;
    expect(r.documentId).toBe(gao.id);
    expect(r.cut).toMatchObject({ tokensTotalEstimated: true, charsTotal: gao.report.length, snappedTo: 'sentence' }); // pre-cut at 512 × 8 characters
    expect(Math.abs(r.cut!.tokensTotal / tok.encode(gao.report).length - 1)).toBeLessThan(0.1);
    expect(r.cut!.tokensKept).toBeLessThanOrEqual(512);
    expect(r.mask.span.snappedTo).toBe('sentence');
    expect(Math.abs(r.mask.ratio - 0.2)).toBeLessThanOrEqual(0.06);

    // One batched generate call of N prompts: civilians identical, spy sharing a prefix.
    expect(policy.calls.generate).toHaveLength(1);
    const prompts = policy.calls.generate[0]!;
    expect(prompts).toHaveLength(4);
    const civ = prompts.filter((_, s) => s !== spy);
    for (const p of civ) expect(p.tokenIds).toEqual(civ[0]!.tokenIds);
    expect(r.prompts.sharedPrefixTokens).toBeGreaterThan(20);
    expect(r.prompts.sharedPrefixTokens).toBeLessThan(r.prompts.spySummaryTokens);
    expect(prompts[spy]!.kvShare).toEqual({ source: spy === 0 ? 1 : 0, tokens: r.prompts.sharedPrefixTokens });

    // The scripted civilians see the spy's "partial" summary and name it; the spy, unable to vote
    // for itself, faces a tie (0.1 each) and names the lowest other label.
    for (const v of r.votes) {
      if (v.seat === spy) {
        expect(v.chosenLabel).toBe(Math.min(...v.candidates));
        expect(v.probs).toEqual([1 / 3, 1 / 3, 1 / 3].map((x) => expect.closeTo(x, 12)) as unknown as number[]);
      } else {
        expect(v.chosenSeat).toBe(spy);
        expect(v.logprob).toBeCloseTo(ln(0.7 / 0.9), 12);
      }
      expect(v.candidates).not.toContain(v.label);
    }
    const framed = r.votes[spy]!.chosenSeat;
    expect(r.metrics).toEqual({
      spyCaught: true,
      voteAccuracy: 1,
      meanCivilianSuspicion: 1 / 9,
      spySuspicion: 1,
      meanSummaryTokens: expect.any(Number),
    });
    // Rewards by hand: spy 1 - 3/3 = 0; the framed civilian 1 - 1/3; other civilians 1. Civilian votes 1 each.
    r.summaries.forEach((s, seat) =>
      expect(r.rewards.summary[seat]).toBeCloseTo(seat === spy ? 0 : seat === framed ? 2 / 3 : 1, 12),
    );
    expect(r.rewards.vote).toEqual(r.labels.map((_, s) => (s === spy ? null : 1)));
    // Advantages: civilians [2/3, 1, 1] around 8/9; the spy against 8/9 (no history); votes all equal -> 0.
    r.summaries.forEach((_, seat) =>
      expect(r.advantages.summary[seat]).toBeCloseTo(
        seat === spy ? -8 / 9 : seat === framed ? 2 / 3 - 8 / 9 : 1 - 8 / 9,
        12,
      ),
    );
    expect(r.advantages.vote).toEqual(r.labels.map((_, s) => (s === spy ? null : 0)));
    expect(spyBaseline).toEqual({ count: 1, mean: 0, variance: 0 });

    // Samples: N summaries + N-1 civilian votes, with what the trainer needs.
    expect(samples.filter((s) => s.stage === 'summary')).toHaveLength(4);
    const voteSamples = samples.filter((s) => s.stage === 'vote');
    expect(voteSamples.map((s) => s.seat).sort()).toEqual(
      r.labels
        .map((_, s) => s)
        .filter((s) => s !== spy)
        .sort(),
    );
    const labelIds = labelTokenIds(tok, 4);
    for (const s of voteSamples) {
      expect(s.completionTokenIds).toEqual([labelIds[r.spyLabel - 1]]);
      expect(s.oldLogprobs[0]).toBeCloseTo(ln(0.7 / 0.9), 12);
      expect(s.candidateTokenIds).toHaveLength(3);
      expect(s.promptTokenIds.length).toBe(r.prompts.voteTokens[s.seat]);
    }
    for (const s of samples.filter((x) => x.stage === 'summary')) {
      expect(s.completionTokenIds.at(-1)).toBe(IM_END);
      expect(s.oldLogprobs).toHaveLength(s.completionTokenIds.length);
    }
    expect(r.train).toEqual({ loss: null, kl: null, gradNorm: null, lr: null });
    expect(r.timings).toEqual({
      summarizeMs: null,
      summaryPrefillMs: null,
      voteMs: null,
      updateMs: null,
      totalMs: null,
    });
  });

  it('is deterministic: same seed and round give the identical record; others differ', async () => {
    const a = runLogLine((await play(gao, { seed: 3 }, 5)).record, { includePromptTexts: true });
    const b = runLogLine((await play(gao, { seed: 3 }, 5)).record, { includePromptTexts: true });
    expect(b).toBe(a);
    const c = (await play(gao, { seed: 3 }, 6)).record;
    const d = (await play(gao, { seed: 4 }, 5)).record;
    const key = (r: RoundRecord) =>
      JSON.stringify([r.spySeat, r.labels, r.mask.span.charStart, r.summaries.map((s) => s.text)]);
    expect(key(c)).not.toBe(key(JSON.parse(a)));
    expect(key(d)).not.toBe(key(JSON.parse(a)));
  });

  it('resumes exactly: rounds 0..2 straight equal round 2 replayed from a saved baseline', async () => {
    let baseline = INITIAL_SPY_BASELINE;
    const lines: string[] = [];
    let saved = '';
    for (let round = 0; round < 3; round++) {
      if (round === 2) saved = JSON.stringify(baseline); // a checkpoint after round 1
      const res = await play(
        gao,
        { seed: 11 },
        round,
        { spy: (s) => (s % 2 ? 'A partial view.' : 'A complete view.') },
        baseline,
      );
      baseline = res.spyBaseline;
      lines.push(runLogLine(res.record));
    }
    const resumed = await play(
      gao,
      { seed: 11 },
      2,
      { spy: (s) => (s % 2 ? 'A partial view.' : 'A complete view.') },
      JSON.parse(saved),
    );
    expect(runLogLine(resumed.record)).toBe(lines[2]);
    expect(JSON.parse(lines[2]!).advantages.spyBaselineCount).toBe(2);
  });

  it('ties in the vote go to the lowest label, and the rewards follow by hand', async () => {
    const { record: r } = await play(gao, { seed: 2 }, 0, { suspicion: () => ln(0.2) });
    const seatOf = (label: number) => r.labels.indexOf(label);
    for (const v of r.votes) expect(v.chosenLabel).toBe(v.label === 1 ? 2 : 1);
    // Player 1 is named by the 3 others, Player 2 by Player 1 only.
    expect(r.rewards.suspicion[seatOf(1)]).toBe(1);
    expect(r.rewards.suspicion[seatOf(2)]).toBeCloseTo(1 / 3, 12);
    expect(r.rewards.suspicion[seatOf(3)]).toBe(0);
    const spyLabel = r.spyLabel;
    for (const v of r.votes) {
      if (v.seat === r.spySeat) continue;
      expect(r.rewards.vote[v.seat]).toBe(v.chosenLabel === spyLabel ? 1 : 0);
    }
    expect(r.metrics.spyCaught).toBe(spyLabel === 1);
  });

  it('plays on a document shorter than any span (one short sentence), N = 3', async () => {
    const doc: SpyDocument = { id: 'tiny', report: 'Congress funded the program.' };
    const { record: r } = await play(doc, { groupSize: 3 });
    expect(r.cut).toBeNull();
    expect(r.mask.span.snappedTo).toBe('word');
    expect(r.mask.span.text.trim()).not.toBe('');
    expect(r.summaries).toHaveLength(3);
    expect(r.votes.every((v) => v.candidates.length === 2)).toBe(true);
    expect(r.metrics.spyCaught).toBe(true);
  });

  it('plays on unicode (CJK, emoji, combining marks) without splitting characters', async () => {
    const doc: SpyDocument = {
      id: 'uni',
      report: normalizeText(
        '東京は日本の首都です。人口は約1400万人です。🚀 ロケットの打ち上げは成功しました。naïve café q̇ の話もあります。最後の文です。',
      ),
    };
    for (let round = 0; round < 5; round++) {
      const { record: r } = await play(doc, { maskMode: 'placeholder' }, round);
      const { charStart, charEnd, text } = r.mask.span;
      expect(doc.report.slice(charStart, charEnd)).toBe(text);
      const spyPrompt = JSON.parse(runLogLine(r, { includePromptTexts: true })).prompts.texts.spySummary as string;
      expect(spyPrompt).toContain('[...]');
      expect(spyPrompt).not.toMatch(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/);
    }
  });

  it('penalises truncated summaries and records timings when given a clock', async () => {
    let t = 0;
    const config = validateConfig({ docTokenBudget: 256, summaryMaxTokens: 8 });
    const { record: r } = await clocked(config, scriptedPolicy(tok), () => (t += 10));
    for (const s of r.summaries) {
      expect(s.truncated).toBe(true);
      expect(s.tokens).toBe(8);
      expect(r.rewards.formatPenalty[s.seat]).toBe(0.5);
    }
    // This policy does not measure its prefill: null, never a 0 that was not measured.
    expect(r.timings).toEqual({ summarizeMs: 10, summaryPrefillMs: null, voteMs: 10, updateMs: null, totalMs: 20 });
  });

  it("summaryPrefillMs: the policy's prefill time over the summaries only, when it measures it", async () => {
    let t = 0;
    const config = validateConfig({ docTokenBudget: 256, summaryMaxTokens: 8, voteReason: true });
    const inner = scriptedPolicy(tok);
    // 3 ms of prefill per generate call: one for the summaries, one for the vote reasons.
    const policy = {
      prefillMs: 100,
      async generate(...a: Parameters<typeof inner.generate>) {
        this.prefillMs += 3;
        return inner.generate(...a);
      },
      voteLogprobs: (...a: Parameters<typeof inner.voteLogprobs>) => inner.voteLogprobs(...a),
    };
    const { record: r } = await clocked(config, policy, () => (t += 10));
    expect(policy.prefillMs).toBe(106); // both calls prefilled...
    expect(r.timings.summaryPrefillMs).toBe(3); // ...only the summaries' counts
    expect(r.timings.summarizeMs).toBe(10);
    // Without a clock the round records no timing at all.
    expect((await clocked(config, policy)).record.timings.summaryPrefillMs).toBeNull();
  });

  it('voteReason: generates a reason per seat first, then reads the vote after it', async () => {
    const { record: r, policy } = await play(gao, { voteReason: true }, 0, {});
    expect(policy.calls.generate).toHaveLength(2);
    expect(policy.calls.generate[1]![0]!.text).toContain('Give your reason in one sentence');
    for (const v of r.votes) expect(typeof v.reason).toBe('string');
    const votePrompt = JSON.parse(runLogLine(r, { includePromptTexts: true })).prompts.texts.votes[0] as string;
    expect(votePrompt.endsWith(`${r.votes[0]!.reason}\nVote: Player `)).toBe(true);
  });

  it('runLogLine writes one JSON line, without prompt texts unless asked', async () => {
    const { record } = await play(gao);
    const line = runLogLine(record);
    expect(line).not.toContain('\n');
    const parsed = JSON.parse(line);
    expect(parsed.prompts.texts).toBeUndefined();
    for (const k of [
      'round',
      'documentId',
      'spySeat',
      'labels',
      'mask',
      'summaries',
      'votes',
      'rewards',
      'advantages',
      'train',
      'timings',
      'rngState',
    ])
      expect(parsed).toHaveProperty(k);
    expect(JSON.parse(runLogLine(record, { includePromptTexts: true })).prompts.texts.votes).toHaveLength(4);
  });

  it("asks the policy to keep the summaries' KV for the votes (their prompts open alike) and releases it at the end, failed or not", async () => {
    for (const voteReason of [false, true]) {
      const config = validateConfig({ docTokenBudget: 128, voteReason });
      const inner = scriptedPolicy(tok);
      const kept: (boolean | undefined)[] = [];
      const next: string[] = [];
      let released = 0;
      const policy: Policy = {
        generate: (p, o) => {
          kept.push(o.keepPromptKv);
          // The calls that follow, at their budgets: each a batch of N prompts; the votes sample nothing.
          for (const c of o.nextCalls ?? []) expect(c.prompts).toHaveLength(p.length);
          next.push((o.nextCalls ?? []).map((c) => (c.maxTokens === 0 ? 'votes' : 'reasons')).join(','));
          return inner.generate(p, o);
        },
        voteLogprobs: inner.voteLogprobs,
        releaseKv: () => void released++,
      };
      await clocked(config, policy);
      // Summaries (and reasons) keep theirs for the next call; one release when the round ends.
      expect(kept).toEqual(voteReason ? [true, true] : [true]);
      expect(next).toEqual(voteReason ? ['reasons,votes', 'votes'] : ['votes']);
      expect(released).toBe(1);
      const failing: Policy = { ...policy, voteLogprobs: () => Promise.reject(new Error('device lost')) };
      await expect(clocked(config, failing)).rejects.toThrow(/device lost/);
      expect(released).toBe(2);
    }
  });

  it('rejects a policy that answers with the wrong shapes', async () => {
    const config = validateConfig({ docTokenBudget: 128 });
    const good = scriptedPolicy(tok);
    const bad: Policy = {
      generate: async (p, o) => (await good.generate(p, o)).slice(1),
      voteLogprobs: good.voteLogprobs,
    };
    await expect(clocked(config, bad)).rejects.toThrow(/returned 3 summaries for 4 prompts/);
    const bad2: Policy = { generate: good.generate, voteLogprobs: async (p) => p.map(() => [0]) };
    await expect(clocked(config, bad2)).rejects.toThrow(/one log-prob per candidate/);
  });
});
