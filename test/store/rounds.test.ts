// The pure reducers of src/store/rounds.ts: a round's event stream builds the round view the UI
// shows, and the chart series grow one point per round-done, update and eval event.
import { describe, expect, it } from 'vitest';
import type { RoundRecord } from '../../src/game/round.ts';
import {
  CAUGHT_WINDOW,
  describeRoundTime,
  EMPTY_ROUNDS,
  formatDuration,
  EMPTY_SERIES,
  MAX_ROUND_VIEWS,
  reduceRounds,
  reduceSeries,
  seatsInLabelOrder,
  tallies,
  type RoundsState,
  type Series,
} from '../../src/store/rounds.ts';
import type { TrainEvent } from '../../src/train/events.ts';

const REPORT = 'The agency audited its programs. It found gaps in oversight.';

function roundStart(round: number): Extract<TrainEvent, { type: 'round-start' }> {
  return {
    type: 'round-start',
    round,
    documentId: `doc-${round}`,
    fullText: REPORT,
    spyText: 'The agency audited its programs.',
    span: { charStart: 33, charEnd: 61 },
    spyMarkAt: 33,
    cut: { keptTokens: 12, totalTokens: 40 },
    groupSize: 3,
    labels: [2, 1, 3],
    spySeat: 1,
  };
}

type Timings = RoundRecord['timings'];
/** A round with no clock: every stage untimed. */
const UNTIMED: Timings = { summarizeMs: null, summaryPrefillMs: null, voteMs: null, updateMs: null, totalMs: null };

/** The fields of a round's record the reducers read (the rest of RoundRecord is not used by them). */
function record(
  round: number,
  o: {
    spySeat: number;
    summary: number[];
    caught: boolean;
    voteAccuracy: number;
    timings?: Timings;
    train?: Partial<RoundRecord['train']>;
  },
) {
  return {
    round,
    spySeat: o.spySeat,
    rewards: { summary: o.summary },
    metrics: { spyCaught: o.caught, voteAccuracy: o.voteAccuracy },
    train: { loss: null, kl: null, gradNorm: null, lr: null, ...o.train },
    timings: o.timings ?? UNTIMED,
  } as unknown as RoundRecord;
}

function roundDone(
  round: number,
  caught = true,
  tokensPerSecond = 25,
  more: { timings?: Timings; train?: Partial<RoundRecord['train']>; seconds?: number; compiledKernels?: number } = {},
): Extract<TrainEvent, { type: 'round-done' }> {
  return {
    type: 'round-done',
    round,
    record: record(round, { spySeat: 1, summary: [1, -0.5, 0.5], caught, voteAccuracy: 0.5, ...more }),
    tokensPerSecond,
    seconds: more.seconds ?? 2,
    ...(more.compiledKernels === undefined ? {} : { compiledKernels: more.compiledKernels }),
  };
}

/** A finished round's time as the round view holds it (the event and record of the first test). */
const TIME = {
  totalMs: 9500,
  summariesMs: 5000,
  summaryPrefillMs: 1200,
  votesMs: 1500,
  updateMs: 2800,
  packing: { sequences: 7, passes: 3, tokens: 650, unpackedTokens: 1440 },
  compiledKernels: 45,
};

const fold = <S>(reduce: (s: S, e: TrainEvent) => S, s: S, events: TrainEvent[]) => events.reduce(reduce, s);

describe('reduceRounds', () => {
  it('builds a round view from its whole event stream', () => {
    const events: TrainEvent[] = [
      roundStart(4),
      { type: 'summary-delta', round: 4, seat: 0, text: 'Audits ' },
      { type: 'summary-delta', round: 4, seat: 2, text: 'Gaps ' },
      { type: 'summary-delta', round: 4, seat: 0, text: 'found gaps.' },
    ];
    const streaming = fold(reduceRounds, EMPTY_ROUNDS, events);
    expect(streaming.order).toEqual([4]);
    const v = streaming.rounds[4]!;
    expect(v).toMatchObject({
      round: 4,
      documentId: 'doc-4',
      fullText: REPORT,
      span: { charStart: 33, charEnd: 61 },
      cut: { keptTokens: 12, totalTokens: 40 },
      labels: [2, 1, 3],
      spySeat: 1,
      summaries: ['Audits found gaps.', '', 'Gaps '],
      truncated: [false, false, false],
      summariesDone: false,
      votes: [],
      reveal: null,
      summaryRewards: null,
      tokensPerSecond: null,
      time: null,
      done: false,
    });

    const done = fold(reduceRounds, streaming, [
      // The final texts replace the streamed ones (the stream may have been cut at the token limit).
      {
        type: 'summaries-done',
        round: 4,
        summaries: [
          { seat: 0, text: 'Audits found gaps.', truncated: false },
          { seat: 1, text: 'The agency audited', truncated: true },
          { seat: 2, text: 'Gaps in oversight.', truncated: false },
        ],
      },
      { type: 'vote', round: 4, voterSeat: 0, candidateSeats: [1, 2], probs: [0.8, 0.2], chosenSeat: 1 },
      { type: 'vote', round: 4, voterSeat: 2, candidateSeats: [0, 1], probs: [0.4, 0.6], chosenSeat: 1 },
      { type: 'reveal', round: 4, spySeat: 1, caught: true, rewards: [1.5, -0.5, 1.5] },
      roundDone(4, true, 31.5, {
        seconds: 9.5,
        compiledKernels: 45,
        timings: { summarizeMs: 5000, summaryPrefillMs: 1200, voteMs: 1500, updateMs: 2800, totalMs: 6500 },
        train: { loss: 0.3, packing: { sequences: 7, passes: 3, tokens: 650, unpackedTokens: 1440 } },
      }),
    ]);
    expect(done.rounds[4]).toMatchObject({
      summaries: ['Audits found gaps.', 'The agency audited', 'Gaps in oversight.'],
      truncated: [false, true, false],
      summariesDone: true,
      votes: [
        { voterSeat: 0, candidateSeats: [1, 2], probs: [0.8, 0.2], chosenSeat: 1 },
        { voterSeat: 2, candidateSeats: [0, 1], probs: [0.4, 0.6], chosenSeat: 1 },
      ],
      reveal: { caught: true, rewards: [1.5, -0.5, 1.5] },
      summaryRewards: [1, -0.5, 0.5],
      tokensPerSecond: 31.5,
      // The round's wall time from the event (update included), the stages from its record.
      time: TIME,
      done: true,
    });
    // Pure: the earlier state is untouched.
    expect(streaming.rounds[4]!.done).toBe(false);
    expect(streaming.rounds[4]!.votes).toEqual([]);
  });

  it('keeps rounds apart: an event changes only its own round', () => {
    const s = fold(reduceRounds, EMPTY_ROUNDS, [
      roundStart(0),
      roundStart(1),
      { type: 'summary-delta', round: 0, seat: 1, text: 'zero' },
      { type: 'summary-delta', round: 1, seat: 1, text: 'one' },
      roundDone(0),
    ]);
    expect(s.order).toEqual([0, 1]);
    expect(s.rounds[0]!.summaries[1]).toBe('zero');
    expect(s.rounds[1]!.summaries[1]).toBe('one');
    expect(s.rounds[0]!.done).toBe(true);
    expect(s.rounds[1]!.done).toBe(false);
  });

  it('ignores events of a round whose start it never saw (after a resume), returning the same state', () => {
    const s = reduceRounds(EMPTY_ROUNDS, roundStart(7));
    for (const e of [
      { type: 'summary-delta', round: 6, seat: 0, text: 'x' },
      { type: 'vote', round: 6, voterSeat: 0, candidateSeats: [1, 2], probs: [1, 0], chosenSeat: 1 },
      { type: 'reveal', round: 6, spySeat: 1, caught: false, rewards: [0, 0, 0] },
      roundDone(6),
    ] as TrainEvent[])
      expect(reduceRounds(s, e)).toBe(s);
  });

  it('returns the same state for events that are not about a round view', () => {
    const s = reduceRounds(EMPTY_ROUNDS, roundStart(0));
    for (const e of [
      { type: 'update', round: 0, step: 1, loss: 0.3, kl: null, gradNorm: 1, lr: 1e-4, skipped: false },
      { type: 'eval', round: 0, base: 0.2, adapter: 0.25, perDocument: [] },
      { type: 'checkpoint', round: 0 },
    ] as TrainEvent[])
      expect(reduceRounds(s, e)).toBe(s);
  });

  it('a repeated round-start replaces that round and moves it last', () => {
    let s = fold(reduceRounds, EMPTY_ROUNDS, [
      roundStart(0),
      { type: 'summary-delta', round: 0, seat: 0, text: 'old' },
      roundStart(1),
    ]);
    s = reduceRounds(s, { ...roundStart(0), documentId: 'replayed' });
    expect(s.order).toEqual([1, 0]);
    expect(s.rounds[0]).toMatchObject({ documentId: 'replayed', summaries: ['', '', ''] });
  });

  it(`keeps the last ${MAX_ROUND_VIEWS} rounds and drops the oldest`, () => {
    let s: RoundsState = EMPTY_ROUNDS;
    for (let r = 0; r <= MAX_ROUND_VIEWS + 1; r++) s = reduceRounds(s, roundStart(r));
    expect(s.order).toHaveLength(MAX_ROUND_VIEWS);
    expect(s.order[0]).toBe(2);
    expect(s.order.at(-1)).toBe(MAX_ROUND_VIEWS + 1);
    expect(Object.keys(s.rounds)).toHaveLength(MAX_ROUND_VIEWS);
    expect(s.rounds[0]).toBeUndefined();
    expect(s.rounds[1]).toBeUndefined();
    expect(s.rounds[2]).toBeDefined();
  });
});

describe('reduceSeries', () => {
  it('adds one round point per round-done: civilian mean, spy reward, caught, vote accuracy, throughput', () => {
    // Seats 0 and 2 are civilians (1 and 0.5: mean 0.75); seat 1 is the spy (-0.5).
    const s = reduceSeries(EMPTY_SERIES, roundDone(0, true, 25));
    expect(s.rounds).toEqual([
      {
        round: 1,
        civilianReward: 0.75,
        spyReward: -0.5,
        caught: 1,
        caughtRate: 1,
        voteAccuracy: 0.5,
        tokensPerSecond: 25,
        // No clock: no stage timed, so the round-time chart says "off".
        prefillSeconds: null,
        decodeSeconds: null,
        voteSeconds: null,
        updateSeconds: null,
      },
    ]);
    expect(s.updates).toBe(EMPTY_SERIES.updates);
    expect(EMPTY_SERIES.rounds).toEqual([]); // pure
  });

  it('splits a timed round into seconds per stage: prefill, the rest of the summaries, votes, update', () => {
    const timed = { summarizeMs: 5000, summaryPrefillMs: 1200, voteMs: 1500, updateMs: 2800, totalMs: 6500 };
    const withUpdate = reduceSeries(EMPTY_SERIES, roundDone(0, true, 25, { timings: timed, train: { loss: 0.3 } }));
    expect(withUpdate.rounds[0]).toMatchObject({
      prefillSeconds: 1.2,
      decodeSeconds: 3.8,
      voteSeconds: 1.5,
      updateSeconds: 2.8,
    });
    // roundsPerUpdate > 1: a timed round that ran no update spent 0 s on one (the stack still adds up).
    const noUpdate = reduceSeries(EMPTY_SERIES, roundDone(0, true, 25, { timings: { ...timed, updateMs: null } }));
    expect(noUpdate.rounds[0]).toMatchObject({ decodeSeconds: 3.8, updateSeconds: 0 });
    // An update that ran but was not timed is unknown, never 0.
    const untimedUpdate = reduceSeries(
      EMPTY_SERIES,
      roundDone(0, true, 25, { timings: { ...timed, updateMs: null }, train: { loss: 0.3 } }),
    );
    expect(untimedUpdate.rounds[0]!.updateSeconds).toBeNull();
    // A policy that does not measure its prefill: the summaries' whole time stays in one part.
    const noPrefill = reduceSeries(
      EMPTY_SERIES,
      roundDone(0, true, 25, { timings: { ...timed, summaryPrefillMs: null } }),
    );
    expect(noPrefill.rounds[0]).toMatchObject({ prefillSeconds: null, decodeSeconds: 5 });
  });

  it('a spy seat out of range counts as reward 0; a lone spy has civilian mean 0', () => {
    const e = (spySeat: number, summary: number[]): TrainEvent => ({
      type: 'round-done',
      round: 0,
      record: record(0, { spySeat, summary, caught: false, voteAccuracy: 0 }),
      tokensPerSecond: 0,
      seconds: 1,
    });
    expect(reduceSeries(EMPTY_SERIES, e(5, [1, 2])).rounds[0]).toMatchObject({ civilianReward: 1.5, spyReward: 0 });
    expect(reduceSeries(EMPTY_SERIES, e(0, [-1])).rounds[0]).toMatchObject({ civilianReward: 0, spyReward: -1 });
  });

  it(`caught rate is over the last ${CAUGHT_WINDOW} rounds`, () => {
    // Caught in the first 10 rounds, then missed 4 times: 6 of the last 10.
    let s: Series = EMPTY_SERIES;
    for (let r = 0; r < 14; r++) s = reduceSeries(s, roundDone(r, r < 10));
    expect(CAUGHT_WINDOW).toBe(10);
    expect(s.rounds.map((p) => p.round)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    expect(s.rounds[9]!.caughtRate).toBe(1);
    expect(s.rounds[10]!.caughtRate).toBeCloseTo(0.9, 12);
    expect(s.rounds[13]!.caughtRate).toBeCloseTo(0.6, 12);
    // Before the window fills, the rate is over the rounds so far: missed, caught, caught = 2/3.
    let t: Series = EMPTY_SERIES;
    for (const [r, caught] of [
      [0, false],
      [1, true],
      [2, true],
    ] as const)
      t = reduceSeries(t, roundDone(r, caught));
    expect(t.rounds.map((p) => p.caughtRate)).toEqual([0, 0.5, 2 / 3]);
  });

  it('adds an update point, with stage losses and gradient shares, or nulls when not reported', () => {
    const s = fold(reduceSeries, EMPTY_SERIES, [
      { type: 'update', round: 3, step: 2, loss: 0.42, kl: null, gradNorm: 1.7, lr: 5e-5, skipped: false },
      {
        type: 'update',
        round: 7,
        step: 4,
        loss: 0.31,
        kl: 0.002,
        gradNorm: 0.9,
        lr: 4e-5,
        skipped: true,
        reason: 'non-finite gradient',
        stages: {
          summary: { loss: 0.2, gradNorm: 0.78, gradShare: 0.75, sequences: 3, tokens: 36 },
          vote: { loss: 0.11, gradNorm: 0.45, gradShare: 0.25, sequences: 3, tokens: 9 },
        },
      },
    ]);
    expect(s.updates).toEqual([
      {
        round: 4,
        step: 2,
        loss: 0.42,
        kl: null,
        gradNorm: 1.7,
        lr: 5e-5,
        skipped: false,
        summaryLoss: null,
        voteLoss: null,
        summaryGradShare: null,
        voteGradShare: null,
      },
      {
        round: 8,
        step: 4,
        loss: 0.31,
        kl: 0.002,
        gradNorm: 0.9,
        lr: 4e-5,
        skipped: true,
        summaryLoss: 0.2,
        voteLoss: 0.11,
        summaryGradShare: 0.75,
        voteGradShare: 0.25,
      },
    ]);
    expect(s.rounds).toBe(EMPTY_SERIES.rounds);
  });

  it('adds an eval point (rounds completed, base and adapter ROUGE-L)', () => {
    const s = reduceSeries(EMPTY_SERIES, {
      type: 'eval',
      round: 9,
      base: 0.21,
      adapter: 0.27,
      perDocument: [{ id: 'a', base: 0.21, adapter: 0.27 }],
    });
    expect(s.evals).toEqual([{ round: 10, base: 0.21, adapter: 0.27 }]);
  });

  it('returns the same series for events that add no point', () => {
    const s = reduceSeries(EMPTY_SERIES, roundDone(0));
    for (const e of [
      roundStart(1),
      { type: 'summary-delta', round: 1, seat: 0, text: 'x' },
      { type: 'reveal', round: 1, spySeat: 1, caught: true, rewards: [1, 0, 1] },
      { type: 'checkpoint', round: 1 },
    ] as TrainEvent[])
      expect(reduceSeries(s, e)).toBe(s);
  });
});

describe('seat helpers', () => {
  it('seatsInLabelOrder lists seats as Player 1, Player 2, ...', () => {
    expect(seatsInLabelOrder([2, 1, 3])).toEqual([1, 0, 2]);
    expect(seatsInLabelOrder([3, 1, 4, 2])).toEqual([1, 3, 0, 2]);
    expect(seatsInLabelOrder([])).toEqual([]);
  });

  it('tallies counts the votes each seat received, over the first n votes', () => {
    const view = {
      labels: [2, 1, 3, 4],
      votes: [
        { voterSeat: 0, candidateSeats: [1, 2, 3], probs: [0.5, 0.3, 0.2], chosenSeat: 1 },
        { voterSeat: 2, candidateSeats: [0, 1, 3], probs: [0.1, 0.8, 0.1], chosenSeat: 1 },
        { voterSeat: 1, candidateSeats: [0, 2, 3], probs: [0.6, 0.2, 0.2], chosenSeat: 0 },
        { voterSeat: 3, candidateSeats: [0, 1, 2], probs: [0.2, 0.2, 0.6], chosenSeat: 2 },
      ],
    };
    expect(tallies(view)).toEqual([1, 2, 1, 0]);
    expect(tallies(view, 2)).toEqual([0, 2, 0, 0]); // the voting stage shows votes one by one
    expect(tallies(view, 0)).toEqual([0, 0, 0, 0]);
  });
});

describe('round time', () => {
  it('formats durations in ms, tenths of a second, seconds, minutes', () => {
    expect(formatDuration(850.4)).toBe('850 ms');
    expect(formatDuration(4240)).toBe('4.2 s');
    expect(formatDuration(38_400)).toBe('38 s');
    expect(formatDuration(125_000)).toBe('2 min 05 s');
    // Rounded before the unit is picked: never "10.0 s" or "60 s".
    expect(formatDuration(9_970)).toBe('10 s');
    expect(formatDuration(999.6)).toBe('1.0 s');
    expect(formatDuration(999.4)).toBe('999 ms');
    expect(formatDuration(59_600)).toBe('1 min 00 s');
  });

  it('describes a finished round: its wall time, each timed stage, the packing and the throughput', () => {
    const time = { ...TIME, compiledKernels: 0 };
    expect(describeRoundTime(time, 123.4)).toBe(
      'Took 9.5 s: summaries 5.0 s (prefill 1.2 s), votes 1.5 s, update 2.8 s ' +
        '(7 sequences in 3 passes, prefix sharing ran 650 of 1,440 tokens); 123 tokens/s.',
    );
    // No prefix to share (or a GPU that cannot pack): said so, not a made-up saving.
    expect(
      describeRoundTime({ ...time, packing: { sequences: 2, passes: 2, tokens: 90, unpackedTokens: 90 } }, null),
    ).toBe('Took 9.5 s: summaries 5.0 s (prefill 1.2 s), votes 1.5 s, update 2.8 s (2 sequences, one a pass).');
    // Kept layers (their backward skips the recompute): over the passes with the adapter on.
    expect(
      describeRoundTime(
        { ...time, packing: { sequences: 2, passes: 2, tokens: 90, unpackedTokens: 90, keptLayers: 5, layers: 72 } },
        null,
      ),
    ).toBe(
      "Took 9.5 s: summaries 5.0 s (prefill 1.2 s), votes 1.5 s, update 2.8 s (2 sequences, one a pass), 5 of 72 layers' activations kept.",
    );
    // A round that compiled kernels says so (the first round's time is mostly that on some GPUs).
    expect(describeRoundTime({ ...time, compiledKernels: 45 }, null)).toMatch(
      /^Took 9\.5 s, 45 GPU kernels compiled on first use included: summaries 5\.0 s/,
    );
    expect(describeRoundTime({ ...time, compiledKernels: 1 }, null)).toMatch(/^Took 9\.5 s, 1 GPU kernel compiled/);
    // Untimed stages and a round without an update are left out, never shown as 0.
    expect(describeRoundTime({ ...time, summaryPrefillMs: null, updateMs: null, packing: null }, 40)).toBe(
      'Took 9.5 s: summaries 5.0 s, votes 1.5 s; 40 tokens/s.',
    );
    expect(
      describeRoundTime(
        {
          totalMs: 700,
          summariesMs: null,
          summaryPrefillMs: null,
          votesMs: null,
          updateMs: null,
          packing: null,
          compiledKernels: null,
        },
        null,
      ),
    ).toBe('Took 700 ms.');
  });
});
