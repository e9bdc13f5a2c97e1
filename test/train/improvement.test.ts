// An update that pushes the right way: the real GpuPolicy, TrainingPass, PPO loss (ppoUpdate, what
// the trainer runs) and AdamW on the tiny model, with a scripted reward: +1 when a completion
// contains a chosen token, -1 otherwise, group-relative advantages. A few updates must raise that
// token's probability and the mean reward. The same run with the advantage sign flipped is the
// control: it must lower both, so a sign error in the loss, its gradient or the optimizer fails
// here (the old check, "the adapter moved", passes either way).
// It also checks issue 12's cost rule: with epochs 1 and klBeta 0 an update runs exactly one
// forward and one backward per sequence that has something to learn.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { groupAdvantages } from '../../src/game/advantages.ts';
import { DEFAULT_CONFIG } from '../../src/game/config.ts';
import { DEFAULT_PROMPTS, renderPrompt, summaryMessages, type ChatPrompt } from '../../src/game/prompts.ts';
import { initLora } from '../../src/model/peft.ts';
import { LoraAdamW, DEFAULT_ADAMW } from '../../src/train/optimizer.ts';
import { GpuPolicy } from '../../src/train/policy.ts';
import { ppoUpdate } from '../../src/train/update.ts';
import { attachAdapter, FULL, movedLora, tinySetup, type TinySetup } from '../helpers/train.ts';

let gpu: Gpu, t: TinySetup, prompt: ChatPrompt, chosen: number;
const G = 8; // completions per update
const MAX_TOKENS = 2;
const EVAL_SEEDS = Array.from({ length: 8 }, (_, i) => 9000 + i);

beforeAll(async () => {
  gpu = await createGpu();
  t = await tinySetup(gpu, 5);
  prompt = renderPrompt(t.tokenizer, summaryMessages(FULL, DEFAULT_PROMPTS), '', DEFAULT_PROMPTS);
  // The chosen token: the base model's most likely first token whose probability is in (0.05, 0.5),
  // so the reward is neither always -1 (no signal) nor nearly always +1.
  const p = softmax(await new GpuPolicy(t.model, t.tokenizer).promptLogits([prompt]));
  const order = Array.from(p.keys()).sort((a, b) => p[b]! - p[a]!);
  chosen = order.find((i) => p[i]! > 0.05 && p[i]! < 0.5) ?? order[1]!;
});
afterAll(async () => {
  gpu?.destroy();
  await t?.cleanup();
});

function softmax(z: Float32Array): Float64Array {
  let m = -Infinity;
  for (const x of z) m = Math.max(m, x);
  const p = Float64Array.from(z, (x) => Math.exp(x - m));
  const s = p.reduce((a, b) => a + b, 0);
  return p.map((x) => x / s);
}

const reward = (ids: number[]) => (ids.includes(chosen) ? 1 : -1);

/** Plays `updates` updates with the advantage multiplied by `sign`; p(chosen first) and the mean reward before and after. */
async function train(sign: 1 | -1, updates: number, measureBefore: boolean) {
  const { lora } = movedLora(t.model, 4);
  const adapter = attachAdapter(t.model, lora, initLora(t.model.cfg, lora, 1)); // PEFT init: B = 0
  const optimizer = new LoraAdamW(gpu, adapter, { ...DEFAULT_ADAMW, lr: 2e-2, maxGradNorm: 1 });
  const policy = new GpuPolicy(t.model, t.tokenizer);
  const ppo = { ...DEFAULT_CONFIG.ppo };
  const sampling = { maxTokens: MAX_TOKENS, temperature: 1, topP: 1, topK: 0 };
  const measure = async () => {
    const p = softmax(await policy.promptLogits([prompt]))[chosen]!;
    const gens = await policy.generate(
      EVAL_SEEDS.map(() => prompt),
      { ...sampling, seeds: EVAL_SEEDS },
    );
    return { p, reward: gens.reduce((s, g) => s + reward(g.tokenIds), 0) / gens.length };
  };
  try {
    const before = measureBefore ? await measure() : null; // B = 0: the base model, the same for both runs
    const passes: { forward: number; backward: number; sequences: number }[] = [];
    for (let u = 0; u < updates; u++) {
      const seeds = Array.from({ length: G }, (_, i) => 100 * u + i + 1);
      const gens = await policy.generate(
        seeds.map(() => prompt),
        { ...sampling, seeds },
      );
      const adv = groupAdvantages(
        gens.map((g) => reward(g.tokenIds)),
        { stdNormalize: false },
      );
      const samples = gens.map((g, i) => ({
        round: u,
        sample: {
          stage: 'summary' as const,
          seat: i,
          promptTokenIds: prompt.tokenIds,
          completionTokenIds: g.tokenIds,
          oldLogprobs: g.logprobs,
          advantage: sign * adv[i]!,
          candidateTokenIds: null,
        },
      }));
      const res = await ppoUpdate(
        { model: t.model, adapter, optimizer, ppo, checkpoints: 'f32', temperature: 1 },
        samples,
      );
      expect(res.skipped).toBe(false);
      expect(res.kl).toBeNull(); // klBeta 0: not computed, not 0
      passes.push({ ...res.passes, sequences: samples.filter((s) => s.sample.advantage !== 0).length });
    }
    return { before, after: await measure(), passes };
  } finally {
    optimizer.destroy();
    adapter.destroy();
    t.model.lora = null;
  }
}

describe('a few PPO updates on the real GPU policy', () => {
  it('raise the rewarded token and the mean reward; the sign-flipped control lowers both', async () => {
    const good = await train(1, 2, true);
    const flipped = { ...(await train(-1, 2, false)), before: good.before! };
    const before = good.before!;
    console.log(
      `chosen token ${chosen}: p ${before.p.toFixed(4)} -> ${good.after.p.toFixed(4)} (flipped: -> ${flipped.after.p.toFixed(4)}); ` +
        `mean reward ${before.reward.toFixed(3)} -> ${good.after.reward.toFixed(3)} (flipped: -> ${flipped.after.reward.toFixed(3)})`,
    );
    expect(good.after.p).toBeGreaterThan(before.p * 1.2);
    expect(good.after.reward).toBeGreaterThan(before.reward);
    // The control: with the advantage negated, the same assertions fail.
    expect(flipped.after.p).toBeLessThan(flipped.before.p);
    expect(flipped.after.reward).toBeLessThanOrEqual(flipped.before.reward);
    expect(flipped.after.p > flipped.before.p * 1.2 && flipped.after.reward > flipped.before.reward).toBe(false);
    // One forward and one backward per sequence with a nonzero advantage, none for the others.
    expect(good.passes[0]!.sequences).toBeGreaterThan(0);
    for (const p of [...good.passes, ...flipped.passes]) {
      expect(p.forward).toBe(p.sequences);
      expect(p.backward).toBe(p.sequences);
    }
  }, 300_000);
});
