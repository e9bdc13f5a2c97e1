// End to end: prefill and decode throughput of the real forward pass and a LoRA training step at a
// model's exact shapes, with random bf16 (or q4) weights made on the spot (no download), and the
// peak GPU memory the device held (gpu.memory). Browser-safe (no node: imports).
import type { Gpu } from '../src/gpu/index.ts';
import { QWEN3_PRESETS, type Qwen3Config } from '../src/model/config.ts';
import { Qwen3Model, type Qwen3Weights } from '../src/model/qwen3.ts';
import { decodeSteps } from '../src/model/generate.ts';
import * as K from '../src/ops/index.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import { TrainingPass } from '../src/train/trainingPass.ts';
import { MLP_CHUNKS_AUTO } from '../src/train/memory.ts';
import { quantizeQ4 } from '../src/model/q4.ts';
import { crossEntropyLoss } from '../src/train/pgLoss.ts';
import { makeRecord, type BenchRecord, type Roofline } from './measure.ts';

export const TINY: Qwen3Config = {
  hiddenSize: 64,
  numLayers: 2,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 16,
  intermediateSize: 128,
  vocabSize: 151936,
  ropeTheta: 1e6,
  rmsNormEps: 1e-6,
  tieWordEmbeddings: true,
  maxPositionEmbeddings: 40960,
  torchDtype: 'bfloat16',
  bosTokenId: null,
  eosTokenIds: [151645],
};

export const MODELS: Record<string, Qwen3Config> = {
  tiny: TINY,
  '0.6b': QWEN3_PRESETS['Qwen/Qwen3-0.6B'],
  '1.7b': QWEN3_PRESETS['Qwen/Qwen3-1.7B'],
  '4b': QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'],
  '8b': QWEN3_PRESETS['Qwen/Qwen3-8B'],
};

export type Format = 'bf16' | 'q4';

/**
 * The model of the A/B benches (bench/pack-ab.ts, bench/keep-ab.ts) from their --shape, --layers
 * and --weights: 'tiny' (hidden 64, 2 layers), 'small' (hidden 256, 4 layers, 4/2 heads of 64,
 * MLP 768), '4b' (Qwen3-4B's layers, `layers` of its 36), all with the real 151,936-token vocabulary.
 */
export function abModel(shape: string, layers: string, weights: string): { cfg: Qwen3Config; format: Format } {
  const shapes: Record<string, Qwen3Config> = {
    tiny: MODELS.tiny!,
    small: {
      ...MODELS.tiny!,
      hiddenSize: 256,
      numLayers: 4,
      numHeads: 4,
      numKvHeads: 2,
      headDim: 64,
      intermediateSize: 768,
    },
    '4b': { ...MODELS['4b']!, numLayers: Number(layers) },
  };
  const cfg = shapes[shape];
  if (!cfg) throw new Error(`--shape must be one of ${Object.keys(shapes).join(', ')} (got "${shape}")`);
  if (!(Number.isInteger(cfg.numLayers) && cfg.numLayers >= 1))
    throw new Error(`--layers must be a whole number >= 1 (got "${layers}")`);
  if (weights !== 'bf16' && weights !== 'q4') throw new Error(`--weights must be bf16 or q4 (got "${weights}")`);
  return { cfg, format: weights };
}

export function matmulParams(c: Qwen3Config): number {
  const {
    hiddenSize: C,
    numHeads: NH,
    numKvHeads: NKV,
    headDim: HD,
    intermediateSize: I,
    numLayers: L,
    vocabSize: V,
  } = c;
  return L * (C * NH * HD * 2 + C * NKV * HD * 2 + 3 * C * I) + V * C;
}

/** Bytes of the weights as stored: bf16 2 per parameter; q4 N*K/2 + N*K/32 per quantized tensor. */
export function modelWeightBytes(c: Qwen3Config, format: Format = 'bf16'): number {
  const { hiddenSize: C, headDim: HD, numLayers: L, vocabSize: V } = c;
  const quantized = matmulParams(c) + (c.tieWordEmbeddings ? 0 : V * C);
  return quantized * (format === 'q4' ? 0.5 + 2 / 32 : 2) + (L * (2 * C + 2 * HD) + C) * 2;
}

/** FLOPs of one token at context length `ctx` (matmuls 2 per MAC, attention QK and PV), LM head included when `head`. */
export function tokenFlops(c: Qwen3Config, ctx: number, head: boolean): number {
  const attn = c.numLayers * 4 * ctx * c.numHeads * c.headDim;
  return 2 * (matmulParams(c) - (head ? 0 : c.vocabSize * c.hiddenSize)) + attn;
}

const gib = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;

/**
 * Random weights straight onto the GPU: one random bf16 block, written repeatedly (values ~N(0, 0.02)).
 * q4: the block quantized once (src/model/q4.ts); a tensor repeats its nibble words, then its scale words.
 */
export function randomWeights(
  gpu: Gpu,
  c: Qwen3Config,
  format: Format,
): { weights: Qwen3Weights; buffers: GPUBuffer[] } {
  const block = new Uint16Array(1 << 21);
  let s = 12345;
  for (let i = 0; i < block.length; i++) {
    s = (s * 1103515245 + 12345) >>> 0;
    const u = ((s >>> 8) / 2 ** 24 - 0.5) * 0.07; // uniform, std ~0.02
    const f = new Float32Array([u]);
    block[i] = new Uint32Array(f.buffer)[0] >>> 16;
  }
  const ones = new Uint16Array(Math.max(c.hiddenSize, c.headDim)).fill(0x3f80); // bf16 1.0
  const buffers: GPUBuffer[] = [];
  const make = (n: number, label: string, fill: Uint16Array = block) => {
    const buf = gpu.createBuffer(n * 2, label);
    for (let off = 0; off < n * 2; off += fill.byteLength) {
      const len = Math.min(fill.byteLength, n * 2 - off);
      gpu.write(buf, new Uint8Array(fill.buffer, 0, len), off);
    }
    buffers.push(buf);
    return buf;
  };
  const packed = format === 'q4' ? quantizeQ4(block, 1, block.length, 'bench block') : null;
  const fillWords = (buf: GPUBuffer, at: number, words: number, src: Uint32Array) => {
    for (let off = 0; off < words; off += src.length)
      gpu.write(buf, src.subarray(0, Math.min(src.length, words - off)), (at + off) * 4);
  };
  const linear = (N: number, Kd: number, label: string): K.Weight => {
    if (!packed) return make(N * Kd, label);
    const n = N * Kd,
      nib = n / 8,
      scales = Math.ceil(n / 64);
    const buf = gpu.createBuffer(K.q4Words(N, Kd) * 4, label);
    fillWords(buf, 0, nib, packed.subarray(0, block.length / 8));
    fillWords(buf, nib, scales, packed.subarray(block.length / 8));
    buffers.push(buf);
    return { format: 'q4', buf, N, K: Kd };
  };
  const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, vocabSize: V } = c;
  const embed = linear(V, C, 'embed');
  const layers = Array.from({ length: c.numLayers }, (_, l) => ({
    inputNorm: make(C, `l${l}.ln1`, ones),
    qProj: linear(NH * HD, C, `l${l}.q`),
    kProj: linear(NKV * HD, C, `l${l}.k`),
    vProj: linear(NKV * HD, C, `l${l}.v`),
    qNorm: make(HD, `l${l}.qn`, ones),
    kNorm: make(HD, `l${l}.kn`, ones),
    oProj: linear(C, NH * HD, `l${l}.o`),
    postNorm: make(C, `l${l}.ln2`, ones),
    gateProj: linear(I, C, `l${l}.gate`),
    upProj: linear(I, C, `l${l}.up`),
    downProj: linear(C, I, `l${l}.down`),
  }));
  const norm = make(C, 'norm', ones);
  const lmHead = c.tieWordEmbeddings ? embed : linear(V, C, 'lm_head');
  return { weights: { embed, layers, norm, lmHead }, buffers };
}

async function timeIt(gpu: Gpu, fn: () => GPUBuffer | void, reps: number): Promise<number> {
  const warm = fn();
  await gpu.sync();
  if (warm) gpu.releaseBuffer(warm);
  const t0 = performance.now();
  for (let i = 0; i < reps; i++) {
    const b = fn();
    if (b) {
      await gpu.sync();
      gpu.releaseBuffer(b);
    }
  }
  await gpu.sync();
  return (performance.now() - t0) / reps / 1000;
}

export interface ModelBenchOptions {
  /** Layers to build (per-layer shapes exact); default all, or 1 for non-tiny models on a CPU adapter. */
  layers?: number;
  /** Contexts: each gets a prefill of that many tokens and decode steps right after it. */
  prompts: number[];
  decode: number;
  batches: number[];
  trainLen?: number;
  loraR: number;
  format: Format;
  kv: 'f32' | 'f16';
  roofline?: Roofline;
  log?: (line: string) => void;
}

/** Prefill, decode at each batch size, and one LoRA training step of model `name` (MODELS). */
export async function benchModel(
  gpu: Gpu,
  name: string,
  full: Qwen3Config,
  o: ModelBenchOptions,
): Promise<BenchRecord[]> {
  const log = o.log ?? (() => {});
  const slow = K.isCpuAdapter(gpu);
  const L = o.layers ?? (slow && name !== 'tiny' ? 1 : full.numLayers);
  const c: Qwen3Config = { ...full, numLayers: L };
  const { prompts, decode: D, batches, format } = o;
  const layersNote = L === full.numLayers ? `${L} layers` : `${L} of ${full.numLayers} layers`;
  log(
    `## ${name}: ${layersNote}, C=${c.hiddenSize} NH=${c.numHeads} NKV=${c.numKvHeads} HD=${c.headDim} I=${c.intermediateSize} V=${c.vocabSize}; ` +
      `${format} weights ${gib(modelWeightBytes(c, format))}, ${o.kv} KV cache`,
  );
  gpu.memory.resetPeak();
  const { weights, buffers } = randomWeights(gpu, c, format);
  await gpu.sync();
  const model = new Qwen3Model(gpu, c, weights, { kv: o.kv });
  const wBytes = modelWeightBytes(c, format);
  const kvElem = o.kv === 'f16' ? 2 : 4;
  const maxB = Math.max(...batches);
  const records: BenchRecord[] = [];
  const tag = `${name} ${format} kv=${o.kv}`;
  const shape = `${tag} L=${L}`;
  const report = (what: string, seconds: number, reps: number, tokens: number, flops: number, bytes: number) => {
    records.push(
      makeRecord({ group: 'e2e', name: `${name} ${what}`, shape, flops, bytes, seconds, reps, tokens }, o.roofline),
    );
  };
  // Prefill: P tokens of one sequence, logits of the last one only; then decode at context P.
  const benchContext = async (P: number) => {
    const cache = model.createCache(maxB, P + D + 1);
    try {
      const pos = Array.from({ length: P }, (_, i) => i);
      const ids = pos.map((i) => (i * 7919) % c.vocabSize);
      const preReps = slow ? 1 : 3;
      const tPre = await timeIt(
        gpu,
        () => model.forward({ ids, slots: pos.map(() => 0), positions: pos, logitRows: [P - 1] }, cache),
        preReps,
      );
      let preFlops = 0;
      for (let t = 0; t < P; t++) preFlops += tokenFlops(c, t + 1, false);
      preFlops += 2 * c.vocabSize * c.hiddenSize;
      const chunks = Math.ceil(P / model.chunk);
      report(
        `prefill ${P} (LoRA r=${o.loraR})`,
        tPre,
        preReps,
        P,
        preFlops,
        wBytes * chunks + P * c.numLayers * 2 * c.numKvHeads * c.headDim * kvElem,
      );

      // Decode: B sequences one token each at context P (weights read once per step for all B). The
      // other slots borrow slot 0's prompt pages (no copy) and prefill only a partial last page.
      for (let b = 1; b < maxB; b++) {
        const shared = cache.share(b, 0, P);
        if (shared < P) {
          const tail = pos.slice(shared);
          gpu.releaseBuffer(
            model.forward(
              { ids: tail.map((i) => ids[i]), slots: tail.map(() => b), positions: tail, logitRows: [] },
              cache,
            ),
          );
        }
      }
      const sampling = { temperature: 0.7, topK: 20, topP: 0.8 }; // Qwen3's generation defaults
      for (const B of batches) {
        const slots = Array.from({ length: B }, (_, b) => b);
        const sampled = gpu.createBuffer(B * 4, 'ids');
        const reps = slow ? 2 : D;
        const tDec = await timeIt(
          gpu,
          () => {
            const logits = model.forward(
              { ids: slots.map((b) => b + 1), slots, positions: slots.map(() => P), logitRows: slots },
              cache,
            );
            K.sample(gpu, sampled, logits, B, c.vocabSize, sampling, 0, 0);
            return logits;
          },
          reps,
        );
        gpu.releaseBuffer(sampled);
        const kvBytes = B * c.numLayers * 2 * (P + 1) * c.numKvHeads * c.headDim * kvElem;
        report(
          `decode B=${B} @ctx ${P} (LoRA)`,
          tDec,
          reps,
          B,
          B * tokenFlops(c, P + 1, true),
          wBytes + kvBytes + B * c.vocabSize * 4 * 2,
        );
        // The same steps as generate and the SpyRL rollouts run them (decodeSteps, ahead decoding):
        // the sampled ids fed back on the GPU, step n + 1 encoded and submitted before step n's ids
        // are read, so the CPU's reading and encoding overlap the GPU's work. The record above
        // waits for each step before encoding the next (its latency); this one is the stream's
        // rate: the time from the first sample to the last token read, over its `reps` forward
        // steps (reps + 1 samples: the first one's cost counts against it). A loop of one step
        // first compiles its kernels (the sampling of rows, the ids picked on the GPU).
        const loop = async (steps: number): Promise<number> => {
          const first = model.forward(
            { ids: slots.map((b) => b + 1), slots, positions: slots.map(() => P), logitRows: slots },
            cache,
          );
          await gpu.sync();
          // Positions P + 1 .. P + steps, inside the cache's P + D + 1.
          const seqs = slots.map((b) => ({ slot: b, promptLength: P + 1, maxTokens: steps + 1, seed: 1, row: b }));
          let tokens = 0;
          const t0 = performance.now();
          for await (const step of decodeSteps(model, cache, first, seqs, sampling, [], true)) tokens += step.length;
          const seconds = (performance.now() - t0) / 1000;
          if (tokens !== B * (steps + 1)) throw new Error(`decode loop: ${tokens} tokens, expected ${B * (steps + 1)}`);
          return seconds;
        };
        await loop(1);
        const tLoop = (await loop(reps)) / reps;
        report(
          `decode B=${B} @ctx ${P} (LoRA, generate loop)`,
          tLoop,
          reps,
          B,
          B * tokenFlops(c, P + reps / 2, true),
          wBytes + B * c.numLayers * 2 * (P + reps / 2) * c.numKvHeads * c.headDim * kvElem + B * c.vocabSize * 4 * 2,
        );
      }
    } finally {
      cache.destroy();
    }
  };
  // LoRA on for prefill and decode, as in a SpyRL rollout; the same adapter is then trained.
  const lcfg = loraConfig({ r: o.loraR, alpha: 2 * o.loraR });
  const adapter = new LoraAdapter(gpu, c, lcfg);
  adapter.setWeights(initLora(c, lcfg, 0));
  model.lora = adapter;
  try {
    for (const P of prompts) await benchContext(P);
    model.lora = null;

    // LoRA training step: forward keeping layer inputs, then backward with per-layer recompute.
    // FLOPs: the forward's matmuls run 3 times (forward, recompute, input gradients) plus the
    // LM head twice on every target row (its logits, then its input gradient, both in the forward:
    // src/train/trainingPass.ts); LoRA's own matmuls are counted separately (small). Then the same
    // step with every layer kept (TrainingPassOptions.keepLayers = L): no recompute, 2 times, and
    // its MLP in chunks of MLP_CHUNKS_AUTO[0] rows, as the memory plan that keeps every layer takes
    // it where memory is left (src/train/memory.ts withKeptLayers: the 24 GiB round's update), so
    // up to 2,048 tokens in one chunk, as PyTorch + PEFT runs it; the recomputing step keeps
    // TrainingPass's default (DEFAULT_MLP_CHUNK), the plan's without a budget.
    const TT = o.trainLen ?? (slow ? (name === 'tiny' ? 64 : 16) : 512);
    const tIds = Array.from({ length: TT }, (_, i) => (i * 104729) % c.vocabSize);
    const keptChunk = MLP_CHUNKS_AUTO[0];
    const trainStep = async (keepLayers: number) => {
      const mlpChunk = keepLayers ? keptChunk : undefined;
      const pass = new TrainingPass(model, adapter, tIds, [...tIds.slice(1), -1], null, { keepLayers, mlpChunk });
      pass.backward(crossEntropyLoss(await pass.forward()).dlogp);
      await gpu.sync();
      const bytes = pass.bytes.peak;
      pass.release();
      return bytes;
    };
    const reps = slow ? 1 : 3;
    const headBytes = modelWeightBytes({ ...c, numLayers: 0 }, format); // the LM head (and an untied embedding)
    const times: number[] = [];
    for (const keep of [0, c.numLayers]) {
      await trainStep(keep); // warm-up: pipelines compiled, pool filled
      const t0 = performance.now();
      let passBytes = 0;
      for (let i = 0; i < reps; i++) passBytes = await trainStep(keep);
      const tTrain = (performance.now() - t0) / reps / 1000;
      times.push(tTrain);
      const runs = keep ? 2 : 3;
      let trainFlops = 0;
      for (let t = 0; t < TT; t++) trainFlops += runs * tokenFlops(c, t + 1, false);
      trainFlops += 2 * 2 * (TT - 1) * c.vocabSize * c.hiddenSize;
      const loraFlops = 2 * runs * TT * adapter.numParams; // ~2 flops per param per token and layer pass
      const trainBytes = (wBytes - headBytes) * runs + headBytes * 2 + 4 * (c.numLayers + 2) * TT * c.hiddenSize * 2;
      report(
        `LoRA step ${TT} tok r=${lcfg.r}${keep ? `, every layer kept, ${TT <= keptChunk ? 'one MLP chunk' : `MLP in ${keptChunk}-row chunks`}` : ''}`,
        tTrain,
        reps,
        TT,
        trainFlops + loraFlops,
        trainBytes,
      );
      log(`   training pass peak ${gib(passBytes)} (trainingPassBytes)`);
    }
    log(`   every layer kept vs recomputed: ${(times[0]! / times[1]!).toFixed(2)}x the step rate, same run`);
    log(
      `   peak GPU memory held ${gib(gpu.memory.peakBytes)} (weights ${gib(wBytes)}, the rest: KV cache, activations, LoRA state, pool)`,
    );
  } finally {
    model.lora = null;
    adapter.destroy();
    for (const b of new Set(buffers)) gpu.releaseBuffer(b);
  }
  return records;
}
