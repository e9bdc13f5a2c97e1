// The game's Policy on our GPU engine: batched summaries with a shared KV-cache prefix (civilians
// prefill their identical prompt once; the spy reuses it up to the removed span), per-prompt
// seeds so a completion depends only on (prompt, seed, weights), and votes read from the
// next-token distribution at the prompt's end.
import type { Generation, GenerateOptions, Policy } from '../game/round.ts';
import type { ChatPrompt } from '../game/prompts.ts';
import * as K from '../ops/index.ts';
import type { Qwen3Model, KVCache } from '../model/qwen3.ts';
import { TextStreamer, type Qwen3Tokenizer } from '../model/tokenizer.ts';

export interface PolicyHooks {
  /** New printable text of prompt `index`'s completion. */
  onDelta?: (index: number, text: string) => void;
}

export class GpuPolicy implements Policy {
  /** Tokens generated (and prompt tokens prefilled) so far, for throughput. */
  generatedTokens = 0;
  prefilledTokens = 0;

  constructor(
    readonly model: Qwen3Model,
    readonly tokenizer: Qwen3Tokenizer,
    readonly hooks: PolicyHooks = {},
  ) {}

  /**
   * Prefills every prompt into its own slot, sharing KV-cache prefixes: a prompt with
   * kvShare {source, tokens} copies the source slot's first `tokens` positions and prefills the
   * rest. Returns the (B, V) logits of each prompt's last token.
   */
  private prefill(prompts: readonly ChatPrompt[], cache: KVCache): GPUBuffer {
    const { gpu, cfg } = this.model;
    const V = cfg.vocabSize;
    const B = prompts.length;
    const logits = gpu.createBuffer(B * V * 4, 'promptLogits'); // (B, V)
    const shared = prompts.map((p) => (p.kvShare && prompts[p.kvShare.source] && !prompts[p.kvShare.source].kvShare ? Math.min(p.kvShare.tokens, p.tokenIds.length - 1) : 0));
    for (const pass of [0, 1]) {
      // Pass 0: prompts that own their prefix; pass 1: those that borrow one.
      const batch = prompts.map((_, b) => b).filter((b) => (shared[b] > 0) === (pass === 1));
      if (batch.length === 0) continue;
      if (pass === 1) {
        const { numKvHeads: NKV, headDim: HD } = cfg;
        const rowBytes = NKV * HD * 4;
        // WebGPU copies never stay inside one buffer: go through a staging buffer.
        const staging = gpu.createBuffer(Math.max(...batch.map((b) => shared[b])) * rowBytes, 'kvShareStaging');
        for (const b of batch) {
          const src = prompts[b].kvShare!.source, n = shared[b];
          for (let l = 0; l < cfg.numLayers; l++) {
            for (const c of [cache.k[l], cache.v[l]]) {
              gpu.copy(c, src * cache.maxT * rowBytes, staging, 0, n * rowBytes);
              gpu.copy(staging, 0, c, b * cache.maxT * rowBytes, n * rowBytes);
            }
          }
        }
        gpu.releaseBuffer(staging);
      }
      const ids: number[] = [], slots: number[] = [], positions: number[] = [], last: number[] = [];
      for (const b of batch) {
        const p = prompts[b].tokenIds;
        for (let t = shared[b]; t < p.length; t++) { ids.push(p[t]); slots.push(b); positions.push(t); }
        last.push(ids.length - 1);
      }
      this.prefilledTokens += ids.length;
      const out = this.model.forward({ ids, slots, positions, logitRows: last }, cache);
      batch.forEach((b, i) => gpu.copy(out, i * V * 4, logits, b * V * 4, V * 4));
      gpu.releaseBuffer(out);
    }
    return logits;
  }

  async generate(prompts: ChatPrompt[], opts: GenerateOptions): Promise<Generation[]> {
    const { model, tokenizer } = this;
    const { gpu, cfg } = model;
    const V = cfg.vocabSize;
    const B = prompts.length;
    if (opts.seeds.length !== B) throw new RangeError(`${opts.seeds.length} seeds for ${B} prompts`);
    const maxPrompt = Math.max(...prompts.map((p) => p.tokenIds.length));
    const cache = model.createCache(B, maxPrompt + opts.maxTokens);
    const stop = new Set(tokenizer.stopIds);
    const sampling = { temperature: opts.temperature, topK: opts.topK, topP: opts.topP };
    const out: Generation[] = prompts.map(() => ({ text: '', tokenIds: [], logprobs: [], truncated: false }));
    const streamers = prompts.map(() => new TextStreamer(tokenizer, { skipSpecial: true }));
    const row = gpu.createBuffer(V * 4, 'sampleRow'); // (1, V)
    const one = gpu.createBuffer(4, 'sampledOne');
    const picked = gpu.createBuffer(B * 8, 'sampledIdsAndLogp'); // (B) u32 ids, then (B) f32 log-probs
    const lse = gpu.createBuffer(B * 4, 'sampleLse');
    let logits = this.prefill(prompts, cache);
    let active = prompts.map((_, b) => b);
    try {
      for (let step = 0; active.length > 0; step++) {
        const A = active.length;
        // Each row samples with its own seed (step = its own token index), so batching never changes a completion.
        active.forEach((b, i) => {
          gpu.copy(logits, i * V * 4, row, 0, V * 4);
          K.sample(gpu, one, row, 1, V, sampling, opts.seeds[b] >>> 0, step);
          gpu.copy(one, 0, picked, i * 4, 4);
        });
        // Behaviour log-probs of the sampled ids under the policy (temperature 1), for the PPO ratio.
        const ids = gpu.createBuffer(A * 4, 'ids');
        const lp = gpu.createBuffer(A * 4, 'lp');
        gpu.copy(picked, 0, ids, 0, A * 4);
        K.logSoftmaxGather(gpu, lp, lse, logits, ids, A, V);
        gpu.copy(lp, 0, picked, B * 4, A * 4);
        const back = await gpu.read(picked, B * 8);
        gpu.releaseBuffer(ids);
        gpu.releaseBuffer(lp);
        gpu.releaseBuffer(logits);
        const sampledIds = new Uint32Array(back, 0, A);
        const sampledLp = new Float32Array(back, B * 4, A);
        const still: number[] = [];
        active.forEach((b, i) => {
          const id = sampledIds[i];
          const g = out[b];
          g.tokenIds.push(id);
          g.logprobs.push(sampledLp[i]);
          this.generatedTokens++;
          if (stop.has(id)) return;
          const delta = streamers[b].push(id);
          if (delta) { g.text += delta; this.hooks.onDelta?.(b, delta); }
          if (g.tokenIds.length >= opts.maxTokens) { g.truncated = true; return; }
          still.push(b);
        });
        for (const b of active) if (!still.includes(b)) {
          const rest = streamers[b].flush();
          if (rest) { out[b].text += rest; this.hooks.onDelta?.(b, rest); }
        }
        const nextIds = still.map((b) => out[b].tokenIds[out[b].tokenIds.length - 1]);
        active = still;
        if (active.length === 0) break;
        logits = model.forward({
          ids: nextIds, slots: active,
          positions: active.map((b) => prompts[b].tokenIds.length + out[b].tokenIds.length - 1),
          logitRows: active.map((_, i) => i),
        }, cache);
      }
    } finally {
      for (const b of [row, one, picked, lse]) gpu.releaseBuffer(b);
      cache.destroy();
    }
    return out;
  }

  async voteLogprobs(prompts: ChatPrompt[], candidateTokenIds: number[][]): Promise<number[][]> {
    const { gpu, cfg } = this.model;
    const V = cfg.vocabSize;
    const B = prompts.length;
    const cache = this.model.createCache(B, Math.max(...prompts.map((p) => p.tokenIds.length)));
    const logits = this.prefill(prompts, cache);
    cache.destroy();
    // Full-vocabulary log-softmax at each prompt's end; only the candidates' values come back.
    const nc = Math.max(...candidateTokenIds.map((c) => c.length));
    const firsts = gpu.createBuffer(B * 4, 'firstCandidate');
    gpu.write(firsts, Uint32Array.from(candidateTokenIds.map((c) => c[0])));
    const lp = gpu.createBuffer(B * 4, 'lp'), lse = gpu.createBuffer(B * 4, 'lse');
    K.logSoftmaxGather(gpu, lp, lse, logits, firsts, B, V);
    const picked = gpu.createBuffer((B * nc + B) * 4, 'candidateLogits'); // (B, nc) logits, then (B) lse
    candidateTokenIds.forEach((c, b) => c.forEach((id, j) => gpu.copy(logits, (b * V + id) * 4, picked, (b * nc + j) * 4, 4)));
    gpu.copy(lse, 0, picked, B * nc * 4, B * 4);
    const z = await gpu.readF32(picked, B * nc + B);
    for (const x of [logits, firsts, lp, lse, picked]) gpu.releaseBuffer(x);
    return candidateTokenIds.map((c, b) => c.map((_, j) => z[b * nc + j] - z[B * nc + b]));
  }
}
