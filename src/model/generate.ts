// Batched generation: all prompts are prefilled in one forward (each in its own KV-cache
// slot), then every decode step runs one token of each unfinished sequence together and
// samples on the GPU; only the sampled ids (B x u32) come back to the CPU.
import * as K from '../ops/index.ts';
import { kvPages, type KVCache } from './kvCache.ts';
import type { Qwen3Model } from './qwen3.ts';
import { readJson, type ModelSource } from './sources.ts';

export interface SamplingOptions {
  /** 0 = greedy (argmax). */
  temperature: number;
  /** 0 = off. */
  topK: number;
  /** 1 = off. */
  topP: number;
  seed: number;
}

export const GREEDY: SamplingOptions = { temperature: 0, topK: 0, topP: 1, seed: 0 };

export interface GenerateOptions extends SamplingOptions {
  maxNewTokens: number;
  stopIds: readonly number[];
  /** Reuse a cache with at least prompts.length slots; otherwise one is made and freed. */
  cache?: KVCache;
}

export interface GeneratedToken {
  seq: number; // index of the prompt
  id: number;
  /** True when this token ended the sequence (a stop id, or the length limit). */
  done: boolean;
  reason?: 'stop' | 'length';
}

export function validateSampling(o: SamplingOptions): void {
  if (!(o.temperature >= 0) || !Number.isFinite(o.temperature))
    throw new RangeError(`temperature must be a number >= 0 (got ${o.temperature})`);
  if (!Number.isInteger(o.topK) || o.topK < 0) throw new RangeError(`top-k must be an integer >= 0 (got ${o.topK})`);
  if (!(o.topP > 0 && o.topP <= 1)) throw new RangeError(`top-p must be in (0, 1] (got ${o.topP})`);
  if (!Number.isInteger(o.seed) || o.seed < 0) throw new RangeError(`seed must be an integer >= 0 (got ${o.seed})`);
}

/** Yields tokens as they are sampled, one decode step at a time (B tokens per step). */
export async function* generate(
  model: Qwen3Model,
  prompts: readonly (readonly number[])[],
  opts: GenerateOptions,
): AsyncGenerator<GeneratedToken[]> {
  validateSampling(opts);
  if (!Number.isInteger(opts.maxNewTokens) || opts.maxNewTokens < 1)
    throw new RangeError(`maxNewTokens must be an integer >= 1 (got ${opts.maxNewTokens})`);
  const B = prompts.length;
  if (B === 0) return;
  for (const [i, p] of prompts.entries()) if (p.length === 0) throw new RangeError(`prompt ${i} is empty`);
  const { gpu, cfg } = model;
  const maxPrompt = Math.max(...prompts.map((p) => p.length));
  // Pages for what can be written: each prompt plus maxNewTokens - 1 fed-back tokens (the last
  // sampled token is never fed back), not B x maxT.
  const pages = prompts.reduce((n, p) => n + kvPages(p.length + opts.maxNewTokens - 1), 0);
  const cache = opts.cache ?? model.createCache(B, maxPrompt + opts.maxNewTokens, { pages });
  if (cache.slots < B) throw new RangeError(`cache has ${cache.slots} slots for ${B} prompts`);
  if (cache.maxT < maxPrompt + opts.maxNewTokens)
    throw new RangeError(`cache holds ${cache.maxT} tokens; prompt + new tokens need ${maxPrompt + opts.maxNewTokens}`);
  const stop = new Set(opts.stopIds);
  const sampled = gpu.createBuffer(B * 4, 'sampledIds'); // (B) u32
  try {
    // Prefill every prompt in one forward; the last token of each gives its first logits.
    const ids: number[] = [],
      slots: number[] = [],
      positions: number[] = [],
      lastRows: number[] = [];
    prompts.forEach((p, b) => {
      p.forEach((id, t) => {
        ids.push(id);
        slots.push(b);
        positions.push(t);
      });
      lastRows.push(ids.length - 1);
    });
    let active = prompts.map((_, b) => b); // sequences still generating
    const length = prompts.map((p) => p.length); // tokens in each sequence so far
    let logits = model.forward({ ids, slots, positions, logitRows: lastRows }, cache);
    for (let step = 0; active.length > 0; step++) {
      K.sample(gpu, sampled, logits, active.length, cfg.vocabSize, opts, opts.seed, step);
      const next = new Uint32Array(await gpu.read(sampled, active.length * 4));
      gpu.releaseBuffer(logits);
      const out: GeneratedToken[] = [];
      const still: number[] = [];
      active.forEach((b, i) => {
        const id = next[i];
        length[b]++;
        const generated = length[b] - prompts[b].length;
        const reason = stop.has(id) ? 'stop' : generated >= opts.maxNewTokens ? 'length' : undefined;
        out.push({ seq: b, id, done: reason !== undefined, reason });
        if (!reason) still.push(b);
      });
      yield out;
      const nextIds = still.map((b) => next[active.indexOf(b)]);
      active = still;
      if (active.length === 0) break;
      logits = model.forward(
        {
          ids: nextIds,
          slots: active,
          positions: active.map((b) => length[b] - 1),
          logitRows: active.map((_, i) => i),
        },
        cache,
      );
    }
  } finally {
    gpu.releaseBuffer(sampled);
    if (!opts.cache) cache.destroy();
  }
}

/**
 * Sampling defaults from generation_config.json (Qwen3 ships do_sample with temperature,
 * top_p, top_k); greedy when the file is absent or says do_sample: false.
 */
export async function samplingDefaults(
  source: Pick<ModelSource, 'exists' | 'readText'>,
): Promise<Omit<SamplingOptions, 'seed'>> {
  if (!(await source.exists('generation_config.json'))) return { temperature: 0, topK: 0, topP: 1 };
  const g = (await readJson(source, 'generation_config.json')) as Record<string, unknown>;
  const n = (k: string, d: number) => (typeof g[k] === 'number' && Number.isFinite(g[k]) ? (g[k] as number) : d);
  if (g['do_sample'] !== true) return { temperature: 0, topK: 0, topP: 1 };
  return { temperature: n('temperature', 1), topK: n('top_k', 0), topP: n('top_p', 1) };
}
