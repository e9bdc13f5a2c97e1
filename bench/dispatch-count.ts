// `npx tsx bench/dispatch-count.ts [--model 4b] [--layers 4] [--format q4] [--r 16]
//   [--train-len 512] [--mlp-chunk 256,512] [--prefill 512] [--chunk 256,1024] [--kernels autoFor=gpu]
//   [--by-kernel]`
// The dispatches of one LoRA training step (a TrainingPass forward and backward of --train-len
// tokens, every layer recomputed, as bench/profile.ts's "LoRA training step" runs it; at each
// --mlp-chunk, TrainingPassOptions.mlpChunk: rows of the MLP's products, the memory plan's in a run,
// src/train/memory.ts mlpChunk) and of one
// prefill (--prefill tokens, the adapter on), at a model's full shapes, counted without running
// them: every gpu.dispatch is encoded with an empty grid, so SwiftShader counts a Qwen3-4B step in
// seconds. The GPU's 'auto' kernel choices by default. Dispatch counts are what this machine can
// measure of the per-dispatch cost a GPU pays (the H100's profiles of 2026-12-06: 10-30 us a
// small dispatch); --by-kernel also lists them by kernel. For a ratio against an earlier commit,
// run this file on both checkouts (`git worktree add /tmp/old <commit>`, copy it into
// /tmp/old/bench). A benchmark, not a test: it asserts nothing.
import '../bin/gpu-env.mjs';
import { parseArgs } from 'node:util';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import { DEFAULT_CHUNK, Qwen3Model } from '../src/model/qwen3.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import * as K from '../src/ops/index.ts';
import { TrainingPass } from '../src/train/trainingPass.ts';
import { DEFAULT_MLP_CHUNK } from '../src/train/trainingPassBytes.ts';
import { crossEntropyLoss } from '../src/train/pgLoss.ts';
import { MODELS, randomWeights, type Format } from './e2e.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: '4b' },
    layers: { type: 'string', default: '4' },
    format: { type: 'string', default: 'q4' },
    r: { type: 'string', default: '16' },
    'train-len': { type: 'string', default: '512' },
    'mlp-chunk': { type: 'string', default: String(DEFAULT_MLP_CHUNK) },
    prefill: { type: 'string', default: '512' },
    chunk: { type: 'string', default: String(DEFAULT_CHUNK) },
    kernels: { type: 'string', default: 'autoFor=gpu' },
    'by-kernel': { type: 'boolean', default: false },
  },
});

const full = MODELS[values.model];
if (!full) throw new Error(`--model: one of ${Object.keys(MODELS).join(', ')}`);
const cfg = { ...full, numLayers: Math.min(full.numLayers, Number(values.layers)) };
const gpu: Gpu = await createGpu();
try {
  Object.assign(K.tuning, K.parseTuning(values.kernels));
  const labels: string[] = [];
  const dispatch = gpu.dispatch.bind(gpu);
  gpu.dispatch = (kernel, buffers, _workgroups, params) => {
    labels.push(kernel.label);
    dispatch(kernel, buffers, 0, params); // encoded with no workgroups: nothing runs
  };
  const { weights } = randomWeights(gpu, cfg, values.format as Format);
  const model = new Qwen3Model(gpu, cfg, weights, { kv: 'f16' });
  const lcfg = loraConfig({ r: Number(values.r), alpha: 2 * Number(values.r) });
  const adapter = new LoraAdapter(gpu, cfg, lcfg);
  adapter.setWeights(initLora(cfg, lcfg, 0));
  const counted: { unit: string; labels: string[] }[] = [];
  const count = async (unit: string, run: () => Promise<void>) => {
    labels.length = 0;
    await run();
    await gpu.sync();
    counted.push({ unit, labels: [...labels] });
  };
  const T = Number(values['train-len']);
  const ids = Array.from({ length: T }, (_, i) => (i * 104729) % cfg.vocabSize);
  for (const mlpChunk of values['mlp-chunk'].split(',').map(Number))
    await count(`LoRA training step, ${T} tokens, MLP in ${mlpChunk}-row chunks`, async () => {
      const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1], null, { mlpChunk });
      pass.backward(crossEntropyLoss(await pass.forward()).dlogp);
      await gpu.sync();
      pass.release();
    });
  const P = Number(values.prefill);
  model.lora = adapter;
  const pos = Array.from({ length: P }, (_, i) => i);
  // Prefill at each --chunk (Qwen3Model.chunk: tokens a pass over the layers; a run takes its
  // memory plan's, src/train/memory.ts forwardChunk).
  for (const chunk of values.chunk.split(',').map(Number)) {
    model.chunk = chunk;
    const cache = model.createCache(1, P);
    await count(`prefill ${P} tokens in ${chunk}-token chunks`, async () => {
      const ids = pos.map((i) => (i * 7919) % cfg.vocabSize);
      gpu.releaseBuffer(model.forward({ ids, slots: pos.map(() => 0), positions: pos, logitRows: [P - 1] }, cache));
    });
    cache.destroy();
  }
  model.lora = null;
  adapter.destroy();
  console.log(
    `# dispatches on ${adapterName(gpu)}: ${values.model} with ${cfg.numLayers} of ${full.numLayers} layers, ${values.format}, LoRA r ${values.r} on all projections, kernels ${values.kernels}`,
  );
  for (const { unit, labels: ls } of counted) {
    console.log(`${unit}: ${ls.length} dispatches`);
    if (!values['by-kernel']) continue;
    const by = new Map<string, number>();
    for (const l of ls) by.set(l, (by.get(l) ?? 0) + 1);
    for (const [l, n] of [...by].sort((a, b) => b[1] - a[1])) console.log(`  ${String(n).padStart(5)}  ${l}`);
  }
} finally {
  gpu.destroy();
}
