// The real GpuPolicy (src/train/policy.ts) on the tiny model with a LoRA adapter that is on and
// not zero:
// - a prompt that borrows a shared KV prefix gets the same next-token logits as a fresh prefill;
// - ratio 1: the log-probs stored at sampling time equal the training pass's recomputation
//   (src/train/update.ts samplePass, what the trainer runs) for every summary, reason and vote
//   token of a played round, at temperature 1 and at 0.7 (f32 checkpoints; the bf16 default is
//   measured and printed);
// - voteLogprobs equals the restricted softmax of a plain one-prompt forward's logits;
// - the sampler's log-prob equals the log of the distribution it draws from (top-k, top-p).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { INITIAL_SPY_BASELINE } from '../../src/game/advantages.ts';
import { validateConfig } from '../../src/game/config.ts';
import {
  DEFAULT_PROMPTS,
  labelTokenIds,
  summaryPrompts,
  votePrompts,
  type ChatPrompt,
} from '../../src/game/prompts.ts';
import { assignRoles } from '../../src/game/roles.ts';
import { Rng } from '../../src/game/rng.ts';
import { playRound, roundRng, type PolicySample } from '../../src/game/round.ts';
import { renormalize } from '../../src/game/votes.ts';
import type { LoraAdapter } from '../../src/model/lora.ts';
import { GpuPolicy } from '../../src/train/policy.ts';
import { samplePass } from '../../src/train/update.ts';
import type { CheckpointDtype } from '../../src/train/trainingPass.ts';
import * as ref from '../helpers/reference.ts';
import { attachAdapter, FULL, movedLora, tinySetup, type TinySetup } from '../helpers/train.ts';

const SPY = 'The agency spent $2 billion on the new system. Audits found gaps in the records. The plan ends in 2030.';
const PROMPTS = {
  ...DEFAULT_PROMPTS,
  summaryInstruction: 'Summarize the report.',
  voteInstruction: 'Find the spy: the player whose summary misses part of the report.',
};

let gpu: Gpu, t: TinySetup, adapter: LoraAdapter;
const measured: Record<string, string> = {};
beforeAll(async () => {
  gpu = await createGpu();
  t = await tinySetup(gpu);
  const { lora, weights } = movedLora(t.model);
  adapter = attachAdapter(t.model, lora, weights);
});
afterAll(async () => {
  console.log('measured:', measured);
  adapter?.destroy();
  gpu?.destroy();
  await t?.cleanup();
});

const unshared = (prompts: ChatPrompt[]) => prompts.map((p) => ({ ...p, kvShare: null }));

describe('GpuPolicy on the tiny model (LoRA on)', () => {
  it('a shared KV prefix gives the logits of a fresh prefill (<= 1e-5 relative)', async () => {
    const roles = assignRoles(4, Rng.fromSeed(3));
    const sp = summaryPrompts(t.tokenizer, roles, FULL, SPY, PROMPTS).prompts;
    const vp = votePrompts(
      t.tokenizer,
      { roles, civilianText: FULL, spyText: SPY, summaries: ['One.', 'Two.', 'Three.', 'Four.'] },
      PROMPTS,
    );
    const policy = new GpuPolicy(t.model, t.tokenizer);
    for (const prompts of [sp, vp]) {
      expect(prompts.some((p) => p.kvShare && p.kvShare.tokens >= 16)).toBe(true); // some prompt borrows pages
      const shared = await policy.promptLogits(prompts);
      // Fresh: each prompt alone, in a cache of its own.
      const V = t.model.cfg.vocabSize;
      let worst = 0;
      for (const [b, p] of unshared(prompts).entries()) {
        const fresh = await policy.promptLogits([p]);
        const row = shared.subarray(b * V, (b + 1) * V);
        let maxDiff = 0,
          maxAbs = 0;
        for (let i = 0; i < V; i++) {
          maxDiff = Math.max(maxDiff, Math.abs(row[i]! - fresh[i]!));
          maxAbs = Math.max(maxAbs, Math.abs(fresh[i]!));
        }
        worst = Math.max(worst, maxDiff / maxAbs);
      }
      measured[`shared prefix rel err (${prompts === sp ? 'summaries' : 'votes'})`] = worst.toExponential(2);
      expect(worst).toBeLessThanOrEqual(1e-5);
    }
  });

  it('with a clock, generate measures its prefill (GPU work finished) and samples the same tokens', async () => {
    const roles = assignRoles(4, Rng.fromSeed(3));
    const sp = summaryPrompts(t.tokenizer, roles, FULL, SPY, PROMPTS).prompts;
    const opts = { maxTokens: 4, temperature: 1, topK: 0, topP: 1, seeds: [1, 2, 3, 4] };
    const plain = new GpuPolicy(t.model, t.tokenizer);
    const want = await plain.generate(sp, opts);
    expect(plain.prefillMs).toBeUndefined(); // no clock: nothing measured, not a 0
    const timed = new GpuPolicy(t.model, t.tokenizer);
    timed.clock = () => performance.now();
    const w0 = performance.now();
    const got = await timed.generate(sp, opts);
    const wall = performance.now() - w0;
    expect(got.map((g) => g.tokenIds)).toEqual(want.map((g) => g.tokenIds));
    expect(got.map((g) => g.logprobs)).toEqual(want.map((g) => g.logprobs));
    measured['prefill / generate wall'] = `${timed.prefillMs!.toFixed(0)} / ${wall.toFixed(0)} ms`;
    expect(timed.prefillMs).toBeGreaterThan(0);
    expect(timed.prefillMs).toBeLessThan(wall);
  });

  it('voteLogprobs equal the restricted softmax of a plain forward', async () => {
    const roles = assignRoles(4, Rng.fromSeed(5));
    const vp = votePrompts(
      t.tokenizer,
      { roles, civilianText: FULL, spyText: SPY, summaries: ['A.', 'B.', 'C.', 'D.'] },
      PROMPTS,
    );
    const labels = labelTokenIds(t.tokenizer, 4);
    const cands = vp.map((_, v) => labels.filter((_, j) => j !== v));
    const got = await new GpuPolicy(t.model, t.tokenizer).voteLogprobs(vp, cands);
    let worst = 0,
      fullWorst = 0;
    for (const [b, p] of vp.entries()) {
      const T = p.tokenIds.length;
      const cache = t.model.createCache(1, T);
      const buf = t.model.forward(
        { ids: p.tokenIds, slots: p.tokenIds.map(() => 0), positions: p.tokenIds.map((_, i) => i), logitRows: [T - 1] },
        cache,
      );
      const logits = await gpu.readF32(buf, t.model.cfg.vocabSize);
      gpu.releaseBuffer(buf);
      cache.destroy();
      // voteLogprobs is the full-vocabulary log-softmax at the candidates; castVotes renormalises
      // it over them. Both are checked against the plain forward, in f64 on the CPU.
      let m = -Infinity;
      for (const x of logits) m = Math.max(m, x);
      let sum = 0;
      for (const x of logits) sum += Math.exp(x - m);
      const fullLse = m + Math.log(sum);
      const z = cands[b]!.map((id) => logits[id]!);
      const mx = Math.max(...z);
      const lse = mx + Math.log(z.reduce((s, x) => s + Math.exp(x - mx), 0));
      const restricted = renormalize(got[b]!);
      z.forEach((x, j) => {
        worst = Math.max(worst, Math.abs(restricted[j]! - (x - lse)));
        fullWorst = Math.max(fullWorst, Math.abs(got[b]![j]! - (x - fullLse)));
      });
    }
    measured['voteLogprobs restricted vs plain forward, max abs'] = worst.toExponential(2);
    measured['voteLogprobs full-vocab vs plain forward, max abs'] = fullWorst.toExponential(2);
    expect(worst).toBeLessThanOrEqual(1e-5);
    expect(fullWorst).toBeLessThanOrEqual(1e-5);
  });

  // A played round (3 players, voteReason on): every sample the trainer would train.
  const played = new Map<number, PolicySample[]>();
  async function roundSamples(temperature: number): Promise<PolicySample[]> {
    if (played.has(temperature)) return played.get(temperature)!;
    const config = validateConfig({
      groupSize: 3,
      docTokenBudget: 64,
      summaryMaxTokens: 8,
      voteReason: true,
      voteReasonMaxTokens: 4,
      seed: 5,
      sampling: { temperature },
      prompts: { summaryInstruction: PROMPTS.summaryInstruction, voteInstruction: PROMPTS.voteInstruction },
      rewards: { spyVote: 1 }, // the spy's vote is trained too: more vote samples
    });
    const res = await playRound(
      {
        config,
        tokenizer: t.tokenizer,
        document: { id: 'doc', report: FULL },
        round: 0,
        rng: roundRng(config.seed, 0),
        spyBaseline: INITIAL_SPY_BASELINE,
      },
      new GpuPolicy(t.model, t.tokenizer),
    );
    played.set(temperature, res.samples);
    return res.samples;
  }

  async function maxRatioError(
    temperature: number,
    checkpoints: CheckpointDtype,
  ): Promise<{ err: number; tokens: Record<string, number> }> {
    const samples = await roundSamples(temperature);
    const tokens: Record<string, number> = { summary: 0, reason: 0, label: 0 };
    let err = 0;
    for (const s of samples) {
      const pass = samplePass(t.model, adapter, s, { checkpoints }, temperature);
      const logp = await pass.forward();
      pass.release();
      expect(logp.length).toBe(s.oldLogprobs.length);
      logp.forEach((x, i) => (err = Math.max(err, Math.abs(x - s.oldLogprobs[i]!))));
      tokens[s.stage === 'summary' ? 'summary' : s.candidateTokenIds ? 'label' : 'reason'] += logp.length;
    }
    return { err, tokens };
  }

  it.each([1, 0.7])(
    'ratio 1: stored sampling log-probs == training-pass recomputation, temperature %f',
    async (temperature) => {
      const { err, tokens } = await maxRatioError(temperature, 'f32');
      expect(tokens.summary).toBeGreaterThan(0);
      expect(tokens.reason).toBeGreaterThan(0);
      expect(tokens.label).toBe(3); // one label per voter (spyVote > 0: the spy's vote is trained)
      measured[`ratio-1 max |logp - old| T=${temperature} f32`] =
        `${err.toExponential(2)} over ${JSON.stringify(tokens)}`;
      expect(err).toBeLessThanOrEqual(1e-4);
      if (temperature !== 1) return;
      // The trainer's default bf16 checkpoints round each layer's input: close, not exact.
      const bf16 = await maxRatioError(temperature, 'bf16');
      measured[`ratio-1 max |logp - old| T=${temperature} bf16 checkpoints`] = bf16.err.toExponential(2);
      expect(bf16.err).toBeLessThan(0.1);
      // The f16 GEMM (tuning.gemmF16, 'auto' on GPUs with shader-f16) in the training forward,
      // against log-probs sampled through the f32 decode GEMV: the same budget as bf16 checkpoints.
      if (process.env.SPYRL_REQUIRE_F16) expect(gpu.features.f16).toBe(true);
      if (!gpu.features.f16) return;
      const saved = { ...K.tuning }; // the run's own settings (SPYRL_KERNELS) come back after
      Object.assign(K.tuning, { matmul: 'tiled', gemmF16: 'on' });
      try {
        const f16 = await maxRatioError(temperature, 'f32');
        // The projections (with LoRA: op matmulLora, the branch in the store) and the LM head's tiles.
        const tiled = ['matmul', 'matmulLora']
          .map((op) => K.kernelVariant(gpu, op))
          .filter((v) => v?.label.includes('gemm_tiled'));
        expect(tiled.length, 'a tiled product ran').toBeGreaterThan(0);
        for (const v of tiled) expect(v!.defines.F16, v!.label).toBe(1);
        measured[`ratio-1 max |logp - old| T=${temperature} f16 GEMM`] = f16.err.toExponential(2);
        expect(f16.err).toBeLessThan(0.1);
      } finally {
        Object.assign(K.tuning, saved);
      }
    },
    180_000,
  );

  it('a recomputation at the wrong temperature is caught (the ratio test can fail)', async () => {
    const samples = (await roundSamples(0.7)).filter((s) => s.stage === 'summary');
    let err = 0;
    for (const s of samples) {
      const pass = samplePass(t.model, adapter, s, { checkpoints: 'f32' }, 1);
      const logp = await pass.forward();
      pass.release();
      logp.forEach((x, i) => (err = Math.max(err, Math.abs(x - s.oldLogprobs[i]!))));
    }
    expect(err).toBeGreaterThan(1e-2);
  }, 60_000);

  it('the sampler returns the log-prob of the distribution it drew from (temperature, top-k, top-p)', async () => {
    const V = 8,
      N = 64;
    const row = Float32Array.from([1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.9, 2.2]);
    const logits = new Float32Array(N * V);
    for (let b = 0; b < N; b++) logits.set(row, b * V);
    const lb = gpu.createBuffer(N * V * 4, 'logits');
    gpu.write(lb, logits);
    const ids = gpu.createBuffer(N * 4, 'ids'),
      lp = gpu.createBuffer(N * 4, 'lp');
    for (const [temperature, topK, topP] of [
      [1, 0, 1],
      [0.7, 0, 1],
      [1.5, 6, 0.7],
      [1, 3, 1],
      [0.8, 0, 0.6],
    ] as const) {
      K.sample(gpu, ids, lb, N, V, { temperature, topK, topP }, 99, 1, lp);
      const got = await gpu.readU32(ids, N);
      const gotLp = await gpu.readF32(lp, N);
      const p = ref.sampleDistribution(row, temperature, topK, topP);
      for (let b = 0; b < N; b++) {
        expect(p[got[b]!]).toBeGreaterThan(0);
        expect(Math.abs(gotLp[b]! - Math.log(p[got[b]!]!)), `T=${temperature} k=${topK} p=${topP}`).toBeLessThan(1e-5);
      }
    }
    K.sample(gpu, ids, lb, N, V, { temperature: 0, topK: 0, topP: 1 }, 99, 1, lp);
    expect(Array.from(await gpu.readF32(lp, N)).every((x) => x === 0)).toBe(true); // greedy: a point mass
    for (const b of [lb, ids, lp]) gpu.releaseBuffer(b);
  });
});
