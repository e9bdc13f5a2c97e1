import { describe, expect, it } from 'vitest';
import { porterStem } from '../../src/game/porter.ts';
import { lcsLength, rougeL, rougeTokenize } from '../../src/game/rouge.ts';

describe('rouge_score tokenizer', () => {
  it('lowercases, turns non [a-z0-9] runs into spaces, drops empties', () => {
    expect(rougeTokenize("The U.S. GAO's FY-2020 report: café & naïve!")).toEqual([
      'the',
      'u',
      's',
      'gao',
      's',
      'fy',
      '2020',
      'report',
      'caf',
      'na',
      've',
    ]);
    expect(rougeTokenize('  ')).toEqual([]);
    expect(rougeTokenize('東京 2024')).toEqual(['2024']);
  });

  it('stems only tokens longer than 3 characters', () => {
    expect(rougeTokenize('Cats are running; dies flies', true)).toEqual(['cat', 'are', 'run', 'die', 'fli']);
    expect(rougeTokenize('was has his', true)).toEqual(['was', 'has', 'his']); // 3 letters: untouched (NLTK would give "wa", "ha", "hi")
  });
});

describe("NLTK's PorterStemmer (NLTK_EXTENSIONS)", () => {
  it("reproduces NLTK's documented examples", () => {
    // nltk/test/stem.doctest
    const words = [
      'caresses',
      'flies',
      'dies',
      'mules',
      'denied',
      'died',
      'agreed',
      'owned',
      'humbled',
      'sized',
      'meeting',
      'stating',
      'siezing',
      'itemization',
      'sensational',
      'traditional',
      'reference',
      'colonizer',
      'plotted',
    ];
    expect(words.map(porterStem).join(' ')).toBe(
      'caress fli die mule deni die agre own humbl size meet state siez item sensat tradit refer colon plot',
    );
  });

  it('keeps the NLTK departures from Porter (1980)', () => {
    expect(porterStem('enjoy')).toBe('enjoy'); // y -> i only after a consonant (Porter: enjoi)
    expect(porterStem('happy')).toBe('happi');
    expect(porterStem('skies')).toBe('sky'); // irregular forms
    expect(porterStem('dying')).toBe('die');
    expect(porterStem('proceed')).toBe('proceed');
    expect(porterStem('constructor')).toBe('constructor'); // not confused with Object.prototype
    expect(porterStem('running')).toBe('run');
    expect(porterStem('hopping')).toBe('hop');
    expect(porterStem('falling')).toBe('fall');
    expect(porterStem('filing')).toBe('file');
    expect(porterStem('relational')).toBe('relat');
    expect(porterStem('electricity')).toBe('electr');
  });
});

describe('ROUGE-L F1', () => {
  it("matches rouge_score's README example", () => {
    // RougeScorer(['rougeL']).score('The quick brown fox jumps over the lazy dog', 'The quick brown dog jumps on the log.')
    // -> precision 0.625, recall 0.5555555555555556, fmeasure 0.5882352941176471
    const s = rougeL('The quick brown fox jumps over the lazy dog', 'The quick brown dog jumps on the log.');
    expect(s.precision).toBe(0.625);
    expect(s.recall).toBeCloseTo(5 / 9, 15);
    expect(s.fmeasure).toBeCloseTo(0.5882352941176471, 15);
  });

  it('is LCS-based: order matters, gaps do not', () => {
    // the cat sat on the mat / the cat on the mat sat: LCS "the cat on the mat" = 5 of 6 each way.
    const s = rougeL('the cat sat on the mat', 'The cat, on the mat, sat!');
    expect(s).toEqual({ precision: 5 / 6, recall: 5 / 6, fmeasure: 5 / 6 });
    expect(lcsLength(['a', 'b', 'c', 'd'], ['b', 'd', 'a', 'c'])).toBe(2);
    expect(rougeL('a b c', 'c b a').fmeasure).toBeCloseTo(1 / 3, 15);
  });

  it('uses the stemmer when asked', () => {
    // target: the cats are running; prediction: a cat runs -> stems [the cat are run] / [a cat run]; LCS 2.
    expect(rougeL('The cats are running', 'A cat runs').fmeasure).toBe(0);
    const s = rougeL('The cats are running', 'A cat runs', { useStemmer: true });
    expect(s.precision).toBeCloseTo(2 / 3, 15);
    expect(s.recall).toBe(0.5);
    expect(s.fmeasure).toBeCloseTo(4 / 7, 15);
  });

  it('scores 0 when either side has no tokens', () => {
    expect(rougeL('', 'anything')).toEqual({ precision: 0, recall: 0, fmeasure: 0 });
    expect(rougeL('something', '!!!')).toEqual({ precision: 0, recall: 0, fmeasure: 0 });
    expect(rougeL('Same text.', 'same TEXT').fmeasure).toBe(1);
  });
});
