// The game's Policy on our GPU engine: batched summaries with a shared KV-cache prefix (civilians
// prefill their identical prompt once and read its pages; the spy reuses them up to the removed
// span; voters share everything before their own question), per-prompt seeds so a completion
// depends only on (prompt, seed, weights), and votes read from the next-token distribution at the
// prompt's end. Each sampled token comes with its log-prob under the distribution it was drawn
// from (shaders/sample.wgsl: temperature, top-k, top-p as applied), the PPO behaviour log-prob.
import type { Generation, GenerateOptions, NextCall, Policy } from '../game/round.ts';
import type { ChatPrompt } from '../game/prompts.ts';
import { commonPrefixLength } from '../game/text.ts';
import * as K from '../ops/index.ts';
import { KV_PAGE_SIZE, kvPages, type KVCache } from '../model/kvCache.ts';
import { decodeSteps } from '../model/generate.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import { TextStreamer, type Qwen3Tokenizer } from '../model/tokenizer.ts';

export interface PolicyHooks {
  /** New printable text of prompt `index`'s completion. */
  onDelta?: (index: number, text: string) => void;
}

/** KV-cache pages of the last generate / voteLogprobs call (a page holds KV_PAGE_SIZE tokens). */
export interface KvUsage {
  /** Pages the cache was created with (its memory: bytesAllocated). */
  pages: number;
  /** Pages mapped once every prompt was prefilled; a shared prefix counts once. */
  prefillPages: number;
  /** Pages mapped at the end (prompts and generated tokens; ahead decoding: a dropped step past a stop id too). */
  endPages: number;
  bytesAllocated: number;
}

/**
 * Positions of each prompt read from its kvShare source instead of prefilled: the prefix rounded
 * down to whole pages, and never the last token (its logits are needed). 0 when the source itself
 * borrows (it is prefilled in the same pass).
 */
export function sharedPositions(prompts: readonly ChatPrompt[], pageSize = KV_PAGE_SIZE): number[] {
  return prompts.map((p, b) => {
    const src = p.kvShare ? prompts[p.kvShare.source] : undefined;
    if (!p.kvShare || !src || src.kvShare || p.kvShare.source === b) return 0;
    const n = Math.floor(Math.min(p.kvShare.tokens, p.tokenIds.length - 1, src.tokenIds.length) / pageSize) * pageSize;
    for (let t = 0; t < n; t++) {
      if (p.tokenIds[t] !== src.tokenIds[t])
        throw new Error(
          `prompt ${b}: kvShare claims ${p.kvShare.tokens} tokens shared with prompt ${p.kvShare.source}, but token ${t} differs`,
        );
    }
    return n;
  });
}

/** A call's KV cache kept for the policy's next call (GenerateOptions.keepPromptKv). */
export interface KeptKv {
  cache: KVCache;
  /** Per slot, its prompt's ids: the positions a later prompt may adopt from it. */
  prompts: number[][];
}

/** Where a prompt's first positions come from before its prefill (prefillSources). */
export interface PrefillSource {
  /** Positions [0, shared) mapped from its kvShare source in the batch (sharedPositions). */
  shared: number;
  /**
   * Positions [0, adopted) read from slot keptSlot of the kept cache, in place (KVCache.reslot),
   * where that reaches past `shared`; else adopted = shared. The prefill starts at `adopted`.
   */
  adopted: number;
  /** -1 where nothing is adopted. */
  keptSlot: number;
}

/**
 * Per prompt, the positions it borrows in its batch (sharedPositions) and those it adopts from a
 * kept call's prompts (KVCache.reslot): its longest common prefix with one of them, whole pages,
 * never the last token, where that reaches past what it borrows. It prefills from `adopted` on.
 * A vote prompt's report, which its player's summary prompt opened with too (src/game/prompts.ts
 * reportHead), is adopted from the summaries' cache; the civilians other than the batch's source
 * borrow their whole prompt but its tail from the source as before.
 */
export function prefillSources(
  prompts: readonly ChatPrompt[],
  kept: readonly (readonly number[])[] | null,
  pageSize = KV_PAGE_SIZE,
): PrefillSource[] {
  const shared = sharedPositions(prompts, pageSize);
  return prompts.map((p, b) => {
    let adopted = shared[b]!,
      keptSlot = -1;
    for (const [k, ids] of (kept ?? []).entries()) {
      const n =
        Math.floor(Math.min(commonPrefixLength(p.tokenIds, ids), ids.length, p.tokenIds.length - 1) / pageSize) *
        pageSize;
      if (n > adopted) {
        adopted = n;
        keptSlot = k;
      }
    }
    return { shared: shared[b]!, adopted, keptSlot };
  });
}

/**
 * Whether `cache` (a kept one) holds these prompts in place: every prompt's positions within its
 * capacity, and its pages within the pool: the distinct kept pages the prompts adopt (where they
 * are), then each prompt's own pages past what it adopts or borrows.
 */
export function fitsInPlace(
  cache: Pick<KVCache, 'maxT' | 'pages' | 'pageSize' | 'slots' | 'pagesUnder'>,
  prompts: readonly ChatPrompt[],
  extra: number,
  sources: readonly PrefillSource[],
): boolean {
  if (prompts.length > cache.slots) return false;
  if (prompts.some((p) => p.tokenIds.length + extra > cache.maxT)) return false;
  const P = cache.pageSize;
  const kept = cache.pagesUnder(
    sources.flatMap((x) => (x.keptSlot < 0 ? [] : [{ src: x.keptSlot, tokens: x.adopted }])),
  );
  const own = prompts.reduce((n, p, b) => n + kvPages(p.tokenIds.length + extra, P) - sources[b]!.adopted / P, 0);
  return kept + own <= cache.pages;
}

/** Pages a batch needs when every prompt writes `extra` positions past its end, shared pages once. */
export function planPages(prompts: readonly ChatPrompt[], extra: number, pageSize = KV_PAGE_SIZE): number {
  const shared = sharedPositions(prompts, pageSize);
  return prompts.reduce((n, p, b) => n + kvPages(p.tokenIds.length + extra, pageSize) - shared[b] / pageSize, 0);
}

export class GpuPolicy implements Policy {
  /** Tokens generated (and prompt tokens prefilled) so far, for throughput. */
  generatedTokens = 0;
  prefilledTokens = 0;
  /** Prompt positions taken from a kept cache instead of prefilled (keepPromptKv), so far. */
  adoptedTokens = 0;
  /** The last generate's cache, when it was asked to keep it (GenerateOptions.keepPromptKv). */
  private kept: KeptKv | null = null;
  /** KV-cache use of the last call. */
  kvUsage: KvUsage | null = null;
  /**
   * Whether generate honours GenerateOptions.keepPromptKv (keeps its cache, sized for the next
   * calls' prompts too, for them to run in). The trainer sets the memory plan's choice
   * (src/train/memory.ts keepPromptKv).
   */
  keepPromptKv = true;
  /** Decode one step ahead of the readback (model/generate.ts decodeSteps); false: read every step first. */
  decodeAhead = true;
  /**
   * A millisecond clock: when set, `generate` waits for its prefill's GPU work before it decodes
   * and adds the time to prefillMs (one sync per call, so timings only; the trainer sets it when
   * it has a clock).
   */
  clock: (() => number) | null = null;
  private prefillTotal = 0;
  /** Milliseconds of prefill measured so far; undefined without a clock (nothing measured). */
  get prefillMs(): number | undefined {
    return this.clock ? this.prefillTotal : undefined;
  }

  constructor(
    readonly model: Qwen3Model,
    readonly tokenizer: Qwen3Tokenizer,
    readonly hooks: PolicyHooks = {},
  ) {}

  /** Releases the cache a generate call kept (keepPromptKv) when no later call took it. */
  releaseKv(): void {
    const kept = this.kept;
    this.kept = null;
    kept?.cache.destroy();
  }

  /**
   * A call's cache and where each prompt's positions come from (prefillSources). The kept cache
   * (the previous generate's, keepPromptKv) serves the call in place when it holds these prompts:
   * each prompt that adopts maps its kept slot's pages (KVCache.reslot, no copy) and the rest are
   * dropped. Where it does not (prompts past its capacity), it is released and the call prefills
   * in a new cache from scratch. A new cache has the pages these prompts need when each writes
   * `extra` more positions, and with `reserve` (GenerateOptions.nextCalls, when this call keeps
   * its cache) what each of those calls needs after it.
   */
  private openCall(
    prompts: readonly ChatPrompt[],
    extra: number,
    reserve: readonly NextCall[] = [],
  ): { cache: KVCache; sources: PrefillSource[] } {
    const kept = this.kept;
    this.kept = null;
    const P = KV_PAGE_SIZE;
    if (kept) {
      const sources = prefillSources(prompts, kept.prompts, P);
      if (fitsInPlace(kept.cache, prompts, extra, sources)) {
        kept.cache.reslot(
          sources.flatMap((x, b) => (x.keptSlot < 0 ? [] : [{ dst: b, src: x.keptSlot, tokens: x.adopted }])),
        );
        for (const x of sources) if (x.keptSlot >= 0) this.adoptedTokens += x.adopted - x.shared;
        return { cache: kept.cache, sources };
      }
      kept.cache.destroy();
    }
    return { cache: this.createCache(prompts, extra, reserve), sources: prefillSources(prompts, null, P) };
  }

  /**
   * Prefills every prompt into its own slot, sharing KV-cache prefixes: a prompt with kvShare
   * {source, tokens} maps the source slot's whole pages of that prefix (cache.share, no copy) and
   * prefills the rest; a prompt that adopted a kept slot's pages (openCall) prefills past them.
   * Returns the (B, V) logits of each prompt's last token.
   */
  private prefill(prompts: readonly ChatPrompt[], cache: KVCache, sources: readonly PrefillSource[]): GPUBuffer {
    const { gpu, cfg } = this.model;
    const V = cfg.vocabSize;
    const B = prompts.length;
    const borrows = (b: number) => sources[b].keptSlot < 0 && sources[b].shared > 0;
    const logits = gpu.createBuffer(B * V * 4, 'promptLogits'); // (B, V)
    for (const pass of [0, 1]) {
      // Pass 0: prompts that own their prefix (or adopted it); pass 1: those that borrow one in the batch.
      const batch = prompts.map((_, b) => b).filter((b) => borrows(b) === (pass === 1));
      if (batch.length === 0) continue;
      if (pass === 1) for (const b of batch) cache.share(b, prompts[b].kvShare!.source, sources[b].shared);
      const ids: number[] = [],
        slots: number[] = [],
        positions: number[] = [],
        last: number[] = [];
      for (const b of batch) {
        const p = prompts[b].tokenIds;
        for (let t = sources[b].adopted; t < p.length; t++) {
          ids.push(p[t]);
          slots.push(b);
          positions.push(t);
        }
        last.push(ids.length - 1);
      }
      this.prefilledTokens += ids.length;
      const out = this.model.forward({ ids, slots, positions, logitRows: last }, cache);
      batch.forEach((b, i) => gpu.copy(out, i * V * 4, logits, b * V * 4, V * 4));
      gpu.releaseBuffer(out);
    }
    return logits;
  }

  /**
   * A cache with exactly the pages these prompts need when each writes `extra` more positions, or
   * more where a `reserve` batch (the next calls' prompts at their budgets) needs more, plus a page
   * a prompt of it for re-tokenization: it then serves those calls in place (openCall).
   */
  private createCache(prompts: readonly ChatPrompt[], extra: number, reserve: readonly NextCall[] = []): KVCache {
    let maxT = Math.max(...prompts.map((p) => p.tokenIds.length)) + extra;
    let pages = planPages(prompts, extra, KV_PAGE_SIZE);
    for (const next of reserve) {
      if (next.prompts.length !== prompts.length) continue; // another batch size: it cannot run here
      const e = Math.max(0, next.maxTokens - 1) + KV_PAGE_SIZE; // a page more for re-tokenization
      maxT = Math.max(maxT, ...next.prompts.map((p) => p.tokenIds.length + e));
      pages = Math.max(pages, planPages(next.prompts, e, KV_PAGE_SIZE));
    }
    return this.model.createCache(prompts.length, maxT, { pageSize: KV_PAGE_SIZE, pages });
  }

  private recordKv(cache: KVCache, prefillPages: number): void {
    this.kvUsage = {
      pages: cache.pages,
      prefillPages,
      endPages: cache.pagesInUse,
      bytesAllocated: cache.bytesAllocated,
    };
  }

  async generate(prompts: ChatPrompt[], opts: GenerateOptions): Promise<Generation[]> {
    const { model, tokenizer } = this;
    const B = prompts.length;
    if (opts.seeds.length !== B) throw new RangeError(`${opts.seeds.length} seeds for ${B} prompts`);
    // The last sampled token is never fed back, so each sequence writes maxTokens - 1 positions past
    // its prompt (the step decodeSteps runs past a stop id writes inside them).
    const keepAsked = opts.keepPromptKv === true && this.keepPromptKv;
    const { cache, sources } = this.openCall(prompts, Math.max(0, opts.maxTokens - 1), keepAsked ? opts.nextCalls : []);
    let keep = false;
    const sampling = { temperature: opts.temperature, topK: opts.topK, topP: opts.topP };
    const out: Generation[] = prompts.map(() => ({ text: '', tokenIds: [], logprobs: [], truncated: false }));
    const streamers = prompts.map(() => new TextStreamer(tokenizer, { skipSpecial: true }));
    // Each row samples with its own seed and step = its own token index, as row 0 of a one-row draw:
    // batching never changes a completion. Each id comes with its log-prob under the distribution it
    // was drawn from (temperature, top-k, top-p as applied): the exact behaviour log-prob for PPO.
    const seqs = prompts.map((p, b) => ({
      slot: b,
      promptLength: p.tokenIds.length,
      maxTokens: opts.maxTokens,
      seed: opts.seeds[b] >>> 0,
      row: 0,
    }));
    try {
      const c0 = this.clock?.();
      const logits = this.prefill(prompts, cache, sources);
      if (this.clock && c0 !== undefined) {
        await model.gpu.sync();
        this.prefillTotal += this.clock() - c0;
      }
      const prefillPages = cache.pagesInUse;
      for await (const step of decodeSteps(model, cache, logits, seqs, sampling, tokenizer.stopIds, this.decodeAhead)) {
        for (const { seq: b, id, logprob, reason } of step) {
          const g = out[b];
          g.tokenIds.push(id);
          g.logprobs.push(logprob);
          this.generatedTokens++;
          if (reason === 'stop') continue;
          const delta = streamers[b].push(id);
          if (delta) {
            g.text += delta;
            this.hooks.onDelta?.(b, delta);
          }
          if (reason === 'length') g.truncated = true;
        }
        for (const { seq: b, reason } of step) {
          if (!reason) continue;
          const rest = streamers[b].flush();
          if (rest) {
            out[b].text += rest;
            this.hooks.onDelta?.(b, rest);
          }
        }
      }
      this.recordKv(cache, prefillPages);
      keep = keepAsked;
    } finally {
      if (keep) this.kept = { cache, prompts: prompts.map((p) => [...p.tokenIds]) };
      else cache.destroy();
    }
    return out;
  }

  /**
   * (B, V) next-token logits at each prompt's end, prefilled as generate and voteLogprobs do
   * (kvShare honoured): what the shared-prefix test compares with a fresh prefill.
   */
  async promptLogits(prompts: ChatPrompt[]): Promise<Float32Array> {
    const { gpu, cfg } = this.model;
    const { cache, sources } = this.openCall(prompts, 0);
    try {
      const logits = this.prefill(prompts, cache, sources);
      this.recordKv(cache, cache.pagesInUse);
      const out = await gpu.readF32(logits, prompts.length * cfg.vocabSize);
      gpu.releaseBuffer(logits);
      return out;
    } finally {
      cache.destroy();
    }
  }

  async voteLogprobs(prompts: ChatPrompt[], candidateTokenIds: number[][]): Promise<number[][]> {
    const { gpu, cfg } = this.model;
    const V = cfg.vocabSize;
    const B = prompts.length;
    const { cache, sources } = this.openCall(prompts, 0);
    let logits: GPUBuffer;
    try {
      logits = this.prefill(prompts, cache, sources);
      this.recordKv(cache, cache.pagesInUse);
    } finally {
      cache.destroy();
    }
    // Full-vocabulary log-softmax at each prompt's end; only the candidates' values come back.
    const nc = Math.max(...candidateTokenIds.map((c) => c.length));
    const firsts = gpu.createBuffer(B * 4, 'firstCandidate');
    gpu.write(firsts, Uint32Array.from(candidateTokenIds.map((c) => c[0])));
    const lp = gpu.createBuffer(B * 4, 'lp'),
      lse = gpu.createBuffer(B * 4, 'lse');
    K.logSoftmaxGather(gpu, lp, lse, logits, firsts, B, V);
    const picked = gpu.createBuffer((B * nc + B) * 4, 'candidateLogits'); // (B, nc) logits, then (B) lse
    candidateTokenIds.forEach((c, b) =>
      c.forEach((id, j) => gpu.copy(logits, (b * V + id) * 4, picked, (b * nc + j) * 4, 4)),
    );
    gpu.copy(lse, 0, picked, B * nc * 4, B * 4);
    const z = await gpu.readF32(picked, B * nc + B);
    for (const x of [logits, firsts, lp, lse, picked]) gpu.releaseBuffer(x);
    return candidateTokenIds.map((c, b) => c.map((_, j) => z[b * nc + j] - z[B * nc + b]));
  }
}
