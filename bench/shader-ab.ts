// `npx tsx bench/shader-ab.ts --old NAME=FILE[,NAME=FILE...] [--ops gemv] [--full] [--rounds 3]
//   [--min-seconds 0.2] [--kv f16] [--kernels name=value,...] [--gemv NxK] [--json FILE]`
// Shader files against earlier versions of them, side by side in one process: two devices on the
// same adapter, 'old' reading each named shader (`gemv`, `common/gemvstaged`: the name under
// shaders/ without .wgsl) from its FILE (e.g. `git show ad6d0c8~1:shaders/gemv.wgsl >
// /tmp/gemv.wgsl`) and every other one from the checkout, 'new' the checkout alone. The same op
// microbenchmarks (bench/ops.ts: --ops of gemv, gemm, attention, decode-attention, at the quick
// shapes or --full Qwen3-4B ones; --gemv NxK sets the GEMV's weight shape, e.g. 2560x9728 for
// down_proj, whose 160 workgroups are few for a large GPU) run on each, alternated old new old new for --rounds, so that
// drift in the machine's load hits both; each record is the mean over calls filling
// --min-seconds (at most 100). Prints every record, then per record the old / new ratio of the
// medians and of the minima (> 1: the new files are faster) with the new side's GB/s. The old
// files must fit today's host code (the same bindings and params): compare a commit's shaders
// against its parent's. Correctness is the tests' (npm test), not this script's.
// A benchmark, not a test: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import { shaderSource } from '../src/gpu/shaders.node.ts';
import * as K from '../src/ops/index.ts';
import type { BenchRecord } from './measure.ts';
import { benchOps, OP_NAMES, OP_SHAPES, type OpName } from './ops.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    old: { type: 'string' },
    ops: { type: 'string', default: 'gemv' },
    full: { type: 'boolean', default: false },
    rounds: { type: 'string', default: '3' },
    'min-seconds': { type: 'string', default: '0.2' },
    kv: { type: 'string', default: 'f16' },
    kernels: { type: 'string', default: '' },
    gemv: { type: 'string' },
    json: { type: 'string' },
  },
});

/** The --old pairs, each name a shader the checkout has and each file one that exists. */
function oldFiles(spec: string | undefined): Map<string, string> {
  if (!spec) throw new Error('--old NAME=FILE[,NAME=FILE...]: the earlier shader files to compare against');
  const out = new Map<string, string>();
  for (const part of spec.split(',')) {
    const m = /^([\w-]+(?:\/[\w-]+)?)=(.+)$/.exec(part.trim());
    if (!m) throw new Error(`--old: "${part}" is not NAME=FILE (e.g. gemv=/tmp/gemv.wgsl)`);
    const [, name, file] = m as unknown as [string, string, string];
    try {
      shaderSource(name);
    } catch {
      throw new Error(`--old: the checkout has no shader "${name}" (shaders/${name}.wgsl)`);
    }
    if (!existsSync(file)) throw new Error(`--old: ${name}: no file ${file}`);
    if (out.has(name)) throw new Error(`--old: ${name} is given twice`);
    out.set(name, readFileSync(file, 'utf8'));
  }
  return out;
}

const old = oldFiles(values.old);
const ops = values.ops.split(',').map((o) => o.trim()) as OpName[];
for (const o of ops) if (!OP_NAMES.includes(o)) throw new Error(`--ops: "${o}" is not one of ${OP_NAMES.join(', ')}`);
const rounds = Number(values.rounds),
  minSeconds = Number(values['min-seconds']);
if (!(Number.isInteger(rounds) && rounds >= 1))
  throw new Error(`--rounds must be a positive integer (got "${values.rounds}")`);
if (!(minSeconds >= 0)) throw new Error(`--min-seconds must be a number >= 0 (got "${values['min-seconds']}")`);
if (values.kv !== 'f16' && values.kv !== 'f32') throw new Error(`--kv must be f16 or f32 (got "${values.kv}")`);
K.resetTuning(K.parseTuning(values.kernels));
const shapes = { ...OP_SHAPES[values.full ? 'full' : 'quick'] };
if (values.gemv !== undefined) {
  const m = /^(\d+)x(\d+)$/.exec(values.gemv);
  if (!m || Number(m[1]) < 1 || Number(m[2]) < 1)
    throw new Error(`--gemv must be NxK, the weight's rows and columns (e.g. 2560x9728; got "${values.gemv}")`);
  shapes.gemvN = Number(m[1]);
  shapes.gemvK = Number(m[2]);
}

const sides: [string, Gpu][] = [
  ['old', await createGpu({ shaderSource: (name) => old.get(name) ?? shaderSource(name) })],
  ['new', await createGpu()],
];
try {
  const [, gpu] = sides[1]!;
  console.log(
    `${adapterName(gpu)}; old: ${[...old.keys()].join(', ')} from --old, the rest from the checkout; ` +
      `ops ${ops.join(',')}, ${values.full ? 'full' : 'quick'} shapes${values.gemv ? ` (GEMV ${values.gemv})` : ''}, ${rounds} rounds alternated` +
      (values.kernels ? `; --kernels ${values.kernels}` : ''),
  );
  const records: Record<string, BenchRecord[]> = { old: [], new: [] };
  for (let round = 0; round < rounds; round++) {
    for (const [side, g] of sides) {
      const rs = await benchOps(g, {
        shapes,
        ops,
        kv: values.kv,
        minSeconds,
        log: (r) =>
          console.log(
            `${side} ${r.name.padEnd(34)} ${r.shape.padEnd(28)} ${(r.seconds * 1000).toFixed(3)} ms x${r.reps}  ` +
              `${r.gbs.toPrecision(3)} GB/s  ${r.note ?? ''}`,
          ),
      });
      records[side]!.push(...rs);
    }
  }
  const median = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return (s[(s.length - 1) >> 1]! + s[s.length >> 1]!) / 2;
  };
  const key = (r: BenchRecord) => `${r.name} [${r.shape}]`;
  console.log('\nold / new (> 1: the new files are faster)');
  for (const k of [...new Set(records.new!.map(key))]) {
    const o = records.old!.filter((r) => key(r) === k).map((r) => r.seconds);
    const n = records.new!.filter((r) => key(r) === k);
    const ns = n.map((r) => r.seconds);
    const gbs = median(n.map((r) => r.gbs));
    console.log(
      `${k.padEnd(64)} ${(median(o) / median(ns)).toFixed(2)} (medians), ${(Math.min(...o) / Math.min(...ns)).toFixed(2)} (minima); ` +
        `old ${o.map((x) => (x * 1000).toFixed(3)).join(', ')} ms, new ${ns.map((x) => (x * 1000).toFixed(3)).join(', ')} ms; new ${gbs.toPrecision(3)} GB/s`,
    );
  }
  if (values.json) {
    writeFileSync(values.json, JSON.stringify({ adapter: adapterName(gpu), old: [...old.keys()], records }, null, 2));
  }
} finally {
  for (const [, g] of sides) g.destroy();
}
