// The trainer's other paths end to end on the tiny model: epochs > 1 and klBeta > 0 in one run
// (two AdamW steps per update; the KL it reports equals a k3 estimate the test computes itself
// from the sampler's log-probs and its own base-model pass), the per-stage loss and grad-norm
// shares in the run log, "off" (null) KL when klBeta is 0, and the refusal of top-p / top-k for
// training.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { ConfigError, validateConfig, type SpyRLConfigInput } from '../../src/game/config.ts';
import type { PolicySample } from '../../src/game/round.ts';
import { writeAdapter } from '../../src/model/peft.ts';
import { SpyRLTrainer } from '../../src/train/spyrl.ts';
import { stageWeights } from '../../src/train/update.ts';
import { TrainingPass } from '../../src/train/trainingPass.ts';
import { FULL, movedLora, tinySetup, type TinySetup } from '../helpers/train.ts';

let gpu: Gpu, t: TinySetup;
beforeAll(async () => {
  gpu = await createGpu();
  t = await tinySetup(gpu, 3);
});
afterAll(async () => {
  gpu?.destroy();
  await t?.cleanup();
});

const docs = [{ id: 'a', report: FULL }];
const small = (over: SpyRLConfigInput) =>
  validateConfig({
    groupSize: 3,
    docTokenBudget: 48,
    summaryMaxTokens: 8,
    roundsPerUpdate: 1,
    evalEvery: 0,
    checkpointEvery: 0,
    lora: { r: 4, alpha: 8 },
    optimizer: { lr: 1e-3 },
    seed: 7,
    ...over,
  });

/** A trainer starting from an adapter whose B is not zero, so the policy differs from the base model (KL > 0). */
async function trainer(config: ReturnType<typeof validateConfig>, now?: () => number) {
  const { lora, weights } = movedLora(t.model, 4, 2, 0.2);
  const resume = { ...writeAdapter(lora, weights, t.model.cfg) };
  return SpyRLTrainer.create({
    model: t.model,
    tokenizer: t.tokenizer,
    config,
    train: docs,
    evalDocs: [],
    resume,
    checkpoints: 'f32',
    now,
  });
}

const k3 = (logp: number, ref: number) => Math.exp(ref - logp) - (ref - logp) - 1;

// 10 minutes a round-playing test, a hang guard: npm test runs this file on lavapipe with a GPU's
// choices too, where with Mesa's shader cache cold the first test compiles the decode GEMVs with the
// folded norm (48-173 s each at 16 lanes; scripts/test.mjs LAVAPIPE_TIMEOUTS), one more of them per
// batch width since the LoRA A products come as partial sums (tuning.loraAFold): 2026-12-08's CI
// run passed 300 s in the first. Warm, it takes 7 s there.
const ROUND_TIMEOUT = 600_000;

describe('SpyRLTrainer update paths', () => {
  it(
    'epochs 2 + klBeta 0.1: two steps per update, and the reported KL is the k3 estimate of the two log-prob sets',
    async () => {
      const tr = await trainer(small({ ppo: { epochs: 2, klBeta: 0.1 } }));
      const seen: { epoch: number; sample: PolicySample; logp: Float32Array; ref: Float32Array | null }[] = [];
      tr.onLogprobs = (epoch, sample, logp, ref) => seen.push({ epoch, sample, logp, ref });
      try {
        const rec = await tr.runRound();
        expect(tr.optimizer.step).toBe(2);
        expect(seen.filter((x) => x.epoch === 1)).toHaveLength(seen.filter((x) => x.epoch === 0).length);
        const first = seen.filter((x) => x.epoch === 0);
        expect(first.length).toBeGreaterThan(0);

        // Independent: the sampler's log-probs (epoch 0 is on-policy: ratio 1) against the base
        // model's, recomputed here by a training pass of the test's own, adapter off.
        let sum = 0,
          n = 0,
          hookSum = 0;
        tr.adapter.enabled = false;
        try {
          for (const { sample: s, logp, ref } of first) {
            const ids = [...s.promptTokenIds, ...s.completionTokenIds];
            const targets = ids.map((_, i) =>
              i >= s.promptTokenIds.length - 1 && i < ids.length - 1 ? ids[i + 1]! : -1,
            );
            const pass = new TrainingPass(t.model, tr.adapter, ids, targets, s.candidateTokenIds, {
              checkpoints: 'f32',
            });
            const base = await pass.forward();
            pass.release();
            base.forEach((b, i) => {
              sum += k3(s.oldLogprobs[i]!, b);
              hookSum += k3(logp[i]!, ref![i]!);
              n++;
            });
          }
        } finally {
          tr.adapter.enabled = true;
        }
        const kl = rec.train.kl!;
        console.log(`reported KL ${kl}, k3 of (sampler, own base pass) ${sum / n}, over ${n} tokens`);
        expect(kl).toBeGreaterThan(1e-4); // the adapter moved the policy: a test that 0 == 0 would prove nothing
        expect(Math.abs(kl - hookSum / n)).toBeLessThanOrEqual(1e-9 * Math.max(1, kl));
        expect(Math.abs(kl - sum / n)).toBeLessThanOrEqual(1e-4 + 1e-3 * kl);

        // Both stages trained, their grad-norm shares summing to 1.
        const st = rec.train.stages!;
        expect(st.summary.sequences).toBe(3);
        expect(st.vote.sequences).toBe(2); // the spy's vote is not trained (rewards.spyVote 0)
        expect(st.summary.gradShare + st.vote.gradShare).toBeCloseTo(1, 12);
        expect(st.vote.gradShare).toBeGreaterThan(0);
        expect(st.summary.gradShare).toBeGreaterThan(0);
        const log = JSON.parse(tr.runLogJsonl().trim());
        expect(log.train.stages.vote).toMatchObject({
          loss: expect.any(Number),
          gradShare: st.vote.gradShare,
          gradNorm: st.vote.gradNorm,
        });
        // The run log carries the update's prefix sharing: every trained sequence, in fewer passes.
        const pk = rec.train.packing!;
        expect(log.train.packing).toEqual(pk);
        expect(pk.sequences).toBeGreaterThanOrEqual(st.summary.sequences + st.vote.sequences);
        expect(pk.passes).toBeLessThan(pk.sequences);
        expect(pk.tokens).toBeLessThan(pk.unpackedTokens);
      } finally {
        tr.destroy();
      }
    },
    ROUND_TIMEOUT,
  );

  it(
    'klBeta 0: the KL is off (null), never a 0 point; with a clock, the stages are timed',
    async () => {
      const tr = await trainer(small({}), () => performance.now());
      const events: unknown[] = [];
      let seconds: number | null = null;
      let compiled: number | undefined;
      tr.onEvent = (e) => {
        if (e.type === 'update') events.push(e);
        if (e.type === 'round-done') [seconds, compiled] = [e.seconds, e.compiledKernels];
      };
      try {
        const pipelines0 = tr.model.gpu.pipelineCount;
        const rec = await tr.runRound();
        // The round reports the kernel variants it used first (pipeline compiles in its time).
        expect(compiled).toBe(tr.model.gpu.pipelineCount - pipelines0);
        expect(rec.train.kl).toBeNull();
        expect(events).toEqual([
          expect.objectContaining({
            kl: null,
            stages: expect.objectContaining({ summary: expect.any(Object), vote: expect.any(Object) }),
          }),
        ]);
        expect(JSON.parse(tr.runLogJsonl().trim()).train.kl).toBeNull();
        // The summaries' prefill is measured by the policy and is a part of the summaries' time.
        const tm = rec.timings;
        expect(tm.summaryPrefillMs).toBeGreaterThan(0);
        expect(tm.summaryPrefillMs).toBeLessThan(tm.summarizeMs!);
        expect(tm.updateMs).toBeGreaterThan(0);
        // The round-done event's wall time holds every stage (the app shows both).
        expect(seconds! * 1000).toBeGreaterThanOrEqual(tm.summarizeMs! + tm.voteMs! + tm.updateMs!);
      } finally {
        tr.destroy();
      }
    },
    ROUND_TIMEOUT,
  );

  it('top-p and top-k are refused for training, naming the field', async () => {
    await expect(trainer(small({ sampling: { topP: 0.9 } }))).rejects.toThrow(ConfigError);
    await expect(trainer(small({ sampling: { topP: 0.9 } }))).rejects.toThrow(
      /config\.sampling\.topP: must be 1 for training/,
    );
    await expect(trainer(small({ sampling: { topK: 20 } }))).rejects.toThrow(
      /config\.sampling\.topK: must be 0 for training/,
    );
  });
});

describe('stage weights (pure)', () => {
  const s = (stage: 'summary' | 'vote', seat: number, n: number, cands: number[] | null = null): PolicySample => ({
    stage,
    seat,
    promptTokenIds: [1],
    completionTokenIds: Array(n).fill(5),
    oldLogprobs: Array(n).fill(-1),
    advantage: 1,
    candidateTokenIds: cands,
  });
  it('token-mean over summaries; a mean over votes, each vote (reason + label) a token-mean of its own', () => {
    const samples = [
      { round: 0, sample: s('summary', 0, 10) },
      { round: 0, sample: s('summary', 1, 30) },
      { round: 0, sample: s('vote', 0, 3) },
      { round: 0, sample: s('vote', 0, 1, [5, 6]) }, // one vote: a reason and its label
      { round: 0, sample: s('vote', 1, 1, [5, 6]) },
      { round: 1, sample: s('vote', 1, 1, [5, 6]) }, // two more votes
    ];
    const { u, counts } = stageWeights(samples, 'token-mean');
    expect(u.slice(0, 2)).toEqual([1 / 40, 1 / 40]);
    expect(u.slice(2)).toEqual([1 / 12, 1 / 12, 1 / 3, 1 / 3]);
    const total = (stage: string) =>
      samples.reduce((a, x, i) => a + (x.sample.stage === stage ? u[i]! * x.sample.completionTokenIds.length : 0), 0);
    expect(total('summary')).toBeCloseTo(1, 12);
    expect(total('vote')).toBeCloseTo(1, 12);
    expect(counts).toEqual({ summary: { sequences: 2, tokens: 40 }, vote: { sequences: 3, tokens: 6 } });
    expect(stageWeights(samples, 'sequence-mean').u.slice(0, 2)).toEqual([1 / 20, 1 / 60]);
  });
});
