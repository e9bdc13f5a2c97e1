// The benchmark suite, one entry for Node (bench/run.ts) and the browser (bench/browser.ts):
// the measured roofline, the per-op microbenchmarks, then the models end to end, every figure
// as a fraction of the roofline. Options come from CLI flags or URL parameters, by the same names.
// Browser-safe: no node: imports.
import type { Gpu } from '../src/gpu/index.ts';
import { isCpuAdapter, parseTuning, tuning, tuningProblem } from '../src/ops/index.ts';
import { MODELS, benchModel, type Format, type ModelBenchOptions } from './e2e.ts';
import { applyRoofline, formatTable, type BenchRecord, type BenchReport } from './measure.ts';
import { OP_NAMES, OP_SHAPES, benchOps, type OpName } from './ops.ts';
import { ROOFLINE_SIZES, measureRoofline } from './roofline.ts';

/** 'round' (one SpyRL round by stage) runs in Node only: bench/run.ts. */
export const PARTS = ['roofline', 'ops', 'e2e', 'round'] as const;
export type Part = (typeof PARTS)[number];

/** The model benchmark's shape options, plus what to run and which formats side by side. */
export interface SuiteOptions extends Pick<ModelBenchOptions, 'prompts' | 'decode' | 'batches' | 'trainLen' | 'loraR'> {
  /** Layer counts the e2e models (and rounds) run with, each in turn; undefined: the default. */
  layers: number[] | undefined;
  mode: 'quick' | 'full';
  parts: Part[];
  ops: OpName[];
  models: string[];
  weights: Format[];
  kv: ModelBenchOptions['kv'][];
  /** Rounds of --parts round; the last one is split by stage. */
  rounds: number;
  /** --gpu-memory in bytes: the rounds' memory budget (kept layers fill it); undefined: none. */
  gpuMemoryBytes: number | undefined;
  /** --kernels: kernel switches (`name=value,...`, the CLI's --kernels) for the whole run; '': the defaults. */
  kernels: string;
  /** --prefill-chunk: tokens per prefill chunk of the rounds (`spyrl train --prefill-chunk`); undefined: the plan's 'auto'. */
  prefillChunk: number | undefined;
  /** --mlp-chunk: rows of the rounds' update MLP chunks (`spyrl train --mlp-chunk`); undefined: the plan's 'auto'. */
  mlpChunk: number | undefined;
}

/** The flags (CLI `--name value`, URL `?name=value`) and what they default to. */
export const SUITE_FLAGS = {
  quick: 'cut shapes (the default on CPU adapters such as SwiftShader)',
  full: 'Qwen3-4B shapes for every op even on a CPU adapter',
  parts: `what to run: ${PARTS.join(',')} (default roofline,ops,e2e; round: Node only)`,
  ops: `op benchmarks: ${OP_NAMES.join(',')}, all or none (default all)`,
  model: `end-to-end models: ${Object.keys(MODELS).join(',')}, all or none (default tiny,4b; quick: tiny)`,
  weights: 'e2e weights bf16,q4 (default both; quick: bf16)',
  kv: 'KV cache f32,f16 (default f32)',
  layers:
    'layers of each e2e model and round, or a list run in turn (e.g. 4,36; default all; 1 for non-tiny models on a CPU adapter)',
  prompt: 'e2e contexts: prefill tokens, then decode at that context (default 128,2048; quick: 128)',
  decode: 'decode steps timed (default 16)',
  batch: 'decode batch sizes (default 1,4)',
  'train-len': 'LoRA training tokens (default 512; quick: 16)',
  'lora-r': 'LoRA rank (default 16)',
  rounds:
    'SpyRL rounds of --parts round: the last is split by stage, the ones before it warm up (pipeline compiles) and print their totals (default 2; quick: 1)',
  'gpu-memory':
    "GiB of GPU memory a round's memory plan may fill, as `spyrl train --gpu-memory`: its update keeps the layers' activations that fit (default: none, the adapter's limits only)",
  kernels:
    "kernel switches for the whole run, as `spyrl --kernels` (name=value,...; e.g. the 'auto' choices before a change, for an A/B in one run; default: none)",
  'prefill-chunk':
    "tokens per prefill chunk of --parts round, as `spyrl train --prefill-chunk` (default auto: the memory plan's largest that adds nothing at the round's peak)",
  'mlp-chunk':
    "rows of the update's MLP chunks in --parts round, as `spyrl train --mlp-chunk` (default auto: the memory plan's largest that adds nothing at the peak, or fits what --gpu-memory leaves after the kept layers)",
} as const;

type FlagValues = Readonly<Record<string, string | boolean | undefined>>;

function list<T extends string>(flag: string, value: string, allowed: readonly T[], all: readonly T[] = allowed): T[] {
  if (value === 'all') return [...all];
  if (value === 'none' || value === '') return [];
  const items = value.split(',').map((s) => s.trim().toLowerCase());
  for (const it of items)
    if (!allowed.includes(it as T))
      throw new RangeError(`--${flag}: unknown '${it}' (choose from ${allowed.join(', ')}, all, none)`);
  return items as T[];
}

function positive(flag: string, value: string | boolean | undefined, dflt: number): number;
function positive(flag: string, value: string | boolean | undefined, dflt?: number): number | undefined;
function positive(flag: string, value: string | boolean | undefined, dflt?: number): number | undefined {
  if (value === undefined || value === false) return dflt;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`--${flag}: '${String(value)}' is not a positive integer`);
  return n;
}

function gibibytes(flag: string, value: string | boolean | undefined): number | undefined {
  if (value === undefined || value === false) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0)
    throw new RangeError(`--${flag}: '${String(value)}' is not a positive number of GiB`);
  return n * 2 ** 30;
}

/** SuiteOptions from flag values; `cpu`: the adapter is a CPU emulation (quick by default). */
export function suiteOptions(v: FlagValues, cpu: boolean): SuiteOptions {
  for (const name of Object.keys(v))
    if (!(name in SUITE_FLAGS) && v[name] !== undefined) throw new RangeError(`unknown flag --${name}`);
  if (v.quick && v.full) throw new RangeError('--quick and --full exclude each other');
  const mode = v.full ? 'full' : v.quick || cpu ? 'quick' : 'full';
  const str = (name: string, dflt: string) => (typeof v[name] === 'string' ? (v[name] as string) : dflt);
  return {
    mode,
    parts: list('parts', str('parts', 'roofline,ops,e2e'), PARTS),
    ops: list('ops', str('ops', 'all'), OP_NAMES),
    models: list('model', str('model', mode === 'quick' ? 'tiny' : 'tiny,4b'), Object.keys(MODELS)),
    weights: list('weights', str('weights', mode === 'quick' ? 'bf16' : 'bf16,q4'), ['bf16', 'q4'] as const),
    kv: list('kv', str('kv', 'f32'), ['f32', 'f16'] as const),
    layers:
      typeof v.layers === 'string'
        ? v.layers.split(',').map((n) => positive('layers', n, 1))
        : positive('layers', v.layers) === undefined
          ? undefined
          : [positive('layers', v.layers)!],
    prompts: str('prompt', mode === 'quick' ? '128' : '128,2048')
      .split(',')
      .map((p) => positive('prompt', p, 1)),
    decode: positive('decode', v.decode, 16),
    batches: str('batch', '1,4')
      .split(',')
      .map((b) => positive('batch', b, 1)),
    trainLen: positive('train-len', v['train-len'], mode === 'quick' ? 16 : undefined),
    loraR: positive('lora-r', v['lora-r'], 16),
    rounds: positive('rounds', v.rounds, mode === 'quick' ? 1 : 2),
    gpuMemoryBytes: gibibytes('gpu-memory', v['gpu-memory']),
    kernels: kernelSpec(str('kernels', '')),
    prefillChunk: str('prefill-chunk', 'auto') === 'auto' ? undefined : positive('prefill-chunk', v['prefill-chunk']),
    mlpChunk: str('mlp-chunk', 'auto') === 'auto' ? undefined : positive('mlp-chunk', v['mlp-chunk']),
  };
}

/** --kernels' text, checked by parseTuning (one error naming the flag and the part). */
function kernelSpec(spec: string): string {
  try {
    parseTuning(spec);
  } catch (e) {
    throw new RangeError(`--kernels: ${(e as Error).message}`, { cause: e });
  }
  return spec;
}

/**
 * Sets --kernels' switches (checked against gpu: a forced variant it lacks is an error) and
 * returns what puts the ones before back.
 */
export function applyKernels(gpu: Gpu, spec: string): () => void {
  const settings = parseTuning(spec);
  const problem = tuningProblem(gpu, settings);
  if (problem) throw new RangeError(`--kernels: ${problem}`);
  const before = { ...tuning };
  Object.assign(tuning, settings);
  return () => Object.assign(tuning, before);
}

export function adapterName(gpu: Gpu): string {
  return `${gpu.info.vendor} ${gpu.info.architecture} ${gpu.info.description}`.trim() || 'unknown adapter';
}

/**
 * Runs the parts of `o` on gpu with its --kernels switches (put back after); `log` gets progress
 * lines and each record as it is made.
 */
export async function runSuite(
  gpu: Gpu,
  o: SuiteOptions,
  runtime: string,
  log: (line: string) => void = () => {},
): Promise<BenchReport> {
  const restore = applyKernels(gpu, o.kernels);
  try {
    return await runParts(gpu, o, runtime, log);
  } finally {
    restore();
  }
}

async function runParts(gpu: Gpu, o: SuiteOptions, runtime: string, log: (line: string) => void): Promise<BenchReport> {
  const features = [
    gpu.features.f16 && 'shader-f16',
    gpu.features.subgroups && 'subgroups',
    gpu.features.timestampQuery && 'timestamp-query',
  ].filter((f): f is string => !!f);
  const report: BenchReport = {
    adapter: adapterName(gpu),
    architecture: gpu.info.architecture,
    features,
    mode: o.mode,
    runtime,
    date: new Date().toISOString(),
    ...(o.kernels ? { kernels: o.kernels } : {}),
    records: [],
  };
  const minSeconds = o.mode === 'quick' ? 0.3 : 0.5;
  const add = (r: BenchRecord) => {
    report.records.push(r);
    log(
      `   ${r.group} ${r.name} [${r.shape}]: ${(r.seconds * 1000).toFixed(2)} ms, ${r.gflops.toFixed(2)} GFLOP/s, ${r.gbs.toFixed(2)} GB/s` +
        (r.ofRoof === undefined ? '' : `, ${(100 * r.ofRoof).toFixed(1)}% of roofline`),
    );
  };
  log(
    `# spyrl bench on ${report.adapter} (${runtime}; features: ${features.join(', ') || 'none'}; ${o.mode} shapes)` +
      (o.kernels ? `; kernels ${o.kernels}` : ''),
  );
  if (isCpuAdapter(gpu)) log('# a CPU emulation of a GPU: its timings say nothing about a real GPU.');
  if (o.parts.includes('roofline')) {
    // A CPU adapter takes minutes per call of the full FMA probe: its quick size measures the same rate.
    const sizes = isCpuAdapter(gpu)
      ? {
          ...ROOFLINE_SIZES[o.mode],
          fmaGroups: ROOFLINE_SIZES.quick.fmaGroups,
          fmaIters: ROOFLINE_SIZES.quick.fmaIters,
        }
      : ROOFLINE_SIZES[o.mode];
    const { roofline, records } = await measureRoofline(gpu, sizes, minSeconds);
    report.roofline = roofline;
    records.forEach(add);
  }
  if (o.parts.includes('ops') && o.ops.length) {
    const shapes = OP_SHAPES[o.mode];
    log(
      `## ops at ${o.mode === 'full' ? 'Qwen3-4B shapes' : 'cut shapes (Qwen3-4B C, heads, head_dim; fewer rows and tokens)'}`,
    );
    // On a GPU the decode GEMV runs side by side: gemv_lanes (16-byte loads, x staged in workgroup
    // memory; the 'auto' choice) and the word-by-word matmul_gemv it replaced.
    const gemvVariants = isCpuAdapter(gpu) ? undefined : { variants: ['lanes', 'gemv'] as const, rounds: 1 };
    // And decode attention with a GQA group's heads per workgroup (the 'auto' choice) against one head each.
    const decodeHeads = isCpuAdapter(gpu) ? undefined : { variants: ['group', 'one'] as const, rounds: 1 };
    // And, where the GPU has shader-f16, the prefill GEMM's f16 tiles (the 'auto' choice there) against f32 ones.
    const gemmVariants =
      isCpuAdapter(gpu) || !gpu.features.f16 ? undefined : { variants: ['f16', 'f32'] as const, rounds: 1 };
    for (const kv of o.kv) {
      const ops = kv === o.kv[0] ? o.ops : o.ops.filter((n) => n === 'decode-attention');
      await benchOps(gpu, {
        shapes,
        ops,
        kv,
        minSeconds,
        roofline: report.roofline,
        log: add,
        gemvVariants: gemvVariants && { ...gemvVariants, variants: [...gemvVariants.variants] },
        decodeHeads: decodeHeads && { ...decodeHeads, variants: [...decodeHeads.variants] },
        gemmVariants: gemmVariants && { ...gemmVariants, variants: [...gemmVariants.variants] },
      });
    }
  }
  if (o.parts.includes('e2e')) {
    for (const name of o.models) {
      for (const layers of o.layers ?? [undefined])
        for (const format of o.weights) {
          for (const kv of o.kv) {
            const recs = await benchModel(gpu, name, MODELS[name], {
              layers,
              prompts: o.prompts,
              decode: o.decode,
              batches: o.batches,
              trainLen: o.trainLen,
              loraR: o.loraR,
              format,
              kv,
              roofline: report.roofline,
              log,
            });
            recs.forEach(add);
          }
        }
    }
  }
  return report;
}

/** The report as a table: roofline first, every other record with its fractions of it. */
export function reportTable(report: BenchReport): string {
  const head = report.roofline
    ? `roofline (measured): copy ${report.roofline.copyGBs.toFixed(2)} GB/s, fma ${report.roofline.fmaGFLOPs.toFixed(2)} GFLOP/s`
    : 'roofline not measured (--parts without roofline): no fractions';
  return `${report.adapter} — ${report.runtime}, ${report.mode} shapes, ${report.date}\n${head}\n${formatTable(report.records)}`;
}

/** Recomputes every record's fractions against the report's roofline (after merging reports). */
export function refreshFractions(report: BenchReport): void {
  if (!report.roofline) return;
  for (const r of report.records) if (r.group !== 'roofline') applyRoofline(r, report.roofline);
}
