// The memory plan (src/train/memory.ts) against what the engine really builds and allocates: the
// prompt lengths prompts.ts renders with the real tokenizer, the peak GPU bytes that
// `spyrl train --rounds 1 --report-memory` measures on tiny models (the device counts every buffer
// it holds, pooled free ones included), and the plan of the default Qwen3-4B round.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QWEN3_PRESETS, type Qwen3Config } from '../../src/model/config.ts';
import { memorySource } from '../../src/model/sources.ts';
import { qwen3TokenizerFiles } from '../../src/model/tinyModel.node.ts';
import { loadTokenizer, type Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { DEFAULT_CHUNK } from '../../src/model/qwen3.ts';
import { Q4_STAGING_BYTES as LOAD_Q4_STAGING_BYTES } from '../../src/model/load.ts';
import { DEFAULT_CONFIG } from '../../src/game/config.ts';
import { fitToBudget } from '../../src/game/documents.ts';
import { loadGovReportNode } from '../../src/game/govreport.node.ts';
import { maskSpan } from '../../src/game/masking.ts';
import { DEFAULT_PROMPTS, reasonPrompts, summaryPrompts, votePrompts } from '../../src/game/prompts.ts';
import { Rng } from '../../src/game/rng.ts';
import { assignRoles } from '../../src/game/roles.ts';
import { planTableMarkdown } from '../../src/cli/memory.ts';
import {
  checkPlanFits,
  DEFAULT_MLP_CHUNK,
  FORWARD_CHUNK,
  FORWARD_CHUNKS_AUTO,
  MLP_CHUNKS_AUTO,
  Q4_STAGING_BYTES,
  planMemory,
  planRound,
  planSft,
  roundPlanOptions,
  roundSequences,
  withKeptLayers,
  KEPT_BUDGET_SHARE,
  type MemoryPlan,
  type RoundPlanOptions,
} from '../../src/train/memory.ts';
import { ROOT, spyrl } from '../helpers/spyrl.ts';

const GiB = 2 ** 30;
const QWEN3_4B: Qwen3Config = QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'];
const NO_LIMITS = { maxStorageBufferBindingSize: 2 ** 40, maxBufferSize: 2 ** 40 };

function breakdown(p: MemoryPlan): string {
  const g = (b: number) => `${(b / GiB).toFixed(3)} GiB`;
  return (
    `total ${g(p.total)} at ${p.peakPhase}: weights ${g(p.weights)}, lora ${g(p.lora)}, kv ${g(p.kv)}, activations ${g(p.activations)}, workspace ${g(p.workspace)}; ` +
    p.phases
      .map(
        (ph) =>
          `${ph.phase} ${g(ph.total)} [${ph.buffers
            .slice(0, 4)
            .map((b) => `${b.name} ${g(b.bytes)}`)
            .join(', ')}]`,
      )
      .join('; ')
  );
}

describe('round sequence lengths: the plan bounds the prompts the game renders', () => {
  let tok: Qwen3Tokenizer;
  let report: string;
  beforeAll(async () => {
    const { tokenizerJson, tokenizerConfig } = await qwen3TokenizerFiles();
    tok = await loadTokenizer(
      memorySource(
        'qwen3',
        new Map([
          ['tokenizer.json', tokenizerJson],
          ['tokenizer_config.json', tokenizerConfig],
        ]),
      ),
    );
    report = (await loadGovReportNode()).train[0]!.report;
  });

  it.each([
    { N: 3, D: 300, G: 24, reason: 0 },
    { N: 4, D: 512, G: 40, reason: 0 },
    { N: 8, D: 200, G: 16, reason: 12 },
  ])('$N players, $D-token reports, $G-token summaries, reasons $reason', ({ N, D, G, reason }) => {
    const budget = fitToBudget(report, tok, D);
    const d = budget.tokenIds.length;
    const masked = maskSpan(budget.text, tok, { maskRatio: 0.2, mode: 'remove', rng: Rng.fromSeed(5).fork('mask') });
    // Summaries of G tokens each, as a policy would return them (decoded text).
    const ids = tok.encode(report);
    const summaries = Array.from({ length: N }, (_, i) => tok.decode(ids.slice(100 + 50 * i, 100 + 50 * i + G)).trim());
    const lens = summaries.map((s) => tok.encode(s).length);
    const g = Math.max(...lens);
    const shorter = lens.reduce((n, l) => n + g - l, 0); // summaries below the longest: slack the plan must have
    const roles = assignRoles(N, Rng.fromSeed(9));
    // The plan at the report and summary lengths these prompts really hold.
    const seq = roundSequences({ players: N, docTokens: d, summaryTokens: g, reasonTokens: reason, maskRatio: 0.2 });

    const sp = summaryPrompts(tok, roles, masked.full, masked.spyText, DEFAULT_PROMPTS).prompts;
    const civilian = sp[roles.spySeat === 0 ? 1 : 0]!.tokenIds.length;
    const spy = sp[roles.spySeat]!.tokenIds.length;
    expect(civilian).toBeLessThanOrEqual(seq.summaryPrompt);
    expect(seq.summaryPrompt - civilian).toBeLessThanOrEqual(2);
    expect(spy).toBeLessThanOrEqual(seq.summaryPrompt - (d - seq.spyReport));

    const input = { roles, civilianText: masked.full, spyText: masked.spyText, summaries };
    const reasons = reason ? summaries.map(() => Array.from({ length: reason }, () => 'word').join(' ')) : null; // `reason` tokens each
    const vp = votePrompts(tok, { ...input, reasons }, DEFAULT_PROMPTS);
    const longest = Math.max(...vp.map((p) => p.tokenIds.length));
    expect(longest).toBeLessThanOrEqual(seq.votePrompt);
    // The per-summary constant allows "(no summary)" (8 tokens); listed summaries take 4.
    expect(seq.votePrompt - longest).toBeLessThanOrEqual(4 * N + 4 + shorter);
    // Every civilian shares all but at most voteTail tokens with the source (its KV pages are mapped, not held).
    for (const [seat, p] of vp.entries()) {
      if (seat !== roles.spySeat && p.kvShare)
        expect(p.tokenIds.length - p.kvShare.tokens).toBeLessThanOrEqual(seq.voteTail);
    }
    if (reason) {
      const rp = reasonPrompts(tok, input, DEFAULT_PROMPTS);
      expect(Math.max(...rp.map((p) => p.tokenIds.length))).toBeLessThanOrEqual(seq.reasonPrompt);
      expect(seq.reasonPrompt - Math.max(...rp.map((p) => p.tokenIds.length))).toBeLessThanOrEqual(4 * N + 4 + shorter);
    }
  });
});

describe('kept layers: as many as memory allows (withKeptLayers)', () => {
  const q4 = roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv: 'f16' });
  const L = QWEN3_4B.numLayers;

  it("keepPromptKv: the votes run in the summaries' cache, sized for both, where that does not raise the peak", () => {
    const kept = planRound(QWEN3_4B, { ...q4, keepPromptKv: true });
    const apart = planRound(QWEN3_4B, { ...q4, keepPromptKv: false });
    const auto = planRound(QWEN3_4B, q4);
    const phase = (p: typeof kept, name: string) => p.phases.find((ph) => ph.phase === name)!;
    // One cache for both stages, at least the votes' own; the votes' prefill starts past the report.
    expect(phase(kept, 'summaries').kv).toBe(phase(kept, 'votes').kv);
    expect(phase(kept, 'votes').kv).toBeGreaterThanOrEqual(phase(apart, 'votes').kv);
    expect(phase(kept, 'summaries').kv).toBeGreaterThan(phase(apart, 'summaries').kv);
    expect(phase(kept, 'votes').activations).toBeLessThanOrEqual(phase(apart, 'votes').activations);
    // The default 4B round: the summaries phase grows (3.38 -> 3.57 GiB at 256-token prefill
    // chunks) but stays under the update's peak, so 'auto' keeps the cache at the same total.
    expect(kept.total).toBe(apart.total);
    expect(auto.keepPromptKv).toBe(true);
    expect(auto.phases).toEqual(kept.phases);
    expect(apart.keepPromptKv).toBe(false);
    // Where it would raise the peak (no training: the play phases are the peak), 'auto' does without.
    const play = planRound(QWEN3_4B, { ...q4, training: false });
    expect(play.keepPromptKv).toBe(false);
    expect(planRound(QWEN3_4B, { ...q4, training: false, keepPromptKv: true }).total).toBeGreaterThan(play.total);
  });

  it("the default 4B round keeps none without a budget (the update is the round's peak)", () => {
    const p = planRound(QWEN3_4B, q4);
    expect(p.peakPhase).toBe('update');
    expect(withKeptLayers(p, NO_LIMITS)).toBe(p);
    expect(
      planMemory(QWEN3_4B, DEFAULT_CONFIG, NO_LIMITS, undefined, { weights: 'q4', kv: 'f16' }).plan.keepLayers,
    ).toBe(0);
  });

  it('with a budget: the most layers whose plan stays within its share, each one a whole layer of products', () => {
    const base = planRound(QWEN3_4B, q4);
    for (const gib of [8, 12, 24]) {
      const budget = gib * GiB;
      const check = planMemory(QWEN3_4B, DEFAULT_CONFIG, NO_LIMITS, budget, { weights: 'q4', kv: 'f16' });
      expect(check.problem).toBeNull();
      const k = check.plan.keepLayers;
      expect(k, `${gib} GiB`).toBeGreaterThan(0);
      // 24 GiB holds every layer's products; 8 and 12 only some.
      if (gib === 24) expect(k).toBe(L);
      else expect(k).toBeLessThan(L);
      expect(check.plan.total).toBeLessThanOrEqual(KEPT_BUDGET_SHARE * budget);
      if (k < L)
        expect(planRound(QWEN3_4B, { ...q4, keepLayers: k + 1 }).total).toBeGreaterThan(KEPT_BUDGET_SHARE * budget);
      // Only the update phase changes: k layers' (T, .) f32 products at the update's longest pass
      // (q, k, v, attention output and lse, xMid, gate, up, LoRA u) and the kept layers' workspace
      // (h1, h2, normed and rotated q and k at T rows; the MLP chunk's buffers), which replace the
      // recomputed layer's workspace where the first kept layer runs: more than k - 1 layers'
      // products, at most k layers' and the kept workspace.
      const T = check.plan.trainSeqLen;
      const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I } = QWEN3_4B;
      const perLayer = 4 * T * (C + 2 * NH * HD + 2 * NKV * HD + NH + 2 * I + 16 * 7);
      const Tc = Math.min(T, check.plan.mlpChunk);
      const work = 4 * (T * (2 * C + NH * HD + NKV * HD) + Tc * I + Tc * (2 * I + 2 * C + 16 * 3));
      const grown = check.plan.total - base.total;
      expect(grown).toBeGreaterThan((k - 1) * perLayer);
      expect(grown).toBeLessThanOrEqual(k * perLayer + work);
      // The same plan as one asked for k kept layers at the prefill chunk their peak allows (the
      // play phases may take a larger chunk under the update's higher peak) and the MLP chunk what
      // they leave of the budget allows.
      expect(check.plan.forwardChunk).toBeGreaterThanOrEqual(base.forwardChunk);
      expect(check.plan.phases).toEqual(
        planRound(QWEN3_4B, {
          ...q4,
          keepLayers: k,
          forwardChunk: check.plan.forwardChunk,
          mlpChunk: check.plan.mlpChunk,
          keepPromptKv: check.plan.keepPromptKv,
        }).phases,
      );
      expect(check.plan.keepPromptKv).toBe(true);
      // The MLP chunk comes after the layers: the next larger one would pass the budget's share
      // (24 GiB: every layer kept and 2,048 rows, 18.30 GiB; 12: 256, a kept layer's leftover
      // short of 512 rows' buffers; 8: 8 layers, whose leftover holds 1,024 rows' but not 2,048).
      expect(check.plan.mlpChunk, `${gib} GiB`).toBe(gib === 24 ? 2048 : gib === 8 ? 1024 : DEFAULT_MLP_CHUNK);
      const larger = MLP_CHUNKS_AUTO.filter((x) => x > check.plan.mlpChunk).at(-1);
      if (larger !== undefined)
        expect(planRound(QWEN3_4B, { ...q4, keepLayers: k, mlpChunk: larger }).total, `${gib} GiB`).toBeGreaterThan(
          KEPT_BUDGET_SHARE * budget,
        );
    }
    // A fixed MLP chunk stays, and the layers fill the budget around it.
    const fixed = planMemory(
      QWEN3_4B,
      DEFAULT_CONFIG,
      NO_LIMITS,
      24 * GiB,
      { weights: 'q4', kv: 'f16' },
      { mlpChunk: 512 },
    ).plan;
    expect(fixed.mlpChunk).toBe(512);
    expect(fixed.keepLayers).toBe(L);
    // An explicit choice stays.
    expect(
      planMemory(QWEN3_4B, DEFAULT_CONFIG, NO_LIMITS, 24 * GiB, { weights: 'q4', kv: 'f16' }, { keepLayers: 2 }).plan
        .keepLayers,
    ).toBe(2);
  });

  it("keeps none when a kept layer's (T, I) buffer would break the binding limit", () => {
    const long = { ...DEFAULT_CONFIG, docTokenBudget: 8192 };
    const limits = { maxStorageBufferBindingSize: 256 * 2 ** 20, maxBufferSize: 2 ** 40 };
    const plain = planMemory(QWEN3_4B, long, limits, 64 * GiB, { weights: 'q4', kv: 'f16' });
    expect(plain.problem).toBeNull();
    expect(plain.plan.keepLayers).toBe(0);
    const kept = planRound(QWEN3_4B, { ...roundPlanOptions(long, { weights: 'q4', kv: 'f16' }), keepLayers: 1 });
    expect(kept.largestBuffer.bytes).toBeGreaterThan(256 * 2 ** 20);
    expect(
      planMemory(QWEN3_4B, long, NO_LIMITS, 64 * GiB, { weights: 'q4', kv: 'f16' }).plan.keepLayers,
    ).toBeGreaterThan(0);
  });

  it('refuses a keepLayers outside 0..L', () => {
    expect(() => planRound(QWEN3_4B, { ...q4, keepLayers: L + 1 })).toThrow(`keepLayers must be an integer in 0..${L}`);
  });
});

describe('the plan', () => {
  const phase = (p: MemoryPlan, name: string) => p.phases.find((ph) => ph.phase === name)!;
  /**
   * A chunk option's 'auto' on one plan: it chose `want`, its plan is that fixed chunk's bit for bit
   * (the options keep 'auto' for replanning), at no higher peak or buffer than the base chunk's,
   * and the next larger candidate would raise one of them (where the chunk runs at all).
   */
  function expectAutoChunk(knob: 'forwardChunk' | 'mlpChunk', o: RoundPlanOptions, want: number, name: string) {
    const [baseChunk, candidates] =
      knob === 'forwardChunk' ? [FORWARD_CHUNK, FORWARD_CHUNKS_AUTO] : [DEFAULT_MLP_CHUNK, MLP_CHUNKS_AUTO];
    const at = (chunk: number | 'auto', keepPromptKv = o.keepPromptKv) =>
      planRound(QWEN3_4B, { ...o, [knob]: chunk, keepPromptKv });
    const auto = at('auto');
    const base = at(baseChunk);
    expect(auto[knob], name).toBe(want);
    expect(base[knob]).toBe(baseChunk);
    expect(auto.phases, name).toEqual(at(want, base.keepPromptKv).phases);
    expect(auto.options[knob]).toBe('auto');
    expect(auto.keepPromptKv).toBe(base.keepPromptKv);
    expect(auto.total, name).toBeLessThanOrEqual(base.total);
    expect(auto.largestBuffer.bytes).toBeLessThanOrEqual(base.largestBuffer.bytes);
    const larger = candidates.filter((x) => x > want).at(-1);
    if (larger !== undefined && !(knob === 'mlpChunk' && o.training === false)) {
      const p = at(larger, base.keepPromptKv);
      expect(p.total > base.total || p.largestBuffer.bytes > base.largestBuffer.bytes, name).toBe(true);
    }
    return { auto, base };
  }

  it('plans the forward chunk and the q4 load staging the engine uses', () => {
    expect(FORWARD_CHUNK).toBe(DEFAULT_CHUNK);
    expect(Q4_STAGING_BYTES).toBe(LOAD_Q4_STAGING_BYTES);
  });

  it("forwardChunk 'auto': the largest chunk that raises neither the peak nor the largest buffer", () => {
    const q4 = roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv: 'f16' });
    const at = (o: typeof q4, forwardChunk: number | 'auto') => planRound(QWEN3_4B, { ...o, forwardChunk });
    const cases = [
      { name: 'q4, f16 KV (the update is the peak)', o: q4, chunk: 1024 },
      { name: 'q4, f16 KV, kept layers', o: { ...q4, keepLayers: 12 }, chunk: 2048 },
      {
        name: 'bf16, f32 KV (the votes are the peak)',
        o: roundPlanOptions(DEFAULT_CONFIG, { weights: 'bf16', kv: 'f32' }),
        chunk: 256,
      },
      { name: 'q4, f16 KV, no training', o: { ...q4, training: false }, chunk: 256 },
    ];
    for (const c of cases) {
      const { auto, base } = expectAutoChunk('forwardChunk', c.o, c.chunk, c.name);
      // Where the chunk grew, only the prefill's activations did (the KV cache and the update did not).
      if (auto.forwardChunk > FORWARD_CHUNK) {
        expect(phase(auto, 'summaries').activations).toBeGreaterThan(phase(base, 'summaries').activations);
        expect(phase(auto, 'summaries').kv).toBe(phase(base, 'summaries').kv);
        expect(phase(auto, 'update')).toEqual(phase(base, 'update'));
      }
    }
    // A fixed chunk is the plan's; anything else is refused by name.
    expect(at(q4, 512).forwardChunk).toBe(512);
    expect(() => at(q4, 0)).toThrow("forwardChunk must be a positive integer of tokens or 'auto' (got 0)");
    expect(() => at(q4, 1.5)).toThrow('forwardChunk');
  });

  it("mlpChunk 'auto': the update's largest MLP chunk that raises neither the peak nor the largest buffer", () => {
    const q4 = roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv: 'f16' });
    const bf16 = roundPlanOptions(DEFAULT_CONFIG, { weights: 'bf16', kv: 'f32' });
    const at = (o: typeof q4, mlpChunk: number | 'auto') => planRound(QWEN3_4B, { ...o, mlpChunk });
    const cases = [
      // The update is the peak: its MLP chunk stays (the prefill's grows instead, above).
      { name: 'q4, f16 KV (the update is the peak)', o: q4, chunk: DEFAULT_MLP_CHUNK },
      // The votes are the peak: the update, 0.75 GiB under them, grows into their memory (2,048 rows:
      // +0.42 GiB).
      { name: 'bf16, f32 KV (the votes are the peak)', o: bf16, chunk: 2048 },
      { name: 'q4, f16 KV, no training (nothing runs the MLP in chunks)', o: { ...q4, training: false }, chunk: 256 },
    ];
    for (const c of cases) {
      const { auto, base } = expectAutoChunk('mlpChunk', c.o, c.chunk, c.name);
      // Where the chunk grew, only the update's activations did.
      if (auto.mlpChunk > DEFAULT_MLP_CHUNK) {
        expect(phase(auto, 'update').activations).toBeGreaterThan(phase(base, 'update').activations);
        for (const ph of ['summaries', 'votes']) expect(phase(auto, ph)).toEqual(phase(base, ph));
      }
    }
    // Both chunks 'auto' (the default): each grows into the other phases' peak, never past it.
    const both = planRound(QWEN3_4B, bf16);
    expect(both.total).toBe(at({ ...bf16, forwardChunk: FORWARD_CHUNK }, DEFAULT_MLP_CHUNK).total);
    // A fixed chunk is the plan's; anything else is refused by name.
    expect(at(q4, 512).mlpChunk).toBe(512);
    expect(at(q4, 512).total).toBeGreaterThan(at(q4, 256).total);
    expect(() => at(q4, 0)).toThrow("mlpChunk must be a positive integer of rows or 'auto' (got 0)");
    expect(() => at(q4, 1.5)).toThrow('mlpChunk');
    // spyrl sft's plan: the pass is its peak, so 'auto' keeps DEFAULT_MLP_CHUNK without a budget and
    // takes what a budget leaves after the kept layers.
    const sft = planSft(QWEN3_4B, { weights: 'q4', lora: q4.lora, seqLen: 2048 });
    expect(sft.mlpChunk).toBe(DEFAULT_MLP_CHUNK);
    expect(sft.options.mlpChunk).toBe('auto');
    const roomy = withKeptLayers(sft, NO_LIMITS, 64 * GiB);
    expect(roomy.keepLayers).toBe(QWEN3_4B.numLayers);
    expect(roomy.mlpChunk).toBe(2048);
    expect(planSft(QWEN3_4B, { weights: 'q4', lora: q4.lora, seqLen: 2048, mlpChunk: 2048 }).total).toBeGreaterThan(
      sft.total,
    );
    expect(
      withKeptLayers(
        planSft(QWEN3_4B, { weights: 'q4', lora: q4.lora, seqLen: 2048, mlpChunk: 512 }),
        NO_LIMITS,
        64 * GiB,
      ).mlpChunk,
    ).toBe(512);
  });

  it('total = weights + LoRA state + the largest phase', () => {
    const p = planRound(QWEN3_4B, roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv: 'f16' }));
    expect(p.phases.map((ph) => ph.phase)).toEqual(['load', 'summaries', 'votes', 'update']);
    expect(p.total).toBe(p.weights + p.lora + p.kv + p.activations + p.workspace);
    expect(p.total).toBe(Math.max(...p.phases.map((ph) => ph.total)));
    for (const ph of p.phases)
      expect(ph.total).toBe(p.weights + (ph.phase === 'load' ? 0 : p.lora) + ph.kv + ph.activations + ph.workspace);
    // The votes hold the most KV (report + 4 summaries per prompt); f16 halves it (both planned
    // with the same keepPromptKv: 'auto' may choose differently at another KV size).
    const votesKv = (kv: 'f16' | 'f32', keepPromptKv: boolean) =>
      planRound(QWEN3_4B, { ...roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv }), keepPromptKv }).phases.find(
        (ph) => ph.phase === 'votes',
      )!.kv;
    for (const keep of [false, true]) expect(votesKv('f32', keep) / votesKv('f16', keep)).toBeCloseTo(2, 2);
    expect(p.phases.find((ph) => ph.phase === 'votes')!.kv).toBe(votesKv('f16', p.keepPromptKv));
  });

  it('Qwen3-4B-Instruct-2507, default round (q4 weights, f16 KV, 4 players, 2,048/256 tokens, LoRA r=16 x 7, training): at most 6 GiB', () => {
    expect(DEFAULT_CONFIG).toMatchObject({
      groupSize: 4,
      docTokenBudget: 2048,
      summaryMaxTokens: 256,
      lora: { r: 16 },
    });
    expect(DEFAULT_CONFIG.lora.targetModules).toHaveLength(7);
    const p = planRound(QWEN3_4B, roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv: 'f16' }));
    expect(p.total, breakdown(p)).toBeLessThanOrEqual(6 * GiB);
    expect(() => checkPlanFits(p, NO_LIMITS, 6 * GiB)).not.toThrow();
    // A limit that is missing (a spread GPUSupportedLimits copies none of its getters) or not a
    // positive number fails by name instead of letting every plan through.
    const missing = { maxBufferSize: 2 ** 40 } as unknown as Parameters<typeof checkPlanFits>[1];
    expect(() => checkPlanFits(p, missing)).toThrow(/GPU limit maxStorageBufferBindingSize is undefined/);
    expect(() => checkPlanFits(p, { maxStorageBufferBindingSize: 2 ** 40, maxBufferSize: NaN })).toThrow(
      /GPU limit maxBufferSize is NaN/,
    );
  });

  it('refuses with what to change: the binding limit, then the budget', () => {
    const bf16 = planRound(QWEN3_4B, roundPlanOptions(DEFAULT_CONFIG, { weights: 'bf16', kv: 'f16' }));
    // The bf16 embedding (778 MB) is above a 512 MiB binding; its q4 copy (219 MB) is not.
    expect(() => checkPlanFits(bf16, { maxStorageBufferBindingSize: 512 * 2 ** 20, maxBufferSize: 2 ** 40 })).toThrow(
      /embed_tokens.*buffer limit: load the weights as q4/,
    );
    expect(() => checkPlanFits(bf16, { maxStorageBufferBindingSize: 128 * 2 ** 20, maxBufferSize: 2 ** 40 })).toThrow(
      /buffer limit: use a GPU\/browser that allows larger storage buffers, or a smaller model/,
    );
    expect(() => checkPlanFits(bf16, NO_LIMITS, 6 * GiB)).toThrow(
      /a round needs about 9\.\d\d GiB of GPU memory at its peak \(update: .*\), above the 6\.00 GiB available: load the weights as q4/,
    );
    const q4 = planRound(QWEN3_4B, roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv: 'f16' }));
    const msg = (() => {
      try {
        checkPlanFits(q4, NO_LIMITS, 3.5 * GiB);
        return '';
      } catch (e) {
        return (e as Error).message;
      }
    })();
    const doc = Number(/set docTokenBudget to at most (\d+) tokens/.exec(msg)?.[1]);
    expect(doc, msg).toBeGreaterThan(16);
    // The named value fits and one more token does not.
    const at = (d: number) =>
      planRound(QWEN3_4B, roundPlanOptions({ ...DEFAULT_CONFIG, docTokenBudget: d }, { weights: 'q4', kv: 'f16' }))
        .total;
    expect(at(doc)).toBeLessThanOrEqual(3.5 * GiB);
    expect(at(doc + 1)).toBeGreaterThan(3.5 * GiB);
    // SFT names the sequence length.
    const sft = planSft(QWEN3_4B, {
      weights: 'q4',
      lora: { r: 16, targets: DEFAULT_CONFIG.lora.targetModules },
      seqLen: 8192,
    });
    expect(() => checkPlanFits(sft, NO_LIMITS, 3.5 * GiB)).toThrow(
      /training needs about .* GPU memory .*reduce the sequence length to at most \d+ tokens \(--seq-len\)/,
    );
  });

  it("the app's check (planMemory): blocking above a binding limit, a warning above the budget", () => {
    const limits = { maxStorageBufferBindingSize: 2 ** 30, maxBufferSize: 2 ** 30 };
    const q4 = { weights: 'q4' as const, kv: 'f16' as const };
    expect(planMemory(QWEN3_4B, DEFAULT_CONFIG, limits, 6 * GiB, q4)).toMatchObject({ problem: null, blocking: false });
    // It fits, so the update keeps layers' activations in what the budget leaves (withKeptLayers).
    const fits = planMemory(QWEN3_4B, DEFAULT_CONFIG, limits, 6 * GiB, q4).plan;
    expect(fits.keepLayers).toBeGreaterThan(0);
    expect(fits.total).toBe(
      planRound(
        QWEN3_4B,
        roundPlanOptions(DEFAULT_CONFIG, q4, { keepLayers: fits.keepLayers, mlpChunk: fits.mlpChunk }),
      ).total,
    );
    expect(planMemory(QWEN3_4B, DEFAULT_CONFIG, limits, 3 * GiB, q4)).toMatchObject({
      problem: expect.stringMatching(/above the 3\.00 GiB available/),
      blocking: false,
    });
    const small = { maxStorageBufferBindingSize: 128 * 2 ** 20, maxBufferSize: 2 ** 30 };
    expect(planMemory(QWEN3_4B, DEFAULT_CONFIG, small, undefined, q4)).toMatchObject({
      problem: expect.stringMatching(/buffer limit/),
      blocking: true,
    });
  });

  it('the README table is the plan (spyrl memory --table)', async () => {
    const readme = await readFile(join(ROOT, 'README.md'), 'utf8');
    expect(readme).toContain(await planTableMarkdown());
  });
});

describe('spyrl memory', () => {
  it('prints one JSON line of byte counts, the same plan as planRound', async () => {
    const memory = (...args: string[]) => spyrl('memory', '--preset', 'Qwen/Qwen3-4B-Instruct-2507', ...args);
    const q4 = ['--weights', 'q4', '--kv', 'f16'];
    const r = await memory(
      ...q4,
      '--players',
      '4',
      '--doc-tokens',
      '2048',
      '--summary-tokens',
      '256',
      '--lora-r',
      '16',
    );
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines).toHaveLength(1);
    const got = JSON.parse(lines[0]!);
    const p = planRound(QWEN3_4B, roundPlanOptions(DEFAULT_CONFIG, { weights: 'q4', kv: 'f16' }));
    expect(got).toMatchObject({
      weights: p.weights,
      kv: p.kv,
      lora: p.lora,
      activations: p.activations,
      workspace: p.workspace,
      total: p.total,
      peakPhase: p.peakPhase,
    });
    // The default 4B round keeps the summaries' cache for the votes (it does not raise the peak).
    expect(got.format.keepPromptKv).toBe(true);
    expect(p.keepPromptKv).toBe(true);
    // ...and prefills 1,024 tokens a chunk ('auto'); --prefill-chunk fixes it.
    expect(got.format.prefillChunk).toBe(1024);
    expect(p.forwardChunk).toBe(1024);
    const fixed = await memory('--prefill-chunk', '512');
    expect(fixed.code, fixed.stderr).toBe(0);
    expect(JSON.parse(fixed.stdout).format.prefillChunk).toBe(512);
    // The update's MLP chunk: 'auto' keeps 256 rows (the update is the peak), grows to 2,048 with
    // the memory of a 24 GiB GPU once every layer is kept; --mlp-chunk fixes it.
    expect(got.format.mlpChunk).toBe(256);
    const roomy = await memory(...q4, '--gpu-memory', '24');
    expect(roomy.code, roomy.stderr).toBe(0);
    expect(JSON.parse(roomy.stdout).format).toMatchObject({ keepLayers: 36, mlpChunk: 2048 });
    const rows = await memory('--mlp-chunk', '1024');
    expect(rows.code, rows.stderr).toBe(0);
    expect(JSON.parse(rows.stdout).format.mlpChunk).toBe(1024);
  });

  it.each([
    [['--preset', 'Qwen/Qwen3-9B'], '--preset: unknown "Qwen/Qwen3-9B"'],
    [['--preset', 'Qwen/Qwen3-0.6B', '--weights', 'q3'], '--weights must be bf16 or q4'],
    [['--preset', 'Qwen/Qwen3-0.6B', '--players', '2'], '--players must be an integer >= 3'],
    [['--preset', 'Qwen/Qwen3-0.6B', '--lora-targets', 'q_proj,x_proj'], '--lora-targets: unknown "x_proj"'],
    [['--weights', 'q4'], 'give exactly one of --model DIR, --config config.json or --preset NAME'],
    [['--config', '/nonexistent/config.json'], 'config.json not found'],
    [
      ['--preset', 'Qwen/Qwen3-0.6B', '--prefill-chunk', '0'],
      '--prefill-chunk must be auto or a positive integer of tokens (got "0")',
    ],
    [
      ['--preset', 'Qwen/Qwen3-0.6B', '--mlp-chunk', 'x'],
      '--mlp-chunk must be auto or a positive integer of rows (got "x")',
    ],
  ])('bad input %j: one error line', async (args, message) => {
    const r = await spyrl('memory', ...args);
    expect(r.code).not.toBe(0);
    expect(r.stderr.split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^spyrl: error: /);
    expect(r.stderr).toContain(message);
  });
});

// Each case: one round (summaries, votes, an update) on a tiny model, on SwiftShader. The tiny
// models keep the real 151,936-token vocabulary, so the weights (19.6 MB) and the (rows, V) logits
// dominate; each phase's bytes above the weights (LoRA state, KV pages, activations, the 64 KiB
// uniform arena, staging) are checked on their own too.
const CASES = [
  {
    name: 'bf16 weights, f32 KV, 3 players, 48-token reports',
    model: [] as string[],
    config: { groupSize: 3, docTokenBudget: 48, summaryMaxTokens: 8, lora: { r: 4, alpha: 8 }, seed: 7 },
    engine: [] as string[],
  },
  {
    name: 'q4 weights, f16 KV, 4 players, 3 layers, LoRA on q/v/down',
    model: ['--layers', '3', '--head-dim', '32'],
    config: {
      groupSize: 4,
      docTokenBudget: 64,
      summaryMaxTokens: 8,
      lora: { r: 8, alpha: 16, targetModules: ['q_proj', 'v_proj', 'down_proj'] },
      seed: 3,
    },
    engine: ['--weights', 'q4', '--kv', 'f16'],
  },
  {
    name: 'bf16 weights, f16 KV, 3 players, 200-token reports in two 128-token prefill chunks, 16-row MLP chunks, reasons before votes',
    model: [],
    config: {
      groupSize: 3,
      docTokenBudget: 200,
      summaryMaxTokens: 8,
      voteReason: true,
      voteReasonMaxTokens: 8,
      lora: { r: 4, alpha: 8, targetModules: ['q_proj', 'o_proj'] },
      seed: 11,
    },
    engine: ['--kv', 'f16', '--prefill-chunk', '128', '--mlp-chunk', '16'],
    forwardChunk: 128,
    mlpChunk: 16,
  },
  {
    // 1 GiB of GPU memory: the plan keeps both layers' activations in the update (withKeptLayers).
    name: 'bf16 weights, f32 KV, 3 players, 48-token reports, --gpu-memory 1: every layer kept',
    model: [] as string[],
    config: { groupSize: 3, docTokenBudget: 48, summaryMaxTokens: 8, lora: { r: 4, alpha: 8 }, seed: 5 },
    engine: ['--gpu-memory', '1'],
    keepLayers: 2,
  },
];

describe('planned vs measured peak GPU memory of a round (spyrl train --report-memory)', () => {
  let tmp: string;
  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'spyrl-memory-'));
  });
  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  it.each(CASES.map((c, i) => ({ ...c, i })))(
    '$name: within 15%',
    async ({ model, config, engine, i, ...c }) => {
      const dir = join(tmp, `tiny${i}`);
      expect((await spyrl('tiny-model', '--out', dir, ...model)).code).toBe(0);
      const cfgFile = join(tmp, `config${i}.json`);
      await writeFile(cfgFile, JSON.stringify({ ...config, roundsPerUpdate: 1, evalEvery: 0, checkpointEvery: 0 }));
      const r = await spyrl(
        'train',
        '--model',
        dir,
        '--docs',
        'bundled',
        '--rounds',
        '1',
        '--out',
        join(tmp, `out${i}`),
        '--config',
        cfgFile,
        '--report-memory',
        ...engine,
      );
      expect(r.code, r.stderr).toBe(0);
      const last = r.stdout.trim().split('\n').at(-1)!;
      const m = JSON.parse(last) as {
        peakBytes: number;
        plannedBytes: number;
        loadedBytes: number;
        plannedWeightsBytes: number;
        keepLayers: number;
        forwardChunk: number;
        mlpChunk: number;
        phases: Record<'play' | 'update', { peakBytes: number; plannedBytes: number }>;
      };
      // The weights are exact: the same tensors, the same packing.
      expect(m.loadedBytes).toBe(m.plannedWeightsBytes);
      expect(m.keepLayers).toBe('keepLayers' in c ? c.keepLayers : 0);
      // The prefill chunk asked for, else 'auto''s: the tiny models' reports fit one 2,048-token chunk.
      expect(m.forwardChunk).toBe('forwardChunk' in c ? c.forwardChunk : 2048);
      // The MLP chunk asked for, else 'auto''s: the tiny models' MLPs are small beside the LM head's
      // rows in a pass, so the largest adds nothing at the peak.
      expect(m.mlpChunk).toBe('mlpChunk' in c ? c.mlpChunk : 2048);
      expect(m.peakBytes / m.plannedBytes, last).toBeGreaterThan(0.85);
      expect(m.peakBytes / m.plannedBytes, last).toBeLessThan(1.15);
      for (const phase of ['play', 'update'] as const) {
        // Above the weights: the plan is a bound at the budgets (a report that fills docTokenBudget),
        // and real reports stop at a sentence end a little short of it.
        const ratio =
          (m.phases[phase].peakBytes - m.loadedBytes) / (m.phases[phase].plannedBytes - m.plannedWeightsBytes);
        expect(ratio, `${phase}: ${last}`).toBeGreaterThan(0.85);
        expect(ratio, `${phase}: ${last}`).toBeLessThan(1.02);
      }
    },
    300_000,
  );
});
