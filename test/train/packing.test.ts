// Prefix sharing in the update (src/train/packing.ts, src/train/update.ts):
// - the packed layout: each sequence's tokens, positions and targets recovered from its path, the
//   keyEnd of every token (what sees it), shared tokens only where no target is;
// - a packed TrainingPass against each sequence run alone: the same log-probs and the same summed
//   LoRA gradients (text at temperature 0.7, and restricted votes with each voter's candidates);
// - ppoUpdate with and without packing: the same loss, stage norms and update, fewer tokens run;
//   a pack never exceeds the byte budget it is given.
// Run: npx vitest run test/train/packing.test.ts
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { DEFAULT_CONFIG } from '../../src/game/config.ts';
import type { PolicySample } from '../../src/game/round.ts';
import type { LoraAdapter } from '../../src/model/lora.ts';
import { packSequences, sharedTokens, type PackInput } from '../../src/train/packing.ts';
import { LoraAdamW, DEFAULT_ADAMW } from '../../src/train/optimizer.ts';
import { TrainingPass, trainingPassBytes } from '../../src/train/trainingPass.ts';
import { splitKAuto } from '../../src/ops/forward.ts';
import {
  packKeepLayers,
  planPacks,
  ppoUpdate,
  samplePass,
  sampleSequence,
  type RoundSample,
} from '../../src/train/update.ts';
import { attachAdapter, movedLora, tinySetup, type TinySetup } from '../helpers/train.ts';

/** A prompt + completion as TrainingPass sees it (targets from the last prompt token on). */
function seq(prompt: number[], completion: number[]): PackInput {
  return sampleSequence({ promptTokenIds: prompt, completionTokenIds: completion } as PolicySample);
}

/** Each sequence's path through the layout: the packed tokens that it sees at its own positions. */
function pathOf(L: ReturnType<typeof packSequences>, lastToken: number): number[] {
  // Walk back from the sequence's last token: a token's ancestor at position p - 1 is the latest
  // earlier token whose subtree still holds it.
  const path = [lastToken];
  for (let t = lastToken; L.positions[t]! > 0;) {
    let a = t - 1;
    while (!(L.positions[a] === L.positions[t]! - 1 && L.keyEnd[a]! > t)) a--;
    path.unshift(a);
    t = a;
  }
  return path;
}

describe('packSequences', () => {
  const A = [1, 2, 3, 4, 5, 6];
  const seqs = [
    seq(A, [70, 71, 72]), // civilian 1
    seq([1, 2, 3, 9, 9], [80, 81]), // the spy: shares 1 2 3
    seq(A, [73, 74]), // civilian 2: the same prompt
    seq([5, 5], [90]), // shares nothing
    seq(A, [70, 71, 72]), // the same as civilian 1
  ];
  const L = packSequences(seqs);

  it('recovers every sequence from its path, with its positions and targets', () => {
    const T = L.ids.length;
    expect(L.targets.length).toBe(T);
    expect(L.positions.length).toBe(T);
    expect(L.keyEnd.length).toBe(T);
    const targetTokens = [...L.targets.keys()].filter((t) => L.targets[t]! >= 0);
    for (const [i, s] of seqs.entries()) {
      const rows = L.rows[i]!;
      expect(rows.length).toBe(s.targets.filter((t) => t >= 0).length);
      // The sequence's last token is the token of its last target row.
      const path = pathOf(L, targetTokens[rows[rows.length - 1]!]!);
      expect(path.map((t) => L.ids[t])).toEqual(s.ids.slice(0, path.length));
      expect(path.length).toBe(s.ids.length - 1); // its last id is a target only
      expect(path.map((t) => L.positions[t])).toEqual(path.map((_, p) => p));
      expect(path.map((t) => L.targets[t])).toEqual(s.targets.slice(0, path.length));
      expect(rows.map((m) => targetTokens[m])).toEqual(path.filter((t) => L.targets[t]! >= 0));
    }
  });

  it('shares only target-free prompt tokens, and each token is seen by its own subtree only', () => {
    // Shared: 1 2 3 by the four sequences starting with them, 4 5 by the three civilians; the last
    // prompt token (6) is each sequence's own, as it predicts the first completion token.
    expect(sharedTokens(seqs, L)).toBe(3 * 3 + 2 * 2);
    for (let j = 0; j < L.ids.length; j++) {
      expect(L.keyEnd[j]).toBeGreaterThan(j);
      // Every token inside [j, keyEnd) descends from j: its path goes through j.
      for (let t = j; t < L.keyEnd[j]!; t++) expect(pathOf(L, t)).toContain(j);
      // And none after it does.
      for (let t = L.keyEnd[j]!; t < L.ids.length; t++) expect(pathOf(L, t)).not.toContain(j);
    }
  });

  it('a single sequence is itself, causal', () => {
    const one = packSequences([seqs[0]!]);
    expect(one.ids).toEqual(seqs[0]!.ids);
    expect(one.positions).toEqual(one.ids.map((_, i) => i));
    expect(new Set(one.keyEnd.slice(0, 5))).toEqual(new Set([one.ids.length]));
  });

  it('refuses a sequence whose targets do not match its tokens', () => {
    expect(() => packSequences([{ ids: [1, 2], targets: [-1] }])).toThrow(/sequence 0: 1 targets for 2 tokens/);
  });
});

let gpu: Gpu, t: TinySetup;
beforeAll(async () => {
  gpu = await createGpu();
  t = await tinySetup(gpu, 5);
});
afterAll(async () => {
  gpu?.destroy();
  await t?.cleanup();
});

async function readGrads(adapter: LoraAdapter): Promise<Float32Array[]> {
  const r = adapter.settings.r;
  const out: Float32Array[] = [];
  for (const p of adapter.pairs) {
    out.push(await gpu.readF32(p.dA, r * p.K));
    out.push(await gpu.readF32(p.dB, p.N * r));
  }
  return out;
}

/** max |a - b| over max |b|, over every tensor. */
function relErr(a: Float32Array[], b: Float32Array[]): number {
  let err = 0,
    mx = 0;
  for (const [i, x] of a.entries())
    for (let k = 0; k < x.length; k++) {
      err = Math.max(err, Math.abs(x[k]! - b[i]![k]!));
      mx = Math.max(mx, Math.abs(b[i]![k]!));
    }
  return err / mx;
}

const prompt = (n: number, seed: number) => Array.from({ length: n }, (_, i) => 200 + ((i * 37 + seed * 11) % 3000));

describe('a packed TrainingPass', () => {
  // Text: three sequences on one prompt (one of them twice as long), one sharing half of it; votes:
  // one report, each voter's own line and candidates.
  const P = prompt(40, 1);
  const text = [
    { ids: P, c: [11, 12, 13, 14, 15] },
    { ids: P, c: [21, 22] },
    { ids: [...P.slice(0, 20), ...prompt(15, 2)], c: [31, 32, 33] },
    { ids: P, c: [41, 42, 43, 44, 45, 46, 47, 48, 49] },
  ];
  const V = prompt(30, 3);
  const votes = [
    { ids: [...V, 7, 8, 16], c: [17], cands: [17, 18, 19] },
    { ids: [...V, 7, 9, 16], c: [16], cands: [16, 18, 19] },
    { ids: [...V, 7, 10, 16], c: [19], cands: [16, 17, 19] },
  ];

  it.each([
    ['text at temperature 0.7', text, 0.7],
    ['restricted votes', votes, 1],
  ] as const)(
    '%s: the log-probs and summed gradients of the sequences run alone',
    async (_, list, temperature) => {
      const { lora, weights } = movedLora(t.model, 4, 3, 0.1);
      const adapter = attachAdapter(t.model, lora, weights);
      try {
        const seqs = list.map((x) => seq(x.ids, x.c));
        const cands = list.map((x) => ('cands' in x ? x.cands : null));
        const rand = (i: number, k: number) => Math.sin(7 * i + 3 * k + 1);
        // Alone: each sequence's log-probs, and the sum of their backwards for dlogp = rand.
        adapter.zeroGrad();
        const alone: Float32Array[] = [];
        for (const [i, s] of seqs.entries()) {
          const pass = new TrainingPass(t.model, adapter, s.ids, s.targets, cands[i], {
            temperature,
            checkpoints: 'f32',
          });
          alone.push(await pass.forward());
          pass.backward(Array.from(alone[i]!, (_, k) => rand(i, k)));
          pass.release();
        }
        const want = await readGrads(adapter);
        // Packed.
        adapter.zeroGrad();
        const L = packSequences(seqs);
        expect(L.ids.length).toBeLessThan(seqs.reduce((n, s) => n + s.ids.length, 0));
        const rowCands: number[][] = [];
        for (const [i, rows] of L.rows.entries()) for (const m of rows) rowCands[m] = cands[i] ?? [];
        const pass = new TrainingPass(t.model, adapter, L.ids, L.targets, cands[0] ? rowCands : null, {
          temperature,
          checkpoints: 'f32',
          layout: { positions: L.positions, keyEnd: L.keyEnd },
        });
        expect(pass.bytes.peak).toBe(
          trainingPassBytes(t.model.cfg, {
            seqLen: L.ids.length,
            numTargets: pass.numTargets,
            lora: { r: 4, targetModules: adapter.settings.targetModules },
            checkpoints: 'f32',
            candidates: cands[0] ? 3 : undefined,
            packed: true,
            splitK: splitKAuto(t.model.gpu), // the split-K scratch a GPU's choices allocate
          }).peak,
        );
        const logp = await pass.forward();
        const dlogp = new Float64Array(logp.length);
        let worst = 0;
        for (const [i, rows] of L.rows.entries()) {
          for (const [k, m] of rows.entries()) {
            worst = Math.max(worst, Math.abs(logp[m]! - alone[i]![k]!));
            dlogp[m] = rand(i, k);
          }
        }
        pass.backward(dlogp);
        pass.release();
        const got = await readGrads(adapter);
        const err = relErr(got, want);
        console.log(
          `${_}: ${L.ids.length} packed tokens for ${seqs.reduce((n, s) => n + s.ids.length, 0)}; |dlogp| ${worst.toExponential(2)}, gradient rel ${err.toExponential(2)}`,
        );
        expect(worst).toBeLessThan(2e-5);
        expect(err).toBeLessThan(1e-4);
        // Every layer kept (no recompute in the backward): the same log-probs and gradients, bit for bit.
        adapter.zeroGrad();
        const kept = new TrainingPass(t.model, adapter, L.ids, L.targets, cands[0] ? rowCands : null, {
          temperature,
          checkpoints: 'f32',
          layout: { positions: L.positions, keyEnd: L.keyEnd },
          keepLayers: t.model.cfg.numLayers,
        });
        expect(kept.bytes.kept).toBeGreaterThan(0);
        expect(await kept.forward()).toEqual(logp);
        kept.backward(dlogp);
        kept.release();
        const keptGrads = await readGrads(adapter);
        expect(keptGrads).toEqual(got);
        // The control: the same packed tokens with plain causal attention (no keyEnd) see their
        // siblings, and the log-probs move.
        const causal = new TrainingPass(t.model, adapter, L.ids, L.targets, cands[0] ? rowCands : null, {
          temperature,
          checkpoints: 'f32',
        });
        const mixed = await causal.forward();
        causal.release();
        expect(Math.max(...Array.from(mixed, (x, m) => Math.abs(x - logp[m]!)))).toBeGreaterThan(1e-3);
      } finally {
        adapter.destroy();
        t.model.lora = null;
      }
    },
    300_000,
  );

  it('refuses a layout that does not fit its tokens', () => {
    const { lora, weights } = movedLora(t.model, 4, 3, 0.1);
    const adapter = attachAdapter(t.model, lora, weights);
    try {
      const make = (keyEnd: number[], positions = [0, 1, 2]) =>
        new TrainingPass(t.model, adapter, [1, 2, 3], [-1, 5, 6], null, { layout: { positions, keyEnd } });
      expect(() => make([3, 3])).toThrow(/layout has 3 positions and 2 keyEnd entries for 3 tokens/);
      expect(() => make([3, 1, 3])).toThrow(/keyEnd\[1\] = 1 is not in 2\.\.3/);
      expect(() => make([3, 3, 3], [0, 2, 1])).toThrow(/position 1 = 2 is not in 0\.\.1/);
    } finally {
      adapter.destroy();
      t.model.lora = null;
    }
  });
});

describe('ppoUpdate with prefix sharing', () => {
  const sample = (
    round: number,
    stage: 'summary' | 'vote',
    seat: number,
    p: number[],
    c: number[],
    advantage: number,
    cands: number[] | null = null,
  ): RoundSample => ({
    round,
    sample: {
      stage,
      seat,
      promptTokenIds: p,
      completionTokenIds: c,
      oldLogprobs: c.map(() => -3),
      advantage,
      candidateTokenIds: cands,
    } satisfies PolicySample,
  });
  const R = prompt(48, 4);
  const spy = [...R.slice(0, 30), ...prompt(12, 5)];
  const VP = prompt(36, 6);
  const SAMPLES: RoundSample[] = [
    sample(0, 'summary', 0, R, [11, 12, 13, 14], 1),
    sample(0, 'summary', 1, spy, [21, 22, 23], -1.5),
    sample(0, 'summary', 2, R, [31, 32], 0.5),
    sample(0, 'summary', 3, R, [41, 42, 43, 44, 45], 0), // advantage 0: not run
    sample(1, 'summary', 0, R, [51, 52, 53], -0.5), // another round: never packed with round 0
    sample(0, 'vote', 0, [...VP, 7, 8], [17], 1, [17, 18, 19]),
    sample(0, 'vote', 1, [...VP, 7, 9], [16], -1, [16, 18, 19]),
    sample(0, 'vote', 2, [...VP, 7, 10], [19], 1, [16, 17, 19]),
    sample(0, 'vote', 0, [...VP, 7, 8, 3], [40, 41], 1), // a reason: text, not packed with labels
  ];

  /** trainingPassBytes' peak of sample i's pass alone. */
  const singlePeak = (adapter: LoraAdapter, i: number, keepLayers = 0) => {
    const { ids, targets } = sampleSequence(SAMPLES[i]!.sample);
    return trainingPassBytes(t.model.cfg, {
      seqLen: ids.length,
      numTargets: targets.filter((x) => x >= 0).length,
      lora: { r: 4, targetModules: adapter.settings.targetModules },
      checkpoints: 'f32',
      candidates: SAMPLES[i]!.sample.candidateTokenIds?.length,
      keepLayers,
    }).peak;
  };

  async function update(packPrefixes: boolean, klBeta = 0, packBytes?: number) {
    const { lora, weights } = movedLora(t.model, 4, 3, 0.1);
    const adapter = attachAdapter(t.model, lora, weights);
    const samples = SAMPLES.map((x) => ({ ...x, sample: { ...x.sample } }));
    for (const x of samples) {
      const pass = samplePass(t.model, adapter, x.sample, { checkpoints: 'f32' }, 0.8);
      x.sample.oldLogprobs = Array.from(await pass.forward(), (v) => v + 0.05);
      pass.release();
    }
    const optimizer = new LoraAdamW(gpu, adapter, { ...DEFAULT_ADAMW, lr: 1e-3, maxGradNorm: 0 });
    try {
      const res = await ppoUpdate(
        {
          model: t.model,
          adapter,
          optimizer,
          ppo: { ...DEFAULT_CONFIG.ppo, voteWeight: 2, klBeta, epochs: 2 },
          checkpoints: 'f32',
          temperature: 0.8,
          packPrefixes,
          packBytes,
        },
        samples,
      );
      const after = await adapter.getTensors('weights');
      return { res, after };
    } finally {
      optimizer.destroy();
      adapter.destroy();
      t.model.lora = null;
    }
  }

  it('gives the update of the unpacked sequences with fewer tokens', async () => {
    // A roomy budget (every pack it can make), then the default one (the largest single pass).
    for (const [klBeta, budget] of [
      [0, 1e12],
      [0.05, undefined],
    ] as const) {
      const packed = await update(true, klBeta, budget);
      const alone = await update(false, klBeta);
      const a = packed.res,
        b = alone.res;
      console.log(
        `klBeta ${klBeta}, budget ${budget ?? 'default'}: packed ${JSON.stringify(a.packing)} ${JSON.stringify(a.passes)}; alone ${JSON.stringify(b.packing)} ${JSON.stringify(b.passes)}`,
      );
      expect(b.packing.tokens).toBe(b.packing.unpackedTokens);
      // The training passes of 2 epochs: every sample with klBeta > 0, all but the advantage-0
      // one without; the KL term's reference forwards (adapter off) are not training passes.
      expect(b.packing.sequences).toBe(2 * (klBeta > 0 ? SAMPLES.length : SAMPLES.length - 1));
      expect(b.packing.passes).toBe(b.packing.sequences);
      expect(a.packing.unpackedTokens).toBe(b.packing.unpackedTokens);
      expect(a.packing.sequences).toBe(b.packing.sequences);
      expect(a.packing.tokens).toBeLessThan((budget ? 0.75 : 0.9) * b.packing.tokens);
      expect(a.passes.forward).toBeLessThan(b.passes.forward);
      // Kept layers fill each pass up to the budget (every layer with the roomy one); bit for bit
      // the recomputed layers' results, so the comparisons below hold either way.
      expect(a.packing.layers).toBeGreaterThan(0);
      expect(a.packing.layers! % t.model.cfg.numLayers).toBe(0);
      if (budget) expect(a.packing.keptLayers).toBe(a.packing.layers);
      expect(b.packing.keptLayers).toBeGreaterThan(0); // the shorter passes, alone
      for (const [x, y] of a.epochs.map((e, i) => [e, b.epochs[i]!] as const)) {
        expect(Math.abs(x.loss - y.loss)).toBeLessThan(1e-5 * Math.max(1, Math.abs(y.loss)));
        expect(Math.abs(x.gradNorm - y.gradNorm)).toBeLessThan(1e-4 * y.gradNorm);
        expect(Math.abs(x.stages.vote.gradNorm - y.stages.vote.gradNorm)).toBeLessThan(1e-4 * y.stages.vote.gradNorm);
        expect(x.meanRatio).toBeCloseTo(y.meanRatio, 5);
        if (klBeta > 0) expect(Math.abs(x.kl! - y.kl!)).toBeLessThan(1e-5 * Math.abs(y.kl!));
      }
      let diff = 0,
        mx = 0;
      for (const [k, w] of packed.after) {
        const v = alone.after.get(k)!;
        for (let i = 0; i < w.length; i++) {
          diff = Math.max(diff, Math.abs(w[i]! - v[i]!));
          mx = Math.max(mx, Math.abs(v[i]!));
        }
      }
      expect(diff).toBeLessThan(1e-5 * mx);
    }
  }, 600_000);

  it('keeps every pack within its byte budget, and packs nothing when one pass is all it may hold', () => {
    const { lora, weights } = movedLora(t.model, 4, 3, 0.1);
    const adapter = attachAdapter(t.model, lora, weights);
    try {
      const which = [...SAMPLES.keys()];
      const single = (i: number) => singlePeak(adapter, i);
      const largest = Math.max(...which.map(single));
      const roomy = planPacks(t.model, adapter, SAMPLES, which, { checkpoints: 'f32' }, 10 * largest);
      const tight = planPacks(t.model, adapter, SAMPLES, which, { checkpoints: 'f32' }, Math.min(...which.map(single)));
      const members = (ps: typeof roomy) => ps.flatMap((p) => p.members).sort((x, y) => x - y);
      expect(members(roomy)).toEqual(which);
      expect(members(tight)).toEqual(which);
      expect(tight.every((p) => p.members.length === 1)).toBe(true);
      // Roomy: round 0's three civilians and its spy share one pass (the spy shares 30 of its 42
      // prompt tokens); the three labels one; the reason, and round 1, their own.
      const sets = roomy.map((p) => p.members.sort((x, y) => x - y).join(','));
      expect(sets).toContain('0,1,2,3');
      expect(sets).toContain('5,6,7');
      expect(sets).toContain('4');
      expect(sets).toContain('8');
      for (const p of roomy) {
        if (!p.layout) continue;
        const peak = trainingPassBytes(t.model.cfg, {
          seqLen: p.layout.ids.length,
          numTargets: p.layout.rows.reduce((n, r) => n + r.length, 0),
          lora: { r: 4, targetModules: adapter.settings.targetModules },
          checkpoints: 'f32',
          candidates: SAMPLES[p.members[0]!]!.sample.candidateTokenIds ? 3 : undefined,
          packed: true,
        }).peak;
        expect(peak).toBeLessThanOrEqual(10 * largest);
      }
    } finally {
      adapter.destroy();
      t.model.lora = null;
    }
  });

  it('a pass keeps the most layers its peak allows within the budget: a shorter pass more', () => {
    const { lora, weights } = movedLora(t.model, 4, 3, 0.1);
    const adapter = attachAdapter(t.model, lora, weights);
    const L = t.model.cfg.numLayers;
    try {
      const which = [...SAMPLES.keys()];
      const peakOf = (i: number, keepLayers: number) => singlePeak(adapter, i, keepLayers);
      const alone = which.map((i) => ({ members: [i], layout: null }));
      const keepOf = (i: number, budget: number, keep = 0) =>
        packKeepLayers(t.model, adapter, SAMPLES, alone[i]!, { checkpoints: 'f32' }, budget, keep);
      // The budget of the longest pass without kept layers: it keeps none, a shorter one some.
      const longest = which.reduce((a, b) => (peakOf(b, 0) > peakOf(a, 0) ? b : a));
      const budget = peakOf(longest, 0);
      expect(keepOf(longest, budget)).toBe(0);
      const ks = which.map((i) => keepOf(i, budget));
      expect(Math.max(...ks)).toBeGreaterThan(0);
      for (const [i, k] of ks.entries()) {
        expect(peakOf(i, k), `sample ${i} keeps ${k}`).toBeLessThanOrEqual(budget);
        if (k < L) expect(peakOf(i, k + 1), `sample ${i}: ${k + 1} would fit`).toBeGreaterThan(budget);
      }
      // Room for all: every layer; no room even for the floor: the floor.
      expect(keepOf(longest, 1e12)).toBe(L);
      expect(keepOf(longest, 1, 1)).toBe(1);
      // A packed pass counts its packed shape.
      const packs = planPacks(t.model, adapter, SAMPLES, which, { checkpoints: 'f32' }, 1e12);
      for (const p of packs)
        expect(packKeepLayers(t.model, adapter, SAMPLES, p, { checkpoints: 'f32' }, 1e12, 0)).toBe(L);
    } finally {
      adapter.destroy();
      t.model.lora = null;
    }
  });
});
