// `npx tsx bench/attention-ab.ts [--T 64,256] [--rounds 2] [--kv f32|f16] [--variants single,tiled] [--json FILE]`
// The attention kernels side by side on this machine's adapter: the per-(token, head) kernels
// ('single') against the query-tiled FlashAttention-2 ones ('tiled'), each forced through
// tuning.attention, alternated A B A B so that drift in the machine's load hits both; training
// forward (with lse), backward, and prefill over the paged cache, at Qwen3-4B heads (32 / 8,
// HD 128). 'tiled:row' and 'tiled:split' also force the tiled backward's rows (one thread a row,
// or 4 with subgroup sums: tuning.attentionBackward); 'tiled:splitwide' the split rows with dK/dV
// workgroups of ROWS / 4 keys (tuning.attentionDkvGroup 'wide'); 'tiled:blocks' the
// register-tiled kernels, 'tiled:blocks2' those with dK/dV at 2 keys a thread
// (tuning.attentionDkvRows). Prints each record, then per op the ratios of the medians and of the
// minima of each variant against the last one (e.g. single / tiled: > 1 = the tiled kernels are
// faster) and the raw seconds. The tiled variants also run a packed round's prefix tree
// (bench/ops.ts benchTree) and print its time over the causal one's.
// A benchmark, not a test: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import { benchOps, benchTree, OP_SHAPES, type AttentionBenchVariant } from './ops.ts';
import { formatTable, type BenchRecord } from './measure.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    T: { type: 'string', default: '64,256' },
    rounds: { type: 'string', default: '2' },
    kv: { type: 'string', default: 'f32' },
    variants: { type: 'string', default: 'single,tiled' },
    json: { type: 'string' },
  },
});
const kv = values.kv === 'f16' ? 'f16' : 'f32';
const variants = values.variants.split(',') as AttentionBenchVariant[];
const last = variants[variants.length - 1]!;
const ms = (seconds: number) => (seconds * 1e3).toFixed(3);
const gpu = await createGpu();
const records: BenchRecord[] = [];
try {
  console.log(`${adapterName(gpu)}: maxComputeWorkgroupStorageSize ${gpu.limits.maxComputeWorkgroupStorageSize}`);
  for (const T of values.T.split(',').map(Number)) {
    const recs = await benchOps(gpu, {
      shapes: { ...OP_SHAPES.quick, attnT: T },
      ops: ['attention'],
      kv,
      minSeconds: 0, // one timed call per record (after a warm-up call): the rounds repeat it
      attentionVariants: { variants, rounds: Number(values.rounds) },
      log: (r) => console.log(`${r.name.padEnd(34)} ${r.shape}  ${ms(r.seconds)} ms  ${r.note ?? ''}`),
    });
    records.push(...recs);
    const median = (xs: number[]) => {
      const s = [...xs].sort((a, b) => a - b);
      return (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2;
    };
    const secs = (name: string) => recs.filter((r) => r.name === name).map((r) => r.seconds);
    for (const op of [
      'attention fwd (train)',
      'attention bwd (train)',
      'attention fwd (tree)',
      'attention bwd (tree)',
      `attention prefill ${kv}`,
    ]) {
      if (secs(`${op} [${last}]`).length === 0) continue;
      for (const v of variants.slice(0, -1)) {
        const [a, b] = [secs(`${op} [${v}]`), secs(`${op} [${last}]`)];
        if (a.length === 0) continue;
        const ratio = (f: (xs: number[]) => number) => (f(a) / f(b)).toFixed(2);
        console.log(
          `T=${T} ${op}: ${v} / ${last} = ${ratio(median)} (medians), ${ratio((xs) => Math.min(...xs))} (minima); ` +
            `${v} ${a.map(ms).join(', ')} ms, ${last} ${b.map(ms).join(', ')} ms`,
        );
      }
    }
  }
  // A packed tree's time against the causal one's, per tiled variant: near its share of the causal
  // pairs when the kernels skip the tiles no query sees, near 1 when they walk them.
  for (const T of values.T.split(',').map(Number)) {
    for (const v of variants.filter((x) => x.startsWith('tiled'))) {
      for (const pass of ['fwd', 'bwd']) {
        const get = (kind: string) =>
          records.filter((r) => r.name === `attention ${pass} (${kind}) [${v}]` && r.shape.startsWith(`T=${T} `));
        const [tree, causal] = [get('tree'), get('train')];
        if (tree.length === 0 || causal.length === 0) continue;
        const min = (rs: BenchRecord[]) => Math.min(...rs.map((r) => r.seconds));
        const share = benchTree(T).pairs / ((T * (T + 1)) / 2);
        console.log(
          `T=${T} ${pass} [${v}]: tree / causal = ${(min(tree) / min(causal)).toFixed(2)} (minima); visible pairs ~${share.toFixed(2)} of the causal`,
        );
      }
    }
  }
  console.log(formatTable(records));
  if (values.json) writeFileSync(values.json, JSON.stringify({ adapter: adapterName(gpu), records }, null, 2));
} finally {
  gpu.destroy();
}
