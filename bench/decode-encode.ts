// `npx tsx bench/decode-encode.ts [--layers 36] [--batch 4] [--steps 12] [--format q4] [--r 16]
//   [--kernels autoFor=gpu] [--stub-dawn] [--labels] [--json FILE]`
// The CPU side of a decode step: the time to encode one step (Qwen3Model.forward with a LoRA
// adapter, then K.sample, as a rollout runs them) with no GPU wait in it, and per step the
// dispatches, the bind groups made and the submits. Qwen3-4B's depth (36 layers) with narrow
// layers, so the GPU work of a step stays small on SwiftShader while the encoding, which depends
// on the dispatches and not on their sizes, is that of the full model. The GPU's 'auto' kernel
// choices by default (what a rollout on a GPU encodes). Each step is followed by a sync, as a
// rollout that reads its sampled ids does, and only the encoding is timed.
// --stub-dawn: after the 2 warm-up steps the compute pass's setPipeline, setBindGroup and
// dispatchWorkgroups become no-ops, so the time is that of our JavaScript alone (the op wrappers,
// the kernel and bind-group lookups, the params), without Dawn's validation and recording, which on
// this machine's SwiftShader shares the 2 cores with the rasterizer's threads and varies run to run.
// The GPU then runs empty passes; the numbers it returns are not used.
// --labels: also prints the kernels of the last step in order (one line a kernel, with a count where
// it repeats in a row), the list to read a layer's dispatches from.
// For a ratio against an earlier commit, run this file on both checkouts in one sitting
// (`git worktree add /tmp/old <commit>`, copy this file into /tmp/old/bench, alternate the runs).
// A benchmark, not a test: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import { Qwen3Model } from '../src/model/qwen3.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import * as K from '../src/ops/index.ts';
import { parseTuning, resetTuning } from '../src/ops/common.ts';
import { TINY, randomWeights, type Format } from './e2e.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    layers: { type: 'string', default: '36' },
    batch: { type: 'string', default: '4' },
    steps: { type: 'string', default: '12' },
    format: { type: 'string', default: 'q4' },
    r: { type: 'string', default: '16' },
    kernels: { type: 'string', default: 'autoFor=gpu' },
    'stub-dawn': { type: 'boolean', default: false },
    labels: { type: 'boolean', default: false },
    json: { type: 'string' },
  },
});
const L = Number(values.layers),
  B = Number(values.batch),
  steps = Number(values.steps),
  r = Number(values.r);
const format = values.format as Format;
resetTuning(parseTuning(values.kernels));
const gpu = await createGpu();
const c = { ...TINY, numLayers: L };
const { weights } = randomWeights(gpu, c, format);
const model = new Qwen3Model(gpu, c, weights, { kv: 'f16' });
const lcfg = loraConfig({ r, alpha: 2 * r });
const adapter = new LoraAdapter(gpu, c, lcfg);
adapter.setWeights(initLora(c, lcfg, 0));
model.lora = adapter;
const P = 8; // prompt tokens per sequence, prefilled first
const cache = model.createCache(B, P + steps + 2);
const sampled = gpu.createBuffer(B * 4, 'sampled');
const slots = Array.from({ length: B }, (_, b) => b);
const pre = model.forward(
  {
    ids: Array.from({ length: B * P }, (_, i) => (i * 7919) % c.vocabSize),
    slots: Array.from({ length: B * P }, (_, i) => Math.floor(i / P)),
    positions: Array.from({ length: B * P }, (_, i) => i % P),
    logitRows: slots.map((b) => b * P + P - 1),
  },
  cache,
);
const sampling = { temperature: 0.7, topK: 20, topP: 0.8 };
K.sample(gpu, sampled, pre, B, c.vocabSize, sampling, 1, 0);
await gpu.sync();
gpu.releaseBuffer(pre);

const WARM_UP = 2; // steps left out of the medians: the first meet new buffer sizes
const stubDawn = values['stub-dawn'];
/** Makes the compute pass's encode calls no-ops (--stub-dawn). */
function stubPassCalls(): void {
  const enc = gpu.device.createCommandEncoder();
  const pass = enc.beginComputePass();
  const proto = Object.getPrototypeOf(pass) as GPUComputePassEncoder;
  pass.end();
  enc.finish();
  const none = () => {};
  Object.assign(proto, { setPipeline: none, setBindGroup: none, dispatchWorkgroups: none });
}
/** The kernels dispatched in the current step (--labels). */
let stepLabels: string[] = [];
if (values.labels) {
  const dispatch = gpu.dispatch.bind(gpu);
  gpu.dispatch = (kernel, ...rest) => {
    stepLabels.push(kernel.label);
    dispatch(kernel, ...rest);
  };
}
const rows: { encodeMs: number; dispatches: number; bindGroups: number; submits: number }[] = [];
for (let s = 0; s < steps; s++) {
  if (stubDawn && s === WARM_UP) stubPassCalls();
  const d0 = gpu.dispatchCount,
    b0 = gpu.bindGroupCount,
    s0 = gpu.submitCount;
  stepLabels = [];
  const t0 = performance.now();
  const logits = model.forward(
    { ids: { buffer: sampled, rows: slots }, slots, positions: slots.map(() => P + s), logitRows: slots },
    cache,
  );
  K.sample(gpu, sampled, logits, B, c.vocabSize, sampling, 1, s + 1);
  const encodeMs = performance.now() - t0;
  rows.push({
    encodeMs,
    dispatches: gpu.dispatchCount - d0,
    bindGroups: gpu.bindGroupCount - b0,
    submits: gpu.submitCount - s0,
  });
  await gpu.sync();
  gpu.releaseBuffer(logits);
}
const warm = rows.slice(WARM_UP);
const median = (x: number[]) => [...x].sort((a, b) => a - b)[Math.floor(x.length / 2)]!;
const enc = median(warm.map((x) => x.encodeMs));
const summary = {
  adapter: adapterName(gpu),
  layers: L,
  batch: B,
  format,
  loraR: r,
  kernels: values.kernels,
  stubDawn,
  steps: warm.length,
  encodeMsMedian: enc,
  encodeMsMin: Math.min(...warm.map((x) => x.encodeMs)),
  dispatchesPerStep: median(warm.map((x) => x.dispatches)),
  bindGroupsPerStep: median(warm.map((x) => x.bindGroups)),
  submitsPerStep: median(warm.map((x) => x.submits)),
  usPerDispatch: (1000 * enc) / median(warm.map((x) => x.dispatches)),
};
console.log(
  `# decode-step encoding on ${summary.adapter}: ${L} layers, B=${B}, ${format}, LoRA r=${r}, ${values.kernels}${stubDawn ? ", Dawn's pass calls stubbed after the warm-up (our JavaScript alone)" : ''}`,
);
console.log('step  encode ms  dispatches  bind groups  submits');
rows.forEach((x, i) =>
  console.log(
    `${String(i).padStart(4)}  ${x.encodeMs.toFixed(2).padStart(9)}  ${String(x.dispatches).padStart(10)}  ${String(x.bindGroups).padStart(11)}  ${String(x.submits).padStart(7)}${i < WARM_UP ? '  (warm-up)' : ''}`,
  ),
);
console.log(
  `median of the warm steps: ${enc.toFixed(2)} ms to encode a step (${summary.usPerDispatch.toFixed(1)} us a dispatch), ${summary.bindGroupsPerStep} bind groups and ${summary.submitsPerStep} submits inside a step`,
);
if (values.labels) {
  console.log(`kernels of the last step (${stepLabels.length} dispatches):`);
  for (let i = 0; i < stepLabels.length;) {
    let j = i + 1;
    while (j < stepLabels.length && stepLabels[j] === stepLabels[i]) j++;
    console.log(`${j - i > 1 ? `${j - i}x `.padStart(5) : '     '}${stepLabels[i]}`);
    i = j;
  }
}
if (values.json) writeFileSync(values.json, JSON.stringify(summary, null, 2));
cache.destroy();
gpu.destroy();
