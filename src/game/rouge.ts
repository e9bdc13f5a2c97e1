// ROUGE-L F1 exactly as Google's rouge_score computes "rougeL": lowercase, every run of
// characters outside [a-z0-9] becomes a space, split on whitespace, optionally Porter-stem
// tokens longer than 3 characters (NLTK's stemmer, see porter.ts), LCS over the token lists.
import { porterStem } from './porter.ts';

export interface RougeScore {
  precision: number;
  recall: number;
  fmeasure: number;
}

export function rougeTokenize(text: string, useStemmer = false): string[] {
  const tokens = text.toLowerCase().replace(/[^a-z0-9]+/g, ' ').split(/\s+/);
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
