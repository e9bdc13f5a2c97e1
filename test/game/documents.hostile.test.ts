// Issue 9: document size cap, non-UTF-8 bytes, the pre-cut of very long reports and the
// per-document cache of the tokenized fit.
import { beforeAll, describe, expect, it } from 'vitest';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  checkDocumentSize,
  decodeDocumentBytes,
  DOCUMENT_MAX_BYTES,
  DocumentParseError,
  fitToBudget,
  parseDocuments,
  PRECUT_CHARS_PER_TOKEN,
  readDocumentFile,
  utf8Length,
} from '../../src/game/documents.ts';
import { loadGovReportNode } from '../../src/game/govreport.node.ts';
import { sentenceEnds, type GameTokenizer } from '../../src/game/text.ts';
import type { Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { qwen3Tokenizer } from '../helpers/game.ts';
import { spyrl } from '../helpers/spyrl.ts';

let tok: Qwen3Tokenizer;
beforeAll(async () => {
  tok = await qwen3Tokenizer();
});

/** The tokenizer, counting the characters it is asked to encode. */
function counting(t: Qwen3Tokenizer): GameTokenizer & { chars: number; calls: number } {
  const c = {
    chars: 0,
    calls: 0,
    encode: (s: string) => t.encode(s),
    encodeText: (s: string) => {
      c.chars += s.length;
      c.calls++;
      return t.encodeText(s);
    },
    encodeChat: t.encodeChat.bind(t),
    decode: t.decode.bind(t),
    idToToken: t.idToToken.bind(t),
    applyChatTemplate: t.applyChatTemplate.bind(t),
  };
  return c;
}

describe('document size cap (20 MB per file or paste)', () => {
  it('refuses a file over the cap with its size and the cap, before decoding', () => {
    expect(DOCUMENT_MAX_BYTES).toBe(20 * 2 ** 20);
    expect(() => checkDocumentSize(DOCUMENT_MAX_BYTES, 'ok.txt')).not.toThrow();
    expect(() => checkDocumentSize(DOCUMENT_MAX_BYTES + 1, 'big.txt')).toThrow(DocumentParseError);
    expect(() => checkDocumentSize(21 * 2 ** 20, 'big.txt')).toThrow(
      'big.txt: is 21.0 MB; the cap is 20.0 MB per file',
    );
    const bytes = new Uint8Array(DOCUMENT_MAX_BYTES + 10).fill(0x61);
    expect(() => readDocumentFile(bytes, 'huge.md')).toThrow(/huge\.md: is 20\.0 MB; the cap is 20\.0 MB/);
  });

  it('refuses a paste over the cap counted in UTF-8 bytes, not characters', () => {
    const threeByteChars = '東'.repeat(Math.ceil(DOCUMENT_MAX_BYTES / 3) + 1); // 7 M characters, 21 MB
    expect(utf8Length(threeByteChars)).toBeGreaterThan(DOCUMENT_MAX_BYTES);
    expect(() => parseDocuments(threeByteChars, 'pasted.txt')).toThrow(/pasted\.txt: is 20\.0 MB; the cap is 20\.0 MB/);
    expect(utf8Length('a€😀')).toBe(new TextEncoder().encode('a€😀').length);
  });

  it('the CLI --docs path refuses the same file with the same message', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'spyrl-docs-'));
    const file = join(dir, 'big.txt');
    await writeFile(file, Buffer.alloc(DOCUMENT_MAX_BYTES + 1, 0x61));
    const r = await spyrl(
      'train',
      '--model',
      join(dir, 'no-model'),
      '--docs',
      file,
      '--rounds',
      '1',
      '--out',
      join(dir, 'out'),
    );
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/big\.txt: is 20\.0 MB; the cap is 20\.0 MB per file/);
  });
});

describe('non-UTF-8 bytes in a document', () => {
  it('are read as U+FFFD, counted, and named in one warning; U+FFFD already in the file is not counted', () => {
    const good = new TextEncoder().encode('Report \uFFFD text. ');
    const bytes = new Uint8Array([...good, 0xff, 0xfe, 0x41, 0xc3, 0x28, 0x2e]); // 0xff, 0xfe, and a broken 2-byte sequence
    const d = decodeDocumentBytes(bytes, 'latin.txt');
    expect(d.replaced).toBe(3);
    expect(d.warning).toBe('latin.txt: 3 byte sequences not valid UTF-8, read as \uFFFD');
    const { docs, warning } = readDocumentFile(bytes, 'latin.txt');
    expect(warning).toBe(d.warning);
    expect(docs).toHaveLength(1);
    expect(docs[0]!.report).toContain('A\uFFFD(.');
    expect(decodeDocumentBytes(good, 'clean.txt')).toEqual({
      text: 'Report \uFFFD text. ',
      replaced: 0,
      warning: null,
    });
  });
});

describe('very long reports', () => {
  it('are cut to about budget × 8 characters before tokenizing, at a sentence end', async () => {
    const { train } = await loadGovReportNode();
    const report = train
      .map((d) => d.report)
      .join('\n\n')
      .repeat(4); // ~4 MB
    expect(report.length).toBeGreaterThan(3_500_000);
    const t = counting(tok);
    const t0 = performance.now();
    const fit = fitToBudget(report, t, 2048);
    const ms = performance.now() - t0;
    expect(t.chars).toBeLessThanOrEqual(3 * 2048 * PRECUT_CHARS_PER_TOKEN); // the pre-cut once, then a few kept prefixes
    expect(fit.tokenIds.length).toBeLessThanOrEqual(2048);
    expect(fit.tokenIds.length).toBeGreaterThan(2048 * 0.9);
    expect(fit.cut).toMatchObject({ tokensTotalEstimated: true, charsTotal: report.length, snappedTo: 'sentence' });
    expect(sentenceEnds(report.slice(0, fit.text.length + 40))).toContain(fit.text.length);
    expect(ms).toBeLessThan(3000); // tokenizing all 4 MB takes several seconds
  });

  it('fits each (document, budget, tokenizer) once: later rounds reuse the cached fit', async () => {
    const { train } = await loadGovReportNode();
    const t = counting(tok);
    const a = fitToBudget(train[2]!.report, t, 300);
    const calls = t.calls;
    expect(calls).toBeGreaterThan(0);
    for (let round = 0; round < 5; round++) expect(fitToBudget(train[2]!.report, t, 300)).toBe(a);
    expect(t.calls).toBe(calls);
    expect(Object.isFrozen(a.tokenIds)).toBe(true); // shared between rounds: nobody may change it
    fitToBudget(train[2]!.report, t, 301);
    expect(t.calls).toBeGreaterThan(calls); // another budget is another fit
    const other = counting(tok);
    fitToBudget(train[2]!.report, other, 300);
    expect(other.calls).toBeGreaterThan(0); // and another tokenizer too
  });
});
