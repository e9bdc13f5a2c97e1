// `npm run bench [-- --model tiny|0.6b|1.7b|4b|8b|all] [--layers N] [--prompt 128] [--decode 16] [--batch 1,4]
//                 [--weights bf16,q4] [--kv f32] [--peak-gbs X] [--peak-tflops X]`
// Prefill and decode throughput of the real forward pass at a model's exact shapes, with random
// bf16 weights made on the spot (no download), for each weights format and KV type given (one
// run, side by side), and the peak GPU memory the device held (gpu.memory). Prints the arithmetic next to each number: FLOPs
// and bytes per token, achieved GFLOP/s and GB/s, and the fraction of the hardware peak when known.
// A benchmark, not a test: nothing here asserts a time.
import { parseArgs } from 'node:util';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import { QWEN3_PRESETS, type Qwen3Config } from '../src/model/config.ts';
import { Qwen3Model, type Qwen3Weights } from '../src/model/qwen3.ts';
import * as K from '../src/ops/index.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import { TrainingPass } from '../src/train/trainingPass.ts';
import { quantizeQ4 } from '../src/model/q4.ts';
import { crossEntropyLoss } from '../src/train/pgLoss.ts';

const { values: args } = parseArgs({
  options: {
    model: { type: 'string', default: 'tiny,4b' },
    layers: { type: 'string' },
    prompt: { type: 'string', default: '128' },
    decode: { type: 'string', default: '16' },
    batch: { type: 'string', default: '1,4' },
    'train-len': { type: 'string' },
    'lora-r': { type: 'string', default: '16' },
    weights: { type: 'string', default: 'bf16,q4' },
    kv: { type: 'string', default: 'f32' },
    'peak-gbs': { type: 'string' },
    'peak-tflops': { type: 'string' },
  },
});

const TINY: Qwen3Config = {
  hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16, intermediateSize: 128, vocabSize: 151936,
  ropeTheta: 1e6, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 40960, torchDtype: 'bfloat16', bosTokenId: null, eosTokenIds: [151645],
};
const MODELS: Record<string, Qwen3Config> = {
  tiny: TINY,
  '0.6b': QWEN3_PRESETS['Qwen/Qwen3-0.6B'],
  '1.7b': QWEN3_PRESETS['Qwen/Qwen3-1.7B'],
  '4b': QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'],
  '8b': QWEN3_PRESETS['Qwen/Qwen3-8B'],
};

/** Known peaks: memory bandwidth (GB/s) and dense f32 (non-tensor-core) TFLOP/s, the units our f32 kernels can use. */
const PEAKS: { match: RegExp; gbs: number; tflops: number; name: string }[] = [
  { match: /H200/i, gbs: 4800, tflops: 67, name: 'NVIDIA H200' },
  { match: /H100/i, gbs: 3350, tflops: 67, name: 'NVIDIA H100 SXM' },
  { match: /A100/i, gbs: 2039, tflops: 19.5, name: 'NVIDIA A100 80GB' },
  { match: /RTX 4090/i, gbs: 1008, tflops: 82.6, name: 'RTX 4090' },
  { match: /RTX 3090/i, gbs: 936, tflops: 35.6, name: 'RTX 3090' },
];

function matmulParams(c: Qwen3Config): number {
  const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, numLayers: L, vocabSize: V } = c;
  return L * (C * NH * HD * 2 + C * NKV * HD * 2 + 3 * C * I) + V * C;
}

type Format = 'bf16' | 'q4';

/** Bytes of the weights as stored: bf16 2 per parameter; q4 N*K/2 + N*K/32 per quantized tensor. */
function weightBytes(c: Qwen3Config, format: Format = 'bf16'): number {
  const { hiddenSize: C, headDim: HD, numLayers: L, vocabSize: V } = c;
  const quantized = matmulParams(c) + (c.tieWordEmbeddings ? 0 : V * C);
  return quantized * (format === 'q4' ? 0.5 + 2 / 32 : 2) + (L * (2 * C + 2 * HD) + C) * 2;
}

/** FLOPs of one token at context length `ctx` (matmuls 2 per MAC, attention QK and PV), LM head included when `head`. */
function tokenFlops(c: Qwen3Config, ctx: number, head: boolean): number {
  const attn = c.numLayers * 4 * ctx * c.numHeads * c.headDim;
  return 2 * (matmulParams(c) - (head ? 0 : c.vocabSize * c.hiddenSize)) + attn;
}

const fmt = (x: number, d = 1) => (x >= 100 ? x.toFixed(0) : x.toFixed(d));
const gb = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;

/**
 * Random weights straight onto the GPU: one random bf16 block, written repeatedly (values ~N(0, 0.02)).
 * q4: the block quantized once (src/model/q4.ts); a tensor repeats its nibble words, then its scale words.
 */
function randomWeights(gpu: Gpu, c: Qwen3Config, format: Format): { weights: Qwen3Weights; buffers: GPUBuffer[] } {
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
    for (let off = 0; off < words; off += src.length) gpu.write(buf, src.subarray(0, Math.min(src.length, words - off)), (at + off) * 4);
  };
  const linear = (N: number, Kd: number, label: string): K.Weight => {
    if (!packed) return make(N * Kd, label);
    const n = N * Kd, nib = n / 8, scales = Math.ceil(n / 64);
    const buf = gpu.createBuffer(K.q4Words(N, Kd) * 4, label);
    fillWords(buf, 0, nib, packed.subarray(0, block.length / 8));
    fillWords(buf, nib, scales, packed.subarray(block.length / 8));
    buffers.push(buf);
    return { format: 'q4', buf, N, K: Kd };
  };
  const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, vocabSize: V } = c;
  const embed = linear(V, C, 'embed');
  const layers = Array.from({ length: c.numLayers }, (_, l) => ({
    inputNorm: make(C, `l${l}.ln1`, ones), qProj: linear(NH * HD, C, `l${l}.q`), kProj: linear(NKV * HD, C, `l${l}.k`),
    vProj: linear(NKV * HD, C, `l${l}.v`), qNorm: make(HD, `l${l}.qn`, ones), kNorm: make(HD, `l${l}.kn`, ones),
    oProj: linear(C, NH * HD, `l${l}.o`), postNorm: make(C, `l${l}.ln2`, ones), gateProj: linear(I, C, `l${l}.gate`),
    upProj: linear(I, C, `l${l}.up`), downProj: linear(C, I, `l${l}.down`),
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
    if (b) { await gpu.sync(); gpu.releaseBuffer(b); }
  }
  await gpu.sync();
  return (performance.now() - t0) / reps / 1000;
}

async function benchModel(gpu: Gpu, name: string, full: Qwen3Config, peak: { gbs?: number; tflops?: number }, format: Format, kvType: 'f32' | 'f16'): Promise<void> {
  const slow = gpu.info.architecture === 'swiftshader';
  const L = args.layers ? Number(args.layers) : slow && name !== 'tiny' ? 1 : full.numLayers;
  const c: Qwen3Config = { ...full, numLayers: L };
  const P = Number(args.prompt), D = Number(args.decode);
  const batches = String(args.batch).split(',').map(Number);
  console.log(`\n## ${name}: ${L === full.numLayers ? '' : `${L} of ${full.numLayers} layers (per-layer shapes exact), `}C=${c.hiddenSize} NH=${c.numHeads} NKV=${c.numKvHeads} HD=${c.headDim} I=${c.intermediateSize} V=${c.vocabSize}`);
  console.log(`   ${format} weights, ${kvType} KV cache: weights ${gb(weightBytes(c, format))} on the GPU; ${(matmulParams(c) / 1e9).toFixed(3)} G matmul parameters`);
  gpu.memory.resetPeak();
  const { weights, buffers } = randomWeights(gpu, c, format);
  await gpu.sync();
  const model = new Qwen3Model(gpu, c, weights, { kv: kvType });
  const wBytes = weightBytes(c, format);
  const kvElem = kvType === 'f16' ? 2 : 4;
  const maxB = Math.max(...batches);
  const cache = model.createCache(maxB, P + D + 1);
  const report = (what: string, seconds: number, tokens: number, flops: number, bytes: number) => {
    const gflops = flops / seconds / 1e9, gbs = bytes / seconds / 1e9;
    const frac = [peak.gbs ? `${fmt((100 * gbs) / peak.gbs)}% of ${peak.gbs} GB/s` : '', peak.tflops ? `${fmt((100 * gflops) / 1000 / peak.tflops, 2)}% of ${peak.tflops} TFLOP/s f32` : ''].filter(Boolean).join(', ');
    console.log(`   ${what.padEnd(26)} ${fmt(tokens / seconds).padStart(8)} tok/s  ${fmt(seconds * 1000, 2).padStart(8)} ms/call   ${fmt(gflops).padStart(7)} GFLOP/s (${(flops / 1e9).toFixed(2)} GFLOP/call)   ${fmt(gbs).padStart(7)} GB/s (${(bytes / 1e9).toFixed(3)} GB/call)${frac ? `   [${frac}]` : ''}`);
  };
  try {
    // Prefill: P tokens of one sequence, logits of the last one only.
    const pos = Array.from({ length: P }, (_, i) => i);
    const ids = pos.map((i) => (i * 7919) % c.vocabSize);
    const tPre = await timeIt(gpu, () => model.forward({ ids, slots: pos.map(() => 0), positions: pos, logitRows: [P - 1] }, cache), slow ? 1 : 3);
    let preFlops = 0;
    for (let t = 0; t < P; t++) preFlops += tokenFlops(c, t + 1, false);
    preFlops += 2 * c.vocabSize * c.hiddenSize;
    const chunks = Math.ceil(P / model.chunk);
    report(`prefill ${P} tokens`, tPre, P, preFlops, wBytes * chunks + P * c.numLayers * 2 * c.numKvHeads * c.headDim * kvElem);

    // Decode: B sequences one token each at context P (weights read once per step for all B). The
    // other slots borrow slot 0's prompt pages (no copy) and prefill only a partial last page.
    for (let b = 1; b < maxB; b++) {
      const shared = cache.share(b, 0, P);
      if (shared < P) {
        const tail = pos.slice(shared);
        gpu.releaseBuffer(model.forward({ ids: tail.map((i) => ids[i]), slots: tail.map(() => b), positions: tail, logitRows: [] }, cache));
      }
    }
    for (const B of batches) {
      const slots = Array.from({ length: B }, (_, b) => b);
      const sampled = gpu.createBuffer(B * 4, 'ids');
      const tDec = await timeIt(gpu, () => {
        const logits = model.forward({ ids: slots.map((b) => b + 1), slots, positions: slots.map(() => P), logitRows: slots }, cache);
        K.sample(gpu, sampled, logits, B, c.vocabSize, { temperature: 0.7, topK: 20, topP: 0.8 }, 0, 0);
        return logits;
      }, slow ? 2 : D);
      gpu.releaseBuffer(sampled);
      const kvBytes = B * c.numLayers * 2 * (P + 1) * c.numKvHeads * c.headDim * kvElem;
      report(`decode batch ${B} @ctx ${P}`, tDec, B, B * tokenFlops(c, P + 1, true), wBytes + kvBytes + B * c.vocabSize * 4 * 2);
    }

    // LoRA training step: forward keeping layer inputs, then backward with per-layer recompute.
    // FLOPs: the forward's matmuls run 3 times (forward, recompute, input gradients) plus the
    // LM head 3 times on every target row; LoRA's own matmuls are counted separately (small).
    const TT = Number(args['train-len'] ?? (slow ? (name === 'tiny' ? 64 : 16) : 512));
    const lcfg = loraConfig({ r: Number(args['lora-r']), alpha: 2 * Number(args['lora-r']) });
    const adapter = new LoraAdapter(gpu, c, lcfg);
    adapter.setWeights(initLora(c, lcfg, 0));
    const tIds = Array.from({ length: TT }, (_, i) => (i * 104729) % c.vocabSize);
    const trainStep = async () => {
      const pass = new TrainingPass(model, adapter, tIds, [...tIds.slice(1), -1]);
      pass.backward(crossEntropyLoss(await pass.forward()).dlogp);
      await gpu.sync();
      pass.release();
    };
    await trainStep(); // warm-up: pipelines compiled, pool filled
    const reps = slow ? 1 : 3;
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) await trainStep();
    const tTrain = (performance.now() - t0) / reps / 1000;
    let trainFlops = 0;
    for (let t = 0; t < TT; t++) trainFlops += 3 * tokenFlops(c, t + 1, false);
    trainFlops += 3 * 2 * (TT - 1) * c.vocabSize * c.hiddenSize;
    const loraFlops = 6 * TT * adapter.numParams; // forward, recompute, backward (dA, dB, dx): ~6 flops per param per token
    const trainBytes = wBytes * 3 + 4 * (c.numLayers + 2) * TT * c.hiddenSize * 2;
    report(`LoRA step ${TT} tok (r=${lcfg.r})`, tTrain, TT, trainFlops + loraFlops, trainBytes);
    adapter.destroy();
    console.log(`   peak GPU memory held ${gb(gpu.memory.peakBytes)} (weights ${gb(wBytes)}, the rest: KV cache, activations, LoRA state, pool)`);
  } finally {
    cache.destroy();
    for (const b of new Set(buffers)) gpu.releaseBuffer(b);
  }
}

const gpu = await createGpu();
const desc = `${gpu.info.vendor} ${gpu.info.architecture} ${gpu.info.description}`.trim();
const known = PEAKS.find((p) => p.match.test(desc));
const peak = { gbs: args['peak-gbs'] ? Number(args['peak-gbs']) : known?.gbs, tflops: args['peak-tflops'] ? Number(args['peak-tflops']) : known?.tflops };
console.log(`# spyrl bench on ${desc || 'unknown adapter'}  (features: ${[gpu.features.f16 && 'shader-f16', gpu.features.subgroups && 'subgroups'].filter(Boolean).join(', ') || 'none'})`);
console.log(`# peak: ${peak.gbs ? `${peak.gbs} GB/s` : 'bandwidth unknown (--peak-gbs)'}, ${peak.tflops ? `${peak.tflops} TFLOP/s f32` : 'compute unknown (--peak-tflops)'}${known ? ` (${known.name} datasheet)` : ''}`);
console.log('# decode is bandwidth-bound: every step reads all weights once (bytes/call), so GB/s is the number to watch; prefill is compute-bound (GFLOP/s).');
if (gpu.info.architecture === 'swiftshader') console.log('# SwiftShader is a CPU emulation of a GPU: its timings say nothing about a real GPU. Large models run 1 layer here unless --layers is given.');
const names = args.model === 'all' ? Object.keys(MODELS) : String(args.model).split(',');
for (const n of names) {
  const c = MODELS[n.toLowerCase()];
  if (!c) throw new Error(`unknown --model ${n} (choose from ${Object.keys(MODELS).join(', ')}, all)`);
  for (const w of String(args.weights).split(',')) {
    if (w !== 'bf16' && w !== 'q4') throw new Error(`unknown --weights ${w} (bf16, q4)`);
    for (const kv of String(args.kv).split(',')) {
      if (kv !== 'f32' && kv !== 'f16') throw new Error(`unknown --kv ${kv} (f32, f16)`);
      await benchModel(gpu, n, c, peak, w, kv);
    }
  }
}
gpu.destroy();
