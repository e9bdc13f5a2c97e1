// `npx tsx bench/profile.ts [--model 4b] [--layers N] [--weights q4|bf16] [--kv f16|f32] [--ctx N]
//   [--batch B] [--prefill T] [--train-len T] [--steps N] [--parts decode,prefill,train]
//   [--sampling round|nucleus] [--top N] [--kernels name=value,...] [--json FILE]`
// Where the GPU time goes: the real forward and LoRA training step at a model's shapes (random
// weights, bench/e2e.ts), every dispatch timed with timestamp queries (Gpu.startProfile), summed
// per kernel (pipeline label: shader.entry[defines;constants]). Three profiles:
//   decode   --steps decode steps of --batch sequences at context --ctx (LoRA on, sampling included:
//            --sampling round, the default, draws as a SpyRL round does (src/game/config.ts
//            DEFAULT_CONFIG.sampling: temperature 1, no top-k or top-p, which training requires);
//            nucleus as Qwen3's chat recommendation (temperature 0.7, top-k 20, top-p 0.8: the
//            profiles of 2026-12-04 and 2026-12-06 in bench/results, whose sampling took the
//            top-k and top-p passes a round never takes)
//   prefill  one prompt of --prefill tokens (LoRA on, logits of its last token)
//   train    one LoRA training step over --train-len tokens (forward, loss, backward)
// Each prints a table (kernel, calls, GPU ms, share of the profile, us per call) per step or pass,
// plus the wall time of the same work unprofiled. --parts picks which run (all three by default). Defaults: on a GPU Qwen3-4B with 4 of 36 layers,
// q4, f16 KV, ctx 2048, B 4, prefill 512, train 512; on a CPU adapter 1 layer, ctx 128, B 1,
// prefill 32, train 16. --kernels sets kernel switches as the CLI's does (e.g. gemmSplitK=off for
// an A/B). Needs timestamp-query. A measurement tool: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu, type Gpu, type KernelTime } from '../src/gpu/index.ts';
import { Qwen3Model } from '../src/model/qwen3.ts';
import { LoraAdapter } from '../src/model/lora.ts';
import { initLora, loraConfig } from '../src/model/peft.ts';
import * as K from '../src/ops/index.ts';
import { TrainingPass } from '../src/train/trainingPass.ts';
import { crossEntropyLoss } from '../src/train/pgLoss.ts';
import { MODELS, randomWeights, type Format } from './e2e.ts';
import { adapterName } from './suite.ts';
import { DEFAULT_CONFIG } from '../src/game/config.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: '4b' },
    layers: { type: 'string' },
    weights: { type: 'string', default: 'q4' },
    kv: { type: 'string', default: 'f16' },
    ctx: { type: 'string' },
    batch: { type: 'string' },
    prefill: { type: 'string' },
    'train-len': { type: 'string' },
    steps: { type: 'string', default: '4' },
    parts: { type: 'string', default: 'decode,prefill,train' },
    sampling: { type: 'string', default: 'round' },
    top: { type: 'string', default: '25' },
    kernels: { type: 'string', default: '' },
    json: { type: 'string' },
  },
});

interface ProfileReport {
  name: string;
  /** What one unit is (a decode step, the prefill, the training step) and how many ran. */
  units: number;
  wallSeconds: number;
  kernels: KernelTime[];
}

function printProfile(r: ProfileReport, top: number): void {
  const total = r.kernels.reduce((s, k) => s + k.seconds, 0);
  const per = (x: number) => (x / r.units) * 1000;
  console.log(
    `\n## ${r.name}: GPU ${per(total).toFixed(2)} ms in ${r.kernels.reduce((s, k) => s + k.calls, 0) / r.units} dispatches` +
      ` per unit; unprofiled wall ${per(r.wallSeconds).toFixed(2)} ms per unit`,
  );
  console.log(
    `${'kernel'.padEnd(78)} ${'calls'.padStart(6)} ${'ms'.padStart(9)} ${'share'.padStart(6)} ${'us/call'.padStart(9)}`,
  );
  for (const k of r.kernels.slice(0, top)) {
    console.log(
      `${k.label.slice(0, 78).padEnd(78)} ${String(k.calls / r.units).padStart(6)} ${per(k.seconds).toFixed(3).padStart(9)} ` +
        `${((100 * k.seconds) / total).toFixed(1).padStart(5)}% ${((k.seconds / k.calls) * 1e6).toFixed(1).padStart(9)}`,
    );
  }
  if (r.kernels.length > top) console.log(`(+${r.kernels.length - top} more kernels)`);
}

/** Runs `work` once unprofiled (timed on the wall clock) and once profiled. */
async function profile(gpu: Gpu, name: string, units: number, work: () => Promise<void>): Promise<ProfileReport> {
  await work(); // warm-up: pipelines compiled, pool filled
  await gpu.sync();
  const t0 = performance.now();
  await work();
  await gpu.sync();
  const wallSeconds = (performance.now() - t0) / 1000;
  gpu.startProfile();
  let kernels: KernelTime[];
  try {
    await work();
  } finally {
    kernels = await gpu.stopProfile();
  }
  return { name, units, wallSeconds, kernels };
}

const gpu = await createGpu();
try {
  Object.assign(K.tuning, K.parseTuning(values.kernels));
  const cpu = K.isCpuAdapter(gpu);
  const full = MODELS[values.model];
  if (!full) throw new Error(`--model: one of ${Object.keys(MODELS).join(', ')}`);
  const num = (v: string | undefined, gpuDefault: number, cpuDefault: number) =>
    v === undefined ? (cpu ? cpuDefault : gpuDefault) : Number(v);
  const L = Math.min(full.numLayers, num(values.layers, 4, 1));
  const c = { ...full, numLayers: L };
  const ctx = num(values.ctx, 2048, 128);
  const B = num(values.batch, 4, 1);
  const P = num(values.prefill, 512, 32);
  const TT = num(values['train-len'], 512, 16);
  const steps = Number(values.steps);
  const PARTS = ['decode', 'prefill', 'train'] as const;
  const parts = new Set(values.parts.split(',').map((x) => x.trim()));
  for (const x of parts)
    if (!(PARTS as readonly string[]).includes(x)) throw new Error(`--parts: '${x}' is not one of ${PARTS.join(', ')}`);
  const SAMPLING = { round: DEFAULT_CONFIG.sampling, nucleus: { temperature: 0.7, topK: 20, topP: 0.8 } };
  const sampling = SAMPLING[values.sampling as keyof typeof SAMPLING];
  if (!sampling) throw new Error(`--sampling: '${values.sampling}' is not one of ${Object.keys(SAMPLING).join(', ')}`);
  const format = values.weights as Format;
  const kv = values.kv === 'f32' ? 'f32' : 'f16';
  console.log(
    `# ${adapterName(gpu)}; ${values.model} with ${L} of ${full.numLayers} layers, ${format} weights, ${kv} KV, LoRA r 16 on all projections${values.kernels ? `; kernels ${values.kernels}` : ''}`,
  );
  if (cpu) console.log('# a CPU emulation of a GPU: its timings say nothing about a real GPU.');
  const { weights, buffers } = randomWeights(gpu, c, format);
  const model = new Qwen3Model(gpu, c, weights, { kv });
  const lcfg = loraConfig({ r: 16, alpha: 32 });
  const adapter = new LoraAdapter(gpu, c, lcfg);
  adapter.setWeights(initLora(c, lcfg, 0));
  model.lora = adapter;
  const reports: ProfileReport[] = [];
  try {
    if (parts.has('decode')) {
      // Decode: B slots share slot 0's prompt of ctx tokens, then steps of one token each.
      const cache = model.createCache(B, ctx + 2 * steps + 2);
      const pos = Array.from({ length: ctx }, (_, i) => i);
      gpu.releaseBuffer(
        model.forward(
          { ids: pos.map((i) => (i * 7919) % c.vocabSize), slots: pos.map(() => 0), positions: pos, logitRows: [] },
          cache,
        ),
      );
      for (let b = 1; b < B; b++) {
        const shared = cache.share(b, 0, ctx);
        const tail = pos.slice(shared);
        if (tail.length)
          gpu.releaseBuffer(
            model.forward(
              { ids: tail.map((i) => i + 1), slots: tail.map(() => b), positions: tail, logitRows: [] },
              cache,
            ),
          );
      }
      const slots = Array.from({ length: B }, (_, b) => b);
      const sampled = gpu.createBuffer(B * 4, 'ids');
      let at = ctx;
      reports.push(
        await profile(
          gpu,
          `decode B=${B} @ctx ${ctx} (${steps} steps, ${values.sampling} sampling)`,
          steps,
          async () => {
            at = ctx; // the same positions each run: the cache rows are rewritten
            for (let s = 0; s < steps; s++, at++) {
              const logits = model.forward(
                { ids: slots.map((b) => b + 1), slots, positions: slots.map(() => at), logitRows: slots },
                cache,
              );
              K.sample(gpu, sampled, logits, B, c.vocabSize, sampling, 0, s);
              gpu.releaseBuffer(logits);
            }
          },
        ),
      );
      gpu.releaseBuffer(sampled);
      cache.destroy();
    }
    if (parts.has('prefill')) {
      const pcache = model.createCache(1, P);
      const ppos = Array.from({ length: P }, (_, i) => i);
      reports.push(
        await profile(gpu, `prefill ${P} tokens`, 1, async () => {
          gpu.releaseBuffer(
            model.forward(
              {
                ids: ppos.map((i) => (i * 7919) % c.vocabSize),
                slots: ppos.map(() => 0),
                positions: ppos,
                logitRows: [P - 1],
              },
              pcache,
            ),
          );
        }),
      );
      pcache.destroy();
    }
    if (parts.has('train')) {
      model.lora = null;
      const ids = Array.from({ length: TT }, (_, i) => (i * 104729) % c.vocabSize);
      reports.push(
        await profile(gpu, `LoRA training step, ${TT} tokens`, 1, async () => {
          const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1]);
          pass.backward(crossEntropyLoss(await pass.forward()).dlogp);
          await gpu.sync();
          pass.release();
        }),
      );
    }
  } finally {
    model.lora = null;
    adapter.destroy();
    for (const b of new Set(buffers)) gpu.releaseBuffer(b);
  }
  for (const r of reports) printProfile(r, Number(values.top));
  if (values.json) writeFileSync(values.json, JSON.stringify({ adapter: adapterName(gpu), reports }, null, 2));
} finally {
  gpu.destroy();
}
