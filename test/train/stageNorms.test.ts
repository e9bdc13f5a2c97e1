// Per-stage gradient norms are exact: in a mixed update, each stage's reported grad norm equals
// the grad norm of an update of that stage's samples alone (same adapter, same weights), and the
// shares are |g_stage|^2 over their sum. Short token sequences on the tiny model keep it cheap.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { DEFAULT_CONFIG } from '../../src/game/config.ts';
import type { PolicySample } from '../../src/game/round.ts';
import { LoraAdamW, DEFAULT_ADAMW } from '../../src/train/optimizer.ts';
import { ppoUpdate, samplePass, type RoundSample } from '../../src/train/update.ts';
import { attachAdapter, movedLora, tinySetup, type TinySetup } from '../helpers/train.ts';

let gpu: Gpu, t: TinySetup;
beforeAll(async () => {
  gpu = await createGpu();
  t = await tinySetup(gpu, 4);
});
afterAll(async () => {
  gpu?.destroy();
  await t?.cleanup();
});

const sample = (
  stage: 'summary' | 'vote',
  seat: number,
  prompt: number[],
  completion: number[],
  advantage: number,
  cands: number[] | null = null,
): RoundSample => ({
  round: 0,
  sample: {
    stage,
    seat,
    promptTokenIds: prompt,
    completionTokenIds: completion,
    oldLogprobs: completion.map(() => -3),
    advantage,
    candidateTokenIds: cands,
  } satisfies PolicySample,
});

const SAMPLES: RoundSample[] = [
  sample('summary', 0, [100, 200, 300, 400], [11, 12, 13], 1),
  sample('summary', 1, [100, 200, 300, 400], [21, 22, 23, 24, 25], -0.5),
  sample('vote', 0, [500, 600, 700], [16], 1, [16, 17, 18]),
  sample('vote', 1, [500, 600, 701], [18], -1, [16, 18]),
  sample('vote', 1, [500, 600], [40, 41], -1), // voter 1's reason: the same vote as its label
];

/** A fresh adapter (same weights every time) and one on-policy update (old log-probs = current ones). */
async function update(samples: RoundSample[]) {
  const { lora, weights } = movedLora(t.model, 4, 3, 0.1);
  const adapter = attachAdapter(t.model, lora, weights);
  for (const x of samples) {
    const pass = samplePass(t.model, adapter, x.sample, { checkpoints: 'f32' }, 1);
    x.sample.oldLogprobs = Array.from(await pass.forward());
    pass.release();
  }
  const optimizer = new LoraAdamW(gpu, adapter, { ...DEFAULT_ADAMW, lr: 1e-12, maxGradNorm: 0 });
  try {
    return await ppoUpdate(
      {
        model: t.model,
        adapter,
        optimizer,
        ppo: { ...DEFAULT_CONFIG.ppo, voteWeight: 2 },
        checkpoints: 'f32',
        temperature: 1,
      },
      samples,
    );
  } finally {
    optimizer.destroy();
    adapter.destroy();
    t.model.lora = null;
  }
}

describe('per-stage gradient norms', () => {
  it('each stage alone has the norm the mixed update reports for it; shares are the squared-norm fractions', async () => {
    const mixed = await update(SAMPLES);
    const summaries = await update(SAMPLES.filter((x) => x.sample.stage === 'summary'));
    const votes = await update(SAMPLES.filter((x) => x.sample.stage === 'vote'));
    const { summary, vote } = mixed.stages;
    console.log(
      JSON.stringify(mixed.passes),
      `summary |g| ${summary.gradNorm} (alone ${summaries.gradNorm}), vote |g| ${vote.gradNorm} (alone ${votes.gradNorm}), total ${mixed.gradNorm}; shares ${summary.gradShare.toFixed(4)} / ${vote.gradShare.toFixed(4)}`,
    );
    expect(summary.gradNorm).toBeGreaterThan(0);
    expect(vote.gradNorm).toBeGreaterThan(0);
    expect(Math.abs(summary.gradNorm - summaries.gradNorm)).toBeLessThanOrEqual(1e-5 * summaries.gradNorm);
    expect(Math.abs(vote.gradNorm - votes.gradNorm)).toBeLessThanOrEqual(1e-5 * votes.gradNorm);
    expect(summary.gradShare).toBeCloseTo(summary.gradNorm ** 2 / (summary.gradNorm ** 2 + vote.gradNorm ** 2), 12);
    // The total gradient is the sum of the two (the vote part was set aside and added back):
    // |g_s + g_v| lies between ||g_s| - |g_v|| and |g_s| + |g_v|, and differs from both stage norms.
    expect(mixed.gradNorm).toBeLessThanOrEqual(summary.gradNorm + vote.gradNorm + 1e-6);
    expect(mixed.gradNorm).toBeGreaterThanOrEqual(Math.abs(summary.gradNorm - vote.gradNorm) - 1e-6);
    expect(Math.abs(mixed.gradNorm - summary.gradNorm)).toBeGreaterThan(1e-6);
    // Stage losses: the summary stage is a token mean over 8 tokens, the vote stage a mean over 2 votes.
    expect(mixed.stages.summary.tokens).toBe(8);
    expect(mixed.stages.vote).toMatchObject({ sequences: 2, tokens: 4 });
    expect(mixed.loss).toBeCloseTo(summary.loss + 2 * vote.loss, 10);
    // Five sequences in four passes: the two vote labels share their first two prompt tokens and
    // run as one packed pass (src/train/packing.ts); the rest share too little to pack.
    expect(mixed.passes).toEqual({ forward: 4, backward: 4 });
    expect(mixed.packing).toMatchObject({ sequences: 5, passes: 4 });
    expect(mixed.packing.unpackedTokens - mixed.packing.tokens).toBe(2);
  }, 300_000);
});
