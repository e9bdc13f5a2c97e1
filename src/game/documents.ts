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
    if (typeof row !== 'object' || row === null || Array.isArray(row))
      throw new DocumentParseError(filename, lineNo, 'each line must be a JSON object');
    const r = row as Record<string, unknown>;
    if (typeof r['report'] !== 'string')
      throw new DocumentParseError(filename, lineNo, 'needs a string field "report"');
    const report = normalizeText(r['report']).trim();
    if (report === '') throw new DocumentParseError(filename, lineNo, '"report" is empty');
    for (const k of ['summary', 'source'] as const) {
      if (r[k] !== undefined && typeof r[k] !== 'string')
        throw new DocumentParseError(filename, lineNo, `"${k}" must be a string when present`);
    }
    const rawId = r['id'];
    if (rawId !== undefined && typeof rawId !== 'string' && typeof rawId !== 'number')
      throw new DocumentParseError(filename, lineNo, '"id" must be a string or a number when present');
    const id = rawId === undefined ? `${baseName(filename)}:${lineNo}` : String(rawId);
    if (seen.has(id))
      throw new DocumentParseError(filename, lineNo, `duplicate id "${id}" (first on line ${seen.get(id)})`);
    seen.set(id, lineNo);
    const doc: SpyDocument = { id, report };
    if (typeof r['source'] === 'string') doc.source = r['source'];
    if (typeof r['summary'] === 'string') doc.summary = normalizeText(r['summary']).trim();
    docs.push(doc);
  }
  if (docs.length === 0) throw new DocumentParseError(filename, null, 'no documents (every line is empty)');
  return docs;
}

/**
 * Largest document file or paste, in bytes (UTF-8). The bundled reports are 3-210 KB; a 20 MB
 * file is ~5 million tokens, far more than any round reads (see fitToBudget's pre-cut), and
 * parsing or holding more would only cost memory. The UI states it next to the upload button.
 */
export const DOCUMENT_MAX_BYTES = 20 * 1024 * 1024;

function megabytes(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MB`;
}

/** Refuses a document file (or paste) over DOCUMENT_MAX_BYTES, naming its size and the cap. */
export function checkDocumentSize(bytes: number, filename: string): void {
  if (bytes > DOCUMENT_MAX_BYTES) {
    throw new DocumentParseError(
      filename,
      null,
      `is ${megabytes(bytes)}; the cap is ${megabytes(DOCUMENT_MAX_BYTES)} per file`,
    );
  }
}

/** UTF-8 byte length of a string, without allocating its encoding. */
export function utf8Length(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length && (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}

export interface DecodedDocument {
  text: string;
  /** Bytes that were not valid UTF-8, each read as U+FFFD (a U+FFFD already in the file is not counted). */
  replaced: number;
  /** One line naming the file and the count when replaced > 0, else null. */
  warning: string | null;
}

/** Counts U+FFFD written in the file itself (its UTF-8 form EF BF BD), so only replacements are reported. */
function countEncodedReplacementChars(bytes: Uint8Array): number {
  let n = 0;
  for (let i = bytes.indexOf(0xef); i >= 0 && i + 2 < bytes.length; i = bytes.indexOf(0xef, i + 1)) {
    if (bytes[i + 1] === 0xbf && bytes[i + 2] === 0xbd) n++;
  }
  return n;
}

/** Decodes a document file's bytes as UTF-8, non-fatally: invalid bytes become U+FFFD and are counted. */
export function decodeDocumentBytes(bytes: Uint8Array, filename: string): DecodedDocument {
  checkDocumentSize(bytes.byteLength, filename);
  const text = new TextDecoder('utf-8', { fatal: false }).decode(bytes);
  let decodedFffd = 0;
  for (let i = text.indexOf('\uFFFD'); i >= 0; i = text.indexOf('\uFFFD', i + 1)) decodedFffd++;
  const replaced = Math.max(0, decodedFffd - countEncodedReplacementChars(bytes));
  const warning =
    replaced > 0
      ? `${filename}: ${replaced} byte sequence${replaced === 1 ? '' : 's'} not valid UTF-8, read as \uFFFD`
      : null;
  return { text, replaced, warning };
}

/** The one entry point for a document file's bytes (app upload and CLI --docs): size cap, UTF-8 decoding, parsing. */
export function readDocumentFile(bytes: Uint8Array, filename: string): { docs: SpyDocument[]; warning: string | null } {
  const { text, warning } = decodeDocumentBytes(bytes, filename);
  return { docs: parseDocuments(text, filename), warning };
}

/** .jsonl: one document per line (`report`, optional `summary`, `id`, `source`); .txt/.md: the whole file is one report. */
export function parseDocuments(text: string, filename: string): SpyDocument[] {
  if (text.length > DOCUMENT_MAX_BYTES / 3) checkDocumentSize(utf8Length(text), filename); // under a third of the cap in chars cannot exceed it in bytes
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
  /** Every document in file order, so the split can be redone with another held-out count. */
  all?: SpyDocument[];
}

/** Held-out reports by default: 3 GAO and 3 CRS from the bundled sample. */
export const DEFAULT_HELD_OUT = 6;

/**
 * Holds out `heldOut` documents for evaluation and trains on the rest; held-out documents are
 * never played. Only documents with a source and a reference summary can be held out. The
 * pick is stratified: sources take turns (in name order), each giving its shortest report not
 * yet taken, so the held-out reports are read whole by evaluation and GAO and CRS are balanced.
 * At least one document always stays for training. Both lists keep the input order.
 */
export function splitGovReport(docs: readonly SpyDocument[], heldOut = DEFAULT_HELD_OUT): DocumentSplit {
  if (!Number.isSafeInteger(heldOut) || heldOut < 0)
    throw new RangeError(`the held-out count must be a non-negative integer, got ${heldOut}`);
  const bySource = new Map<string, number[]>();
  docs.forEach((d, i) => {
    if (d.source === undefined || !d.summary) return;
    bySource.set(d.source, [...(bySource.get(d.source) ?? []), i]);
  });
  const queues = [...bySource.keys()]
    .sort()
    .map((k) => bySource.get(k)!.sort((a, b) => docs[a]!.report.length - docs[b]!.report.length || a - b));
  const want = Math.min(heldOut, docs.length - 1);
  const held = new Set<number>();
  while (held.size < want && queues.some((q) => q.length > 0)) {
    for (const q of queues) if (q.length > 0 && held.size < want) held.add(q.shift()!);
  }
  return {
    train: docs.filter((_, i) => !held.has(i)),
    eval: docs.filter((_, i) => held.has(i)),
    all: [...docs],
  };
}

export async function loadBundledGovReport(readText: () => Promise<string>): Promise<DocumentSplit> {
  return splitGovReport(parseDocuments(await readText(), GOVREPORT_PATH));
}

// ---------------------------------------------------------------------------------------------
// Per-agent token budget.

export interface DocumentCut {
  tokensKept: number;
  /** Tokens in the whole report; an estimate (tokensTotalEstimated) when the report was pre-cut. */
  tokensTotal: number;
  /** True when the report was longer than PRECUT_CHARS_PER_TOKEN × budget characters and only that prefix was tokenized. */
  tokensTotalEstimated: boolean;
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
 * A report is cut to budget × 8 characters before it is tokenized: English runs ~4.5 characters
 * per Qwen3 token and CJK ~1, so the prefix still holds about twice the budget, while a 4 MB
 * report no longer costs seconds of BPE per round.
 */
export const PRECUT_CHARS_PER_TOKEN = 8;

/** The prefix of `report` tokenized for `budget`: up to budget × 8 characters, ending at a sentence end or else whitespace. */
export function precutReport(
  report: string,
  budget: number,
): { text: string; snappedTo: DocumentCut['snappedTo'] } | null {
  const limit = budget * PRECUT_CHARS_PER_TOKEN;
  if (report.length <= limit) return null;
  const window = report.slice(0, limit + 64); // a little lookahead so an end at `limit` is judged in context
  const sentence = sentenceEnds(window)
    .filter((e) => e <= limit)
    .pop();
  if (sentence !== undefined && sentence >= limit / 2)
    return { text: report.slice(0, sentence), snappedTo: 'sentence' };
  const word = wordEnds(window)
    .filter((e) => e <= limit)
    .pop();
  if (word !== undefined && word >= limit / 2) return { text: report.slice(0, word), snappedTo: 'word' };
  return { text: report.slice(0, snapBack(report, limit)), snappedTo: 'char' };
}

/** Recent fits per tokenizer and budget: the trainer and the round preview ask for the same document every round. */
const fitCache = new WeakMap<object, Map<number, Map<string, BudgetedText>>>();
const FIT_CACHE_ENTRIES = 64;

/**
 * The longest prefix of `report` ending at a sentence end whose tokens fit in `budget`
 * (falling back to a word end, then to any whole character). `report` must be NFC. Reports
 * longer than budget × 8 characters are pre-cut first (precutReport). The result is cached per
 * (tokenizer, budget, report) and frozen: callers share it.
 */
export function fitToBudget(report: string, tokenizer: GameTokenizer, budget: number): BudgetedText {
  if (!Number.isSafeInteger(budget) || budget < 1)
    throw new RangeError(`docTokenBudget must be a positive integer, got ${budget}`);
  let perTokenizer = fitCache.get(tokenizer);
  if (!perTokenizer) fitCache.set(tokenizer, (perTokenizer = new Map()));
  let perBudget = perTokenizer.get(budget);
  if (!perBudget) perTokenizer.set(budget, (perBudget = new Map()));
  const hit = perBudget.get(report);
  if (hit) {
    perBudget.delete(report); // refresh its place: the Map's order is the eviction order
    perBudget.set(report, hit);
    return hit;
  }
  const fit = freezeFit(fitUncached(report, tokenizer, budget));
  perBudget.set(report, fit);
  if (perBudget.size > FIT_CACHE_ENTRIES) perBudget.delete(perBudget.keys().next().value!);
  return fit;
}

function freezeFit(fit: BudgetedText): BudgetedText {
  Object.freeze(fit.tokenIds);
  if (fit.cut) Object.freeze(fit.cut);
  return Object.freeze(fit);
}

function fitUncached(report: string, tokenizer: GameTokenizer, budget: number): BudgetedText {
  const pre = precutReport(report, budget);
  const source = pre ? pre.text : report;
  // Documents are untrusted: "<|im_end|>" in a report is text, as renderPrompt will encode it.
  const ids = tokenizer.encodeText(source);
  const total = (kept: number) => ({
    tokensTotal: pre ? Math.round((ids.length * report.length) / Math.max(1, source.length)) : ids.length,
    tokensTotalEstimated: pre !== null,
    tokensKept: kept,
    charsTotal: report.length,
  });
  if (ids.length <= budget) {
    if (!pre) return { text: report, tokenIds: ids, cut: null };
    const text = source.trimEnd();
    const kept = text.length === source.length ? ids : tokenizer.encodeText(text);
    return { text, tokenIds: kept, cut: { ...total(kept.length), charOffset: text.length, snappedTo: pre.snappedTo } };
  }
  const offsets = tokenCharOffsets(tokenizer, source, ids);
  const limit = offsets[budget]!; // the first `budget` tokens end here
  const tryEnds = (ends: number[], snappedTo: DocumentCut['snappedTo']): BudgetedText | null => {
    for (let k = ends.length - 1, tries = 0; k >= 0 && tries < 8; k--) {
      if (ends[k]! > limit) continue;
      tries++; // re-encoding a prefix can merge differently at the cut: verify, step back if over
      const text = source.slice(0, ends[k]).trimEnd();
      if (text === '') return null;
      const kept = tokenizer.encodeText(text);
      if (kept.length <= budget)
        return { text, tokenIds: kept, cut: { ...total(kept.length), charOffset: text.length, snappedTo } };
    }
    return null;
  };
  const charEnds: number[] = [];
  for (let p = snapBack(source, limit); p > 0 && charEnds.length < 8; p = snapBack(source, p - 1)) charEnds.unshift(p);
  const fit =
    tryEnds(sentenceEnds(source), 'sentence') ?? tryEnds(wordEnds(source), 'word') ?? tryEnds(charEnds, 'char');
  if (!fit) throw new RangeError(`cannot fit any prefix of the report into ${budget} tokens`);
  return fit;
}

// ---------------------------------------------------------------------------------------------
// Schedule.

/** Round r plays documents in epochs: each epoch is a seeded shuffle, so resuming needs only (seed, round). */
export function documentForRound<T>(docs: readonly T[], round: number, seed: number | string): T {
  if (docs.length === 0) throw new RangeError('no training documents');
  if (!Number.isSafeInteger(round) || round < 0)
    throw new RangeError(`round must be a non-negative integer, got ${round}`);
  const epoch = Math.floor(round / docs.length);
  const order = Rng.fromSeed(seed)
    .fork(`documents/epoch-${epoch}`)
    .shuffle(docs.map((_, i) => i));
  return docs[order[round % docs.length]!]!;
}
