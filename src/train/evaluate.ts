// Evaluation on the held-out reports: greedy summaries from each system (the base model, the
// adapter, optionally another checkpoint of the same architecture) scored against the reference
// summaries with ROUGE-1/2/L (rouge_score's tokenisation, Porter stemming by default) and length.
// One evaluation serves the trainer's periodic eval, `spyrl eval` and the app's compare view.
//
// Protocol: each report is read whole up to evalDocTokenBudget (the reference summarises the
// whole report). A longer report is either cut to the budget and marked (its reference covers
// more than the model read) or skipped, per evalOverflow. Summaries are greedy (temperature 0),
// at most evalSummaryMaxTokens, one report at a time so memory is bounded by one long prompt.
import type { SpyRLConfig } from '../game/config.ts';
import { fitToBudget, type SpyDocument } from '../game/documents.ts';
import { renderPrompt, summaryMessages, type ChatPrompt } from '../game/prompts.ts';
import type { Generation, GenerateOptions } from '../game/round.ts';
import { rougeScores, rougeTokenize } from '../game/rouge.ts';
import type { GameTokenizer } from '../game/text.ts';
import type { Qwen3Config } from '../model/config.ts';

export type EvalConfig = Pick<
  SpyRLConfig,
  'evalDocTokenBudget' | 'evalOverflow' | 'evalSummaryMaxTokens' | 'evalStemmer' | 'prompts'
>;

/** Thrown when there is nothing to evaluate: evaluation never falls back to training documents. */
export class NoHeldOutError extends Error {
  override name = 'NoHeldOutError';
}

/** 'whole': the report fit; 'cut': cut to the budget, the reference covers more than the input; 'skipped': too long, not scored. */
export type Coverage = 'whole' | 'cut' | 'skipped';

export interface EvalDocumentPlan {
  doc: SpyDocument;
  coverage: Coverage;
  /** Report tokens the model reads, of reportTokens. */
  inputTokens: number;
  reportTokens: number;
  /** null when skipped. */
  prompt: ChatPrompt | null;
}

/** Scores of one summary: ROUGE F1 values and its length. */
export interface SummaryScores {
  rouge1: number;
  rouge2: number;
  rougeL: number;
  /** Generated tokens (the stop token not counted). */
  tokens: number;
  /** rouge_score tokens (words) of the summary. */
  words: number;
  /** Cut at evalSummaryMaxTokens. */
  truncated: boolean;
}

export interface EvalSystemResult {
  summary: string;
  scores: SummaryScores;
}

export interface EvalDocumentResult {
  id: string;
  source?: string;
  reference: string;
  coverage: Coverage;
  inputTokens: number;
  reportTokens: number;
  /** By system key; empty when skipped. */
  results: Record<string, EvalSystemResult>;
}

export type MeanScores = Omit<SummaryScores, 'truncated'> & { truncated: number };

export interface EvalReport {
  /** Columns in order (e.g. base, adapter, a compare checkpoint). */
  systems: { key: string; label: string }[];
  settings: { docTokenBudget: number; summaryMaxTokens: number; overflow: 'mark' | 'skip'; stemmer: boolean };
  documents: EvalDocumentResult[];
  /** Over the scored (not skipped) documents, by system key; truncated is a share. */
  means: Record<string, MeanScores>;
}

/** One column of the comparison: something that writes greedy summaries. */
export interface EvalSystem {
  key: string;
  label: string;
  generate(prompts: ChatPrompt[], opts: GenerateOptions): Promise<Generation[]>;
  /** Runs around this system's summaries (e.g. switch the adapter off, then on again). */
  around?: <T>(job: () => Promise<T>) => Promise<T>;
}

export interface EvalProgress {
  system: string;
  /** Summaries done of total (over all systems). */
  done: number;
  total: number;
  documentId: string;
}

/** Which held-out reports are scored and what the model reads of each. */
export function planEvaluation(
  docs: readonly SpyDocument[],
  tokenizer: GameTokenizer,
  cfg: EvalConfig,
): EvalDocumentPlan[] {
  return docs
    .filter((d) => d.summary)
    .map((doc) => {
      const fit = fitToBudget(doc.report, tokenizer, cfg.evalDocTokenBudget);
      const reportTokens = fit.cut ? fit.cut.tokensTotal : fit.tokenIds.length;
      if (fit.cut && cfg.evalOverflow === 'skip')
        return { doc, coverage: 'skipped', inputTokens: 0, reportTokens, prompt: null };
      const prompt = renderPrompt(tokenizer, summaryMessages(fit.text, cfg.prompts), '', cfg.prompts);
      return { doc, coverage: fit.cut ? 'cut' : 'whole', inputTokens: fit.tokenIds.length, reportTokens, prompt };
    });
}

export function scoreSummary(
  reference: string,
  gen: Pick<Generation, 'text' | 'tokenIds' | 'truncated'>,
  stopIds: readonly number[],
  useStemmer: boolean,
): SummaryScores {
  const r = rougeScores(reference, gen.text, { useStemmer });
  const last = gen.tokenIds.at(-1);
  const tokens = gen.tokenIds.length - (last !== undefined && stopIds.includes(last) ? 1 : 0);
  return {
    rouge1: r.rouge1.fmeasure,
    rouge2: r.rouge2.fmeasure,
    rougeL: r.rougeL.fmeasure,
    tokens,
    words: rougeTokenize(gen.text, useStemmer).length,
    truncated: gen.truncated,
  };
}

function meanOf(rows: SummaryScores[]): MeanScores {
  const n = Math.max(1, rows.length);
  const avg = (f: (s: SummaryScores) => number) => rows.reduce((a, s) => a + f(s), 0) / n;
  return {
    rouge1: avg((s) => s.rouge1),
    rouge2: avg((s) => s.rouge2),
    rougeL: avg((s) => s.rougeL),
    tokens: avg((s) => s.tokens),
    words: avg((s) => s.words),
    truncated: avg((s) => (s.truncated ? 1 : 0)),
  };
}

export interface EvaluateOptions {
  docs: readonly SpyDocument[];
  tokenizer: GameTokenizer & { stopIds?: readonly number[] };
  config: EvalConfig;
  systems: EvalSystem[];
  onProgress?: (p: EvalProgress) => void;
}

/** Greedy summaries of every held-out report from every system, scored. */
export async function evaluateHeldOut(o: EvaluateOptions): Promise<EvalReport> {
  const { config: cfg } = o;
  if (o.systems.length === 0) throw new RangeError('evaluation needs at least one system');
  const withRef = o.docs.filter((d) => d.summary);
  if (withRef.length === 0) {
    throw new NoHeldOutError(
      o.docs.length === 0
        ? 'no held-out reports: evaluation needs a held-out split (config evalHeldOut > 0, documents with a "source" and a reference "summary")'
        : 'no held-out report has a reference summary to score against',
    );
  }
  const plan = planEvaluation(withRef, o.tokenizer, cfg);
  const scored = plan.filter((p) => p.prompt);
  if (scored.length === 0) {
    throw new NoHeldOutError(
      `every held-out report is longer than evalDocTokenBudget (${cfg.evalDocTokenBudget} tokens) and evalOverflow is 'skip': raise the budget or use 'mark'`,
    );
  }
  const stopIds = o.tokenizer.stopIds ?? [];
  const documents: EvalDocumentResult[] = plan.map((p) => ({
    id: p.doc.id,
    ...(p.doc.source !== undefined ? { source: p.doc.source } : {}),
    reference: p.doc.summary!,
    coverage: p.coverage,
    inputTokens: p.inputTokens,
    reportTokens: p.reportTokens,
    results: {},
  }));
  const greedy = { maxTokens: cfg.evalSummaryMaxTokens, temperature: 0, topP: 1, topK: 0, seeds: [0] };
  const total = scored.length * o.systems.length;
  let done = 0;
  for (const sys of o.systems) {
    const run = async () => {
      for (const p of scored) {
        // One report at a time: the KV cache holds one long prompt, not all of them.
        const [gen] = await sys.generate([p.prompt!], greedy);
        const row = documents[plan.indexOf(p)]!;
        row.results[sys.key] = {
          summary: gen!.text,
          scores: scoreSummary(row.reference, gen!, stopIds, cfg.evalStemmer),
        };
        o.onProgress?.({ system: sys.key, done: ++done, total, documentId: p.doc.id });
      }
    };
    await (sys.around ? sys.around(run) : run());
  }
  const means: Record<string, MeanScores> = {};
  for (const sys of o.systems)
    means[sys.key] = meanOf(documents.flatMap((d) => (d.results[sys.key] ? [d.results[sys.key]!.scores] : [])));
  return {
    systems: o.systems.map(({ key, label }) => ({ key, label })),
    settings: {
      docTokenBudget: cfg.evalDocTokenBudget,
      summaryMaxTokens: cfg.evalSummaryMaxTokens,
      overflow: cfg.evalOverflow,
      stemmer: cfg.evalStemmer,
    },
    documents,
    means,
  };
}

/** The export: one JSON line per held-out report (id, coverage, reference, each system's summary and scores, the settings). */
export function evalReportJsonl(report: EvalReport): string {
  return report.documents.map((d) => JSON.stringify({ ...d, settings: report.settings }) + '\n').join('');
}

/** A coverage note for tables: says how a report that did not fit was handled. */
export function coverageNote(d: Pick<EvalDocumentResult, 'coverage' | 'inputTokens' | 'reportTokens'>): string {
  if (d.coverage === 'whole') return `whole report (${d.reportTokens} tokens)`;
  if (d.coverage === 'cut')
    return `first ${d.inputTokens} of ${d.reportTokens} tokens: the reference covers more than the input`;
  return `skipped: ${d.reportTokens} tokens exceed evalDocTokenBudget`;
}

/** Null when a compare checkpoint has the architecture of the base model, else what differs. */
export function architectureMismatch(base: Qwen3Config, other: Qwen3Config): string | null {
  const keys = [
    'numLayers',
    'hiddenSize',
    'numHeads',
    'numKvHeads',
    'headDim',
    'intermediateSize',
    'vocabSize',
    'tieWordEmbeddings',
  ] as const;
  const diff = keys
    .filter((k) => base[k] !== other[k])
    .map((k) => `${k} ${String(other[k])} (base model: ${String(base[k])})`);
  return diff.length ? diff.join(', ') : null;
}
