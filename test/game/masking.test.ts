import { beforeAll, describe, expect, it } from 'vitest';
import { fitToBudget } from '../../src/game/documents.ts';
import { loadGovReportNode } from '../../src/game/govreport.node.ts';
import { maskSpan } from '../../src/game/masking.ts';
import { Rng } from '../../src/game/rng.ts';
import { isCharBoundary, normalizeText, sentenceEnds, tokenCharOffsets } from '../../src/game/text.ts';
import type { Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { qwen3Tokenizer } from '../helpers/game.ts';

let tok: Qwen3Tokenizer;
let report: string;
beforeAll(async () => {
  tok = await qwen3Tokenizer();
  report = fitToBudget((await loadGovReportNode()).train[1]!.report, tok, 1500).text;
});

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

describe('tokenCharOffsets', () => {
  it('maps every token to where it starts in the text', () => {
    const text = normalizeText('Hello, world. 東京 🚀 naïve — q\u0307 👩‍👩‍👧 end.');
    const ids = tok.encode(text);
    const off = tokenCharOffsets(tok, text, ids);
    expect(off).toHaveLength(ids.length + 1);
    expect(off[0]).toBe(0);
    expect(off[ids.length]).toBe(text.length);
    for (let i = 1; i < off.length; i++) expect(off[i]!).toBeGreaterThanOrEqual(off[i - 1]!);
    for (const o of off) expect(isCharBoundary(text, o)).toBe(true);
    // Decoding the tokens before each ASCII-aligned offset gives exactly that prefix.
    for (let i = 0; i < 5; i++) expect(tok.decode(ids.slice(0, i))).toBe(text.slice(0, off[i]));
  });

  it('refuses ids that do not belong to the text', () => {
    expect(() => tokenCharOffsets(tok, 'abc', tok.encode('abcd'))).toThrow(/bytes/);
  });
});

describe('sentenceEnds', () => {
  it('ends sentences at terminal punctuation and line ends, not after abbreviations or decimals', () => {
    const t =
      'The U.S. Dept. of Energy spent $3.5 billion. Sec. 101 applies (see Fig. 2). "Is it done?" she asked.\nHeading\n\nNew para! 東京です。大阪です。';
    const ends = sentenceEnds(t);
    const pieces = ends.map((e, i) => t.slice(i === 0 ? 0 : ends[i - 1]!, e).trim());
    expect(pieces).toEqual([
      'The U.S. Dept. of Energy spent $3.5 billion.',
      'Sec. 101 applies (see Fig. 2).',
      '"Is it done?"',
      'she asked.',
      'Heading',
      'New para!',
      '東京です。',
      '大阪です。',
    ]);
  });
});

describe('maskSpan', () => {
  it('removes one sentence-snapped span of about maskRatio of the tokens', () => {
    const total = tok.encode(report).length;
    const starts = new Set<number>();
    const ends = new Set([0, ...sentenceEnds(report), report.length]);
    for (let seed = 0; seed < 12; seed++) {
      const m = maskSpan(report, tok, { maskRatio: 0.2, mode: 'remove', rng: Rng.fromSeed(seed) });
      const { charStart, charEnd, tokenStart, tokenEnd, text } = m.span;
      expect(m.full).toBe(report);
      expect(report.slice(0, charStart) + text + report.slice(charEnd)).toBe(report);
      expect(m.spyText).toBe(report.slice(0, charStart) + report.slice(charEnd));
      expect(m.span.snappedTo).toBe('sentence');
      expect(ends.has(charStart)).toBe(true);
      expect(ends.has(charEnd)).toBe(true);
      expect(m.totalTokens).toBe(total);
      expect(m.ratio).toBe((tokenEnd - tokenStart) / total);
      expect(Math.abs(m.ratio - 0.2)).toBeLessThanOrEqual(0.05 + 1 / total);
      // The removed text re-encodes to within a token or two of the recorded token count.
      expect(Math.abs(tok.encode(text).length - (tokenEnd - tokenStart))).toBeLessThanOrEqual(2);
      starts.add(charStart);
    }
    expect(starts.size).toBeGreaterThan(6); // the position is random
  });

  it('is a function of the rng: same seed, same span', () => {
    const a = maskSpan(report, tok, { maskRatio: 0.3, mode: 'remove', rng: Rng.fromSeed(9) });
    const b = maskSpan(report, tok, { maskRatio: 0.3, mode: 'remove', rng: Rng.fromSeed(9) });
    expect(b).toEqual(a);
    expect(Math.abs(a.ratio - 0.3)).toBeLessThanOrEqual(0.075 + 1 / a.totalTokens);
  });

  it('placeholder mode marks the gap, keeping the whitespace around it', () => {
    const text = 'Alpha one is here. Bravo two is here. Charlie three is here. Delta four is here. Echo five is here.';
    for (let seed = 0; seed < 10; seed++) {
      const m = maskSpan(text, tok, {
        maskRatio: 0.2,
        mode: 'placeholder',
        rng: Rng.fromSeed(seed),
        placeholder: '[...]',
      });
      expect(m.span.snappedTo).toBe('sentence');
      const before = text.slice(0, m.span.charStart);
      const after = text.slice(m.span.charEnd);
      expect(m.spyText.replace('[...]', '').replace(/\s+/g, ' ').trim()).toBe(
        `${before} ${after}`.replace(/\s+/g, ' ').trim(),
      );
      expect(m.spyText).toMatch(/(^|\. )\[\.\.\.\]( [A-Z]|$)/);
      const removed = maskSpan(text, tok, { maskRatio: 0.2, mode: 'remove', rng: Rng.fromSeed(seed) });
      expect(removed.spyText).not.toMatch(/^\s|\s$|\s\s/); // seamless: no double or edge spaces
    }
  });

  it('a one-sentence report still loses a non-empty span (at word ends), leaving text behind', () => {
    const text = 'Congress funded the new program last year.';
    for (let seed = 0; seed < 8; seed++) {
      const m = maskSpan(text, tok, { maskRatio: 0.2, mode: 'remove', rng: Rng.fromSeed(seed) });
      expect(m.span.snappedTo).toBe('word');
      expect(m.span.text.trim().length).toBeGreaterThan(0);
      expect(m.spyText.trim().length).toBeGreaterThan(0);
      expect(m.span.tokenEnd - m.span.tokenStart).toBeGreaterThanOrEqual(1);
      expect(m.span.tokenEnd - m.span.tokenStart).toBeLessThan(m.totalTokens);
    }
  });

  it('documented fallback: a one-token report is removed whole (the spy gets nothing, or the placeholder)', () => {
    expect(tok.encode('Hello')).toHaveLength(1);
    const m = maskSpan('Hello', tok, { maskRatio: 0.2, mode: 'remove', rng: Rng.fromSeed(0) });
    expect(m.span).toMatchObject({ charStart: 0, charEnd: 5, tokenStart: 0, tokenEnd: 1, text: 'Hello' });
    expect(m.spyText).toBe('');
    expect(maskSpan('Hello', tok, { maskRatio: 0.2, mode: 'placeholder', rng: Rng.fromSeed(0) }).spyText).toBe('[...]');
    expect(() => maskSpan('  ', tok, { maskRatio: 0.2, mode: 'remove', rng: Rng.fromSeed(0) })).toThrow(/empty/);
    expect(() => maskSpan('Hello', tok, { maskRatio: 1, mode: 'remove', rng: Rng.fromSeed(0) })).toThrow(/maskRatio/);
  });

  it('never splits a character: CJK, emoji sequences, combining marks', () => {
    const text = normalizeText(
      '東京都は日本の首都で人口が多い都市です🚀👩‍👩‍👧‍👦🇯🇵q\u0307a\u0308\u0301x̌ỹ最後に文字列は終わります',
    );
    for (let seed = 0; seed < 30; seed++) {
      for (const ratio of [0.1, 0.2, 0.5]) {
        const m = maskSpan(text, tok, { maskRatio: ratio, mode: 'remove', rng: Rng.fromSeed(seed) });
        expect(isCharBoundary(text, m.span.charStart)).toBe(true);
        expect(isCharBoundary(text, m.span.charEnd)).toBe(true);
        expect(m.spyText).not.toMatch(LONE_SURROGATE);
        expect(m.spyText).not.toMatch(/^[\p{M}\u200D]/u);
        expect(text.slice(0, m.span.charStart) + m.span.text + text.slice(m.span.charEnd)).toBe(text);
        expect(m.span.text.length).toBeGreaterThan(0);
        expect(m.spyText.length).toBeGreaterThan(0);
      }
    }
  });
});
