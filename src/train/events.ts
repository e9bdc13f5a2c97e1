// What a SpyRL run reports as it goes: one stream of events the CLI prints and the app animates.
import type { PackingStats, RoundRecord, StageStats } from '../game/round.ts';
import type { EvalReport } from './evaluate.ts';

export type TrainEvent =
  /** A round begins: the document, both copies, the removed span, seats and labels (roles hidden in the UI until the reveal). */
  | {
      type: 'round-start';
      round: number;
      documentId: string;
      /** The report as every civilian sees it (after the token budget cut). */
      fullText: string;
      /** The spy's copy. */
      spyText: string;
      /** Removed span in `fullText` (characters). */
      span: { charStart: number; charEnd: number };
      /** Where the span was in `spyText` (characters; a placeholder's position in placeholder mode). */
      spyMarkAt: number;
      /** The report was cut to fit the token budget: tokens kept of total, null when it fit. */
      cut: { keptTokens: number; totalTokens: number } | null;
      groupSize: number;
      /** labels[seat] = k of "Player k". */
      labels: number[];
      spySeat: number;
    }
  /** New text of one agent's summary (a few tokens at a time). */
  | { type: 'summary-delta'; round: number; seat: number; text: string }
  | { type: 'summaries-done'; round: number; summaries: { seat: number; text: string; truncated: boolean }[] }
  /** One voter's distribution over the other players (seats) and its vote. */
  | { type: 'vote'; round: number; voterSeat: number; candidateSeats: number[]; probs: number[]; chosenSeat: number }
  /** The spy is revealed; each seat's total reward. */
  | { type: 'reveal'; round: number; spySeat: number; caught: boolean; rewards: number[] }
  /**
   * An optimizer step over the last roundsPerUpdate rounds: the total loss, each stage's loss and
   * grad-norm share; kl is null when it was not computed (klBeta 0).
   */
  | {
      type: 'update';
      round: number;
      step: number;
      loss: number;
      kl: number | null;
      gradNorm: number;
      lr: number;
      skipped: boolean;
      reason?: string;
      stages?: StageStats;
      /** Prefix sharing in the update (src/train/update.ts): sequences, passes, tokens run and unpacked. */
      packing?: PackingStats;
    }
  /** Mean ROUGE-L F1 of greedy summaries of the held-out reports, base model vs adapter; report: every summary and score (src/train/evaluate.ts). */
  | {
      type: 'eval';
      round: number;
      base: number;
      adapter: number;
      perDocument: { id: string; base: number; adapter: number }[];
      report?: EvalReport;
    }
  /**
   * The round is complete (its run-log record) with throughput: the tokens prefilled and
   * generated over the round's wall time (seconds, its update and evaluation included), and the
   * GPU kernel variants first used in it (each a pipeline compile, inside `seconds`).
   */
  | {
      type: 'round-done';
      round: number;
      record: RoundRecord;
      tokensPerSecond: number;
      seconds: number;
      compiledKernels?: number;
    }
  | { type: 'checkpoint'; round: number };

export type TrainListener = (e: TrainEvent) => void;
