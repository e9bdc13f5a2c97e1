// `npx tsx bench/decode-attention-ab.ts [--rounds 3] [--full] [--kv f32|f16] [--json FILE]`
// Paged decode attention side by side on this machine's adapter: a GQA group's query heads in
// one workgroup, each key and value read once for all of them (tuning.attentionHeads 'group',
// the 'auto' choice), against one workgroup per head, the group's K/V read once per head
// ('one'), alternated A B A B so that drift in the machine's load hits both. Qwen3-4B heads
// (32 query, 8 KV, HD 128: 4 heads a group) at B = 1 and 4; quick: context 256, --full 2,048.
// Prints each record, then per B the ratios one / group of the medians and of the minima (> 1:
// grouping is faster). A benchmark, not a test: nothing here asserts a time.
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
    kv: { type: 'string', default: 'f32' },
    json: { type: 'string' },
  },
});
const kv = values.kv === 'f16' ? 'f16' : 'f32';
const gpu = await createGpu();
try {
  console.log(adapterName(gpu));
  const records: BenchRecord[] = await benchOps(gpu, {
    shapes: OP_SHAPES[values.full ? 'full' : 'quick'],
    ops: ['decode-attention'],
    kv,
    minSeconds: 0, // one timed call per record (after a warm-up call): the rounds repeat it
    decodeHeads: { variants: ['group', 'one'], rounds: Number(values.rounds) },
    log: (r) =>
      console.log(
        `${r.name.padEnd(36)} ${r.shape}  ${(r.seconds * 1000).toFixed(1)} ms  ${r.gbs.toFixed(2)} GB/s  ${r.note ?? ''}`,
      ),
  });
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2;
  };
  const secs = (name: string) => records.filter((r) => r.name === name).map((r) => r.seconds);
  for (const base of [...new Set(records.map((r) => r.name.replace(/ \[.*\]$/, '')))]) {
    const [one, group] = [secs(`${base} [one]`), secs(`${base} [group]`)];
    const ratio = (f: (xs: number[]) => number) => (f(one) / f(group)).toFixed(2);
    console.log(
      `${base}: one / group = ${ratio(median)} (medians), ${ratio((xs) => Math.min(...xs))} (minima); ` +
        `one ${one.map((x) => (x * 1000).toFixed(1)).join(', ')} ms, group ${group.map((x) => (x * 1000).toFixed(1)).join(', ')} ms`,
    );
  }
  console.log(formatTable(records));
  if (values.json) writeFileSync(values.json, JSON.stringify({ adapter: adapterName(gpu), records }, null, 2));
} finally {
  gpu.destroy();
}
