// `npx tsx bench/chunk-ab.ts [--model mid|mid-v8k|4b] [--layers 4] [--format q4] [--tokens 1024]
//   [--chunks 256,1024] [--rounds 3] [--mode prefill|train] [--keep-layers 0] [--kernels k=v,...]`
// --mode prefill (default): one prompt's prefill (Qwen3Model.forward with a LoRA adapter, r 16 on
// every projection, as a SpyRL rollout prefills) at each prefill chunk (Qwen3Model.chunk: the
// memory plan's forwardChunk). --mode train: one LoRA training step (a TrainingPass forward and
// backward of --tokens tokens, bf16 checkpoints, --keep-layers layers kept, as the update runs
// them) at each MLP chunk (TrainingPassOptions.mlpChunk: the memory plan's mlpChunk). Alternated
// over rounds after one warm-up of each (pipeline compiles): the time of a unit, its dispatches,
// tokens/s, and each chunk's median against the first chunk's. `mid` is
// a Qwen3-shaped model this machine's SwiftShader runs in seconds (hidden 256, intermediate 768, 4/2
// heads of 64, the real vocabulary; `mid-v8k` the same with 8,192 tokens); `4b` Qwen3-4B's shapes
// (a GPU's). Random weights. A
// benchmark, not a test: it asserts nothing.
import '../bin/gpu-env.mjs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import { Qwen3Model } from '../src/model/qwen3.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import * as K from '../src/ops/index.ts';
import { crossEntropyLoss } from '../src/train/pgLoss.ts';
import { TrainingPass } from '../src/train/trainingPass.ts';
import { MODELS, randomWeights, type Format } from './e2e.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: 'mid' },
    layers: { type: 'string', default: '4' },
    format: { type: 'string', default: 'q4' },
    tokens: { type: 'string', default: '1024' },
    chunks: { type: 'string', default: '256,1024' },
    rounds: { type: 'string', default: '3' },
    mode: { type: 'string', default: 'prefill' },
    'keep-layers': { type: 'string', default: '0' },
    kernels: { type: 'string', default: '' },
  },
});
const MID = {
  ...MODELS['4b']!,
  hiddenSize: 256,
  intermediateSize: 768,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 64,
};
const SHAPES = {
  mid: MID,
  // A training step's LM head (forward, recompute and input gradient over every row) at the real
  // 151,936 tokens takes minutes on SwiftShader, and it is the same at any MLP chunk.
  'mid-v8k': { ...MID, vocabSize: 8192 },
  '4b': MODELS['4b']!,
};
const base = SHAPES[values.model as keyof typeof SHAPES];
if (!base) throw new Error(`--model: one of ${Object.keys(SHAPES).join(', ')}`);
const cfg = { ...base, numLayers: Number(values.layers) };
const T = Number(values.tokens);
const chunks = values.chunks.split(',').map(Number);
const rounds = Number(values.rounds);
const train = values.mode === 'train';
if (!train && values.mode !== 'prefill') throw new Error('--mode: prefill or train');
const gpu = await createGpu();
try {
  if (values.kernels) Object.assign(K.tuning, K.parseTuning(values.kernels));
  const { weights } = randomWeights(gpu, cfg, values.format as Format);
  const model = new Qwen3Model(gpu, cfg, weights, { kv: 'f16' });
  const lcfg = loraConfig({ r: 16, alpha: 32 });
  const adapter = new LoraAdapter(gpu, cfg, lcfg);
  adapter.setWeights(initLora(cfg, lcfg, 0));
  if (!train) model.lora = adapter; // a TrainingPass takes the adapter itself
  const pos = Array.from({ length: T }, (_, i) => i);
  const ids = pos.map((i) => (i * 7919) % cfg.vocabSize);
  const prefill = async (chunk: number) => {
    model.chunk = chunk;
    const cache = model.createCache(1, T);
    await gpu.sync();
    const d0 = gpu.dispatchCount;
    const t0 = performance.now();
    gpu.releaseBuffer(model.forward({ ids, slots: pos.map(() => 0), positions: pos, logitRows: [T - 1] }, cache));
    await gpu.sync();
    const ms = performance.now() - t0;
    cache.destroy();
    return { ms, dispatches: gpu.dispatchCount - d0 };
  };
  const keepLayers = Number(values['keep-layers']);
  const step = async (mlpChunk: number) => {
    await gpu.sync();
    const d0 = gpu.dispatchCount;
    const t0 = performance.now();
    const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1], null, {
      checkpoints: 'bf16',
      mlpChunk,
      keepLayers,
    });
    try {
      pass.backward(crossEntropyLoss(await pass.forward()).dlogp);
      await gpu.sync();
    } finally {
      pass.release();
    }
    return { ms: performance.now() - t0, dispatches: gpu.dispatchCount - d0 };
  };
  const unit = train ? step : prefill;
  const what = train
    ? `LoRA training step (${keepLayers} layers kept) of ${T} tokens by MLP chunk`
    : `prefill of ${T} tokens`;
  console.log(
    `# ${what} on ${adapterName(gpu)}: ${values.model} shapes, ${cfg.numLayers} layers, ${values.format}, f16 KV, LoRA r 16 on every projection${values.kernels ? `, kernels ${values.kernels}` : ''}`,
  );
  for (const c of chunks) await unit(c); // warm-up: pipelines, the pool
  const times = new Map<number, number[]>(chunks.map((c) => [c, []]));
  const dispatches = new Map<number, number>();
  for (let r = 0; r < rounds; r++) {
    for (const c of r % 2 ? [...chunks].reverse() : chunks) {
      const x = await unit(c);
      times.get(c)!.push(x.ms);
      dispatches.set(c, x.dispatches);
      console.log(
        `round ${r + 1}: ${c}-${train ? 'row MLP' : 'token'} chunks ${x.ms.toFixed(1)} ms, ${x.dispatches} dispatches`,
      );
    }
  }
  const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!;
  const first = med(times.get(chunks[0]!)!);
  console.log('chunk  median ms  tok/s  dispatches  vs first');
  for (const c of chunks) {
    const m = med(times.get(c)!);
    console.log(
      `${String(c).padStart(5)}  ${m.toFixed(1).padStart(9)}  ${((T / m) * 1000).toFixed(0).padStart(5)}  ${String(dispatches.get(c)).padStart(10)}  ${(first / m).toFixed(2)}x`,
    );
  }
  adapter.destroy();
} finally {
  gpu.destroy();
}
