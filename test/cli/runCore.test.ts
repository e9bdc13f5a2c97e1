// The run core (src/train/run.ts) behind `spyrl train`, `spyrl eval` and the app's engine, on a
// tiny model: the CLI refuses a run with the very message the app's memory check shows, and CLI
// eval and the engine's evaluate go through one evaluation function (evaluatePolicy, spied on
// here) and write byte-identical reports for the same model, adapter, documents and config.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { DEMO_URL, tinyDemoFetch } from '../helpers/tinyDemoFetch.ts';
import { spyrl } from '../helpers/spyrl.ts';
import { validateConfig } from '../../src/game/config.ts';
import { loadQwen3Config } from '../../src/model/config.ts';
import { initLora, loraConfig, writeAdapter } from '../../src/model/peft.ts';
import { writeFolder } from '../../src/model/peft.node.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { memoryHubCache } from '../../src/model/sources.ts';
import { makeTinyCheckpoint, type TinyCheckpointOptions } from '../../src/model/tinyModel.ts';
import { qwen3TokenizerFiles } from '../../src/model/tinyModel.node.ts';
import { evalReportJsonl } from '../../src/train/evaluate.ts';
import { evaluatePolicy } from '../../src/train/runEval.ts';
import { evalDocCount, planRunMemory } from '../../src/train/runPlan.ts';
import { createGpu } from '../../src/gpu/index.ts';
import { evalCmd, heldOutDocs } from '../../src/cli/eval.ts';
import { PlaygroundEngine } from '../../src/worker/engine.ts';
import { memoryRunStorage } from '../../src/worker/runStorage.ts';
import { zipFiles } from '../../src/worker/adapterZip.ts';
import { createAppStore } from '../../src/store/store.ts';
import { memoryPlanOf, selectMemoryInputs } from '../../src/store/modelSlice.ts';
import type { EngineApi } from '../../src/worker/client.ts';

vi.mock('../../src/train/runEval.ts', async (importOriginal) => {
  const m = await importOriginal<typeof import('../../src/train/runEval.ts')>();
  return { ...m, evaluatePolicy: vi.fn(m.evaluatePolicy) };
});

const SHAPE: Omit<TinyCheckpointOptions, 'tokenizerJson' | 'tokenizerConfig'> = {
  layers: 1,
  hidden: 32,
  heads: 2,
  kvHeads: 1,
  headDim: 16,
  intermediate: 64,
};
// Small enough for SwiftShader: one held-out report read up to 32 tokens, 8-token summaries.
const RAW_CONFIG = { evalHeldOut: 1, evalDocTokenBudget: 32, evalSummaryMaxTokens: 8, lora: { r: 2, alpha: 4 } };

let tmp: string, model: string, adapter: string, configFile: string;
let adapterFiles: Record<string, Uint8Array | string>;
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-runcore-'));
  // The checkpoint tinyDemoFetch serves the engine, as a folder for the CLI: the same bytes.
  const { files } = makeTinyCheckpoint({ ...(await qwen3TokenizerFiles()), tied: true, ...SHAPE });
  model = join(tmp, 'tiny');
  await writeFolder(model, Object.fromEntries(files));
  // An adapter whose B is not zero, so the adapter column is not the base model's.
  const cfg = await loadQwen3Config(nodeFolderSource(model));
  const lora = loraConfig({ r: 2, alpha: 4 });
  const w = initLora(cfg, lora, 1);
  for (const [k, v] of w) if (k.includes('lora_B')) v.forEach((_, i) => (v[i] = Math.sin(i + 1) * 0.5));
  adapterFiles = { ...writeAdapter(lora, w, cfg) };
  adapter = join(tmp, 'adapter');
  await writeFolder(adapter, adapterFiles);
  configFile = join(tmp, 'config.json');
  await writeFile(configFile, JSON.stringify(RAW_CONFIG));
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

function sink() {
  let text = '';
  const out = new Writable({
    write(chunk, _enc, done) {
      text += String(chunk);
      done();
    },
  });
  return { out, text: () => text };
}

describe('run core: one plan, one evaluation', () => {
  it('spyrl train refuses a run over --gpu-memory with the message the app shows for that model', async () => {
    const cfg = await loadQwen3Config(nodeFolderSource(model));
    const config = validateConfig(RAW_CONFIG);
    const store = createAppStore({
      engine: {} as EngineApi,
      callback: (f) => f,
      hasWebGpu: true,
      loadBundledDocuments: async () => ({ train: [], eval: [] }),
      saveFile: () => undefined,
    });
    store.getState().setWeights('bf16'); // the CLI's defaults: --weights bf16 --kv f32
    store.getState().setKv('f32');
    store.getState().setGpuBudget('0.0001');
    store.setState({
      modelOption: 'demo',
      optionCfg: { option: 'demo', cfg },
      probe: {
        available: true,
        description: 'test',
        limits: { maxBufferSize: 2 ** 40, maxStorageBufferBindingSize: 2 ** 40 },
        features: [],
      },
      configResult: { config, error: null },
    });
    const app = memoryPlanOf(selectMemoryInputs(store.getState()))!;
    expect(app.blocking).toBe(false);
    expect(app.problem).toMatch(/^a round needs about .* above the 0\.00 GiB available/);
    const r = await spyrl(
      'train',
      '--model',
      model,
      '--rounds',
      '1',
      '--out',
      join(tmp, 'never'),
      '--config',
      configFile,
      '--gpu-memory',
      '0.0001',
    );
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(`spyrl: error: ${app.problem}`);
  }, 120_000);

  it('spyrl eval and the engine evaluate through evaluatePolicy and write the same report', async () => {
    const spy = vi.mocked(evaluatePolicy);
    spy.mockClear();
    const jsonl = join(tmp, 'cli-eval.jsonl');
    const cli = sink();
    await evalCmd(['--model', model, '--adapter', adapter, '--config', configFile, '--out', jsonl], cli.out);
    expect(spy).toHaveBeenCalledTimes(1);
    expect(spy.mock.calls[0]![0].labels).toEqual({ base: `base model ${model}`, adapter: `adapter ${adapter}` });

    const engine = new PlaygroundEngine({
      demoUrl: () => DEMO_URL,
      fetch: await tinyDemoFetch(SHAPE),
      storage: memoryRunStorage(),
      hubCache: () => memoryHubCache(),
    });
    try {
      await engine.loadModel({ kind: 'demo' }, undefined, { weights: 'bf16', kv: 'f32' });
      await engine.loadAdapter([new File([zipFiles(adapterFiles) as Uint8Array<ArrayBuffer>], 'adapter.zip')]);
      const config = validateConfig(RAW_CONFIG);
      // The documents spyrl eval scores (its own function), and training documents for the run.
      const evalDocs = await heldOutDocs(undefined, config.evalHeldOut);
      const train = [{ id: 't', report: 'The agency audited its programs. It found gaps in the oversight.' }];
      await engine.startRun({ config, train, evalDocs }, () => undefined);
      const report = await engine.evaluate({ compare: null });
      expect(spy).toHaveBeenCalledTimes(2);
      expect(spy.mock.calls[1]![0].labels).toEqual({ base: 'base model', adapter: 'adapter (round 0)' });
      expect(report.systems.map((s) => s.key)).toEqual(['base', 'adapter']);
      expect(report.documents.length).toBe(1);
      expect(report.documents[0]!.results['base']!.scores.tokens).toBeGreaterThan(0);
      // The adapter changes the summary, so its column is not the base model's again.
      expect(report.documents[0]!.results['adapter']!.summary).not.toBe(report.documents[0]!.results['base']!.summary);
      // Same summaries, scores, coverage and settings, byte for byte.
      expect(evalReportJsonl(report)).toBe(await readFile(jsonl, 'utf8'));
    } finally {
      engine.dispose();
    }
  }, 300_000);

  it("the engine refuses a run its device cannot hold with the app's message, before any trainer", async () => {
    // The device, with a 16 MiB binding limit: the tiny weights fit, a round's logits do not.
    const limits = { maxStorageBufferBindingSize: 16 * 2 ** 20 };
    let deviceMaxBuffer = 0;
    const engine = new PlaygroundEngine({
      demoUrl: () => DEMO_URL,
      fetch: await tinyDemoFetch(SHAPE),
      storage: memoryRunStorage(),
      hubCache: () => memoryHubCache(),
      createGpu: async () => {
        const gpu = await createGpu();
        // GPUSupportedLimits keeps its values in getters: a proxy changes one and reads the rest.
        const real = gpu.limits;
        deviceMaxBuffer = real.maxBufferSize;
        const get = (_: GPUSupportedLimits, k: string | symbol) =>
          k === 'maxStorageBufferBindingSize'
            ? limits.maxStorageBufferBindingSize
            : real[k as keyof GPUSupportedLimits];
        Object.defineProperty(gpu, 'limits', { value: new Proxy(real, { get }) });
        return gpu;
      },
    });
    try {
      const info = await engine.loadModel({ kind: 'demo' }, undefined, { weights: 'bf16', kv: 'f32' });
      const config = validateConfig(RAW_CONFIG);
      const evalDocs = await heldOutDocs(undefined, config.evalHeldOut);
      const train = [{ id: 't', report: 'The agency audited its programs.' }];
      const err = await engine.startRun({ config, train, evalDocs }, () => undefined).catch((e: Error) => e);
      expect(err).toBeInstanceOf(RangeError);
      expect(engine.hasRun()).toBe(false);
      // Exactly the app's check (the same function) for this model, format and limits.
      const check = planRunMemory(
        info.cfg,
        config,
        { maxBufferSize: deviceMaxBuffer, ...limits },
        undefined,
        info.format,
        evalDocCount(config, evalDocs),
      );
      expect(check.blocking).toBe(true);
      expect((err as Error).message).toBe(check.problem);
    } finally {
      engine.dispose();
    }
  }, 120_000);
});
