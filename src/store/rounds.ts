// Rounds and metrics as the event stream builds them: pure reducers from TrainEvent to the
// round views the UI shows and the small append-only series the charts draw.
import type { PackingStats, RoundRecord } from '../game/round.ts';
import type { TrainEvent } from '../train/events.ts';

export interface VoteView {
  voterSeat: number;
  candidateSeats: number[];
  probs: number[];
  chosenSeat: number;
}

/** What a round-start event says about the round, kept as the round's view. */
type RoundStart = Omit<Extract<TrainEvent, { type: 'round-start' }>, 'type'>;

export interface RoundView extends RoundStart {
  summaries: string[];
  truncated: boolean[];
  summariesDone: boolean;
  votes: VoteView[];
  reveal: { caught: boolean; rewards: number[] } | null;
  /** Per seat: the summary's reward (from the round record). */
  summaryRewards: number[] | null;
  tokensPerSecond: number | null;
  /** Where the round's time went (from the round record and the round-done event); null until it is done. */
  time: RoundTime | null;
  done: boolean;
}

/** A finished round's wall time and its stages, in milliseconds; a stage not measured is null. */
export interface RoundTime {
  /** The whole round, its update and evaluation included. */
  totalMs: number;
  summariesMs: number | null;
  /** The part of summariesMs spent prefilling the summary prompts. */
  summaryPrefillMs: number | null;
  votesMs: number | null;
  /** null when the round ran no update (roundsPerUpdate > 1) or it was not timed. */
  updateMs: number | null;
  /** Prefix sharing in the round's update; null without an update or when not reported. */
  packing: PackingStats | null;
  /** GPU kernel variants first used in this round (pipeline compiles, inside totalMs); null when not reported. */
  compiledKernels: number | null;
}

export interface RoundPoint {
  /** Rounds completed (1 = the first round). */
  round: number;
  civilianReward: number;
  spyReward: number;
  caught: number;
  /** Share of the last CAUGHT_WINDOW rounds in which the spy was caught. */
  caughtRate: number;
  voteAccuracy: number;
  tokensPerSecond: number;
  /**
   * Seconds per stage (stacked on the round-time chart): the summaries' prefill and the rest of the
   * summaries (decode), the votes, the update (0 in a round that ran none). null when not timed:
   * the chart says "off" instead of drawing a 0.
   */
  prefillSeconds: number | null;
  decodeSeconds: number | null;
  voteSeconds: number | null;
  updateSeconds: number | null;
}

export interface UpdatePoint {
  round: number;
  step: number;
  loss: number;
  /** null when not computed (klBeta 0): the chart says "off" instead of drawing a 0. */
  kl: number | null;
  gradNorm: number;
  lr: number;
  skipped: boolean;
  /** Each stage's loss (before its weight) and share of the squared gradient norm; null when not reported. */
  summaryLoss: number | null;
  voteLoss: number | null;
  summaryGradShare: number | null;
  voteGradShare: number | null;
}

export interface EvalPoint {
  round: number;
  base: number;
  adapter: number;
}

export interface Series {
  rounds: RoundPoint[];
  updates: UpdatePoint[];
  evals: EvalPoint[];
}

export const EMPTY_SERIES: Series = { rounds: [], updates: [], evals: [] };
export const CAUGHT_WINDOW = 10;
/** Round views kept for browsing (texts are a few KB each). */
export const MAX_ROUND_VIEWS = 200;

export interface RoundsState {
  rounds: Record<number, RoundView>;
  /** Round numbers held, ascending. */
  order: number[];
}

export const EMPTY_ROUNDS: RoundsState = { rounds: {}, order: [] };

function patch(state: RoundsState, round: number, f: (r: RoundView) => Partial<RoundView>): RoundsState {
  const r = state.rounds[round];
  if (!r) return state; // an event of a round whose start we never saw (e.g. after a resume)
  return { ...state, rounds: { ...state.rounds, [round]: { ...r, ...f(r) } } };
}

export function reduceRounds(state: RoundsState, e: TrainEvent): RoundsState {
  switch (e.type) {
    case 'round-start': {
      const view: RoundView = {
        round: e.round,
        documentId: e.documentId,
        fullText: e.fullText,
        spyText: e.spyText,
        span: e.span,
        spyMarkAt: e.spyMarkAt,
        cut: e.cut,
        groupSize: e.groupSize,
        labels: e.labels,
        spySeat: e.spySeat,
        summaries: e.labels.map(() => ''),
        truncated: e.labels.map(() => false),
        summariesDone: false,
        votes: [],
        reveal: null,
        summaryRewards: null,
        tokensPerSecond: null,
        time: null,
        done: false,
      };
      const order = [...state.order.filter((n) => n !== e.round), e.round];
      const rounds = { ...state.rounds, [e.round]: view };
      while (order.length > MAX_ROUND_VIEWS) delete rounds[order.shift()!];
      return { rounds, order };
    }
    case 'summary-delta':
      return patch(state, e.round, (r) => ({
        summaries: r.summaries.map((s, seat) => (seat === e.seat ? s + e.text : s)),
      }));
    case 'summaries-done':
      return patch(state, e.round, (r) => {
        const summaries = [...r.summaries];
        const truncated = [...r.truncated];
        for (const s of e.summaries) {
          summaries[s.seat] = s.text;
          truncated[s.seat] = s.truncated;
        }
        return { summaries, truncated, summariesDone: true };
      });
    case 'vote':
      return patch(state, e.round, (r) => ({
        votes: [
          ...r.votes,
          { voterSeat: e.voterSeat, candidateSeats: e.candidateSeats, probs: e.probs, chosenSeat: e.chosenSeat },
        ],
      }));
    case 'reveal':
      return patch(state, e.round, () => ({ reveal: { caught: e.caught, rewards: e.rewards } }));
    case 'round-done':
      return patch(state, e.round, () => ({
        done: true,
        tokensPerSecond: e.tokensPerSecond,
        summaryRewards: e.record.rewards.summary,
        time: roundTime(e.record, e.seconds, e.compiledKernels),
      }));
    default:
      return state;
  }
}

export function reduceSeries(s: Series, e: TrainEvent): Series {
  switch (e.type) {
    case 'round-done': {
      const r = e.record;
      const civ = r.rewards.summary.filter((_, seat) => seat !== r.spySeat);
      const caught = r.metrics.spyCaught ? 1 : 0;
      const recent = [...s.rounds.slice(-(CAUGHT_WINDOW - 1)).map((p) => p.caught), caught];
      const point: RoundPoint = {
        round: e.round + 1,
        civilianReward: civ.reduce((a, b) => a + b, 0) / Math.max(1, civ.length),
        spyReward: r.rewards.summary[r.spySeat] ?? 0,
        caught,
        caughtRate: recent.reduce((a, b) => a + b, 0) / recent.length,
        voteAccuracy: r.metrics.voteAccuracy,
        tokensPerSecond: e.tokensPerSecond,
        ...stageSeconds(r),
      };
      return { ...s, rounds: [...s.rounds, point] };
    }
    case 'update':
      return {
        ...s,
        updates: [
          ...s.updates,
          {
            round: e.round + 1,
            step: e.step,
            loss: e.loss,
            kl: e.kl,
            gradNorm: e.gradNorm,
            lr: e.lr,
            skipped: e.skipped,
            summaryLoss: e.stages?.summary.loss ?? null,
            voteLoss: e.stages?.vote.loss ?? null,
            summaryGradShare: e.stages?.summary.gradShare ?? null,
            voteGradShare: e.stages?.vote.gradShare ?? null,
          },
        ],
      };
    case 'eval':
      return { ...s, evals: [...s.evals, { round: e.round + 1, base: e.base, adapter: e.adapter }] };
    default:
      return s;
  }
}

function roundTime(r: RoundRecord, seconds: number, compiledKernels: number | undefined): RoundTime {
  const t = r.timings;
  return {
    compiledKernels: compiledKernels ?? null,
    totalMs: seconds * 1000,
    summariesMs: t.summarizeMs,
    summaryPrefillMs: t.summaryPrefillMs,
    votesMs: t.voteMs,
    updateMs: t.updateMs,
    packing: r.train.packing ?? null,
  };
}

function stageSeconds(
  r: RoundRecord,
): Pick<RoundPoint, 'prefillSeconds' | 'decodeSeconds' | 'voteSeconds' | 'updateSeconds'> {
  const t = r.timings;
  const s = (ms: number | null) => (ms === null ? null : ms / 1000);
  const timed = t.summarizeMs !== null;
  // A timed round without an update spent no time on one; a round without a clock is not timed.
  const ranUpdate = r.train.loss !== null || t.updateMs !== null;
  return {
    prefillSeconds: s(t.summaryPrefillMs),
    decodeSeconds: t.summarizeMs === null ? null : s(t.summarizeMs - (t.summaryPrefillMs ?? 0)),
    voteSeconds: s(t.voteMs),
    updateSeconds: t.updateMs !== null ? s(t.updateMs) : timed && !ranUpdate ? 0 : null,
  };
}

/** A duration for people: "850 ms", "4.2 s", "38 s", "2 min 05 s". */
export function formatDuration(ms: number): string {
  if (Math.round(ms) < 1000) return `${Math.round(ms)} ms`; // 999.6 ms is "1.0 s", never "1000 ms"
  const s = ms / 1000;
  if (s < 9.95) return `${s.toFixed(1)} s`;
  const whole = Math.round(s);
  if (whole < 60) return `${whole} s`;
  return `${Math.floor(whole / 60)} min ${String(whole % 60).padStart(2, '0')} s`;
}

/**
 * One line on where a finished round's time went, e.g. "Took 9.5 s: summaries 5.0 s (prefill
 * 1.2 s), votes 1.5 s, update 2.8 s (7 sequences in 3 passes, prefix sharing ran 650 of 1,440
 * tokens); 123 tokens/s." Stages that were not timed are left out, never shown as 0.
 */
export function describeRoundTime(time: RoundTime, tokensPerSecond: number | null): string {
  const parts: string[] = [];
  if (time.summariesMs !== null) {
    const prefill = time.summaryPrefillMs === null ? '' : ` (prefill ${formatDuration(time.summaryPrefillMs)})`;
    parts.push(`summaries ${formatDuration(time.summariesMs)}${prefill}`);
  }
  if (time.votesMs !== null) parts.push(`votes ${formatDuration(time.votesMs)}`);
  if (time.updateMs !== null) {
    const p = time.packing;
    const n = (x: number) => x.toLocaleString('en-US');
    const packed =
      p === null
        ? ''
        : p.passes < p.sequences
          ? ` (${p.sequences} sequences in ${p.passes} passes, prefix sharing ran ${n(p.tokens)} of ${n(p.unpackedTokens)} tokens)`
          : ` (${p.sequences} sequences, one a pass)`;
    // Layers kept for the backward (the rest recomputed in it), over the passes.
    const kept = p?.layers ? `, ${n(p.keptLayers ?? 0)} of ${n(p.layers)} layers' activations kept` : '';
    parts.push(`update ${formatDuration(time.updateMs)}${packed}${kept}`);
  }
  const rate = tokensPerSecond === null ? '' : `; ${Math.round(tokensPerSecond).toLocaleString('en-US')} tokens/s`;
  // The first rounds compile the GPU kernels they use first: say so, or round 1 looks slow for no reason.
  const k = time.compiledKernels ?? 0;
  const compiled = k > 0 ? `, ${k} GPU kernel${k === 1 ? '' : 's'} compiled on first use included` : '';
  return `Took ${formatDuration(time.totalMs)}${compiled}${parts.length ? `: ${parts.join(', ')}` : ''}${rate}.`;
}

/** Seats ordered by their public label (Player 1, Player 2, ...). */
export function seatsInLabelOrder(labels: number[]): number[] {
  return labels
    .map((label, seat) => ({ label, seat }))
    .sort((a, b) => a.label - b.label)
    .map((x) => x.seat);
}

/** Votes received per seat among the first `n` votes. */
export function tallies(view: Pick<RoundView, 'labels' | 'votes'>, n = view.votes.length): number[] {
  const t = view.labels.map(() => 0);
  for (const v of view.votes.slice(0, n)) t[v.chosenSeat] = (t[v.chosenSeat] ?? 0) + 1;
  return t;
}
