// `npx tsx bench/gemv-ab.ts [--rounds 3] [--full] [--variants blocks,lanes,gemv] [--json FILE]`
// The decode GEMV kernels side by side on this machine's adapter, each forced through
// tuning.matmul and alternated A B C A B C so that drift in the machine's load hits all:
//   blocks  shaders/gemv.wgsl gemv_rows (the CPU-adapter kernel: no barriers, 4 columns a thread)
//   lanes   shaders/gemv.wgsl gemv_lanes (the GPU kernel: 16-byte weight loads, x staged in
//           workgroup memory, LANES threads a column)
//   gemv    shaders/matmul.wgsl matmul_gemv (the GPU kernel before it: one 4-byte word per load,
//           x read from global memory by every column)
// bf16 and q4 weights at B = 1 and 4: quick shapes 2560 x 2560, --full the MLP's 9728 x 2560.
// Prints each record, then per weight format and B the ratios of the medians and of the minima
// against 'lanes' (> 1: lanes is faster). On a CPU adapter (SwiftShader) these are CPU timings of
// GPU kernels: they rank the kernels there, not on a GPU. A benchmark, not a test: nothing here asserts a time.
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
    variants: { type: 'string', default: 'blocks,lanes,gemv' },
    json: { type: 'string' },
  },
});
const variants = values.variants.split(',') as ('blocks' | 'lanes' | 'gemv')[];
const gpu = await createGpu();
try {
  console.log(`${adapterName(gpu)}; subgroups ${gpu.features.subgroups}`);
  const records: BenchRecord[] = await benchOps(gpu, {
    shapes: OP_SHAPES[values.full ? 'full' : 'quick'],
    ops: ['gemv'],
    kv: 'f32',
    minSeconds: 0, // one timed call per record (after a warm-up call): the rounds repeat it
    gemvVariants: { variants, rounds: Number(values.rounds) },
    log: (r) =>
      console.log(
        `${r.name.padEnd(26)} ${r.shape}  ${(r.seconds * 1000).toFixed(1)} ms  ${r.gbs.toFixed(2)} GB/s  ${r.note ?? ''}`,
      ),
  });
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2;
  };
  const secs = (name: string) => records.filter((r) => r.name === name).map((r) => r.seconds);
  const bases = [...new Set(records.map((r) => r.name.replace(/ \[.*\]$/, '')))];
  for (const base of bases) {
    const lanes = secs(`${base} [lanes]`);
    if (!lanes.length) continue;
    for (const v of variants.filter((v) => v !== 'lanes')) {
      const other = secs(`${base} [${v}]`);
      const ratio = (f: (xs: number[]) => number) => (f(other) / f(lanes)).toFixed(2);
      console.log(
        `${base}: ${v} / lanes = ${ratio(median)} (medians), ${ratio((xs) => Math.min(...xs))} (minima); ` +
          `${v} ${other.map((x) => (x * 1000).toFixed(1)).join(', ')} ms, lanes ${lanes.map((x) => (x * 1000).toFixed(1)).join(', ')} ms`,
      );
    }
  }
  console.log(formatTable(records));
  if (values.json) writeFileSync(values.json, JSON.stringify({ adapter: adapterName(gpu), records }, null, 2));
} finally {
  gpu.destroy();
}
