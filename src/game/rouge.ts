// ROUGE-1, ROUGE-2 and ROUGE-L exactly as Google's rouge_score computes "rouge1", "rouge2" and
// "rougeL": lowercase, every run of characters outside [a-z0-9] becomes a space, split on
// whitespace, optionally Porter-stem tokens longer than 3 characters (NLTK's stemmer, see
// porter.ts); ROUGE-N from clipped n-gram counts, ROUGE-L from the LCS of the token lists.
import { porterStem } from './porter.ts';

export interface RougeScore {
  precision: number;
  recall: number;
  fmeasure: number;
}

export function rougeTokenize(text: string, useStemmer = false): string[] {
  const tokens = text
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, ' ')
    .split(/\s+/);
  return tokens.map((t) => (useStemmer && t.length > 3 ? porterStem(t) : t)).filter((t) => /^[a-z0-9]+$/.test(t));
}

/** Length of the longest common subsequence (two rows of the DP table). */
export function lcsLength(a: readonly string[], b: readonly string[]): number {
  if (a.length === 0 || b.length === 0) return 0;
  let prev = new Int32Array(b.length + 1);
  let cur = new Int32Array(b.length + 1);
  for (let i = 1; i <= a.length; i++) {
    const ai = a[i - 1];
    for (let j = 1; j <= b.length; j++) {
      cur[j] = ai === b[j - 1] ? prev[j - 1]! + 1 : Math.max(prev[j]!, cur[j - 1]!);
    }
    [prev, cur] = [cur, prev];
  }
  return prev[b.length]!;
}

/** rouge_score's RougeScorer(['rougeL'], use_stemmer).score(target, prediction)['rougeL']. */
export function rougeL(target: string, prediction: string, opts: { useStemmer?: boolean } = {}): RougeScore {
  const t = rougeTokenize(target, opts.useStemmer);
  const p = rougeTokenize(prediction, opts.useStemmer);
  if (t.length === 0 || p.length === 0) return { precision: 0, recall: 0, fmeasure: 0 };
  const lcs = lcsLength(t, p);
  const precision = lcs / p.length;
  const recall = lcs / t.length;
  const fmeasure = precision + recall > 0 ? (2 * precision * recall) / (precision + recall) : 0;
  return { precision, recall, fmeasure };
}

/** Multiset of the n-grams of `tokens` (keys joined with a space: tokens never contain one). */
function ngramCounts(tokens: readonly string[], n: number): Map<string, number> {
  const counts = new Map<string, number>();
  for (let i = 0; i + n <= tokens.length; i++) {
    const key = tokens.slice(i, i + n).join(' ');
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return counts;
}

function fromOverlap(overlap: number, predicted: number, target: number): RougeScore {
  // rouge_score divides by max(count, 1): an empty side scores 0, never NaN.
  const precision = overlap / Math.max(predicted, 1);
  const recall = overlap / Math.max(target, 1);
  const fmeasure = precision + recall > 0 ? (2 * precision * recall) / (precision + recall) : 0;
  return { precision, recall, fmeasure };
}

/** ROUGE-N over already tokenized text: overlap = sum over n-grams of min(count in target, count in prediction). */
export function rougeNTokens(target: readonly string[], prediction: readonly string[], n: number): RougeScore {
  if (!Number.isSafeInteger(n) || n < 1) throw new RangeError(`ROUGE-N needs n >= 1, got ${n}`);
  const t = ngramCounts(target, n);
  const p = ngramCounts(prediction, n);
  let overlap = 0;
  for (const [k, c] of p) overlap += Math.min(c, t.get(k) ?? 0);
  return fromOverlap(overlap, Math.max(0, prediction.length - n + 1), Math.max(0, target.length - n + 1));
}

/** rouge_score's RougeScorer(['rouge<n>'], use_stemmer).score(target, prediction)['rouge<n>']. */
export function rougeN(target: string, prediction: string, n: number, opts: { useStemmer?: boolean } = {}): RougeScore {
  return rougeNTokens(rougeTokenize(target, opts.useStemmer), rougeTokenize(prediction, opts.useStemmer), n);
}

export interface RougeScores {
  rouge1: RougeScore;
  rouge2: RougeScore;
  rougeL: RougeScore;
}

/** ROUGE-1, ROUGE-2 and ROUGE-L of one prediction against one reference, tokenizing each text once. */
export function rougeScores(target: string, prediction: string, opts: { useStemmer?: boolean } = {}): RougeScores {
  const t = rougeTokenize(target, opts.useStemmer);
  const p = rougeTokenize(prediction, opts.useStemmer);
  const l =
    t.length === 0 || p.length === 0
      ? { precision: 0, recall: 0, fmeasure: 0 }
      : fromOverlap(lcsLength(t, p), p.length, t.length);
  return { rouge1: rougeNTokens(t, p, 1), rouge2: rougeNTokens(t, p, 2), rougeL: l };
}
