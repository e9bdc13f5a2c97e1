// Text geometry shared by budgeting and masking: which UTF-16 positions are safe to cut at
// (never inside a surrogate pair, before a combining mark or inside an emoji sequence), where
// sentences end, and where each token of a byte-level BPE encoding starts in the string.
import type { Qwen3Tokenizer } from '../model/tokenizer.ts';

/** The part of the tokenizer the game uses; a scripted test tokenizer can implement it. */
export type GameTokenizer = Pick<
  Qwen3Tokenizer,
  'encode' | 'encodeText' | 'encodeChat' | 'decode' | 'idToToken' | 'applyChatTemplate'
>;

/** Documents enter the game NFC-normalised, as the Qwen3 tokenizer's normalizer would see them. */
export function normalizeText(text: string): string {
  return text
    .replace(/^\uFEFF/, '')
    .replace(/\r\n?/g, '\n')
    .normalize('NFC');
}

const MARK = /^[\p{M}\u200D]/u; // combining marks (incl. variation selectors) and ZWJ attach to the previous character
const EMOJI_MODIFIER = /^[\u{1F3FB}-\u{1F3FF}\u{E0020}-\u{E007F}]/u; // skin tones, tag characters
const REGIONAL_INDICATOR = /^[\u{1F1E6}-\u{1F1FF}]/u;

function isLowSurrogate(c: number): boolean {
  return c >= 0xdc00 && c <= 0xdfff;
}

function isHighSurrogate(c: number): boolean {
  return c >= 0xd800 && c <= 0xdbff;
}

/** True when cutting `text` at UTF-16 index i keeps every user-perceived character whole. */
export function isCharBoundary(text: string, i: number): boolean {
  if (i <= 0 || i >= text.length) return true;
  if (isLowSurrogate(text.charCodeAt(i)) && isHighSurrogate(text.charCodeAt(i - 1))) return false;
  const rest = text.slice(i, i + 2);
  if (MARK.test(rest) || EMOJI_MODIFIER.test(rest)) return false;
  if (text.charCodeAt(i - 1) === 0x200d) return false; // after a zero-width joiner
  if (REGIONAL_INDICATOR.test(rest)) {
    let n = 0; // flags are pairs: a boundary only after an even number of indicators
    for (let j = i; j >= 2 && REGIONAL_INDICATOR.test(text.slice(j - 2, j)); j -= 2) n++;
    return n % 2 === 0;
  }
  return true;
}

/** Largest safe cut position <= i. */
export function snapBack(text: string, i: number): number {
  let j = Math.max(0, Math.min(i, text.length));
  while (!isCharBoundary(text, j)) j--;
  return j;
}

/** Smallest safe cut position >= i. */
export function snapForward(text: string, i: number): number {
  let j = Math.max(0, Math.min(i, text.length));
  while (!isCharBoundary(text, j)) j++;
  return j;
}

const ABBREVIATIONS = new Set([
  'mr',
  'mrs',
  'ms',
  'dr',
  'prof',
  'st',
  'jr',
  'sr',
  'no',
  'nos',
  'vs',
  'etc',
  'inc',
  'ltd',
  'co',
  'corp',
  'fig',
  'sec',
  'secs',
  'pp',
  'vol',
  'gen',
  'gov',
  'sen',
  'rep',
  'reps',
  'dept',
  'approx',
  'est',
  'al',
  'jan',
  'feb',
  'mar',
  'apr',
  'jun',
  'jul',
  'aug',
  'sep',
  'sept',
  'oct',
  'nov',
  'dec',
  'e.g',
  'i.e',
  'u.s',
]);
const LATIN_TERMINATOR = /[.!?]/;
const CJK_TERMINATOR = /[。！？]/;
const CLOSER = /[\p{Pe}\p{Pf}"'’”»]/u;
const SPACE = /[ \t\f\v\u00A0\u3000]/;

/** The word ending at `end` (letters, digits and inner dots), lowercased. */
function wordBefore(text: string, end: number): string {
  let j = end;
  while (j > 0 && /[\p{L}\p{N}.]/u.test(text[j - 1]!)) j--;
  return text.slice(j, end).toLowerCase();
}

/**
 * Positions just after each sentence's last character (terminal punctuation plus closing
 * quotes/brackets, or the end of a line), sorted, ending with the end of the text (trailing
 * whitespace excluded). A Latin full stop ends a sentence only before whitespace and not after
 * a single letter ("U.S.") or a common abbreviation ("Sec.", "No."); CJK terminators need no
 * space. Deterministic and locale-free, so Node and the browser cut identically.
 */
export function sentenceEnds(text: string): number[] {
  const ends: number[] = [];
  const push = (e: number) => {
    if (e > 0 && (ends.length === 0 || ends[ends.length - 1]! < e)) ends.push(e);
  };
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text[i]!;
    if (c === '\n') {
      let e = i; // end of the line's content
      while (e > 0 && SPACE.test(text[e - 1]!)) e--;
      if (e > 0 && text[e - 1] !== '\n') push(e);
      continue;
    }
    const cjk = CJK_TERMINATOR.test(c);
    if (!cjk && !LATIN_TERMINATOR.test(c)) continue;
    let e = i + 1;
    while (
      e < n &&
      (CLOSER.test(text[e]!) || (cjk && CJK_TERMINATOR.test(text[e]!)) || (!cjk && LATIN_TERMINATOR.test(text[e]!)))
    )
      e++;
    if (e >= n) break;
    if (!cjk) {
      if (!/\s/.test(text[e]!)) continue; // "3.5", "e.g.," and URLs are not ends
      if (c === '.') {
        const w = wordBefore(text, i);
        if (/^\p{L}$/u.test(w) || ABBREVIATIONS.has(w) || /^(\p{L}\.)+\p{L}$/u.test(w)) continue;
      }
    }
    push(e);
    i = e - 1;
  }
  let last = n;
  while (last > 0 && /\s/.test(text[last - 1]!)) last--;
  if (last > 0 && (ends.length === 0 || ends[ends.length - 1]! < last)) ends.push(last);
  else if (last > 0 && ends[ends.length - 1]! > last) ends[ends.length - 1] = last;
  return ends;
}

/** Positions just after each word (a maximal run of non-whitespace), sorted. */
export function wordEnds(text: string): number[] {
  const ends: number[] = [];
  for (let i = 1; i <= text.length; i++) {
    if (!/\s/.test(text[i - 1]!) && (i === text.length || /\s/.test(text[i]!))) ends.push(i);
  }
  return ends;
}

let byteDecoder: Map<string, number> | null = null;

/** GPT-2's bytes_to_unicode, inverted: the printable stand-in character of each byte -> the byte. */
function byteLevelDecoder(): Map<string, number> {
  if (byteDecoder) return byteDecoder;
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  byteDecoder = new Map(bs.map((b, i) => [String.fromCodePoint(cs[i]!), b]));
  return byteDecoder;
}

const utf8 = new TextEncoder();

/** UTF-8 byte length of each token: byte-level BPE strings map one character to one byte. */
function tokenByteLengths(tokenizer: Pick<GameTokenizer, 'idToToken'>, ids: readonly number[]): number[] {
  const dec = byteLevelDecoder();
  return ids.map((id) => {
    const tok = tokenizer.idToToken(id);
    if (tok === undefined) throw new RangeError(`token id ${id} is not in the vocabulary`);
    let len = 0;
    for (const ch of tok) {
      if (!dec.has(ch)) return utf8.encode(tok).length; // an added token stored as plain text
      len++;
    }
    return len;
  });
}

/**
 * offsets[i] = UTF-16 index where token i starts (rounded down to a safe cut position when the
 * token starts inside a character), offsets[ids.length] = text.length. `ids` must be
 * tokenizer.encode(text) for an NFC text (see normalizeText).
 */
export function tokenCharOffsets(
  tokenizer: Pick<GameTokenizer, 'idToToken'>,
  text: string,
  ids: readonly number[],
): number[] {
  const lens = tokenByteLengths(tokenizer, ids);
  const byteToChar: number[] = []; // byte offset -> UTF-16 index of the character holding it
  for (let i = 0; i < text.length;) {
    const cp = text.codePointAt(i)!;
    const units = cp > 0xffff ? 2 : 1;
    const bytes = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (let b = 0; b < bytes; b++) byteToChar.push(i);
    i += units;
  }
  const total = lens.reduce((a, b) => a + b, 0);
  if (total !== byteToChar.length) {
    throw new RangeError(
      `tokens cover ${total} bytes but the text has ${byteToChar.length}: encode an NFC text (normalizeText) and pass its own ids`,
    );
  }
  const offsets: number[] = [];
  let byte = 0;
  for (const len of lens) {
    offsets.push(byte < byteToChar.length ? snapBack(text, byteToChar[byte]!) : text.length);
    byte += len;
  }
  offsets.push(text.length);
  return offsets;
}

/**
 * Number of tokens whose (snapped) start is before UTF-16 position `pos`. Every token belongs to
 * the region its start falls in, so a span [a, b) holds tokens [tokensBefore(a), tokensBefore(b)).
 */
export function tokensBefore(offsets: readonly number[], pos: number): number {
  let lo = 0;
  let hi = offsets.length - 1; // offsets[last] = text.length, not a token start
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (offsets[mid]! >= pos) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** Length of the longest common prefix of two token sequences (the KV cache two prompts can share). */
export function commonPrefixLength(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}
