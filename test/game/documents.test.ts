import { beforeAll, describe, expect, it } from 'vitest';
import {
  DocumentParseError,
  documentForRound,
  fitToBudget,
  parseDocuments,
  splitGovReport,
} from '../../src/game/documents.ts';
import { loadGovReportNode } from '../../src/game/govreport.node.ts';
import { sentenceEnds } from '../../src/game/text.ts';
import type { Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { qwen3Tokenizer } from '../helpers/game.ts';

let tok: Qwen3Tokenizer;
beforeAll(async () => {
  tok = await qwen3Tokenizer();
});

describe('parseDocuments', () => {
  it('reads JSONL with optional summary, id and source', () => {
    const text =
      '{"report": "First report.", "summary": "S1", "id": "a", "source": "GAO"}\n\n{"report": "Second\\r\\nreport.", "id": 7}\n{"report": "Third."}\n';
    const docs = parseDocuments(text, 'dir/mine.jsonl');
    expect(docs).toEqual([
      { id: 'a', source: 'GAO', report: 'First report.', summary: 'S1' },
      { id: '7', report: 'Second\nreport.' },
      { id: 'mine:4', report: 'Third.' },
    ]);
  });

  it('reads .txt and .md as one document each, NFC and \\n line ends', () => {
    expect(parseDocuments('\uFEFFCafe\u0301 report.\r\nLine two.\r\n', 'notes/My Report.txt')).toEqual([
      { id: 'My Report', report: 'Café report.\nLine two.' },
    ]);
    expect(parseDocuments('# Title\n\nBody.', 'x.MD')[0]!.report).toBe('# Title\n\nBody.');
  });

  it('names the file and line of bad input', () => {
    expect(() => parseDocuments('{"report": "ok"}\n{bad', 'f.jsonl')).toThrow(/f\.jsonl:2: not valid JSON/);
    expect(() => parseDocuments('{"summary": "x"}', 'f.jsonl')).toThrow(/f\.jsonl:1: needs a string field "report"/);
    expect(() => parseDocuments('{"report": "  "}', 'f.jsonl')).toThrow(/"report" is empty/);
    expect(() => parseDocuments('{"report": "a", "id": "x"}\n{"report": "b", "id": "x"}', 'f.jsonl')).toThrow(
      /duplicate id "x" \(first on line 1\)/,
    );
    expect(() => parseDocuments('[1]', 'f.jsonl')).toThrow(DocumentParseError);
    expect(() => parseDocuments('   \n', 'empty.txt')).toThrow(/empty/);
    expect(() => parseDocuments('x', 'doc.pdf')).toThrow(/unsupported file type "\.pdf"/);
  });
});

describe('bundled GovReport', () => {
  it('holds out the 3 shortest GAO and 3 shortest CRS reports (never played) and trains on the other 22', async () => {
    const { train, eval: held } = await loadGovReportNode();
    expect(train).toHaveLength(22);
    expect(held.map((d) => [d.id, d.source])).toEqual([
      ['ccdv_govreport_test_5', 'GAO'],
      ['CRS_R44688', 'CRS'],
      ['CRS_R46218', 'CRS'],
      ['GAO_GAO-20-290T', 'GAO'],
      ['GAO_GAO-19-683', 'GAO'],
      ['leval_gov_report_summ_6', 'CRS'],
    ]);
    for (const d of [...train, ...held]) expect(d.summary && d.summary.length > 0).toBe(true);
    expect(new Set(train.map((d) => d.id)).size).toBe(22);
    expect(train.some((d) => held.includes(d))).toBe(false);
  });

  it('splitGovReport holds out nothing from documents without a source', () => {
    const docs = parseDocuments('{"report": "a"}\n{"report": "b"}', 'u.jsonl');
    expect(splitGovReport(docs)).toMatchObject({ train: docs, eval: [] });
  });
});

describe('fitToBudget', () => {
  it('keeps a report that fits, and cuts a long one at a sentence end under the budget', async () => {
    const { train } = await loadGovReportNode();
    const report = train[0]!.report;
    expect(fitToBudget('Short report.', tok, 100)).toEqual({
      text: 'Short report.',
      tokenIds: tok.encode('Short report.'),
      cut: null,
    });
    for (const budget of [64, 500, 2048]) {
      const { text, tokenIds, cut } = fitToBudget(report, tok, budget);
      expect(cut).not.toBeNull();
      expect(tokenIds).toEqual(tok.encode(text));
      expect(cut!.tokensKept).toBe(tokenIds.length);
      expect(cut!.tokensKept).toBeLessThanOrEqual(budget);
      if (budget >= 500) expect(cut!.tokensKept).toBeGreaterThan(budget * 0.9); // not cut needlessly early
      // Reports over budget × 8 characters are pre-cut before tokenizing; the total is then an estimate.
      const exact = tok.encode(report).length;
      expect(cut!.tokensTotalEstimated).toBe(report.length > budget * 8);
      if (cut!.tokensTotalEstimated) expect(Math.abs(cut!.tokensTotal - exact) / exact).toBeLessThan(0.1);
      else expect(cut!.tokensTotal).toBe(exact);
      expect(cut!.snappedTo).toBe('sentence');
      expect(report.startsWith(text)).toBe(true);
      expect(cut!.charOffset).toBe(text.length);
      expect(sentenceEnds(report)).toContain(cut!.charOffset);
    }
  });

  it('falls back to a word end, then a whole character, when the first sentence is over budget', () => {
    const words = fitToBudget('one two three four five six seven eight nine ten eleven twelve', tok, 5);
    expect(words.cut!.snappedTo).toBe('word');
    expect(words.text).toBe('one two three four five');
    const cjk = fitToBudget('東京は日本の首都であり大阪は西日本の中心都市であり名古屋は中部の都市である', tok, 4);
    expect(cjk.cut!.snappedTo).toBe('char');
    expect(cjk.tokenIds.length).toBeLessThanOrEqual(4);
    expect(cjk.text.length).toBeGreaterThan(0);
    expect(() => fitToBudget('x', tok, 0)).toThrow(/docTokenBudget/);
  });
});

describe('documentForRound', () => {
  it('plays every document once per epoch, in a seeded order', () => {
    const docs = ['a', 'b', 'c', 'd', 'e'];
    const epoch0 = [0, 1, 2, 3, 4].map((r) => documentForRound(docs, r, 1));
    const epoch1 = [5, 6, 7, 8, 9].map((r) => documentForRound(docs, r, 1));
    expect([...epoch0].sort()).toEqual(docs);
    expect([...epoch1].sort()).toEqual(docs);
    expect([0, 1, 2, 3, 4].map((r) => documentForRound(docs, r, 1))).toEqual(epoch0);
    const other = Array.from({ length: 20 }, (_, r) => documentForRound(docs, r, 2));
    expect(other).not.toEqual(Array.from({ length: 20 }, (_, r) => documentForRound(docs, r, 1)));
  });
});
