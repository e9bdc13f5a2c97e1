// ROUGE-1/2/L against scores computed in Python (scripts/rouge_fixture.py): rouge_score's
// algorithm on NLTK's real PorterStemmer, over GovReport references and extractive candidates.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { porterStem } from '../../src/game/porter.ts';
import { rougeL, rougeN, rougeScores, rougeTokenize, type RougeScore } from '../../src/game/rouge.ts';

interface Case {
  reference: string;
  candidate: string;
  useStemmer: boolean;
  expected: Record<'rouge1' | 'rouge2' | 'rougeL', RougeScore>;
  tokens: number;
}
const fixture = JSON.parse(readFileSync(new URL('../fixtures/rouge/rouge_cases.json', import.meta.url), 'utf8')) as {
  cases: Case[];
  stems: Record<string, string>;
};

describe('ROUGE-1/2/L against the Python reference', () => {
  it('has cases with and without stemming where stemming changes the score', () => {
    expect(fixture.cases.length).toBeGreaterThanOrEqual(60);
    const pairs = fixture.cases
      .filter((c) => c.useStemmer)
      .map((c) => [
        c,
        fixture.cases.find((d) => !d.useStemmer && d.reference === c.reference && d.candidate === c.candidate)!,
      ]);
    expect(
      pairs.filter(([a, b]) => a!.expected.rouge1.fmeasure !== b!.expected.rouge1.fmeasure).length,
    ).toBeGreaterThan(10);
  });

  it('matches precision, recall and F1 of every case (1e-12)', () => {
    for (const c of fixture.cases) {
      const got = rougeScores(c.reference, c.candidate, { useStemmer: c.useStemmer });
      for (const k of ['rouge1', 'rouge2', 'rougeL'] as const) {
        for (const m of ['precision', 'recall', 'fmeasure'] as const) {
          expect(
            Math.abs(got[k][m] - c.expected[k][m]),
            `${k}.${m} stem=${c.useStemmer} "${c.candidate.slice(0, 40)}"`,
          ).toBeLessThan(1e-12);
        }
      }
      expect(rougeTokenize(c.candidate, c.useStemmer)).toHaveLength(c.tokens);
    }
  });

  it('agrees with the single-metric functions', () => {
    for (const c of fixture.cases.slice(0, 20)) {
      const o = { useStemmer: c.useStemmer };
      expect(rougeN(c.reference, c.candidate, 1, o)).toEqual(rougeScores(c.reference, c.candidate, o).rouge1);
      expect(rougeN(c.reference, c.candidate, 2, o)).toEqual(rougeScores(c.reference, c.candidate, o).rouge2);
      expect(rougeL(c.reference, c.candidate, o)).toEqual(rougeScores(c.reference, c.candidate, o).rougeL);
    }
  });

  it("stems every word of the bundled sample as NLTK's PorterStemmer does", () => {
    const words = Object.entries(fixture.stems);
    expect(words.length).toBeGreaterThan(5000);
    const wrong = words.filter(([w, s]) => porterStem(w) !== s);
    expect(wrong.slice(0, 10)).toEqual([]);
  });
});

describe('ROUGE-N by hand', () => {
  it('clips repeated n-grams and scores empty sides 0', () => {
    // target a a a b, prediction a b b b a: unigrams min(3,2)+min(1,3) = 3 -> P 3/5, R 3/4;
    // bigrams target {aa:2, ab:1}, prediction {ab:1, bb:2, ba:1} -> overlap 1, P 1/4, R 1/3.
    const s = rougeScores('a a a b', 'a b b b a');
    expect(s.rouge1.precision).toBeCloseTo(3 / 5, 15);
    expect(s.rouge1.recall).toBeCloseTo(3 / 4, 15);
    expect(s.rouge2.precision).toBeCloseTo(1 / 4, 15);
    expect(s.rouge2.recall).toBeCloseTo(1 / 3, 15);
    expect(rougeScores('', 'x y').rouge2).toEqual({ precision: 0, recall: 0, fmeasure: 0 });
    expect(rougeN('one', 'one', 2)).toEqual({ precision: 0, recall: 0, fmeasure: 0 }); // no bigrams on either side
    expect(() => rougeN('a', 'a', 0)).toThrow(RangeError);
  });
});
