// Porter stemmer as NLTK's PorterStemmer() runs it by default (mode NLTK_EXTENSIONS), which is
// what rouge_score's use_stemmer=True calls. Differs from Porter (1980) where NLTK does:
// irregular forms, "ies"/"ied" on 4-letter words, y->i only after a consonant, "alli", "fulli",
// "logi", "bli", and no stemming of words of 1-2 letters. Input: a lowercase word.

const IRREGULAR: Record<string, string> = {
  skies: 'sky',
  sky: 'sky',
  dying: 'die',
  lying: 'lie',
  tying: 'tie',
  news: 'news',
  innings: 'inning',
  inning: 'inning',
  outings: 'outing',
  outing: 'outing',
  cannings: 'canning',
  canning: 'canning',
  howe: 'howe',
  proceed: 'proceed',
  exceed: 'exceed',
  succeed: 'succeed',
};

function isConsonant(w: string, i: number): boolean {
  const c = w[i];
  if (c === 'a' || c === 'e' || c === 'i' || c === 'o' || c === 'u') return false;
  if (c === 'y') return i === 0 ? true : !isConsonant(w, i - 1);
  return true;
}

/** m: the number of vowel-consonant sequences. */
function measure(stem: string): number {
  let m = 0;
  for (let i = 1; i < stem.length; i++) if (!isConsonant(stem, i - 1) && isConsonant(stem, i)) m++;
  return m;
}

const positive = (stem: string) => measure(stem) > 0;
const gt1 = (stem: string) => measure(stem) > 1;

function containsVowel(stem: string): boolean {
  for (let i = 0; i < stem.length; i++) if (!isConsonant(stem, i)) return true;
  return false;
}

function endsDoubleConsonant(w: string): boolean {
  return w.length >= 2 && w[w.length - 1] === w[w.length - 2] && isConsonant(w, w.length - 1);
}

function endsCvc(w: string): boolean {
  const n = w.length;
  return (
    (n >= 3 &&
      isConsonant(w, n - 3) &&
      !isConsonant(w, n - 2) &&
      isConsonant(w, n - 1) &&
      !'wxy'.includes(w[n - 1]!)) ||
    (n === 2 && !isConsonant(w, 0) && isConsonant(w, 1))
  );
}

type Rule = [suffix: string, replacement: string, condition: ((stem: string) => boolean) | null];

/** The first rule whose suffix matches decides: applied if its condition holds, else the word is kept. */
function applyRules(word: string, rules: readonly Rule[]): string {
  for (const [suffix, replacement, cond] of rules) {
    if (suffix === '*d') {
      if (endsDoubleConsonant(word)) {
        const stem = word.slice(0, -2);
        return !cond || cond(stem) ? stem + replacement : word;
      }
      continue;
    }
    if (word.endsWith(suffix)) {
      const stem = word.slice(0, word.length - suffix.length);
      return !cond || cond(stem) ? stem + replacement : word;
    }
  }
  return word;
}

function step1a(w: string): string {
  if (w.endsWith('ies') && w.length === 4) return w.slice(0, -3) + 'ie';
  return applyRules(w, [
    ['sses', 'ss', null],
    ['ies', 'i', null],
    ['ss', 'ss', null],
    ['s', '', null],
  ]);
}

function step1b(w: string): string {
  if (w.endsWith('ied')) return w.slice(0, -3) + (w.length === 4 ? 'ie' : 'i');
  if (w.endsWith('eed')) {
    const stem = w.slice(0, -3);
    return measure(stem) > 0 ? stem + 'ee' : w;
  }
  let stem: string | null = null;
  for (const suffix of ['ed', 'ing']) {
    if (w.endsWith(suffix)) {
      const s = w.slice(0, w.length - suffix.length);
      if (containsVowel(s)) {
        stem = s;
        break;
      }
    }
  }
  if (stem === null) return w;
  const last = stem[stem.length - 1]!;
  return applyRules(stem, [
    ['at', 'ate', null],
    ['bl', 'ble', null],
    ['iz', 'ize', null],
    ['*d', last, () => !'lsz'.includes(last)],
    ['', 'e', (s) => measure(s) === 1 && endsCvc(s)],
  ]);
}

function step1c(w: string): string {
  return applyRules(w, [['y', 'i', (s) => s.length > 1 && isConsonant(s, s.length - 1)]]);
}

function step2(w: string): string {
  if (w.endsWith('alli') && positive(w.slice(0, -4))) return step2(w.slice(0, -4) + 'al');
  return applyRules(w, [
    ['ational', 'ate', positive],
    ['tional', 'tion', positive],
    ['enci', 'ence', positive],
    ['anci', 'ance', positive],
    ['izer', 'ize', positive],
    ['bli', 'ble', positive],
    ['alli', 'al', positive],
    ['entli', 'ent', positive],
    ['eli', 'e', positive],
    ['ousli', 'ous', positive],
    ['ization', 'ize', positive],
    ['ation', 'ate', positive],
    ['ator', 'ate', positive],
    ['alism', 'al', positive],
    ['iveness', 'ive', positive],
    ['fulness', 'ful', positive],
    ['ousness', 'ous', positive],
    ['aliti', 'al', positive],
    ['iviti', 'ive', positive],
    ['biliti', 'ble', positive],
    ['fulli', 'ful', positive],
    ['logi', 'log', () => positive(w.slice(0, -3))], // the 'l' stays with the stem ("geo-logi")
  ]);
}

function step3(w: string): string {
  return applyRules(w, [
    ['icate', 'ic', positive],
    ['ative', '', positive],
    ['alize', 'al', positive],
    ['iciti', 'ic', positive],
    ['ical', 'ic', positive],
    ['ful', '', positive],
    ['ness', '', positive],
  ]);
}

function step4(w: string): string {
  return applyRules(w, [
    ['al', '', gt1],
    ['ance', '', gt1],
    ['ence', '', gt1],
    ['er', '', gt1],
    ['ic', '', gt1],
    ['able', '', gt1],
    ['ible', '', gt1],
    ['ant', '', gt1],
    ['ement', '', gt1],
    ['ment', '', gt1],
    ['ent', '', gt1],
    ['ion', '', (s) => measure(s) > 1 && (s.endsWith('s') || s.endsWith('t'))],
    ['ou', '', gt1],
    ['ism', '', gt1],
    ['ate', '', gt1],
    ['iti', '', gt1],
    ['ous', '', gt1],
    ['ive', '', gt1],
    ['ize', '', gt1],
  ]);
}

function step5a(w: string): string {
  if (w.endsWith('e')) {
    const stem = w.slice(0, -1);
    const m = measure(stem);
    if (m > 1 || (m === 1 && !endsCvc(stem))) return stem;
  }
  return w;
}

function step5b(w: string): string {
  return applyRules(w, [['ll', 'l', () => measure(w.slice(0, -1)) > 1]]);
}

export function porterStem(word: string): string {
  const w = word.toLowerCase();
  if (Object.hasOwn(IRREGULAR, w)) return IRREGULAR[w]!;
  if (w.length <= 2) return w;
  return step5b(step5a(step4(step3(step2(step1c(step1b(step1a(w))))))));
}
