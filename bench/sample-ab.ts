// `npx tsx bench/sample-ab.ts --old FILE [--rounds 5] [--batch 1,4] [--vocab 151936]
//   [--top-k 20] [--top-p 0.8] [--temperature 0.7]`
// The sampling kernel (shaders/sample.wgsl) against an earlier version of that file (--old, e.g.
// `git show e432bdf:shaders/sample.wgsl > /tmp/sample-old.wgsl`), side by side in one process: two
// devices on the same adapter, one reading the old file for 'sample' and every other shader from
// the checkout, the same random logits, alternated old new old new so that drift in the machine's
// load hits both. Default: Qwen3's vocabulary and sampling (temperature 0.7, top-k 20, top-p 0.8).
// Prints each timed call and the old / new ratio of the medians and of the minima (> 1: the new
// kernel is faster). A benchmark, not a test: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import { shaderSource } from '../src/gpu/shaders.node.ts';
import * as K from '../src/ops/index.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    old: { type: 'string' },
    rounds: { type: 'string', default: '5' },
    batch: { type: 'string', default: '1,4' },
    vocab: { type: 'string', default: '151936' },
    'top-k': { type: 'string', default: '20' },
    'top-p': { type: 'string', default: '0.8' },
    temperature: { type: 'string', default: '0.7' },
  },
});
if (!values.old) throw new Error('--old FILE: the earlier shaders/sample.wgsl to compare against');
const oldSample = readFileSync(values.old, 'utf8');
const V = Number(values.vocab);
const opts = { temperature: Number(values.temperature), topK: Number(values['top-k']), topP: Number(values['top-p']) };
const rounds = Number(values.rounds);

const sides: [string, Gpu][] = [
  ['old', await createGpu({ shaderSource: (name) => (name === 'sample' ? oldSample : shaderSource(name)) })],
  ['new', await createGpu()],
];
const median = (x: number[]) => [...x].sort((a, b) => a - b)[Math.floor(x.length / 2)]!;
try {
  console.log(`${adapterName(sides[1]![1])}; V ${V}, ${JSON.stringify(opts)}, ${rounds} rounds alternated`);
  for (const B of values.batch.split(',').map(Number)) {
    // Logits of a trained model's spread (a few units), the same on both sides.
    const logits = new Float32Array(B * V);
    let s = 12345;
    for (let i = 0; i < logits.length; i++) {
      s = (s * 1103515245 + 12345) >>> 0;
      logits[i] = ((s >>> 8) / 2 ** 24 - 0.5) * 12;
    }
    const bufs = sides.map(([, gpu]) => {
      const l = gpu.createBuffer(B * V * 4, 'logits');
      gpu.write(l, logits);
      return { l, ids: gpu.createBuffer(B * 4, 'ids') };
    });
    const times: Record<string, number[]> = { old: [], new: [] };
    const ids: Record<string, number[]> = {};
    for (let r = -1; r < rounds; r++) {
      for (const [i, [name, gpu]] of sides.entries()) {
        const t0 = performance.now();
        K.sample(gpu, bufs[i]!.ids, bufs[i]!.l, B, V, opts, 7, r + 1);
        const got = await gpu.readU32(bufs[i]!.ids, B);
        const ms = performance.now() - t0;
        if (r >= 0) {
          times[name]!.push(ms);
          console.log(`B=${B} ${name} round ${r}: ${ms.toFixed(1)} ms, ids ${Array.from(got).join(' ')}`);
        }
        ids[name] = Array.from(got);
      }
    }
    const [o, n] = [times.old!, times.new!];
    console.log(
      `B=${B}: old / new = ${(median(o) / median(n)).toFixed(2)} (medians), ${(Math.min(...o) / Math.min(...n)).toFixed(2)} (minima); ` +
        `old ${o.map((x) => x.toFixed(0)).join(', ')} ms, new ${n.map((x) => x.toFixed(0)).join(', ')} ms; ` +
        `last draws ${JSON.stringify(ids.old) === JSON.stringify(ids.new) ? 'equal' : `differ (old ${ids.old}, new ${ids.new})`}`,
    );
  }
} finally {
  for (const [, gpu] of sides) gpu.destroy();
}
