// Batched generation: all prompts are prefilled in one forward (each in its own KV-cache
// slot), then every decode step runs one token of each unfinished sequence together and
// samples on the GPU in one dispatch. The sampled ids stay on the GPU and feed the next step's
// embedding; the CPU reads them one step behind (ahead decoding): step n + 1 is encoded and
// submitted before step n's ids come back, so the CPU's reading and encoding overlap the GPU's work.
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
  /** Encode each step before reading the previous one's ids (default true); false reads every step first. */
  ahead?: boolean;
}

export interface GeneratedToken {
  seq: number; // index of the prompt
  id: number;
  /** Its log-prob under the distribution it was drawn from (0 for greedy). */
  logprob: number;
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

/** One sequence of a decodeSteps batch. */
export interface DecodeSequence {
  slot: number; // its KV-cache slot
  promptLength: number; // positions already in the cache: its first sampled token is fed at this one
  maxTokens: number; // tokens it may generate; the last one is never fed back
  /** Its draws use RNG = hash(seed, token index, row) (shaders/sample.wgsl). */
  seed: number;
  row: number;
}

/** A token decodeSteps reports; `reason` is set on the last token of its sequence. */
export interface DecodedToken {
  seq: number; // index into the sequences
  id: number;
  logprob: number; // under the distribution it was drawn from (0 for greedy)
  reason?: 'stop' | 'length';
}

/** A sampled step on its way back: which sequences it holds (in row order), where, and its read. */
interface StepInFlight {
  rows: number[];
  picked: GPUBuffer; // (2 B) u32: ids, then log-prob f32 bits (K.sampleRows)
  read: Promise<ArrayBuffer>;
}

/**
 * The decode loop of generate and of the SpyRL policy. `logits` (B, V), released here, hold each
 * sequence's next-token logits after its prompt. Yields the tokens of each step in sequence order,
 * then nothing more for a sequence once one carries a reason.
 *
 * With `ahead` (the default) step n + 1 is encoded from step n's ids on the GPU (embedPicked) and
 * submitted before step n is read. A sequence that stopped at step n is therefore known one step
 * late: it runs step n + 1 anyway, and that token is dropped. Its KV write is at position
 * promptLength + n <= promptLength + maxTokens - 2, inside the pages planned for maxTokens - 1
 * fed-back tokens (it may map one more of them than the synchronous path). A sequence at maxTokens is
 * known in advance and takes no extra step. The reported tokens equal those of `ahead: false`,
 * which reads every step before it encodes the next.
 */
export async function* decodeSteps(
  model: Qwen3Model,
  cache: KVCache,
  logits: GPUBuffer,
  seqs: readonly DecodeSequence[],
  sampling: K.SampleOptions,
  stopIds: readonly number[],
  ahead = true,
): AsyncGenerator<DecodedToken[]> {
  const { gpu, cfg } = model;
  const V = cfg.vocabSize;
  const B = seqs.length;
  const stop = new Set(stopIds);
  const picked = [gpu.createBuffer(2 * B * 4, 'sampledA'), gpu.createBuffer(2 * B * 4, 'sampledB')]; // (2B) u32 each
  const rng = gpu.createBuffer(3 * B * 4, 'sampleRng'); // (B, 3) u32: seed, step, row
  const done = seqs.map(() => false);
  let turn = 0;
  // Samples step `step` of `rows` from their logits and starts the read, which submits the step.
  const sampleStep = (step: number, rows: number[], stepLogits: GPUBuffer): StepInFlight => {
    const out = picked[turn];
    turn ^= 1; // the previous step's ids stay intact while this step's forward reads them
    gpu.write(rng, Uint32Array.from(rows.flatMap((b) => [seqs[b].seed >>> 0, step, seqs[b].row >>> 0])));
    K.sampleRows(gpu, out, stepLogits, rng, rows.length, V, sampling);
    gpu.releaseBuffer(stepLogits);
    const read = gpu.read(out);
    read.catch(() => undefined); // awaited in order below; an abandoned one must not go unhandled
    return { rows, picked: out, read };
  };
  // Feeds the ids of `prev` to step `step` of `rows` (a subset of prev.rows), all on the GPU.
  const decodeStep = (step: number, prev: StepInFlight, rows: number[]): StepInFlight => {
    const stepLogits = model.forward(
      {
        ids: { buffer: prev.picked, rows: rows.map((b) => prev.rows.indexOf(b)) },
        slots: rows.map((b) => seqs[b].slot),
        positions: rows.map((b) => seqs[b].promptLength + step - 1),
        logitRows: rows.map((_, i) => i),
      },
      cache,
    );
    return sampleStep(step, rows, stepLogits);
  };
  let cur: StepInFlight | null = null,
    next: StepInFlight | null = null;
  try {
    cur = sampleStep(
      0,
      seqs.map((_, b) => b),
      logits,
    );
    for (let step = 0; cur; step++) {
      // Rows of this step that a step + 1 needs as far as the CPU knows: not stopped, not at maxTokens.
      const feeding = (s: StepInFlight) => s.rows.filter((b) => !done[b] && step + 1 < seqs[b].maxTokens);
      if (ahead) {
        const rows = feeding(cur);
        next = rows.length > 0 ? decodeStep(step + 1, cur, rows) : null;
      }
      const back = await cur.read;
      const A = cur.rows.length;
      const ids = new Uint32Array(back, 0, A);
      const logprobs = new Float32Array(back, A * 4, A);
      const tokens: DecodedToken[] = [];
      cur.rows.forEach((b, i) => {
        if (done[b]) return; // the step past its stop id: dropped
        const id = ids[i];
        const reason = stop.has(id) ? 'stop' : step + 1 >= seqs[b].maxTokens ? 'length' : undefined;
        if (reason) done[b] = true;
        tokens.push({ seq: b, id, logprob: logprobs[i], reason });
      });
      if (tokens.length > 0) yield tokens;
      if (!ahead) {
        const rows = feeding(cur);
        next = rows.length > 0 ? decodeStep(step + 1, cur, rows) : null;
      }
      cur = next;
      next = null;
    }
  } finally {
    // Stopped early (an error, or the consumer returned): let the reads in flight finish first.
    for (const s of [cur, next]) if (s) await s.read.catch(() => undefined);
    for (const b of [...picked, rng]) gpu.releaseBuffer(b);
  }
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
  const maxPrompt = Math.max(...prompts.map((p) => p.length));
  // Pages for what can be written: each prompt plus maxNewTokens - 1 fed-back tokens (the last
  // sampled token is never fed back; decodeSteps' step past a stop stays inside them), not B x maxT.
  const pages = prompts.reduce((n, p) => n + kvPages(p.length + opts.maxNewTokens - 1), 0);
  const cache = opts.cache ?? model.createCache(B, maxPrompt + opts.maxNewTokens, { pages });
  try {
    if (cache.slots < B) throw new RangeError(`cache has ${cache.slots} slots for ${B} prompts`);
    if (cache.maxT < maxPrompt + opts.maxNewTokens)
      throw new RangeError(
        `cache holds ${cache.maxT} tokens; prompt + new tokens need ${maxPrompt + opts.maxNewTokens}`,
      );
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
    const logits = model.forward({ ids, slots, positions, logitRows: lastRows }, cache);
    // Sequence b draws with hash(seed, token index, b): its tokens do not depend on when the others stop.
    const seqs = prompts.map((p, b) => ({
      slot: b,
      promptLength: p.length,
      maxTokens: opts.maxNewTokens,
      seed: opts.seed,
      row: b,
    }));
    for await (const step of decodeSteps(model, cache, logits, seqs, opts, opts.stopIds, opts.ahead ?? true))
      yield step.map(({ seq, id, logprob, reason }) => ({ seq, id, logprob, done: reason !== undefined, reason }));
  } finally {
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
