// The held-out evaluation: what each report feeds the model (whole, cut and marked, or skipped),
// ROUGE-1/2/L with stemming and length per summary, no fallback when nothing is held out; then
// SpyRLTrainer.evaluate on the tiny model: base (adapter off), adapter and a compare checkpoint.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { validateConfig } from '../../src/game/config.ts';
import { splitGovReport, type SpyDocument } from '../../src/game/documents.ts';
import { loadGovReportNode } from '../../src/game/govreport.node.ts';
import type { ChatPrompt } from '../../src/game/prompts.ts';
import type { GenerateOptions, Generation } from '../../src/game/round.ts';
import { rougeScores } from '../../src/game/rouge.ts';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { loadQwen3WithTokenizer } from '../../src/model/load.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';
import type { Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import {
  coverageNote,
  evalReportJsonl,
  evaluateHeldOut,
  NoHeldOutError,
  planEvaluation,
  type EvalSystem,
} from '../../src/train/evaluate.ts';
import { planRound, roundPlanOptions } from '../../src/train/memory.ts';
import { QWEN3_PRESETS } from '../../src/model/config.ts';
import { GpuPolicy } from '../../src/train/policy.ts';
import { SpyRLTrainer } from '../../src/train/spyrl.ts';
import { qwen3Tokenizer } from '../helpers/game.ts';

let tok: Qwen3Tokenizer;
beforeAll(async () => {
  tok = await qwen3Tokenizer();
});

const SHORT: SpyDocument = {
  id: 'short',
  source: 'GAO',
  report: 'The agency spent two billion dollars. Audits found gaps.',
  summary: 'The agencies spent billions; audits found gaps in records.',
};
const LONG: SpyDocument = {
  id: 'long',
  source: 'CRS',
  report: 'Congress passed the act. '.repeat(40).trim(),
  summary: 'Congress passed acts.',
};
const NO_REF: SpyDocument = { id: 'noref', source: 'CRS', report: 'No reference here.' };

/** A system that "summarises" by echoing a fixed text per prompt and records what it read. */
function echoSystem(
  key: string,
  text: (p: ChatPrompt) => string,
  seen: { key: string; opts: GenerateOptions; prompt: ChatPrompt }[],
): EvalSystem {
  return {
    key,
    label: key,
    async generate(prompts, opts): Promise<Generation[]> {
      return prompts.map((p) => {
        seen.push({ key, opts, prompt: p });
        const t = text(p);
        const ids = tok.encode(t);
        return { text: t, tokenIds: [...ids, tok.stopIds[0]!], logprobs: ids.map(() => 0).concat(0), truncated: false };
      });
    },
  };
}

describe('evaluateHeldOut (scripted systems)', () => {
  const cfg = validateConfig({ evalDocTokenBudget: 40, evalSummaryMaxTokens: 512 });

  it('reads a report whole when it fits, cuts and marks it when it does not, and skips it when asked', () => {
    const plan = planEvaluation([SHORT, LONG, NO_REF], tok, cfg);
    expect(plan.map((p) => [p.doc.id, p.coverage])).toEqual([
      ['short', 'whole'],
      ['long', 'cut'],
    ]); // no reference: not scored
    expect(plan[0]!.inputTokens).toBe(plan[0]!.reportTokens);
    expect(plan[1]!.inputTokens).toBeLessThanOrEqual(40);
    expect(plan[1]!.reportTokens).toBeGreaterThan(40);
    expect(plan[0]!.prompt!.text).toContain(SHORT.report);
    expect(coverageNote({ coverage: 'cut', inputTokens: 37, reportTokens: 201 })).toBe(
      'first 37 of 201 tokens: the reference covers more than the input',
    );
    const skip = planEvaluation([SHORT, LONG], tok, { ...cfg, evalOverflow: 'skip' });
    expect(skip.map((p) => [p.doc.id, p.coverage, p.prompt === null])).toEqual([
      ['short', 'whole', false],
      ['long', 'skipped', true],
    ]);
  });

  it('scores every system on every report: ROUGE-1/2/L with stemming, length, greedy at evalSummaryMaxTokens', async () => {
    const seen: { key: string; opts: GenerateOptions; prompt: ChatPrompt }[] = [];
    let inside = false;
    const base = {
      ...echoSystem('base', () => 'Agency spending was two billion dollars.', seen),
      around: async <T>(job: () => Promise<T>) => {
        inside = true;
        try {
          return await job();
        } finally {
          inside = false;
        }
      },
    };
    const spy = echoSystem(
      'adapter',
      (p) =>
        p.text.includes('Audits')
          ? 'The agency spent billions and audits found gaps in the records.'
          : 'Congress passed the act.',
      seen,
    );
    const progress: number[] = [];
    const baseGen = base.generate.bind(base);
    base.generate = async (prompts, opts) => {
      expect(inside).toBe(true);
      return baseGen(prompts, opts);
    };
    const report = await evaluateHeldOut({
      docs: [SHORT, LONG, NO_REF],
      tokenizer: tok,
      config: cfg,
      systems: [base, spy],
      onProgress: (p) => progress.push(p.done),
    });
    expect(progress).toEqual([1, 2, 3, 4]);
    expect(seen.every((s) => s.opts.temperature === 0 && s.opts.maxTokens === 512)).toBe(true);
    expect(seen.map((s) => s.key)).toEqual(['base', 'base', 'adapter', 'adapter']); // one report per call
    expect(report.documents.map((d) => d.id)).toEqual(['short', 'long']);
    const short = report.documents[0]!.results['adapter']!;
    const want = rougeScores(SHORT.summary!, short.summary, { useStemmer: true });
    expect(short.scores).toMatchObject({
      rouge1: want.rouge1.fmeasure,
      rouge2: want.rouge2.fmeasure,
      rougeL: want.rougeL.fmeasure,
      words: 11,
      truncated: false,
    });
    expect(short.scores.tokens).toBe(tok.encode(short.summary).length); // the stop token is not counted
    // Stemming is on by default and changes the score ("agencies"/"agency", "spent"/"spending" ...).
    expect(rougeScores(SHORT.summary!, short.summary, { useStemmer: false }).rouge1.fmeasure).toBeLessThan(
      short.scores.rouge1,
    );
    expect(report.settings).toEqual({ docTokenBudget: 40, summaryMaxTokens: 512, overflow: 'mark', stemmer: true });
    expect(report.means['adapter']!.rougeL).toBeCloseTo(
      (short.scores.rougeL + report.documents[1]!.results['adapter']!.scores.rougeL) / 2,
      12,
    );
    expect(report.means['adapter']!.rougeL).toBeGreaterThan(report.means['base']!.rougeL);
    const lines = evalReportJsonl(report)
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatchObject({
      id: 'long',
      coverage: 'cut',
      reference: LONG.summary,
      results: { base: { summary: expect.any(String) }, adapter: { scores: { rougeL: expect.any(Number) } } },
    });
  });

  it('refuses to run without held-out reports instead of falling back', async () => {
    const sys = echoSystem('base', () => 'x', []);
    await expect(evaluateHeldOut({ docs: [], tokenizer: tok, config: cfg, systems: [sys] })).rejects.toThrow(
      NoHeldOutError,
    );
    await expect(evaluateHeldOut({ docs: [], tokenizer: tok, config: cfg, systems: [sys] })).rejects.toThrow(
      /held-out split/,
    );
    await expect(evaluateHeldOut({ docs: [NO_REF], tokenizer: tok, config: cfg, systems: [sys] })).rejects.toThrow(
      /reference summary/,
    );
    await expect(
      evaluateHeldOut({ docs: [LONG], tokenizer: tok, config: { ...cfg, evalOverflow: 'skip' }, systems: [sys] }),
    ).rejects.toThrow(/evalDocTokenBudget/);
  });

  it('holds out a configurable, stratified set that is never played', async () => {
    const { train, eval: held, all } = await loadGovReportNode();
    expect(held.filter((d) => d.source === 'GAO')).toHaveLength(3);
    expect(held.filter((d) => d.source === 'CRS')).toHaveLength(3);
    const four = splitGovReport(all!, 4);
    expect(four.eval.map((d) => d.source).sort()).toEqual(['CRS', 'CRS', 'GAO', 'GAO']);
    expect(four.train).toHaveLength(all!.length - 4);
    expect(splitGovReport(all!, 0).eval).toEqual([]);
    for (const d of held) expect(train).not.toContain(d);
    // With the default budget every default held-out report is read whole.
    const plan = planEvaluation(held, tok, validateConfig({}));
    expect(plan.map((p) => p.coverage)).toEqual(held.map(() => 'whole'));
  });
});

describe('the memory plan of an evaluation', () => {
  it('holds one report of evalDocTokenBudget at a time, not all held-out reports together', () => {
    const cfg = QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'];
    const evalKv = (run: Parameters<typeof roundPlanOptions>[0], docs: number) =>
      planRound(cfg, roundPlanOptions(run, { weights: 'q4', kv: 'f16' }, { evalDocs: docs })).phases.find(
        (p) => p.phase === 'eval',
      )!.kv;
    const c = validateConfig({});
    // One report at a time: the KV cache does not grow with the number of held-out reports.
    expect(evalKv(c, 6)).toBe(evalKv(c, 1));
    // It grows with the evaluation's own budgets (a 16k-token report holds about twice the KV of an 8k one).
    const longer = evalKv({ ...c, evalDocTokenBudget: 16384 }, 6);
    expect(longer / evalKv(c, 6)).toBeGreaterThan(1.8);
    expect(evalKv({ ...c, evalSummaryMaxTokens: 2048 }, 6)).toBeGreaterThan(evalKv(c, 6));
  });
});

describe('SpyRLTrainer.evaluate on the tiny model', () => {
  let gpu: Gpu, tmp: string;
  beforeAll(async () => {
    gpu = await createGpu();
    tmp = await mkdtemp(join(tmpdir(), 'spyrl-eval-'));
  });
  afterAll(async () => {
    gpu?.destroy();
    await rm(tmp, { recursive: true, force: true });
  });

  it('scores base, adapter and a compare checkpoint; the base column is the adapter switched off', async () => {
    await writeTinyCheckpoint(join(tmp, 'a'), {
      layers: 1,
      hidden: 32,
      heads: 2,
      kvHeads: 1,
      headDim: 16,
      intermediate: 64,
      seed: 1,
    });
    await writeTinyCheckpoint(join(tmp, 'b'), {
      layers: 1,
      hidden: 32,
      heads: 2,
      kvHeads: 1,
      headDim: 16,
      intermediate: 64,
      seed: 2,
    });
    const a = await loadQwen3WithTokenizer(gpu, nodeFolderSource(join(tmp, 'a')));
    const b = await loadQwen3WithTokenizer(gpu, nodeFolderSource(join(tmp, 'b')));
    const { eval: held } = await loadGovReportNode();
    const config = validateConfig({
      groupSize: 3,
      docTokenBudget: 32,
      summaryMaxTokens: 8,
      evalDocTokenBudget: 48,
      evalSummaryMaxTokens: 8,
      evalEvery: 0,
      lora: { r: 2, alpha: 4 },
    });
    const trainer = await SpyRLTrainer.create({
      model: a.model,
      tokenizer: a.tokenizer!,
      config,
      train: held.slice(1),
      evalDocs: held.slice(0, 1),
    });
    try {
      // Give the adapter a non-zero B so adapter and base differ.
      const w = await trainer.adapter.getTensors('weights');
      for (const [k, v] of w) if (k.includes('lora_B')) v.forEach((_, i) => (v[i] = Math.sin(i + 1) * 0.5));
      trainer.adapter.setWeights(w);
      const comparePolicy = new GpuPolicy(b.model, b.tokenizer!);
      const compare: EvalSystem = { key: 'compare', label: 'tiny b', generate: (p, o) => comparePolicy.generate(p, o) };
      const ev = await trainer.evaluate({ compare });
      expect(ev.report.systems.map((s) => s.key)).toEqual(['base', 'adapter', 'compare']);
      expect(ev.report.documents.map((d) => d.coverage)).toEqual(['cut']); // 48 tokens of a few thousand: marked
      for (const d of ev.report.documents) {
        for (const k of ['base', 'adapter', 'compare']) {
          const r = d.results[k]!;
          expect(r.scores.tokens).toBeGreaterThan(0);
          expect(r.scores.tokens).toBeLessThanOrEqual(8);
          expect(r.scores.rougeL).toBe(rougeScores(d.reference, r.summary, { useStemmer: true }).rougeL.fmeasure);
        }
      }
      expect(ev.base).toBe(ev.report.means['base']!.rougeL);
      expect(trainer.adapter.enabled).toBe(true); // switched back on after the base column

      // The base column equals a plain greedy generation with no adapter at all.
      const plain = new GpuPolicy(a.model, a.tokenizer!);
      const prompt = planEvaluation(held.slice(0, 1), a.tokenizer!, config)[0]!.prompt!;
      const savedLora = a.model.lora;
      a.model.lora = null;
      const [g] = await plain.generate([prompt], { maxTokens: 8, temperature: 0, topP: 1, topK: 0, seeds: [0] });
      a.model.lora = savedLora;
      expect(ev.report.documents[0]!.results['base']!.summary).toBe(g!.text);
      const [g2] = await plain.generate([prompt], { maxTokens: 8, temperature: 0, topP: 1, topK: 0, seeds: [0] });
      expect(ev.report.documents[0]!.results['adapter']!.summary).toBe(g2!.text);
      expect(g2!.tokenIds).not.toEqual(g!.tokenIds);
    } finally {
      trainer.destroy();
    }
  }, 300_000);
});
