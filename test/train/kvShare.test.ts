// Shared KV prefixes without copies (GpuPolicy on the paged cache): the game's real prompts
// (summary prompts: civilians identical, the spy sharing up to the removed span; vote prompts:
// voters sharing everything before their own question) on a tiny random Qwen3 with the real
// tokenizer. With sharing, completions, behaviour log-probs and vote log-probs must be
// bit-identical to prefilling every prompt in full (kvShare removed), and the cache must hold
// one prefix plus per-prompt tails, not one prefix per prompt.
//
// Bit-identity holds because every kernel computes a token's row independently of the other
// rows in its batch (matmul 'rows', row-wise norms, one attention workgroup per (token, head)):
// the borrowed pages hold exactly the K/V the borrower would have computed. The tiled GEMM a GPU
// picks for large batches sums in another order than the GEMV it picks for small ones, so the
// test forces 'rows' (what SwiftShader picks anyway).
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { loadQwen3WithTokenizer } from '../../src/model/load.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';
import { KV_PAGE_SIZE, kvPages } from '../../src/model/kvCache.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import type { Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import {
  DEFAULT_PROMPTS,
  labelTokenIds,
  reasonPrompts,
  summaryPrompts,
  votePrompts,
  type ChatPrompt,
} from '../../src/game/prompts.ts';
import { commonPrefixLength } from '../../src/game/text.ts';
import { assignRoles, type Roles } from '../../src/game/roles.ts';
import { Rng } from '../../src/game/rng.ts';
import { GpuPolicy, planPages, prefillSources } from '../../src/train/policy.ts';

// The first sentence, which the spy's copy shares, spans more than a page (the prompts open with it).
const FIRST = 'The agency spent $2 billion on the new records system that serves veterans in every state.';
const FULL = `${FIRST} It hired 300 staff in three regions. Audits found gaps in the records. The plan ends in 2030.`;
const SPY = `${FIRST} Audits found gaps in the records. The plan ends in 2030.`;
const P = KV_PAGE_SIZE;
// Short instructions keep the prompts (and SwiftShader's time) small; the structure is the game's.
const PROMPTS = {
  ...DEFAULT_PROMPTS,
  summaryInstruction: 'Summarize the report.',
  voteInstruction: 'Find the spy: the player whose summary misses part of the report.',
};

let gpu: Gpu, tmp: string, model: Qwen3Model, tokenizer: Qwen3Tokenizer, roles: Roles;
const matmulBefore = K.tuning.matmul;
const attentionBefore = K.tuning.attention;
beforeAll(async () => {
  gpu = await createGpu();
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-kvshare-'));
  await writeTinyCheckpoint(tmp, {
    layers: 2,
    hidden: 32,
    heads: 4,
    kvHeads: 2,
    headDim: 16,
    intermediate: 64,
    seed: 3,
  });
  const loaded = await loadQwen3WithTokenizer(gpu, nodeFolderSource(tmp));
  model = loaded.model;
  tokenizer = loaded.tokenizer!;
  roles = assignRoles(5, Rng.fromSeed(3));
  K.tuning.matmul = 'rows';
  // Bit-identity needs a borrower's tail chunk and a full prefill to run the same attention
  // arithmetic per row; 'auto' picks by chunk length (tiled from 9 tokens on CPU adapters, 128 on
  // GPUs), so pin the per-(token, head) kernels, whose rows do not depend on the chunk.
  K.tuning.attention = 'single';
});
afterAll(async () => {
  K.tuning.matmul = matmulBefore;
  K.tuning.attention = attentionBefore;
  gpu?.destroy();
  await rm(tmp, { recursive: true, force: true });
});

const unshared = (prompts: ChatPrompt[]) => prompts.map((p) => ({ ...p, kvShare: null }));

/** Pages held by prompts written `extra` positions past their ends, each borrower's whole shared pages counted once. */
function expectedPages(prompts: ChatPrompt[], extra: number, share: boolean): number {
  return prompts.reduce((n, p) => {
    const borrowed = share && p.kvShare ? Math.floor(Math.min(p.kvShare.tokens, p.tokenIds.length - 1) / P) : 0;
    return n + kvPages(p.tokenIds.length + extra) - borrowed;
  }, 0);
}

describe('GpuPolicy with shared KV prefixes', () => {
  it('summaries: identical tokens and log-probs, one prefix plus tails in the cache', async () => {
    const { prompts, sharedPrefixTokens } = summaryPrompts(tokenizer, roles, FULL, SPY, PROMPTS);
    const civ = prompts.find((p) => p.kvShare === null)!.tokenIds.length;
    const spy = prompts[roles.spySeat]!.tokenIds.length;
    expect(sharedPrefixTokens).toBeGreaterThan(P); // the spy borrows at least one page
    const opts = { maxTokens: 4, temperature: 1, topK: 0, topP: 1, seeds: [11, 12, 13, 14, 15] };

    const policy = new GpuPolicy(model, tokenizer);
    const withShare = await policy.generate(prompts, opts);
    const shared = policy.kvUsage!;
    const sharedPrefill = policy.prefilledTokens;
    const alone = await policy.generate(unshared(prompts), opts);
    const full = policy.kvUsage!;

    expect(withShare).toEqual(alone);
    expect(withShare.every((g) => g.tokenIds.length > 0 && g.logprobs.every(Number.isFinite))).toBe(true);
    // One civilian prefix, three civilian tails of <= P tokens, the spy's tail after its borrowed pages.
    const civTail = kvPages(civ) - Math.floor((civ - 1) / P);
    const spyOwn = kvPages(spy) - Math.floor(Math.min(sharedPrefixTokens, spy - 1) / P);
    expect(shared.prefillPages).toBe(kvPages(civ) + 3 * civTail + spyOwn);
    expect(full.prefillPages).toBe(4 * kvPages(civ) + kvPages(spy));
    expect(shared.pages).toBe(expectedPages(prompts, opts.maxTokens - 1, true));
    expect(shared.pages).toBe(planPages(prompts, opts.maxTokens - 1));
    expect(full.pages).toBe(expectedPages(prompts, opts.maxTokens - 1, false));
    expect(shared.endPages).toBeLessThanOrEqual(shared.pages);
    expect(shared.bytesAllocated / full.bytesAllocated).toBeCloseTo(shared.pages / full.pages, 2);
    console.log(
      `summaries: civilian prompt ${civ} tokens, spy ${spy} (${sharedPrefixTokens} shared); ` +
        `KV pages after prefill ${shared.prefillPages} shared vs ${full.prefillPages} unshared; ` +
        `cache ${shared.bytesAllocated} vs ${full.bytesAllocated} bytes; prefilled ${sharedPrefill} vs ${policy.prefilledTokens - sharedPrefill} tokens`,
    );
  });

  it('votes: the voters share their common prefix; identical vote log-probs', async () => {
    const summaries = roles.labels.map((_, seat) => `Summary ${seat}.`);
    const prompts = votePrompts(tokenizer, { roles, civilianText: FULL, spyText: SPY, summaries }, PROMPTS);
    const source = prompts.findIndex((p) => p.kvShare === null);
    prompts.forEach((p, seat) => {
      if (seat === source) return;
      // Civilians share the report and every summary, all but their own question and answer
      // prefix (~40 tokens); the spy shares up to the removed span.
      if (seat === roles.spySeat) expect(p.kvShare!.tokens).toBeGreaterThan(P);
      else {
        const sharedText = tokenizer.decode(p.tokenIds.slice(0, p.kvShare!.tokens));
        for (const summary of summaries) expect(sharedText).toContain(`: ${summary}`);
        expect(p.tokenIds.length - p.kvShare!.tokens).toBeLessThan(48);
      }
    });
    const labels = labelTokenIds(tokenizer, roles.groupSize);
    const cands = prompts.map(() => labels);
    const policy = new GpuPolicy(model, tokenizer);
    const withShare = await policy.voteLogprobs(prompts, cands);
    const shared = policy.kvUsage!;
    const alone = await policy.voteLogprobs(unshared(prompts), cands);
    const full = policy.kvUsage!;
    expect(withShare).toEqual(alone);
    expect(shared.prefillPages).toBe(expectedPages(prompts, 0, true));
    expect(full.prefillPages).toBe(expectedPages(prompts, 0, false));
    console.log(
      `votes: prompts ${prompts.map((p) => p.tokenIds.length).join(', ')} tokens; KV pages ${shared.prefillPages} shared vs ${full.prefillPages} unshared`,
    );
  });

  it('votes adopt the report pages the summaries kept (keepPromptKv): identical completions and vote log-probs, the report prefilled once', async () => {
    const sp = summaryPrompts(tokenizer, roles, FULL, SPY, PROMPTS).prompts;
    const opts = { maxTokens: 4, temperature: 1, topK: 0, topP: 1, seeds: [21, 22, 23, 24, 25] };
    const labels = labelTokenIds(tokenizer, roles.groupSize);
    // A round's three calls (summaries, reasons, votes), with the summaries and reasons keeping
    // their caches for the next call, and without.
    // The next calls at their budgets, as playRound passes them: placeholder summaries and reasons,
    // so the kept cache holds the reasons and votes. This random model's 4 sampled tokens can be
    // byte pieces that decode and re-encode into several tokens each, so the placeholders have 4
    // words a token (a real model's summary re-encodes to about its own length; playRound passes one a token).
    const words = roles.labels.map(() => Array.from({ length: 4 * opts.maxTokens }, () => 'word').join(' '));
    const atBudget = { roles, civilianText: FULL, spyText: SPY, summaries: words };
    const voteCall = { prompts: votePrompts(tokenizer, { ...atBudget, reasons: words }, PROMPTS), maxTokens: 0 };
    const nextCalls = [{ prompts: reasonPrompts(tokenizer, atBudget, PROMPTS), maxTokens: opts.maxTokens }, voteCall];
    const play = async (keep: boolean, honour = true, sized = true) => {
      const policy = new GpuPolicy(model, tokenizer);
      policy.keepPromptKv = honour; // the memory plan's choice (src/train/run.ts)
      const summaries = await policy.generate(sp, { ...opts, keepPromptKv: keep, nextCalls: sized ? nextCalls : [] });
      const summariesUsage = policy.kvUsage!;
      const input = { roles, civilianText: FULL, spyText: SPY, summaries: summaries.map((g) => g.text) };
      const rp = reasonPrompts(tokenizer, input, PROMPTS);
      const reasonsPrefilled = policy.prefilledTokens;
      const reasonsAdopted = policy.adoptedTokens;
      const reasons = await policy.generate(rp, { ...opts, keepPromptKv: keep, nextCalls: sized ? [voteCall] : [] });
      const reasonsUsage = policy.kvUsage!;
      const reasonsRun = {
        prefilled: policy.prefilledTokens - reasonsPrefilled,
        adopted: policy.adoptedTokens - reasonsAdopted,
      };
      const vp = votePrompts(tokenizer, { ...input, reasons: reasons.map((g) => g.text) }, PROMPTS);
      const votesPrefilled = policy.prefilledTokens;
      const votes = await policy.voteLogprobs(
        vp,
        vp.map(() => labels),
      );
      const votesUsage = policy.kvUsage!;
      const live = gpu.memory.inUseBytes;
      policy.releaseKv(); // nothing left to release: the votes took and released the reasons' cache
      expect(gpu.memory.inUseBytes).toBe(live);
      return {
        summaries,
        reasons,
        votes,
        rp,
        vp,
        reasonsRun,
        reasonsUsage,
        summariesUsage,
        votesUsage,
        votesPrefilled: policy.prefilledTokens - votesPrefilled,
        adopted: policy.adoptedTokens,
      };
    };
    const kept = await play(true);
    const fresh = await play(false);
    // A policy told not to keep (the plan's keepPromptKv false) ignores the request; a kept cache
    // not sized for the next calls (no nextCalls) cannot hold them, and they prefill afresh.
    for (const other of [await play(true, false), await play(true, true, false)]) {
      expect(other.adopted).toBe(0);
      expect(other.votes).toEqual(fresh.votes);
      expect(other.summariesUsage.pages).toBe(fresh.summariesUsage.pages);
    }
    // Kept: the reasons and votes ran in the summaries' cache (its pages and bytes), sized for them.
    expect(kept.summariesUsage.pages).toBeGreaterThan(fresh.summariesUsage.pages);
    expect(kept.reasonsUsage.bytesAllocated).toBe(kept.summariesUsage.bytesAllocated);
    expect(kept.votesUsage.bytesAllocated).toBe(kept.summariesUsage.bytesAllocated);
    expect(kept.summaries).toEqual(fresh.summaries);
    expect(kept.reasons).toEqual(fresh.reasons);
    expect(kept.votes).toEqual(fresh.votes);
    expect(fresh.adopted).toBe(0);
    // What each prompt adopts: its longest common prefix with a kept prompt, whole pages, where
    // that beats what it borrows in its batch (the report for the reasons' source and the spy).
    const expectAdopted = (prompts: ChatPrompt[], keptPrompts: ChatPrompt[]) => {
      const sources = prefillSources(
        prompts,
        keptPrompts.map((p) => p.tokenIds),
        P,
      );
      let adopted = 0;
      sources.forEach((s, b) => {
        const best = Math.max(...keptPrompts.map((k) => commonPrefixLength(prompts[b]!.tokenIds, k.tokenIds)));
        const whole = Math.floor(Math.min(best, prompts[b]!.tokenIds.length - 1) / P) * P;
        expect(s.adopted).toBe(Math.max(s.shared, whole));
        adopted += s.adopted - s.shared;
      });
      return adopted;
    };
    const reasonsAdopted = expectAdopted(kept.rp, sp);
    const votesAdopted = expectAdopted(kept.vp, kept.rp);
    // Both the reasons' source and the spy adopt their copy of the report (at least a page).
    const source = kept.rp.findIndex((p) => p.kvShare === null);
    expect(
      prefillSources(
        kept.rp,
        sp.map((p) => p.tokenIds),
        P,
      )[source]!.adopted,
    ).toBeGreaterThanOrEqual(P);
    expect(
      prefillSources(
        kept.rp,
        sp.map((p) => p.tokenIds),
        P,
      )[roles.spySeat]!.adopted,
    ).toBeGreaterThan(prefillSources(kept.rp, null, P)[roles.spySeat]!.shared);
    expect(kept.reasonsRun.adopted).toBe(reasonsAdopted);
    expect(kept.adopted).toBe(reasonsAdopted + votesAdopted);
    expect(kept.reasonsRun.prefilled).toBe(fresh.reasonsRun.prefilled - reasonsAdopted);
    expect(kept.votesPrefilled).toBe(fresh.votesPrefilled - votesAdopted);
    // The adopted pages are where the summaries left them (the spy's and the source's report pages
    // hold the civilians' common prefix once): no more pages than a fresh prefill maps.
    expect(kept.reasonsUsage.prefillPages).toBeLessThanOrEqual(fresh.reasonsUsage.prefillPages);
    expect(kept.summariesUsage.pages).toBe(
      Math.max(
        planPages(sp, opts.maxTokens - 1),
        planPages(nextCalls[0]!.prompts, opts.maxTokens - 1 + P),
        planPages(voteCall.prompts, P),
      ),
    );
    console.log(
      `reasons: prefilled ${kept.reasonsRun.prefilled} tokens with the summaries' pages adopted vs ${fresh.reasonsRun.prefilled}; ` +
        `votes: ${kept.votesPrefilled} vs ${fresh.votesPrefilled}`,
    );
  });

  it('a kvShare that claims tokens the prompts do not share is refused', async () => {
    const a = tokenizer.encode(
      'one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty',
    );
    expect(a.length).toBeGreaterThan(P);
    const b = [...a];
    b[3] = (b[3]! + 1) % 1000;
    const prompts: ChatPrompt[] = [
      { messages: [], prefill: '', text: '', tokenIds: a, kvShare: null },
      { messages: [], prefill: '', text: '', tokenIds: b, kvShare: { source: 0, tokens: a.length } },
    ];
    await expect(new GpuPolicy(model, tokenizer).voteLogprobs(prompts, [[1], [1]])).rejects.toThrow(/token 3 differs/);
  });
});
