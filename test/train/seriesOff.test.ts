// The charts' series (src/store/rounds.ts): a KL that was not computed stays null (the chart says
// "off"), never a 0 point; each stage's loss and grad-norm share are carried per update.
import { describe, expect, it } from 'vitest';
import { EMPTY_SERIES, reduceSeries } from '../../src/store/rounds.ts';

const stages = {
  summary: { loss: -0.1, gradNorm: 0.3, gradShare: 0.9, sequences: 8, tokens: 900 },
  vote: { loss: 0.05, gradNorm: 0.1, gradShare: 0.1, sequences: 6, tokens: 6 },
};

describe('update series', () => {
  it('keeps an uncomputed KL as null and the stage losses and shares', () => {
    let s = reduceSeries(EMPTY_SERIES, {
      type: 'update',
      round: 1,
      step: 1,
      loss: -0.05,
      kl: null,
      gradNorm: 0.4,
      lr: 1e-4,
      skipped: false,
      stages,
    });
    s = reduceSeries(s, {
      type: 'update',
      round: 3,
      step: 2,
      loss: -0.02,
      kl: 0.003,
      gradNorm: 0.2,
      lr: 1e-4,
      skipped: false,
      stages,
    });
    expect(s.updates[0]).toMatchObject({
      round: 2,
      kl: null,
      summaryLoss: -0.1,
      voteLoss: 0.05,
      summaryGradShare: 0.9,
      voteGradShare: 0.1,
    });
    expect(s.updates[1]!.kl).toBe(0.003);
  });

  it('an update event without stage stats leaves them null, not 0', () => {
    const s = reduceSeries(EMPTY_SERIES, {
      type: 'update',
      round: 0,
      step: 1,
      loss: 0.1,
      kl: 0,
      gradNorm: 0.4,
      lr: 1e-4,
      skipped: false,
    });
    expect(s.updates[0]).toMatchObject({
      kl: 0,
      summaryLoss: null,
      voteLoss: null,
      summaryGradShare: null,
      voteGradShare: null,
    });
  });
});
