// The peer: onnxruntime-web running the same checkpoint, exported to ONNX with a KV cache by
// scripts/export_onnx.py, beside our engine. Two uses: its logits checked against ours (a second,
// independent implementation of every op; test/bench/peer.test.ts, wasm EP in Node) and its
// prefill and decode tok/s next to ours, as a ratio (bench/browser.ts, WebGPU EP in Chromium).
// Browser-safe: the caller passes the onnxruntime-web module it loaded (webgpu or wasm build).
import type * as OrtModule from 'onnxruntime-web';
import type { Gpu } from '../src/gpu/index.ts';
import type { Qwen3Config } from '../src/model/config.ts';
import type { Qwen3Model } from '../src/model/qwen3.ts';
import * as K from '../src/ops/index.ts';
import { makeRecord, type BenchRecord, type BenchReport } from './measure.ts';

export type Ort = typeof OrtModule;
type Session = OrtModule.InferenceSession;
type Tensor = OrtModule.Tensor;

/** The committed peer model: the golden "tied" checkpoint and its export (scripts/export_onnx.py). */
export const PEER_FILES = {
  checkpoint: 'test/fixtures/golden/tied',
  onnx: 'test/fixtures/onnx/tied.onnx',
} as const;

/**
 * The peer's models by bench.html's peer-model parameter: the committed tiny checkpoint, or Qwen3-4B
 * layer shapes (random weights, a vocabulary cut) that scripts/peer_checkpoint.py writes into a
 * git-ignored folder, too big to commit.
 */
export const PEER_MODELS: Record<string, { checkpoint: string; onnx: string; make?: string }> = {
  tiny: PEER_FILES,
  '4b': {
    checkpoint: 'bench/peer-4b',
    onnx: 'bench/peer-4b/model.onnx',
    make: 'python3 scripts/peer_checkpoint.py',
  },
};

const pastName = (kind: 'key' | 'value', l: number) => `past_${kind}_${l}`;
const presentName = (kind: 'key' | 'value', l: number) => `present_${kind}_${l}`;

/** Output names that a WebGPU session should keep on the GPU (the cache), so decode does not round-trip it. */
export function presentNames(cfg: Qwen3Config): string[] {
  return Array.from({ length: cfg.numLayers }, (_, l) => [presentName('key', l), presentName('value', l)]).flat();
}

/**
 * The ORT side of one sequence: each call feeds tokens after the cached ones and returns their
 * logits (T, V) on the CPU; the cache stays where the session put it (GPU buffers with the
 * WebGPU EP and preferredOutputLocation, else CPU).
 */
export class OrtSequence {
  private past: Record<string, Tensor>;
  private owned: Tensor[] = [];

  constructor(
    private readonly ort: Ort,
    private readonly session: Session,
    private readonly cfg: Qwen3Config,
  ) {
    this.past = this.emptyCache();
  }

  private emptyCache(): Record<string, Tensor> {
    const { numLayers: L, numKvHeads: NKV, headDim: HD } = this.cfg;
    const past: Record<string, Tensor> = {};
    for (let l = 0; l < L; l++) {
      for (const kind of ['key', 'value'] as const)
        past[pastName(kind, l)] = new this.ort.Tensor('float32', new Float32Array(0), [1, NKV, 0, HD]);
    }
    return past;
  }

  async feed(ids: readonly number[]): Promise<Float32Array> {
    const input = new this.ort.Tensor('int64', BigInt64Array.from(ids.map((i) => BigInt(i))), [1, ids.length]);
    const out = await this.session.run({ input_ids: input, ...this.past });
    this.releaseOwned();
    for (let l = 0; l < this.cfg.numLayers; l++) {
      for (const kind of ['key', 'value'] as const) {
        const t = out[presentName(kind, l)];
        this.past[pastName(kind, l)] = t;
        this.owned.push(t);
      }
    }
    const logits = out.logits;
    const data =
      logits.location === 'cpu' ? (logits.data as Float32Array) : ((await logits.getData(true)) as Float32Array);
    return data;
  }

  private releaseOwned(): void {
    for (const t of this.owned) if (t.location !== 'cpu') t.dispose();
    this.owned = [];
  }

  release(): void {
    this.releaseOwned();
    this.past = this.emptyCache();
  }
}

/** Logits (T, V) of `ids` through ORT: ids[0..split) in one call, then one token per call. */
export async function ortLogits(
  ort: Ort,
  session: Session,
  cfg: Qwen3Config,
  ids: readonly number[],
  split: number,
): Promise<Float32Array> {
  const seq = new OrtSequence(ort, session, cfg);
  try {
    const rows = [await seq.feed(ids.slice(0, split))];
    for (let t = split; t < ids.length; t++) rows.push(await seq.feed([ids[t]]));
    return concat(rows);
  } finally {
    seq.release();
  }
}

/** Logits (T, V) of `ids` through our engine, on the same schedule as ortLogits (prefill, then the cache). */
export async function ourLogits(model: Qwen3Model, ids: readonly number[], split: number): Promise<Float32Array> {
  const V = model.cfg.vocabSize;
  const cache = model.createCache(1, ids.length);
  try {
    const rows: Float32Array[] = [];
    const run = async (from: number, to: number) => {
      const pos = Array.from({ length: to - from }, (_, i) => from + i);
      const buf = model.forward(
        { ids: ids.slice(from, to), slots: pos.map(() => 0), positions: pos, logitRows: pos.map((_, i) => i) },
        cache,
      );
      rows.push(await model.gpu.readF32(buf, pos.length * V));
      model.gpu.releaseBuffer(buf);
    };
    await run(0, split);
    for (let t = split; t < ids.length; t++) await run(t, t + 1);
    return concat(rows);
  } finally {
    cache.destroy();
  }
}

function concat(rows: Float32Array[]): Float32Array {
  const out = new Float32Array(rows.reduce((n, r) => n + r.length, 0));
  let at = 0;
  for (const r of rows) {
    out.set(r, at);
    at += r.length;
  }
  return out;
}

/** max |a - b| / max |b|. */
export function maxRelDiff(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) throw new RangeError(`logits lengths differ: ${a.length} vs ${b.length}`);
  let d = 0,
    m = 0;
  for (let i = 0; i < a.length; i++) {
    d = Math.max(d, Math.abs(a[i] - b[i]));
    m = Math.max(m, Math.abs(b[i]));
  }
  return d / m;
}

function argmax(x: Float32Array, from: number, n: number): number {
  let best = from;
  for (let i = from + 1; i < from + n; i++) if (x[i] > x[best]) best = i;
  return best - from;
}

export interface PeerBenchOptions {
  /** Prompt tokens of the prefill. */
  prompt: number;
  /** Greedy decode steps timed. */
  steps: number;
  /** Prefill repetitions timed (after one warm-up). */
  reps: number;
  /** The peer's execution provider, for the record names. */
  ep: string;
}

/**
 * Prefill tok/s (P tokens, last logits on the CPU) and greedy decode tok/s (one token per step,
 * its id on the CPU before the next step) of ours and of the ORT session, on one model, plus the
 * logits check. Ours samples on the GPU and reads 4 bytes a step; ORT returns the logits row
 * and the CPU takes the argmax, its cache staying on its device.
 */
export async function benchPeer(
  gpu: Gpu,
  ort: Ort,
  session: Session,
  model: Qwen3Model,
  o: PeerBenchOptions,
): Promise<{ records: BenchRecord[]; ratios: NonNullable<BenchReport['ratios']>; logitsRelDiff: number }> {
  const cfg = model.cfg,
    V = cfg.vocabSize;
  const ids = Array.from({ length: o.prompt }, (_, i) => (i * 7919 + 11) % V);
  const checkIds = ids.slice(0, Math.min(ids.length, 12));
  const logitsRelDiff = maxRelDiff(
    await ourLogits(model, checkIds, Math.ceil(checkIds.length / 2)),
    await ortLogits(ort, session, cfg, checkIds, Math.ceil(checkIds.length / 2)),
  );

  const P = o.prompt,
    maxT = P + o.steps + 2;
  const pos = Array.from({ length: P }, (_, i) => i);
  const records: BenchRecord[] = [];
  const shape = `L=${cfg.numLayers} C=${cfg.hiddenSize} V=${V}`;

  // Ours: prefill (one call, last row's logits read back), then greedy decode with sampling on the GPU.
  const oursPrefill = async () => {
    const cache = model.createCache(1, maxT);
    const t0 = performance.now();
    const buf = model.forward({ ids, slots: pos.map(() => 0), positions: pos, logitRows: [P - 1] }, cache);
    await gpu.readF32(buf, V);
    const s = (performance.now() - t0) / 1000;
    gpu.releaseBuffer(buf);
    return { s, cache };
  };
  const oursDecode = async (steps: number) => {
    const { cache } = await oursPrefill();
    const sampled = gpu.createBuffer(4, 'peer.ids');
    let next = ids[P - 1];
    const t0 = performance.now();
    for (let i = 0; i < steps; i++) {
      const logits = model.forward({ ids: [next], slots: [0], positions: [P + i], logitRows: [0] }, cache);
      K.sample(gpu, sampled, logits, 1, V, { temperature: 0, topK: 0, topP: 1 }, 0, i);
      next = (await gpu.readU32(sampled, 1))[0];
      gpu.releaseBuffer(logits);
    }
    const s = (performance.now() - t0) / 1000;
    gpu.releaseBuffer(sampled);
    cache.destroy();
    return s;
  };
  // ORT: the same two phases.
  const ortPrefill = async () => {
    const seq = new OrtSequence(ort, session, cfg);
    const t0 = performance.now();
    const logits = await seq.feed(ids);
    const s = (performance.now() - t0) / 1000;
    return { s, seq, logits };
  };
  const ortDecode = async (steps: number) => {
    const { seq, logits } = await ortPrefill();
    let next = argmax(logits, (P - 1) * V, V);
    const t0 = performance.now();
    for (let i = 0; i < steps; i++) {
      const row = await seq.feed([next]);
      next = argmax(row, 0, V);
    }
    const s = (performance.now() - t0) / 1000;
    seq.release();
    return s;
  };

  const mean = async (f: () => Promise<number>, reps: number) => {
    await f(); // warm-up: pipelines, pools
    let total = 0;
    for (let i = 0; i < reps; i++) total += await f();
    return total / reps;
  };
  const prefillOurs = await mean(async () => {
    const r = await oursPrefill();
    r.cache.destroy();
    return r.s;
  }, o.reps);
  const prefillOrt = await mean(async () => {
    const r = await ortPrefill();
    r.seq.release();
    return r.s;
  }, o.reps);
  const decodeOurs = (await mean(() => oursDecode(o.steps), 1)) / o.steps;
  const decodeOrt = (await mean(() => ortDecode(o.steps), 1)) / o.steps;

  const flopsPerToken = (ctx: number) =>
    2 *
      (cfg.numLayers *
        (cfg.hiddenSize * (cfg.numHeads + 2 * cfg.numKvHeads) * cfg.headDim +
          cfg.hiddenSize * cfg.numHeads * cfg.headDim +
          3 * cfg.hiddenSize * cfg.intermediateSize)) +
    cfg.numLayers * 4 * ctx * cfg.numHeads * cfg.headDim;
  let prefillFlops = 2 * V * cfg.hiddenSize;
  for (let t = 1; t <= P; t++) prefillFlops += flopsPerToken(t);
  const decodeFlops = flopsPerToken(P + o.steps / 2) + 2 * V * cfg.hiddenSize;
  const add = (name: string, seconds: number, reps: number, tokens: number, flops: number) =>
    records.push(makeRecord({ group: 'peer', name, shape, flops, bytes: 0, seconds, reps, tokens }));
  add(`ours prefill ${P}`, prefillOurs, o.reps, P, prefillFlops);
  add(`ort-${o.ep} prefill ${P}`, prefillOrt, o.reps, P, prefillFlops);
  add(`ours decode (greedy, ${o.steps} steps)`, decodeOurs, o.steps, 1, decodeFlops);
  add(`ort-${o.ep} decode (greedy, ${o.steps} steps)`, decodeOrt, o.steps, 1, decodeFlops);
  const ratios = [
    {
      name: `prefill ${P} tok/s`,
      ours: P / prefillOurs,
      peer: P / prefillOrt,
      ratio: prefillOrt / prefillOurs,
      unit: 'tok/s',
    },
    {
      name: 'decode tok/s (B=1)',
      ours: 1 / decodeOurs,
      peer: 1 / decodeOrt,
      ratio: decodeOrt / decodeOurs,
      unit: 'tok/s',
    },
  ];
  return { records, ratios, logitsRelDiff };
}
