// `npx tsx bench/gemm-f16-ab.ts [--rounds 3] [--full] [--json FILE]`
// The prefill GEMM's tile precision side by side on this machine's adapter: shaders/matmul.wgsl
// gemm_tiled with f32 tiles and with f16 tiles (define F16: f16 operands in shared memory, packed
// vec4<f16> products summed per 16-step of K, f32 accumulation across steps), both forced
// (tuning.matmul 'tiled', tuning.gemmF16 'on' / 'off') and alternated A B A B so that drift in the
// machine's load hits both. bf16 weights at Qwen3-4B's MLP width: quick shapes M = 32 of N 1024,
// --full M = 128 and 512 of N 9728, K 2560 both. Prints each record and the ratios of the medians
// and of the minima (f32 / f16: > 1 means f16 is faster). Needs shader-f16 (a GPU, or Mesa's
// lavapipe: VK_ICD_FILENAMES=$(bash scripts/lavapipe.sh)). On a CPU adapter these are CPU timings
// of GPU kernels, where f16 arithmetic is emulated: they say nothing about a GPU. A benchmark, not
// a test: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import { benchOps, OP_SHAPES } from './ops.ts';
import { formatTable, type BenchRecord } from './measure.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '3' },
    full: { type: 'boolean', default: false },
    json: { type: 'string' },
  },
});
const gpu = await createGpu();
try {
  console.log(`${adapterName(gpu)}; shader-f16 ${gpu.features.f16}`);
  if (!gpu.features.f16) throw new Error(`gemm-f16-ab: ${adapterName(gpu)} has no shader-f16`);
  const records: BenchRecord[] = (
    await benchOps(gpu, {
      shapes: OP_SHAPES[values.full ? 'full' : 'quick'],
      ops: ['gemm'],
      kv: 'f32',
      minSeconds: 0, // one timed call per record (after a warm-up call): the rounds repeat it
      gemmVariants: { variants: ['f32', 'f16'], rounds: Number(values.rounds) },
      log: (r) =>
        r.name.startsWith('gemm bf16') &&
        console.log(
          `${r.name.padEnd(24)} ${r.shape}  ${(r.seconds * 1000).toFixed(1)} ms  ${r.gflops.toFixed(2)} GFLOP/s  ${r.note ?? ''}`,
        ),
    })
  ).filter((r) => r.name.startsWith('gemm bf16'));
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2;
  };
  const secs = (name: string) => records.filter((r) => r.name === name).map((r) => r.seconds);
  for (const base of new Set(records.map((r) => r.name.replace(/ \[.*\]$/, '')))) {
    const [a, b] = [secs(`${base} [f32]`), secs(`${base} [f16]`)];
    const ratio = (f: (xs: number[]) => number) => (f(a) / f(b)).toFixed(2);
    console.log(
      `${base}: f32 / f16 = ${ratio(median)} (medians), ${ratio((xs) => Math.min(...xs))} (minima); ` +
        `f32 ${a.map((x) => (x * 1000).toFixed(1)).join(', ')} ms, f16 ${b.map((x) => (x * 1000).toFixed(1)).join(', ')} ms`,
    );
  }
  console.log(formatTable(records));
  if (values.json) writeFileSync(values.json, JSON.stringify({ adapter: adapterName(gpu), records }, null, 2));
} finally {
  gpu.destroy();
}
