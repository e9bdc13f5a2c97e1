// The engine's q4 path for a Hub repo (a fake Hub serving the tiny model, the real engine on
// Dawn): the first q4 load downloads, quantizes and stores the q4 weights; the next one reads
// only those (one request, main -> its commit, even with the download deleted) and computes the
// same logits.
import { describe, expect, it } from 'vitest';
import { makeTinyCheckpoint } from '../../src/model/tinyModel.ts';
import { qwen3TokenizerFiles } from '../../src/model/tinyModel.node.ts';
import { memoryHubCache } from '../../src/model/sources.ts';
import { isQ4 } from '../../src/ops/common.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import { PlaygroundEngine, type TrainerCreateOptions, type TrainerLike } from '../../src/worker/engine.ts';
import { memoryRunStorage } from '../../src/worker/runStorage.ts';
import { validateConfig } from '../../src/game/config.ts';
import type { LoadProgress } from '../../src/worker/protocol.ts';

const REPO = 'spyrl-test/tiny-qwen3';
const SHA = 'a1'.repeat(20);
const API_MAIN = `https://huggingface.co/api/models/${REPO}/revision/main`;
const config = validateConfig({ groupSize: 3, docTokenBudget: 96, summaryMaxTokens: 12, lora: { r: 2, alpha: 4 } });
const docs = { train: [{ id: 'a', report: 'The agency audited its programs.' }], evalDocs: [] };
const TOKENS = [9707, 11, 1879, 0, 151643, 42];

/** A Hub that serves the tiny checkpoint for REPO and records every request. */
async function fakeHub() {
  const { files } = makeTinyCheckpoint({
    ...(await qwen3TokenizerFiles()),
    layers: 2,
    hidden: 64,
    heads: 4,
    kvHeads: 2,
    headDim: 16,
    intermediate: 128,
    tied: true,
  });
  const calls: string[] = [];
  const fetchFn = (async (input: RequestInfo | URL) => {
    const url = String(input);
    calls.push(url);
    if (url === API_MAIN)
      return Response.json({ sha: SHA, siblings: [...files.keys()].map((rfilename) => ({ rfilename })) });
    const prefix = `https://huggingface.co/${REPO}/resolve/${SHA}/`;
    const body = url.startsWith(prefix) ? files.get(url.slice(prefix.length)) : undefined;
    return body === undefined ? new Response('Entry not found', { status: 404 }) : new Response(body as BodyInit);
  }) as typeof fetch;
  return { fetch: fetchFn, calls };
}

/** Logits of TOKENS as one sequence, (T, V) f32. */
async function logits(model: Qwen3Model): Promise<Float32Array> {
  const T = TOKENS.length;
  const rows = TOKENS.map((_, t) => t);
  const cache = model.createCache(1, T);
  const buf = model.forward({ ids: TOKENS, slots: rows.map(() => 0), positions: rows, logitRows: rows }, cache);
  const out = await model.gpu.readF32(buf, T * model.cfg.vocabSize);
  model.gpu.releaseBuffer(buf);
  cache.destroy();
  return out;
}

describe('PlaygroundEngine: q4 cache of a Hub repo', () => {
  it('stores the q4 weights on the first q4 load and reads only them on the next', async () => {
    const hub = await fakeHub();
    const cache = memoryHubCache();
    const models: Qwen3Model[] = [];
    const createTrainer = async (o: TrainerCreateOptions): Promise<TrainerLike> => {
      models.push(o.model);
      return {
        round: 0,
        step: async () => Promise.reject(new Error('not here')),
        checkpointFiles: async () => ({}),
        adapterFiles: async () => ({}),
        runLogJsonl: () => '',
        destroy: () => undefined,
      };
    };
    const engine = new PlaygroundEngine({
      fetch: hub.fetch,
      hubCache: () => cache,
      storage: memoryRunStorage(),
      createTrainer,
      demoUrl: () => 'http://demo.invalid/',
    });
    const choice = { kind: 'hub' as const, repo: REPO };

    // 1. Download, quantize on load, store.
    const progress: LoadProgress[] = [];
    const first = await engine.loadModel(choice, (p) => progress.push(p), { weights: 'q4', kv: 'f16' });
    expect(first.format).toEqual({ weights: 'q4', kv: 'f16' });
    expect(first.quantizedCache?.status).toBe('stored');
    expect(hub.calls.some((u) => u.endsWith('/model.safetensors'))).toBe(true);
    expect(progress.some((p) => p.stage === 'cache')).toBe(true);
    expect(progress.filter((p) => p.stage === 'cache').at(-1)!.fraction).toBeGreaterThan(0.9);
    await engine.startRun({ config, ...docs }, () => undefined);
    expect(isQ4(models[0]!.weights.embed)).toBe(true);
    expect(models[0]!.kv).toBe('f16');
    const quantizedOnLoad = await logits(models[0]!);
    expect(quantizedOnLoad.every(Number.isFinite)).toBe(true);

    const listed = await engine.listCachedModels();
    expect(listed.map((m) => [m.repo, m.format, m.complete])).toEqual([
      [REPO, 'bf16', true],
      [REPO, 'q4', true],
    ]);
    expect(first.quantizedCache!.bytes).toBe(listed[1]!.bytes);

    expect(listed.map((m) => [m.revision, m.branches])).toEqual([
      [SHA, ['main']],
      [SHA, ['main']],
    ]);
    expect(first.ref).toEqual({ kind: 'hub', repo: REPO, revision: SHA });

    // 2. Without the download: one request (main -> its commit, shared by the config check and
    // the load), the stored q4 weights, the same logits.
    await engine.deleteCachedModel(REPO, SHA, 'bf16');
    hub.calls.length = 0;
    expect((await engine.inspectModel(choice)).cfg.hiddenSize).toBe(64);
    const second = await engine.loadModel(choice, undefined, { weights: 'q4', kv: 'f16' });
    expect(hub.calls).toEqual([API_MAIN]);
    expect(second.quantizedCache).toEqual({ status: 'hit', bytes: first.quantizedCache!.bytes });
    await engine.startRun({ config, ...docs }, () => undefined);
    expect(isQ4(models[1]!.weights.embed)).toBe(true);
    expect(await logits(models[1]!)).toEqual(quantizedOnLoad);

    // A damaged store (same size, garbage header) fails naming the cache and what to do.
    const key = `${REPO}/${SHA}+q4/model.q4.safetensors`;
    const size = (await cache.get(key))!.size;
    const w = await cache.create(key);
    await w.write(new Uint8Array(size).fill(0xff));
    await w.close();
    await expect(engine.loadModel(choice, undefined, { weights: 'q4', kv: 'f16' })).rejects.toThrow(
      `in the q4 cache of ${REPO}: delete it under Cached models`,
    );

    // 3. A bf16 load ignores the q4 entry (and downloads again); deleting q4 empties the cache.
    const third = await engine.loadModel(choice, undefined, { weights: 'bf16', kv: 'f32' });
    expect(third.quantizedCache).toBeNull();
    expect(hub.calls.some((u) => u.endsWith('/model.safetensors'))).toBe(true);
    await engine.startRun({ config, ...docs }, () => undefined);
    expect(isQ4(models[2]!.weights.embed)).toBe(false);
    const bf16 = await logits(models[2]!);
    let maxDiff = 0,
      maxRef = 0;
    bf16.forEach(
      (x, i) => (
        (maxDiff = Math.max(maxDiff, Math.abs(x - quantizedOnLoad[i]!))),
        (maxRef = Math.max(maxRef, Math.abs(x)))
      ),
    );
    // q4 moved the logits, but not far (4-bit weights of a random tiny model).
    expect(maxDiff).toBeGreaterThan(0);
    expect(maxDiff).toBeLessThan(0.5 * maxRef);
    await engine.deleteCachedModel(REPO, SHA, 'q4');
    expect((await engine.listCachedModels()).map((m) => m.format)).toEqual(['bf16']);
    engine.dispose();
  });

  it('the default for a small Hub model is bf16 with an f16 KV cache, and nothing is stored', async () => {
    const hub = await fakeHub();
    const cache = memoryHubCache();
    const engine = new PlaygroundEngine({
      fetch: hub.fetch,
      hubCache: () => cache,
      storage: memoryRunStorage(),
      demoUrl: () => 'http://demo.invalid/',
    });
    const info = await engine.loadModel({ kind: 'hub', repo: REPO });
    expect(info.format).toEqual({ weights: 'bf16', kv: 'f16' });
    expect(info.quantizedCache).toBeNull();
    expect((await engine.listCachedModels()).map((m) => m.format)).toEqual(['bf16']);
    engine.dispose();
  });
});
