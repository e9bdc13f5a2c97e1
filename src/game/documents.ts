// Documents the game is played on: parsing user files (.jsonl, .txt, .md), the bundled
// GovReport sample and its train/eval split, the per-agent token budget, and which document
// each round plays. Callers supply file text (Node: fs, browser: fetch), so this stays pure.
import { Rng } from './rng.ts';
import { normalizeText, sentenceEnds, snapBack, tokenCharOffsets, wordEnds, type GameTokenizer } from './text.ts';

export interface SpyDocument {
  id: string;
  /** e.g. "GAO" or "CRS" for GovReport; absent for user files that do not say. */
  source?: string;
  /** The text every civilian summarizes (NFC, \n line ends). */
  report: string;
  /** A reference summary, used only by evaluation (ROUGE-L). */
  summary?: string;
}

export class DocumentParseError extends Error {
  override name = 'DocumentParseError';
  constructor(
    readonly file: string,
    readonly line: number | null,
    detail: string,
  ) {
    super(`${file}${line === null ? '' : `:${line}`}: ${detail}`);
  }
}

function baseName(filename: string): string {
  const name = filename.split(/[\\/]/).pop() ?? filename;
  return name.replace(/\.[^.]*$/, '') || name;
}

function extension(filename: string): string {
  const m = /\.([^./\\]+)$/.exec(filename);
  return m ? m[1]!.toLowerCase() : '';
}

function parseJsonl(text: string, filename: string): SpyDocument[] {
  const docs: SpyDocument[] = [];
  const seen = new Map<string, number>();
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (line === '') continue;
    const lineNo = i + 1;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (e) {
      throw new DocumentParseError(filename, lineNo, `not valid JSON (${(e as Error).message})`);
    }
    if (typeof row !== 'object' || row === null || Array.isArray(row)) throw new DocumentParseError(filename, lineNo, 'each line must be a JSON object');
    const r = row as Record<string, unknown>;
    if (typeof r['report'] !== 'string') throw new DocumentParseError(filename, lineNo, 'needs a string field "report"');
    const report = normalizeText(r['report']).trim();
    if (report === '') throw new DocumentParseError(filename, lineNo, '"report" is empty');
    for (const k of ['summary', 'source'] as const) {
      if (r[k] !== undefined && typeof r[k] !== 'string') throw new DocumentParseError(filename, lineNo, `"${k}" must be a string when present`);
    }
    const rawId = r['id'];
    if (rawId !== undefined && typeof rawId !== 'string' && typeof rawId !== 'number') throw new DocumentParseError(filename, lineNo, '"id" must be a string or a number when present');
    const id = rawId === undefined ? `${baseName(filename)}:${lineNo}` : String(rawId);
    if (seen.has(id)) throw new DocumentParseError(filename, lineNo, `duplicate id "${id}" (first on line ${seen.get(id)})`);
    seen.set(id, lineNo);
    const doc: SpyDocument = { id, report };
    if (typeof r['source'] === 'string') doc.source = r['source'];
    if (typeof r['summary'] === 'string') doc.summary = normalizeText(r['summary']).trim();
    docs.push(doc);
  }
  if (docs.length === 0) throw new DocumentParseError(filename, null, 'no documents (every line is empty)');
  return docs;
}

/** .jsonl: one document per line (`report`, optional `summary`, `id`, `source`); .txt/.md: the whole file is one report. */
export function parseDocuments(text: string, filename: string): SpyDocument[] {
  const ext = extension(filename);
  if (ext === 'jsonl') return parseJsonl(text, filename);
  if (ext === 'txt' || ext === 'md') {
    const report = normalizeText(text).trim();
    if (report === '') throw new DocumentParseError(filename, null, 'the file is empty');
    return [{ id: baseName(filename), report }];
  }
  throw new DocumentParseError(filename, null, `unsupported file type ".${ext}" (use .jsonl, .txt or .md)`);
}

// ---------------------------------------------------------------------------------------------
// Bundled GovReport sample.

/** Repository path of the bundled sample (readers: govreport.node.ts, govreport.browser.ts). */
export const GOVREPORT_PATH = 'data/govreport/govreport_sample.jsonl';

export interface DocumentSplit {
  train: SpyDocument[];
  eval: SpyDocument[];
}

/** Holds out the last document of each source (GovReport: the last GAO and the last CRS row); trains on the rest. */
export function splitGovReport(docs: readonly SpyDocument[]): DocumentSplit {
  const lastOfSource = new Map<string, number>();
  docs.forEach((d, i) => {
    if (d.source !== undefined) lastOfSource.set(d.source, i);
  });
  const held = new Set(lastOfSource.values());
  return {
    train: docs.filter((_, i) => !held.has(i)),
    eval: [...held].sort((a, b) => a - b).map((i) => docs[i]!),
  };
}

export async function loadBundledGovReport(readText: () => Promise<string>): Promise<DocumentSplit> {
  return splitGovReport(parseDocuments(await readText(), GOVREPORT_PATH));
}

// ---------------------------------------------------------------------------------------------
// Per-agent token budget.

export interface DocumentCut {
  tokensKept: number;
  tokensTotal: number;
  /** The kept text is report.slice(0, charOffset) (trailing whitespace trimmed). */
  charOffset: number;
  charsTotal: number;
  /** 'sentence' normally; 'word' or 'char' when the first sentence alone exceeds the budget. */
  snappedTo: 'sentence' | 'word' | 'char';
}

export interface BudgetedText {
  text: string;
  tokenIds: number[];
  /** null when the whole report fits. */
  cut: DocumentCut | null;
}

/**
 * The longest prefix of `report` ending at a sentence end whose tokens fit in `budget`
 * (falling back to a word end, then to any whole character). `report` must be NFC.
 */
export function fitToBudget(report: string, tokenizer: GameTokenizer, budget: number): BudgetedText {
  if (!Number.isSafeInteger(budget) || budget < 1) throw new RangeError(`docTokenBudget must be a positive integer, got ${budget}`);
  const ids = tokenizer.encode(report);
  if (ids.length <= budget) return { text: report, tokenIds: ids, cut: null };
  const offsets = tokenCharOffsets(tokenizer, report, ids);
  const limit = offsets[budget]!; // the first `budget` tokens end here
  const tryEnds = (ends: number[], snappedTo: DocumentCut['snappedTo']): BudgetedText | null => {
    for (let k = ends.length - 1, tries = 0; k >= 0 && tries < 8; k--) {
      if (ends[k]! > limit) continue;
      tries++; // re-encoding a prefix can merge differently at the cut: verify, step back if over
      const text = report.slice(0, ends[k]).trimEnd();
      if (text === '') return null;
      const kept = tokenizer.encode(text);
      if (kept.length <= budget) {
        return { text, tokenIds: kept, cut: { tokensKept: kept.length, tokensTotal: ids.length, charOffset: text.length, charsTotal: report.length, snappedTo } };
      }
    }
    return null;
  };
  const charEnds: number[] = [];
  for (let p = snapBack(report, limit); p > 0 && charEnds.length < 8; p = snapBack(report, p - 1)) charEnds.unshift(p);
  const fit = tryEnds(sentenceEnds(report), 'sentence') ?? tryEnds(wordEnds(report), 'word') ?? tryEnds(charEnds, 'char');
  if (!fit) throw new RangeError(`cannot fit any prefix of the report into ${budget} tokens`);
  return fit;
}

// ---------------------------------------------------------------------------------------------
// Schedule.

/** Round r plays documents in epochs: each epoch is a seeded shuffle, so resuming needs only (seed, round). */
export function documentForRound<T>(docs: readonly T[], round: number, seed: number | string): T {
  if (docs.length === 0) throw new RangeError('no training documents');
  if (!Number.isSafeInteger(round) || round < 0) throw new RangeError(`round must be a non-negative integer, got ${round}`);
  const epoch = Math.floor(round / docs.length);
  const order = Rng.fromSeed(seed).fork(`documents/epoch-${epoch}`).shuffle(docs.map((_, i) => i));
  return docs[order[round % docs.length]!]!;
}
