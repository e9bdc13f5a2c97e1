// `npx tsx bench/keep-ab.ts [--reps 3] [--shape tiny|small|4b] [--layers 4] [--weights bf16|q4]
//  [--tokens 16] [--checkpoints bf16|f16|f32]`
// Kept layers (TrainingPassOptions.keepLayers) side by side: one LoRA training step (forward,
// cross-entropy over every next token, backward) over the same random tokens, recomputing every
// layer in the backward (keep 0) or keeping every layer's activations (keep L), alternated A B A B
// so that drift in the machine's load hits both; rep -1 warms both up (pipelines, the pool) and is
// not counted. Per side the step's milliseconds, the layer-product FLOPs it ran (3 or 2 passes of
// the layers' matmuls + the LM head twice on every target row) and the pass's planned peak bytes;
// then the ratio of the median times (> 1: keeping is faster). Shapes as bench/pack-ab.ts: 'tiny'
// (hidden 64, 2 layers), 'small' (hidden 256, 4 layers), '4b' (Qwen3-4B's layers, --layers of its
// 36), all with the real 151,936-token vocabulary and random weights. A benchmark, not a test:
// nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import { Qwen3Model } from '../src/model/qwen3.ts';
import { crossEntropyLoss } from '../src/train/pgLoss.ts';
import { TrainingPass, type CheckpointDtype } from '../src/train/trainingPass.ts';
import { abModel, randomWeights, tokenFlops } from './e2e.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '3' },
    shape: { type: 'string', default: 'small' },
    layers: { type: 'string', default: '4' },
    weights: { type: 'string', default: 'bf16' },
    tokens: { type: 'string', default: '16' },
    checkpoints: { type: 'string', default: 'bf16' },
  },
});
const { cfg, format } = abModel(values.shape, values.layers, values.weights);
const checkpoints = values.checkpoints as CheckpointDtype;
if (!['bf16', 'f16', 'f32'].includes(checkpoints))
  throw new Error(`--checkpoints must be bf16, f16 or f32 (got "${values.checkpoints}")`);
const reps = Number(values.reps);
const T = Number(values.tokens);
if (!(Number.isInteger(reps) && reps >= 1))
  throw new Error(`--reps must be a whole number >= 1 (got "${values.reps}")`);
if (!(Number.isInteger(T) && T >= 2)) throw new Error(`--tokens must be a whole number >= 2 (got "${values.tokens}")`);

const gpu = await createGpu();
const { weights } = randomWeights(gpu, cfg, format);
const model = new Qwen3Model(gpu, cfg, weights);
const lcfg = loraConfig({ r: 16, alpha: 32 });
const adapter = new LoraAdapter(gpu, cfg, lcfg);
adapter.setWeights(initLora(cfg, lcfg, 0));
const ids = Array.from({ length: T }, (_, i) => (i * 104729) % cfg.vocabSize);
const L = cfg.numLayers;
console.log(
  `# ${adapterName(gpu)}; ${values.shape} (hidden ${cfg.hiddenSize}, ${L} layers, ${format}), T = ${T}, LoRA r 16 on all 7, ${checkpoints} checkpoints`,
);

/** FLOPs of one step: the layers' products `runs` times over T tokens, the LM head twice on T - 1 rows. */
function stepFlops(runs: number): number {
  let f = 0;
  for (let t = 0; t < T; t++) f += runs * tokenFlops(cfg, t + 1, false);
  return f + 2 * 2 * (T - 1) * cfg.vocabSize * cfg.hiddenSize;
}

async function step(keepLayers: number): Promise<{ ms: number; peak: number }> {
  adapter.zeroGrad();
  const t0 = performance.now();
  const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1], null, { checkpoints, keepLayers });
  pass.backward(crossEntropyLoss(await pass.forward()).dlogp);
  await gpu.sync();
  const ms = performance.now() - t0;
  const peak = pass.bytes.peak;
  pass.release();
  return { ms, peak };
}

const sides = [
  { name: 'recompute', keep: 0, runs: 3, ms: [] as number[], peak: 0 },
  { name: 'keep all', keep: L, runs: 2, ms: [] as number[], peak: 0 },
];
for (let r = -1; r < reps; r++) {
  for (const side of r % 2 === 0 ? sides : [...sides].reverse()) {
    const { ms, peak } = await step(side.keep);
    side.peak = peak;
    if (r >= 0) side.ms.push(ms);
    console.log(`${side.name.padEnd(9)} ${r < 0 ? 'warm-up' : `rep ${r}`}: ${ms.toFixed(0)} ms`);
  }
}
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
console.log(`\n| side | step ms (median of ${reps}) | GFLOP | GFLOP/s | pass peak MiB |\n|---|---|---|---|---|`);
for (const s of sides) {
  const m = median(s.ms);
  const g = stepFlops(s.runs) / 1e9;
  console.log(
    `| ${s.name} | ${m.toFixed(0)} | ${g.toFixed(1)} | ${(g / (m / 1000)).toFixed(2)} | ${(s.peak / 2 ** 20).toFixed(1)} |`,
  );
}
const [a, b] = sides.map((s) => median(s.ms));
console.log(`\nrecompute / keep all: ${(a! / b!).toFixed(2)}x (> 1: keeping is faster)`);
adapter.destroy();
gpu.destroy();
process.exit(0);
