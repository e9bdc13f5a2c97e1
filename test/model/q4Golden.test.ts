// q4 weights end to end against PyTorch: `spyrl logits --weights q4` on the golden checkpoints
// against scripts/golden_q4.py's logits (f32 forward on the dequantized weights q * s; tolerance
// from the fixtures: max|logit - ref| <= 2e-3 x max|ref|), `spyrl grad --weights q4` against the
// script's QLoRA gradients (per tensor 1e-3 x max|g_ref| + 1e-6, as the bf16 gradient test), the
// refusal of K % 32 != 0 and of NaN / out-of-range groups, a load that never holds a bf16 copy of
// a quantized tensor on the GPU, and the q4 store round trip (export, load, identical logits).
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { paramCount } from '../../src/model/config.ts';
import { ModelLoadError } from '../../src/model/errors.ts';
import { loadQwen3, wholeRows } from '../../src/model/load.ts';
import { logitDrift } from '../../src/model/q4.ts';
import { exportQuantized, q4SafetensorsFile, Q4_STORE_FILE } from '../../src/model/q4Store.ts';
import {
  openSafetensorsModel,
  writeSafetensors,
  readSafetensorsHeader,
  bytesSource,
} from '../../src/model/safetensors.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { memorySource, type ModelSource } from '../../src/model/sources.ts';
import { GOLDEN, GOLDEN_Q4, goldenQ4Expected } from '../helpers/goldenQ4.ts';
import { logitsOf } from '../helpers/logits.ts';
import { ROOT, spyrl } from '../helpers/spyrl.ts';

const VARIANTS = ['tied', 'untied-sharded', 'mha'] as const;
const expected = goldenQ4Expected;
const f32File = async (path: string) => new Float32Array((await readFile(path)).buffer.slice(0));

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

let tmp: string;
let gpu: Gpu;
const measured: string[] = [];
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-q4-'));
  gpu = await createGpu();
});
afterAll(async () => {
  console.log('q4 engine vs references:\n' + measured.map((m) => `  ${m}`).join('\n'));
  gpu?.destroy();
  await rm(tmp, { recursive: true, force: true });
});

describe('spyrl --weights q4 against PyTorch (scripts/golden_q4.py)', () => {
  it.each(VARIANTS)('logits on %s within 2e-3 x max|ref| of the q4 reference', async (variant) => {
    const exp = await expected(variant);
    const out = join(tmp, `${variant}.f32`);
    const r = await spyrl(
      'logits',
      '--model',
      join(GOLDEN, variant),
      '--weights',
      'q4',
      '--tokens',
      exp.tokens.join(','),
      '--out',
      out,
    );
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ tokens: exp.tokens, shape: exp.shape });
    const got = await f32File(out);
    const err = maxAbsDiff(got, await f32File(join(GOLDEN_Q4, variant, 'logits.f32')));
    const bf16Ref = await f32File(join(GOLDEN, variant, 'logits.f32'));
    const drift = logitDrift(bf16Ref, got, exp.shape[1]);
    const [T, V] = exp.shape;
    const argmax = (x: Float32Array, t: number) =>
      x.subarray(t * V, (t + 1) * V).reduce((best, v, i, row) => (v > row[best]! ? i : best), 0);
    const top1 = Array.from({ length: T }, (_, t) => argmax(bf16Ref, t) === argmax(got, t)).filter(Boolean).length;
    measured.push(
      `${variant}: max|logit - q4 ref| = ${err.toExponential(2)} (${(err / exp.max_abs_logit).toExponential(2)} x max|ref|); ` +
        `drift from bf16 ref: max abs ${drift.maxAbs.toFixed(2)}, max rel ${drift.maxRel.toFixed(3)}, mean KL ${drift.meanKl.toFixed(3)}, top-1 ${top1}/${T}`,
    );
    expect(err).toBeLessThanOrEqual(exp.tolerance.rel * exp.max_abs_logit);
  });

  it('grad on lora-tied-all: loss and every LoRA gradient match the QLoRA reference', async () => {
    const fix = join(GOLDEN_Q4, 'lora-tied-all');
    const ref = JSON.parse(await readFile(join(fix, 'loss.json'), 'utf8')) as {
      model_dir: string;
      adapter_dir: string;
      tokens: number[];
      loss: number;
      tolerance: { rel: number };
    };
    const out = join(tmp, 'q4grads.safetensors');
    const r = await spyrl(
      'grad',
      '--model',
      join(ROOT, ref.model_dir),
      '--adapter',
      join(ROOT, ref.adapter_dir),
      '--weights',
      'q4',
      '--tokens',
      ref.tokens.join(','),
      '--out',
      out,
    );
    expect(r.code, r.stderr).toBe(0);
    const { loss } = JSON.parse(r.stdout) as { loss: number };
    expect(Math.abs(loss - ref.loss) / ref.loss).toBeLessThanOrEqual(1e-4);
    const read = async (file: string) => {
      const st = await openSafetensorsModel(
        memorySource('grads', new Map([['model.safetensors', new Uint8Array(await readFile(file))]])),
      );
      const m = new Map<string, Float32Array>();
      for (const name of st.tensors.keys()) {
        const b = await st.readTensor(name);
        m.set(name, new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)));
      }
      return m;
    };
    const got = await read(out);
    const want = await read(join(fix, 'grads.safetensors'));
    expect([...got.keys()].sort()).toEqual([...want.keys()].sort());
    let worst = 0;
    for (const [key, g] of want) {
      const mine = got.get(key)!;
      let maxRef = 0,
        err = 0;
      for (let i = 0; i < g.length; i++) {
        maxRef = Math.max(maxRef, Math.abs(g[i]!));
        err = Math.max(err, Math.abs(mine[i]! - g[i]!));
      }
      expect(err, key).toBeLessThanOrEqual(ref.tolerance.rel * maxRef + 1e-6);
      worst = Math.max(worst, err / maxRef);
    }
    measured.push(
      `lora-tied-all: loss ${loss.toFixed(5)} vs ${ref.loss.toFixed(5)}; worst per-tensor gradient error ${worst.toExponential(2)} x max|g_ref|`,
    );
  });

  it('a model with K % 32 != 0 is refused as q4, naming the tensor, and loads as bf16', async () => {
    const dir = join(tmp, 'hidden48');
    const made = await spyrl(
      'tiny-model',
      '--out',
      dir,
      '--layers',
      '1',
      '--hidden',
      '48',
      '--heads',
      '2',
      '--kv-heads',
      '1',
      '--head-dim',
      '16',
      '--intermediate',
      '64',
      '--vocab',
      '512',
    );
    expect(made.code, made.stderr).toBe(0);
    const out = join(tmp, 'h48.f32');
    const q4 = await spyrl('logits', '--model', dir, '--weights', 'q4', '--tokens', '1,2,3', '--out', out);
    expect(q4.code).not.toBe(0);
    expect(q4.stderr.split('\n')).toHaveLength(1);
    expect(q4.stderr).toMatch(
      /^spyrl: error: .*model\.safetensors: tensor "model\.embed_tokens\.weight": .*multiple of 32.*48/,
    );
    const bf16 = await spyrl('logits', '--model', dir, '--weights', 'bf16', '--tokens', '1,2,3', '--out', out);
    expect(bf16.code, bf16.stderr).toBe(0);
    expect(JSON.parse(bf16.stdout).shape).toEqual([3, 512]);
  });
});

function releaseModel(g: Gpu, model: Awaited<ReturnType<typeof loadQwen3>>['model']): void {
  const w = model.weights;
  const all = [w.embed, w.norm, w.lmHead, ...w.layers.flatMap((l) => Object.values(l))];
  for (const x of new Set(all)) g.releaseBuffer(K.isQ4(x) ? x.buf : x);
}

describe('the q4 loader', () => {
  it('never holds a bf16 copy of a quantized tensor: peak GPU bytes during load < the bf16 model; chunking does not change a bit', async () => {
    const dir = join(GOLDEN, 'untied-sharded');
    const exp = await expected('untied-sharded');
    const st = await openSafetensorsModel(nodeFolderSource(dir));
    const bf16Bytes = [...st.tensors.values()].reduce((n, t) => n + t.byteLength, 0);
    const largestQuantized = Math.max(
      ...[...st.tensors.values()].filter((t) => t.shape.length === 2).map((t) => t.byteLength),
    );
    const g = await createGpu(); // fresh: its memory peak is this load's
    let largest = 0; // the largest storage buffer the load asks for
    const create = g.createBuffer.bind(g);
    g.createBuffer = (bytes: number, label: string) => {
      largest = Math.max(largest, bytes);
      return create(bytes, label);
    };
    try {
      const progress: number[] = [];
      const { model, cfg } = await loadQwen3(g, nodeFolderSource(dir), {
        weights: 'q4',
        q4StagingBytes: 4096,
        onProgress: (p) => progress.push(p.loaded / p.total),
      });
      const mem = g.memory; // held: the q4 weights and bf16 norms; besides them only the uniform arena and read staging
      measured.push(
        `untied-sharded q4 load: bf16 tensors ${bf16Bytes} B; gpu.memory.peakBytes ${mem.peakBytes} (4 KiB staging, ` +
          `${mem.uniformBytes} uniform, ${mem.stagingBytes} readback); held after load ${mem.inUseBytes}; largest buffer ${largest}`,
      );
      expect(paramCount(cfg, { lmHead: true }) * 2).toBe(bf16Bytes);
      expect(progress.at(-1)).toBe(1);
      expect(mem.peakBytes).toBeLessThanOrEqual(mem.inUseBytes + 4096 + 4 * 23 + mem.uniformBytes + mem.stagingBytes); // + staging + status words
      expect(mem.inUseBytes).toBeLessThan(bf16Bytes * 0.3); // q4 is ~0.28 of bf16
      expect(largest).toBeLessThan(largestQuantized); // never a buffer the size of a bf16 Linear or embedding
      const small = await logitsOf(model, exp.tokens);
      releaseModel(g, model);
      const { model: big } = await loadQwen3(g, nodeFolderSource(dir), { weights: 'q4' }); // default staging: one chunk per tensor here
      expect(Buffer.compare(Buffer.from((await logitsOf(big, exp.tokens)).buffer), Buffer.from(small.buffer))).toBe(0);
      releaseModel(g, big);
    } finally {
      g.destroy();
    }
  });

  it('wholeRows regroups chunks of any size (rows split across chunks) into batches of whole rows', async () => {
    const rowBytes = 12,
      rows = 23;
    const data = Uint8Array.from({ length: rowBytes * rows }, (_, i) => (i * 7) % 251);
    for (const sizes of [[5], [12], [30, 1, 7], [276], [13, 11]]) {
      async function* chunks() {
        for (let at = 0, i = 0; at < data.length; i++) {
          const n = Math.min(sizes[i % sizes.length]!, data.length - at);
          yield { offset: at, bytes: data.slice(at, at + n) };
          at += n;
        }
      }
      const seen = new Uint8Array(data.length);
      let next = 0;
      for await (const b of wholeRows(chunks(), rowBytes, 4)) {
        expect(b.row0).toBe(next);
        expect(b.rows).toBeGreaterThan(0);
        expect(b.rows).toBeLessThanOrEqual(4);
        expect(b.bytes.byteLength).toBe(b.rows * rowBytes);
        seen.set(b.bytes, b.row0 * rowBytes);
        next += b.rows;
      }
      expect(next).toBe(rows);
      expect(seen).toEqual(data);
    }
    async function* ragged() {
      yield { offset: 0, bytes: new Uint8Array(13) };
    }
    await expect(
      (async () => {
        for await (const _ of wholeRows(ragged(), rowBytes, 4)) void _;
      })(),
    ).rejects.toThrow(/into a row/);
  });

  it('refuses a NaN and a weight beyond the q4 range, naming file, tensor, row and columns', async () => {
    const dir = join(GOLDEN, 'tied');
    const file = new Uint8Array(await readFile(join(dir, 'model.safetensors')));
    const header = await readSafetensorsHeader(bytesSource('model.safetensors', file));
    const config = await readFile(join(dir, 'config.json'), 'utf8');
    const source = (poke: (bytes: Uint8Array) => void): ModelSource => {
      const copy = file.slice();
      poke(copy);
      return memorySource(
        'poked',
        new Map<string, Uint8Array | string>([
          ['config.json', config],
          ['model.safetensors', copy],
        ]),
      );
    };
    const name = 'model.layers.1.mlp.down_proj.weight'; // (64, 160): 5 groups per row
    const at = (row: number, col: number) => header.tensors.get(name)!.fileOffset + 2 * (row * 160 + col);
    const setBf16 = (bits: number, row: number, col: number) => (b: Uint8Array) => {
      b[at(row, col)] = bits & 0xff;
      b[at(row, col) + 1] = bits >> 8;
    };
    const nan = source(setBf16(0x7fc0, 3, 70));
    await expect(loadQwen3(gpu, nan, { weights: 'q4' })).rejects.toThrow(ModelLoadError);
    await expect(loadQwen3(gpu, nan, { weights: 'q4' })).rejects.toThrow(
      /model\.safetensors: tensor "model\.layers\.1\.mlp\.down_proj\.weight": NaN at row 3, columns 64\.\.95/,
    );
    const big = source(setBf16(0x48e0, 10, 159)); // 458752: 458752 / 7 = 65536 rounds past f16 max
    await expect(loadQwen3(gpu, big, { weights: 'q4' })).rejects.toThrow(
      /down_proj\.weight": max \|w\| at row 10, columns 128\.\.159 needs a q4 scale beyond f16/,
    );
    const { model } = await loadQwen3(gpu, big, { weights: 'bf16' }); // bf16 has no such limit
    releaseModel(gpu, model);
  });
});

describe('the q4 store (browser cache): export, then load without quantizing', () => {
  /** The q4 store of a golden variant, in memory, and the source to load it from. */
  async function store(variant: string): Promise<{ bytes: Uint8Array; source: ModelSource; logits: Float32Array }> {
    const dir = join(GOLDEN, variant);
    const { model } = await loadQwen3(gpu, nodeFolderSource(dir), { weights: 'q4' });
    const pieces: Uint8Array[] = [];
    for await (const p of q4SafetensorsFile(gpu, model, { pieceBytes: 4096 })) pieces.push(p); // several pieces per large tensor
    const bytes = new Uint8Array(Buffer.concat(pieces));
    const logits = await logitsOf(model, (await expected(variant)).tokens);
    releaseModel(gpu, model);
    const config = await readFile(join(dir, 'config.json'), 'utf8');
    return {
      bytes,
      logits,
      source: memorySource(
        `${variant} q4`,
        new Map<string, Uint8Array | string>([
          ['config.json', config],
          [Q4_STORE_FILE, bytes],
        ]),
      ),
    };
  }

  it.each(VARIANTS)(
    "%s: stored words match the script's sha256; the loaded store gives identical logits, bit for bit",
    async (variant) => {
      const exp = await expected(variant);
      const { bytes, source, logits } = await store(variant);
      const st = await readSafetensorsHeader(bytesSource(Q4_STORE_FILE, bytes));
      expect(st.metadata).toEqual({ format: 'spyrl-q4', group: '32', version: '1' });
      for (const [name, e] of Object.entries(exp.q4)) {
        const info = st.tensors.get(name)!;
        expect(info.dtype, name).toBe('U32');
        const data = bytes.subarray(info.fileOffset, info.fileOffset + info.byteLength);
        expect(createHash('sha256').update(data).digest('hex'), name).toBe(e.sha256);
      }
      expect(st.tensors.has('lm_head.weight')).toBe(variant === 'untied-sharded');
      const seen: number[] = [];
      const { model } = await loadQwen3(gpu, source, {
        weights: 'q4',
        prequantized: source,
        onProgress: (p) => seen.push(p.loaded / p.total),
      });
      expect(seen.at(-1)).toBe(1);
      expect(K.isQ4(model.weights.embed) && model.weights.lmHead === model.weights.embed).toBe(
        variant !== 'untied-sharded',
      );
      const again = await logitsOf(model, exp.tokens);
      releaseModel(gpu, model);
      expect(Buffer.compare(Buffer.from(again.buffer), Buffer.from(logits.buffer))).toBe(0);
      // exportQuantized gives the same tensors, by name, as the file.
      const { model: m2 } = await loadQwen3(gpu, source, { weights: 'q4', prequantized: source });
      for await (const t of exportQuantized(gpu, m2, { pieceBytes: 1000 })) {
        // read back in pieces
        const info = st.tensors.get(t.name)!;
        expect(
          Buffer.compare(
            Buffer.from(t.bytes),
            Buffer.from(bytes.subarray(info.fileOffset, info.fileOffset + info.byteLength)),
          ),
          t.name,
        ).toBe(0);
      }
      releaseModel(gpu, m2);
    },
  );

  it('refuses a store of another model, a file that is not a q4 store, and a bf16 model export', async () => {
    const { source: tied } = await store('tied');
    const mhaConfig = await readFile(join(GOLDEN, 'mha', 'config.json'), 'utf8');
    const wrong: ModelSource = { ...tied, readText: async (f) => (f === 'config.json' ? mhaConfig : tied.readText(f)) };
    await expect(loadQwen3(gpu, wrong, { weights: 'q4', prequantized: tied })).rejects.toThrow(
      /model\.q4\.safetensors: tensor "model\.embed_tokens\.weight": U32 \[18432\] in the q4 store, expected U32 \[\d+\]/,
    );
    const plain = writeSafetensors(
      [{ name: 'model.embed_tokens.weight', dtype: 'U32', shape: [1], data: new Uint8Array(4) }],
      { format: 'pt' },
    );
    const notStore = memorySource('x', new Map<string, Uint8Array | string>([[Q4_STORE_FILE, plain]]));
    await expect(loadQwen3(gpu, tied, { weights: 'q4', prequantized: notStore })).rejects.toThrow(
      /model\.q4\.safetensors: not a q4 store: metadata "format" is "pt"/,
    );
    await expect(
      loadQwen3(gpu, tied, { weights: 'q4', prequantized: memorySource('empty', new Map()) }),
    ).rejects.toThrow(/model\.q4\.safetensors: not found/);
    await expect(loadQwen3(gpu, tied, { prequantized: tied })).rejects.toThrow(/weights: 'q4'/);
    const { model } = await loadQwen3(gpu, nodeFolderSource(join(GOLDEN, 'tied')));
    await expect(
      (async () => {
        for await (const _ of exportQuantized(gpu, model)) void _;
      })(),
    ).rejects.toThrow(/model\.embed_tokens\.weight is bf16/);
    releaseModel(gpu, model);
  });
});
