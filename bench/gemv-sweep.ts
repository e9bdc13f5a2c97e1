// `npx tsx bench/gemv-sweep.ts [--model 4b] [--layers 4] [--weights q4|bf16] [--batch 1,4]
//   [--lanes auto,4,8,16] [--cols auto,1,2,4] [--ops qkv,o,gateup,down,head] [--rounds 3] [--ms 4]
//   [--json FILE]`
// The decode GEMV's layouts swept at a model's decode shapes in one run, so that one short device
// session ranks them all: every pair of tuning.gemvLanes (staged lanes a column) and
// tuning.gemvCols (columns a thread, shaders/gemv.wgsl CPT) over the products a decode step
// issues, called as the model calls them (src/model/qwen3.ts): q/k/v and gate/up as one group
// dispatch each with the RMSNorm folded in, o_proj with its LoRA B product in the store, down_proj
// with the SwiGLU formed as x is staged and its LoRA B product, and the LM head.
// Each measurement is `reps` calls over the --layers layers' own weights in turn (4 layers of
// Qwen3-4B q4: 200 MB, past a 50 MB L2, as a decode step reads them), recorded into one command
// buffer and timed on the wall clock to its completion, so it carries the barriers between
// dispatches that a decode step pays and not a pass per dispatch as bench/profile.ts does; `reps` is
// set from a first timing so that one measurement takes about --ms of GPU time. The configurations
// alternate round by round (A B C ... A B C) so that drift hits all. Prints per product and
// batch the median us a call, GB/s of its weights and the fraction of the copy rate measured in
// the same run (bench/roofline.ts), the kernel each took (LANES, COLS, CPT), the fastest, and the
// rows whose kernel is the one 'auto' takes (bench/device-report.ts sets them side by side).
// The GPU's 'auto' kernel choices on any adapter (tuning.autoFor = 'gpu'); on a CPU adapter
// (SwiftShader) these are CPU timings of GPU kernels (use --model tiny there). A
// benchmark, not a test: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import * as K from '../src/ops/index.ts';
import { MODELS, randomWeights, type Format } from './e2e.ts';
import { measureRoofline, ROOFLINE_SIZES } from './roofline.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    model: { type: 'string', default: '4b' },
    layers: { type: 'string', default: '4' },
    weights: { type: 'string', default: 'q4' },
    batch: { type: 'string', default: '1,4' },
    lanes: { type: 'string', default: 'auto,4,8,16' },
    cols: { type: 'string', default: 'auto,1,2,4' },
    ops: { type: 'string', default: 'qkv,o,gateup,down,head' },
    rounds: { type: 'string', default: '3' },
    ms: { type: 'string', default: '4' },
    json: { type: 'string' },
  },
});

type Lanes = K.Tuning['gemvLanes'];
type Cols = K.Tuning['gemvCols'];
const OPS = ['qkv', 'o', 'gateup', 'down', 'head'] as const;
type Op = (typeof OPS)[number];

function list<T extends string>(flag: string, text: string, allowed: readonly T[]): T[] {
  const items = text.split(',').map((s) => s.trim());
  for (const s of items)
    if (!allowed.includes(s as T)) throw new RangeError(`--${flag}: "${s}" is not one of ${allowed.join(', ')}`);
  return items as T[];
}

const base = MODELS[values.model];
if (!base) throw new RangeError(`--model: one of ${Object.keys(MODELS).join(', ')}`);
const format = values.weights as Format;
if (format !== 'q4' && format !== 'bf16') throw new RangeError('--weights: q4 or bf16');
const layers = Number(values.layers);
if (!Number.isInteger(layers) || layers < 1) throw new RangeError('--layers: a positive integer');
const batches = values.batch.split(',').map(Number);
if (batches.some((b) => !Number.isInteger(b) || b < 1 || b > K.GEMV_MAX_T))
  throw new RangeError(`--batch: integers 1..${K.GEMV_MAX_T}`);
const lanesList = list('lanes', values.lanes, K.TUNING_CHOICES.gemvLanes);
const colsList = list('cols', values.cols, K.TUNING_CHOICES.gemvCols);
const ops = list('ops', values.ops, OPS);
const rounds = Number(values.rounds);
const targetSeconds = Number(values.ms) / 1000;

const cfg = { ...base, numLayers: layers };
const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, vocabSize: V } = cfg;
const R = 16; // LoRA rank of the o_proj and down_proj epilogues
const EPS = cfg.rmsNormEps;

const weightBytes = (w: K.Weight, N: number, Kd: number) =>
  typeof w === 'object' && 'format' in w ? K.q4Words(N, Kd) * 4 : N * Kd * 2;

interface Result {
  op: Op;
  batch: number;
  lanes: Lanes;
  cols: Cols;
  kernel: string;
  seconds: number[]; // per call, one per round
  bytes: number; // weight bytes a call
}

const gpu: Gpu = await createGpu();
try {
  // The kernels a GPU's 'auto' takes, on any adapter (a CPU adapter's 'auto' would run gemv_rows).
  K.tuning.autoFor = 'gpu';
  const { roofline } = await measureRoofline(gpu, ROOFLINE_SIZES[K.isCpuAdapter(gpu) ? 'quick' : 'full'], 0.2);
  console.log(
    `${adapterName(gpu)}; ${values.model} ${format}, ${layers} layers' weights in turn; copy ${roofline.copyGBs.toFixed(0)} GB/s; subgroups ${gpu.features.subgroups}`,
  );
  const { weights } = randomWeights(gpu, cfg, format);
  const maxT = Math.max(...batches);
  const f32 = (n: number, label: string) => {
    const buf = gpu.createBuffer(n * 4, label);
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) v[i] = Math.sin(i * 0.37) * 0.5;
    gpu.write(buf, v);
    return buf;
  };
  const x = f32(maxT * C, 'x');
  const attn = f32(maxT * NH * HD, 'attn');
  const gate = f32(maxT * I, 'gate');
  const up = f32(maxT * I, 'up');
  const u = f32(maxT * R, 'lora.u');
  const bO = f32(C * R, 'lora.B.o');
  const bDown = f32(C * R, 'lora.B.down');
  const q = gpu.createBuffer(maxT * NH * HD * 4, 'q');
  const k = gpu.createBuffer(maxT * NKV * HD * 4, 'k');
  const v = gpu.createBuffer(maxT * NKV * HD * 4, 'v');
  const out = gpu.createBuffer(maxT * C * 4, 'out');
  const g = gpu.createBuffer(maxT * I * 4, 'g');
  const uo = gpu.createBuffer(maxT * I * 4, 'u');
  const logits = gpu.createBuffer(maxT * V * 4, 'logits');

  /** One call of `op` at batch T over layer l's weights; its weight bytes. */
  const call = (op: Op, T: number, l: number): number => {
    const L = weights.layers[l]!;
    switch (op) {
      case 'qkv':
        K.matmulGroup(gpu, [q, k, v], x, [L.qProj, L.kProj, L.vProj], T, [NH * HD, NKV * HD, NKV * HD], C, {
          w: L.inputNorm,
          eps: EPS,
        });
        return weightBytes(L.qProj, NH * HD, C) + 2 * weightBytes(L.kProj, NKV * HD, C);
      case 'o':
        K.matmul(gpu, out, attn, L.oProj, T, C, NH * HD, true, { u, B: bO, r: R, scale: 2 });
        return weightBytes(L.oProj, C, NH * HD);
      case 'gateup':
        K.matmulGroup(gpu, [g, uo], x, [L.gateProj, L.upProj], T, [I, I], C, { w: L.postNorm, eps: EPS });
        return 2 * weightBytes(L.gateProj, I, C);
      case 'down':
        K.matmul(gpu, out, gate, L.downProj, T, C, I, true, { u, B: bDown, r: R, scale: 2 }, up);
        return weightBytes(L.downProj, C, I);
      case 'head':
        K.matmul(gpu, logits, x, weights.lmHead, T, V, C);
        return weightBytes(weights.lmHead, V, C);
    }
  };
  const kernelOf = (op: Op) => {
    const name = op === 'qkv' || op === 'gateup' ? 'matmulGroup' : op === 'head' ? 'matmul' : 'matmulLora';
    return K.kernelVariant(gpu, name)?.label ?? '?';
  };
  /** Seconds a call of `op` at batch T: `reps` calls, each over the next layer's weights. */
  const timeCalls = async (op: Op, T: number, reps: number): Promise<number> => {
    await gpu.sync();
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) call(op, T, (op === 'head' ? 0 : i) % layers);
    await gpu.sync();
    return (performance.now() - t0) / 1000 / reps;
  };

  const configs = lanesList.flatMap((lanes) => colsList.map((cols) => ({ lanes, cols })));
  const results: Result[] = [];
  for (const op of ops)
    for (const T of batches) {
      const rows: Result[] = [];
      const repsOf = new Map<string, number>();
      // The kernel 'auto' takes here: its rows are marked.
      K.tuning.gemvLanes = 'auto';
      K.tuning.gemvCols = 'auto';
      call(op, T, 0);
      await gpu.sync();
      const autoKernel = kernelOf(op);
      for (let round = 0; round < rounds; round++)
        for (const c of configs) {
          K.tuning.gemvLanes = c.lanes;
          K.tuning.gemvCols = c.cols;
          const key = `${c.lanes}/${c.cols}`;
          let reps = repsOf.get(key);
          if (reps === undefined) {
            await timeCalls(op, T, 1); // compile and warm up
            const first = await timeCalls(op, T, 4);
            reps = Math.max(4, Math.min(400, Math.round(targetSeconds / first)));
            repsOf.set(key, reps);
          }
          const s = await timeCalls(op, T, reps);
          let r = rows.find((x) => x.lanes === c.lanes && x.cols === c.cols);
          if (!r) {
            const bytes = call(op, T, 0);
            await gpu.sync();
            r = { op, batch: T, lanes: c.lanes, cols: c.cols, kernel: kernelOf(op), seconds: [], bytes };
            rows.push(r);
          }
          r.seconds.push(s);
        }
      const median = (xs: number[]) => {
        const s = [...xs].sort((a, b) => a - b);
        return (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2;
      };
      console.log(`\n## ${op} B=${T} (${(rows[0]!.bytes / 2 ** 20).toFixed(1)} MiB of weights a call)`);
      console.log(
        `${'lanes'.padEnd(6)}${'cols'.padEnd(6)}${'us/call'.padStart(9)}${'GB/s'.padStart(8)}${'%copy'.padStart(7)}  kernel`,
      );
      const best = Math.min(...rows.map((r) => median(r.seconds)));
      for (const r of rows) {
        const m = median(r.seconds);
        const gbs = r.bytes / m / 1e9;
        console.log(
          `${r.lanes.padEnd(6)}${r.cols.padEnd(6)}${(m * 1e6).toFixed(1).padStart(9)}${gbs.toFixed(gbs < 10 ? 2 : 0).padStart(8)}` +
            `${((100 * gbs) / roofline.copyGBs).toFixed(1).padStart(6)}%  ${r.kernel}${m === best ? '  <- fastest' : ''}` +
            `${r.kernel === autoKernel ? "  <- 'auto'" : ''}`,
        );
      }
      results.push(...rows);
    }
  if (values.json) {
    writeFileSync(
      values.json,
      JSON.stringify(
        { adapter: adapterName(gpu), model: values.model, weights: format, layers, roofline, results },
        null,
        2,
      ),
    );
    console.log(`\nreport written to ${values.json}`);
  }
} finally {
  K.tuning.gemvLanes = 'auto';
  K.tuning.gemvCols = 'auto';
  K.tuning.autoFor = 'auto';
  gpu.destroy();
}
