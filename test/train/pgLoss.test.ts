// Policy-gradient loss math (src/train/pgLoss.ts) and the schedules (src/train/schedule.ts):
// hand-computed values, clip edges, and dlogp against central finite differences of the loss.
// Run: npx vitest run test/train/pgLoss.test.ts

import { describe, expect, it } from 'vitest';
import {
  crossEntropyLoss,
  klK3,
  ppoClipTerm,
  ppoLoss,
  type PpoBatch,
  type PpoLossOptions,
} from '../../src/train/pgLoss.ts';
import { clipScale, learningRate } from '../../src/train/schedule.ts';
import { rng } from '../helpers/reference.ts';

describe('ppoClipTerm', () => {
  const [lo, hi] = [1 - 0.2, 1 + 0.2];
  it.each([
    // ratio, A, loss, dRatio, clipped
    [1.5, 2, -2.4, 0, true], // A > 0, ratio above 1+eps: clipped, no gradient
    [0.5, 2, -1, -2, false], // A > 0, ratio below 1-eps: the unclipped term is smaller
    [0.5, -2, 1.6, 0, true], // A < 0, ratio below 1-eps: clipped
    [1.5, -2, 3, 2, false], // A < 0, ratio above 1+eps: unclipped (pessimistic bound)
    [1.1, 3, -3.3, -3, false], // inside the range
    [1.7, 0, 0, 0, false], // zero advantage: nothing to learn
  ])('ratio %f, A %f -> loss %f, dRatio %f, clipped %s', (ratio, A, loss, dRatio, clipped) => {
    const got = ppoClipTerm(ratio, A, lo, hi);
    expect(got.loss).toBeCloseTo(loss, 12);
    expect(got.dRatio + 0).toBe(dRatio + 0); // + 0 turns -0 into 0
    expect(got.clipped).toBe(clipped);
  });

  it('at exactly 1 +- eps keeps the unclipped gradient for both signs of A', () => {
    for (const ratio of [lo, hi]) {
      for (const A of [-1.5, 1.5]) {
        const got = ppoClipTerm(ratio, A, lo, hi);
        expect(got.clipped).toBe(false);
        expect(got.dRatio).toBe(-A);
        expect(got.loss).toBe(-ratio * A);
      }
    }
    // One ulp past the edge on the clipping side is clipped.
    expect(ppoClipTerm(hi + 2 ** -52, 1, lo, hi).clipped).toBe(true);
    expect(ppoClipTerm(lo - 2 ** -53, -1, lo, hi).clipped).toBe(true);
    expect(ppoClipTerm(hi + 2 ** -52, -1, lo, hi).clipped).toBe(false);
    expect(ppoClipTerm(lo - 2 ** -53, 1, lo, hi).clipped).toBe(false);
  });
});

describe('klK3', () => {
  it('value and gradient by hand', () => {
    const k = klK3(-1, -0.5); // ref - logp = 0.5
    expect(k.value).toBeCloseTo(Math.exp(0.5) - 0.5 - 1, 15);
    expect(k.value).toBeCloseTo(0.1487212707001282, 15);
    expect(k.dlogp).toBeCloseTo(1 - Math.exp(0.5), 15);
    expect(klK3(-2, -2)).toEqual({ value: 0, dlogp: -0 });
    const far = klK3(-0.1, -5); // ref far below: the estimate is still >= 0
    expect(far.value).toBeCloseTo(Math.exp(-4.9) + 4.9 - 1, 12);
    expect(far.dlogp).toBeCloseTo(1 - Math.exp(-4.9), 12);
  });

  it('stays accurate for tiny differences (k3 ~ d^2 / 2)', () => {
    const d = 1e-7;
    const k = klK3(0, d);
    expect(k.value / ((d * d) / 2)).toBeCloseTo(1, 6);
    expect(k.dlogp / -d).toBeCloseTo(1, 6);
  });

  it('gradient matches finite differences', () => {
    for (const [logp, refLogp] of [
      [-1, -0.5],
      [-3, -0.2],
      [-0.01, -4],
    ]) {
      const h = 1e-6;
      const fd = (klK3(logp + h, refLogp).value - klK3(logp - h, refLogp).value) / (2 * h);
      expect(Math.abs(klK3(logp, refLogp).dlogp - fd)).toBeLessThan(1e-8);
    }
  });
});

describe('ppoLoss', () => {
  // Two sequences: tokens 0, 1 and token 2. Ratios 1.5, 0.5, 1.1.
  const small: PpoBatch = {
    logp: [Math.log(1.5) - 1, Math.log(0.5) - 2, Math.log(1.1) - 0.5],
    oldLogp: [-1, -2, -0.5],
    advantages: [2, -2, 3],
    seqLens: [2, 1],
  };
  // Per-token losses from the ppoClipTerm table: -2.4 (clipped), 1.6 (clipped), -3.3.

  it('token-mean by hand, with gradients', () => {
    const r = ppoLoss(small);
    expect(r.loss).toBeCloseTo((-2.4 + 1.6 - 3.3) / 3, 12);
    // Clipped tokens get no gradient; token 2: dloss/dlogp = w * (-A) * ratio = (1/3) * -3 * 1.1.
    expect(Array.from(r.dlogp).map((x) => (Math.abs(x) < 1e-15 ? 0 : x))).toEqual([0, 0, expect.closeTo(-1.1, 12)]);
    expect(r.stats.clipFraction).toBeCloseTo(2 / 3, 15);
    expect(r.stats.meanRatio).toBeCloseTo((1.5 + 0.5 + 1.1) / 3, 12);
    expect(r.stats.kl).toBe(0);
  });

  it('sequence-mean by hand: mean within each sequence, then over sequences', () => {
    const r = ppoLoss(small, { aggregation: 'sequence-mean' });
    expect(r.loss).toBeCloseTo(((-2.4 + 1.6) / 2 + -3.3) / 2, 12);
    expect(r.dlogp[2]).toBeCloseTo(0.5 * -3 * 1.1, 12);
  });

  it('clip-higher: a larger upper range unclips token 0', () => {
    const r = ppoLoss(small, { clipEpsHigh: 0.6 });
    expect(r.loss).toBeCloseTo((-3 + 1.6 - 3.3) / 3, 12);
    expect(r.dlogp[0]).toBeCloseTo((1 / 3) * -2 * 1.5, 12);
    expect(r.stats.clipFraction).toBeCloseTo(1 / 3, 15);
  });

  it('ratio exactly at 1 + eps through logp keeps the gradient', () => {
    const batch: PpoBatch = { logp: [Math.log(1.2)], oldLogp: [0], advantages: [1], seqLens: [1] };
    expect(Math.exp(batch.logp[0] - batch.oldLogp[0])).toBe(1.2); // the edge is hit exactly
    const r = ppoLoss(batch);
    expect(r.stats.clipFraction).toBe(0);
    expect(r.dlogp[0]).toBeCloseTo(-1.2, 14);
  });

  it('KL term by hand: beta * k3 added per token, stat is the token-mean k3', () => {
    const refLogp = [-1.5, -2, -0.2];
    const r = ppoLoss({ ...small, refLogp }, { klBeta: 0.1 });
    const k = small.logp.length;
    const k3 = Array.from({ length: k }, (_, t) => klK3(small.logp[t], refLogp[t]));
    const k3Mean = k3.reduce((s, x) => s + x.value, 0) / k;
    expect(r.loss).toBeCloseTo((-2.4 + 1.6 - 3.3) / 3 + 0.1 * k3Mean, 12);
    expect(r.stats.kl).toBeCloseTo(k3Mean, 15);
    expect(r.dlogp[0]).toBeCloseTo((0.1 * k3[0].dlogp) / 3, 15); // clipped: only the KL gradient
  });

  // Random batches: tokens away from the clip edges (the loss has kinks there), both aggregations.
  function randomBatch(seed: number, withRef: boolean): PpoBatch {
    const rand = rng(seed);
    const seqLens = [3, 1, 5, 2];
    const T = seqLens.reduce((a, b) => a + b);
    const oldLogp = Array.from({ length: T }, () => -0.1 - 4 * rand());
    const nearEdge = (d: number) => [0.8, 0.9, 1.1, 1.2, 1.28].some((edge) => Math.abs(Math.exp(d) - edge) < 1e-3);
    const logp = oldLogp.map((o) => {
      let d: number;
      do d = (rand() - 0.5) * 0.8;
      while (nearEdge(d));
      return o + d;
    });
    const advantages = Array.from({ length: T }, () => (rand() - 0.5) * 4);
    const refLogp = withRef ? oldLogp.map((o) => o + (rand() - 0.5)) : undefined;
    return { logp, oldLogp, advantages, refLogp, seqLens };
  }

  for (const opts of [
    { aggregation: 'token-mean' },
    { aggregation: 'sequence-mean' },
    { aggregation: 'token-mean', klBeta: 0.3 },
    { aggregation: 'sequence-mean', klBeta: 0.05, clipEps: 0.1, clipEpsHigh: 0.28 },
  ] as PpoLossOptions[]) {
    it(`dlogp matches central finite differences (${JSON.stringify(opts)})`, () => {
      const batch = randomBatch(7 + (opts.klBeta ?? 0) * 100, (opts.klBeta ?? 0) > 0);
      const { dlogp, stats } = ppoLoss(batch, opts);
      expect(stats.clipFraction).toBeGreaterThan(0); // both branches are exercised
      expect(stats.clipFraction).toBeLessThan(1);
      const logp = Array.from(batch.logp);
      const h = 1e-6;
      for (let t = 0; t < logp.length; t++) {
        const at = (x: number) => ppoLoss({ ...batch, logp: logp.map((v, i) => (i === t ? x : v)) }, opts).loss;
        const fd = (at(logp[t] + h) - at(logp[t] - h)) / (2 * h);
        expect(Math.abs(dlogp[t] - fd), `token ${t}: ${dlogp[t]} vs ${fd}`).toBeLessThan(1e-8);
      }
    });
  }

  it('rejects inconsistent batches', () => {
    expect(() => ppoLoss({ ...small, seqLens: [2, 2] })).toThrow(RangeError);
    expect(() => ppoLoss({ ...small, seqLens: [3, 0] })).toThrow(RangeError);
    expect(() => ppoLoss({ ...small, advantages: [1, 2] })).toThrow(RangeError);
    expect(() => ppoLoss(small, { klBeta: 0.1 })).toThrow(/refLogp/);
    expect(() => ppoLoss({ logp: [], oldLogp: [], advantages: [], seqLens: [] })).toThrow(RangeError);
  });
});

describe('crossEntropyLoss', () => {
  it('is -mean(logp) with dlogp = -1/T, matching finite differences', () => {
    const logp = [-0.5, -2, -0.25, -3.25];
    const r = crossEntropyLoss(logp);
    expect(r.loss).toBe(1.5);
    expect(Array.from(r.dlogp)).toEqual([-0.25, -0.25, -0.25, -0.25]);
    const h = 1e-6;
    const fd =
      (crossEntropyLoss([logp[0] + h, ...logp.slice(1)]).loss -
        crossEntropyLoss([logp[0] - h, ...logp.slice(1)]).loss) /
      (2 * h);
    expect(fd).toBeCloseTo(-0.25, 8);
  });
});

describe('learningRate', () => {
  it('constant, with and without warmup', () => {
    expect(learningRate(1e-4, { kind: 'constant' }, 1)).toBe(1e-4);
    expect(learningRate(1e-4, { kind: 'constant' }, 1000)).toBe(1e-4);
    const s = { kind: 'constant', warmup: 4 } as const;
    [2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4].forEach((want, k) => expect(learningRate(1e-4, s, k + 1)).toBeCloseTo(want, 18));
    expect(learningRate(1e-4, s, 4)).toBe(1e-4); // exactly lr at the end of warmup
  });

  it('cosine: linear warmup, lr at the end of warmup, midpoint, minLr at total and after', () => {
    const s = { kind: 'cosine', minLr: 1e-4, warmup: 10, total: 110 } as const;
    const lr = (step: number) => learningRate(1e-3, s, step);
    expect(lr(1)).toBeCloseTo(1e-4, 18);
    expect(lr(5)).toBeCloseTo(5e-4, 18);
    expect(lr(10)).toBe(1e-3);
    expect(lr(60)).toBeCloseTo(5.5e-4, 15); // halfway through the cosine
    expect(lr(35)).toBeCloseTo(1e-4 + 0.5 * 9e-4 * (1 + Math.cos(Math.PI / 4)), 15);
    expect(lr(110)).toBeCloseTo(1e-4, 18);
    expect(lr(500)).toBeCloseTo(1e-4, 18);
    for (let k = 11; k <= 110; k++) expect(lr(k)).toBeLessThanOrEqual(lr(k - 1));
    expect(learningRate(1e-3, { ...s, warmup: 0 }, 1)).toBeCloseTo(
      1e-4 + 0.5 * 9e-4 * (1 + Math.cos(Math.PI / 110)),
      15,
    );
  });

  it('rejects steps below 1 and total < warmup', () => {
    expect(() => learningRate(1, { kind: 'constant' }, 0)).toThrow(RangeError);
    expect(() => learningRate(1, { kind: 'cosine', warmup: 10, total: 5, minLr: 0 }, 11)).toThrow(RangeError);
  });
});

describe('clipScale', () => {
  it('is min(1, maxNorm / (norm + 1e-6)) and refuses a non-finite norm', () => {
    expect(clipScale(0.5, 1)).toBe(1);
    expect(clipScale(4, 1)).toBeCloseTo(1 / (4 + 1e-6), 15);
    expect(clipScale(0, 1)).toBe(1);
    expect(clipScale(1e9, Infinity)).toBe(1);
    expect(() => clipScale(NaN, 1)).toThrow(/skip/);
    expect(() => clipScale(Infinity, 1)).toThrow(RangeError);
  });
});
