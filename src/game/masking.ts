// The spy's copy: one contiguous span covering maskRatio of the report's tokens is removed,
// snapped to sentence boundaries when possible, at a seeded random position.
import type { Rng } from './rng.ts';
import { sentenceEnds, tokenCharOffsets, tokensBefore, wordEnds, type GameTokenizer } from './text.ts';

export type MaskMode = 'remove' | 'placeholder';

/** What the span's ends were snapped to; 'whole' is the fallback for a one-token report. */
export type SpanSnap = 'sentence' | 'word' | 'token' | 'whole';

export interface MaskedSpan {
  /** UTF-16 offsets in the full text: full = full.slice(0, charStart) + span + full.slice(charEnd). */
  charStart: number;
  charEnd: number;
  /** Tokens of the full text whose start lies in [charStart, charEnd). */
  tokenStart: number;
  tokenEnd: number;
  text: string;
  snappedTo: SpanSnap;
}

export interface MaskedDocument {
  full: string;
  spyText: string;
  span: MaskedSpan;
  mode: MaskMode;
  totalTokens: number;
  targetTokens: number;
  /** (tokenEnd - tokenStart) / totalTokens. */
  ratio: number;
}

export interface MaskOptions {
  maskRatio: number;
  mode: MaskMode;
  rng: Rng;
  /** Inserted where the span was, in 'placeholder' mode. */
  placeholder?: string;
  /** Accepted relative error of the span's token count; default 0.25 (0.2 ± 0.05 of the report). */
  tolerance?: number;
}

interface Candidate {
  start: number;
  end: number;
}

/**
 * For each cut point a (ascending) the cut point b > a whose token count is closest to the
 * target (ties: the shorter span); kept when within tolerance and, for reports of 2+ tokens,
 * when something of the report remains.
 */
function candidateSpans(
  cuts: number[],
  tokensAt: (pos: number) => number,
  target: number,
  tol: number,
  total: number,
): Candidate[] {
  const out: Candidate[] = [];
  let j = 1;
  for (let i = 0; i < cuts.length - 1; i++) {
    const t0 = tokensAt(cuts[i]!);
    if (j <= i) j = i + 1;
    while (j + 1 < cuts.length && tokensAt(cuts[j + 1]!) - t0 <= target) j++;
    let best = j;
    if (j + 1 < cuts.length && tokensAt(cuts[j + 1]!) - t0 - target < target - (tokensAt(cuts[j]!) - t0)) best = j + 1;
    const count = tokensAt(cuts[best]!) - t0;
    if (count > 0 && Math.abs(count - target) <= tol && (total < 2 || count < total))
      out.push({ start: cuts[i]!, end: cuts[best]! });
  }
  return out;
}

/**
 * Removes one contiguous span of about maskRatio of the tokens of `full` (NFC). Cut points are
 * tried in order: sentence ends, word ends, token starts; the span starts at a cut point (so
 * it begins with the whitespace before its first sentence) and ends at one, except a span at
 * the very start also takes the whitespace after it, so the spy's copy never starts with a space.
 * A one-token report is removed whole (snappedTo 'whole': the spy sees an empty report, or only
 * the placeholder). One rng.int draw picks the position among the candidates.
 */
export function maskSpan(full: string, tokenizer: GameTokenizer, opts: MaskOptions): MaskedDocument {
  const { maskRatio, mode, rng } = opts;
  if (!(maskRatio > 0 && maskRatio < 1)) throw new RangeError(`maskRatio must be in (0, 1), got ${maskRatio}`);
  if (full.trim() === '') throw new RangeError('cannot mask an empty report');
  const ids = tokenizer.encode(full);
  const offsets = tokenCharOffsets(tokenizer, full, ids);
  const total = ids.length;
  const target = Math.max(1, Math.round(maskRatio * total));
  const tol = Math.max(1, Math.round((opts.tolerance ?? 0.25) * target));
  const tokensAt = (pos: number) => tokensBefore(offsets, pos);
  const withEnds = (ends: number[]) => [...new Set([0, ...ends, full.length])].sort((a, b) => a - b);

  const levels: [Exclude<SpanSnap, 'whole'>, number[]][] = [
    ['sentence', withEnds(sentenceEnds(full))],
    ['word', withEnds(wordEnds(full))],
    ['token', withEnds(offsets)],
  ];
  let chosen: Candidate = { start: 0, end: full.length };
  let snappedTo: SpanSnap = 'whole';
  for (const [level, cuts] of levels) {
    const cands = candidateSpans(cuts, tokensAt, target, tol, total);
    if (cands.length > 0) {
      chosen = cands[rng.int(cands.length)]!;
      snappedTo = level;
      break;
    }
  }
  const start = chosen.start;
  let end = chosen.end;
  if (start === 0) while (end < full.length && /\s/.test(full[end]!)) end++;

  const span = full.slice(start, end);
  const prefix = full.slice(0, start);
  const suffix = full.slice(end);
  let spyText = prefix + suffix;
  if (mode === 'placeholder') {
    const lead = /^\s*/.exec(span)![0];
    const trail = start === 0 && suffix !== '' ? /\s*$/.exec(span)![0] : '';
    spyText = prefix + lead + (opts.placeholder ?? '[...]') + trail + suffix;
  }
  const tokenStart = tokensAt(start);
  const tokenEnd = end >= full.length ? total : tokensAt(end);
  return {
    full,
    spyText,
    span: { charStart: start, charEnd: end, tokenStart, tokenEnd, text: span, snappedTo },
    mode,
    totalTokens: total,
    targetTokens: target,
    ratio: (tokenEnd - tokenStart) / total,
  };
}
