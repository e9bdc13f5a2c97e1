// The worker's engine and the UI store without a Worker or a browser: the engine is called with
// plain objects (the real tiny model on Dawn, a scripted trainer), the store drives it directly.
import { describe, expect, it } from 'vitest';
import { DEMO_URL, tinyDemoFetch } from '../helpers/tinyDemoFetch.ts';
import { unzipSync } from 'fflate';
import { initLora, loraConfig, writeAdapter } from '../../src/model/peft.ts';
import { validateConfig } from '../../src/game/config.ts';
import type { RoundRecord } from '../../src/game/round.ts';
import type { TrainEvent } from '../../src/train/events.ts';
import { PlaygroundEngine, type TrainerCreateOptions, type TrainerLike } from '../../src/worker/engine.ts';
import { memoryRunStorage } from '../../src/worker/runStorage.ts';
import { memoryHubCache } from '../../src/model/sources.ts';
import { zipFiles } from '../../src/worker/adapterZip.ts';
import { createAppStore } from '../../src/store/store.ts';
import { kernelSpecProblem } from '../../src/store/modelSlice.ts';
import type { EngineApi } from '../../src/worker/client.ts';
import type { LoadProgress } from '../../src/worker/protocol.ts';
import { resetTuning, tuning, TUNING_DEFAULTS } from '../../src/ops/common.ts';

const config = validateConfig({
  groupSize: 3,
  docTokenBudget: 96,
  summaryMaxTokens: 12,
  roundsPerUpdate: 1,
  evalEvery: 0,
  checkpointEvery: 1,
  lora: { r: 2, alpha: 4 },
});
const docs = { train: [{ id: 'a', report: 'The agency audited its programs. It found gaps.' }], evalDocs: [] };

/** A scripted trainer: the events and files of SpyRLTrainer, without the GPU work. */
function scriptedTrainer(created: TrainerCreateOptions[]) {
  return async (o: TrainerCreateOptions): Promise<TrainerLike> => {
    created.push(o);
    const lora = loraConfig({ r: o.config.lora.r, alpha: o.config.lora.alpha });
    let round = o.resume?.['trainer_state.json'] ? Number(JSON.parse(String(o.resume['trainer_state.json'])).round) : 0;
    const log: string[] = [];
    const emit = (e: TrainEvent) => o.onEvent?.(e);
    return {
      get round() {
        return round;
      },
      async step() {
        const r = round;
        emit({
          type: 'round-start',
          round: r,
          documentId: 'a',
          fullText: 'The agency audited its programs. It found gaps.',
          spyText: 'The agency audited its programs.',
          span: { charStart: 32, charEnd: 47 },
          spyMarkAt: 32,
          cut: null,
          groupSize: 3,
          labels: [2, 1, 3],
          spySeat: 1,
        });
        for (let seat = 0; seat < 3; seat++) emit({ type: 'summary-delta', round: r, seat, text: `summary ${seat}` });
        emit({
          type: 'summaries-done',
          round: r,
          summaries: [0, 1, 2].map((seat) => ({ seat, text: `summary ${seat}`, truncated: false })),
        });
        for (const [voter, chosen] of [
          [0, 1],
          [1, 0],
          [2, 1],
        ])
          emit({
            type: 'vote',
            round: r,
            voterSeat: voter!,
            candidateSeats: [0, 1, 2].filter((s) => s !== voter),
            probs: [0.3, 0.7],
            chosenSeat: chosen!,
          });
        emit({ type: 'reveal', round: r, spySeat: 1, caught: true, rewards: [1.5, -0.5, 1.5] });
        emit({ type: 'update', round: r, step: r + 1, loss: 0.25, kl: 0, gradNorm: 0.5, lr: 5e-5, skipped: false });
        const record = {
          round: r,
          spySeat: 1,
          rewards: { summary: [0.5, -0.5, 0.5] },
          metrics: { spyCaught: true, voteAccuracy: 1 },
          train: { loss: 0.25, kl: 0, gradNorm: 0.5, lr: 5e-5 },
          timings: { summarizeMs: 40, summaryPrefillMs: 10, voteMs: 20, updateMs: 30, totalMs: 60 },
        } as unknown as RoundRecord;
        round++;
        log.push(JSON.stringify({ round: r }));
        emit({ type: 'round-done', round: r, record, tokensPerSecond: 42, seconds: 1 });
        return record;
      },
      adapterFiles: async () => ({ ...writeAdapter(lora, initLora(o.model.cfg, lora, 0), o.model.cfg) }),
      checkpointFiles: async () => ({
        ...writeAdapter(lora, initLora(o.model.cfg, lora, 0), o.model.cfg),
        'trainer_state.json': JSON.stringify({ round }),
        'run.jsonl': log.join('\n'),
      }),
      runLogJsonl: () => log.join('\n'),
      destroy: () => undefined,
    };
  };
}

async function makeEngine() {
  const created: TrainerCreateOptions[] = [];
  const storage = memoryRunStorage();
  const engine = new PlaygroundEngine({
    demoUrl: () => DEMO_URL,
    fetch: await tinyDemoFetch({ layers: 2, hidden: 64, heads: 4, kvHeads: 2, headDim: 16, intermediate: 128 }),
    createTrainer: scriptedTrainer(created),
    storage,
    hubCache: () => memoryHubCache(),
  });
  return { engine, created, storage };
}

describe('PlaygroundEngine', () => {
  it('loads the demo model, plays, autosaves, zips the adapter and resumes from the save', async () => {
    const { engine, created } = await makeEngine();
    const progress: LoadProgress[] = [];
    const info = await engine.loadModel({ kind: 'demo' }, (p) => progress.push(p));
    expect(info).toMatchObject({ name: 'tiny-test', ref: { kind: 'demo' }, cfg: { numLayers: 2, hiddenSize: 64 } });
    expect(progress.at(-1)).toMatchObject({ stage: 'upload', fraction: 1 });

    const events: TrainEvent[] = [];
    // The model panel's GPU memory reaches the run core, where kept layers fill up to 90% of it.
    await engine.startRun({ config, ...docs, gpuMemoryBytes: 2 ** 30 }, (e) => events.push(e));
    expect(created.at(-1)!.keepBudgetBytes).toBe(2 ** 30);
    const step = await engine.step();
    expect(step.round).toBe(1);
    expect(events.map((e) => e.type)).toContain('reveal');

    const meta = await engine.autosave({ series: 'kept' });
    expect(meta).toMatchObject({ round: 1, model: { kind: 'demo' }, modelName: 'tiny-test', ui: { series: 'kept' } });
    expect(meta.files.map((f) => f.name)).toContain('documents.json');

    const zip = unzipSync(await engine.adapterZip());
    expect(Object.keys(zip).sort()).toEqual(['README.md', 'adapter_config.json', 'adapter_model.safetensors']);
    const readme = new TextDecoder().decode(zip['README.md']);
    expect(readme).toContain('| rounds played | 1 |');
    expect(readme).toContain('| optimizer steps | 1 |');

    const resumed = await engine.resumeSavedRun(() => undefined, 3 * 2 ** 30);
    expect(resumed.round).toBe(1);
    expect(created.at(-1)!.keepBudgetBytes).toBe(3 * 2 ** 30);
    expect(resumed.options.train).toEqual(docs.train);
    expect(Object.keys(created.at(-1)!.resume!).sort()).toEqual([
      'adapter_config.json',
      'adapter_model.safetensors',
      'run.jsonl',
      'trainer_state.json',
    ]);
    engine.dispose();
  });

  it('resumes only on the base as the run held it: another KV type or weights format is refused, naming both', async () => {
    const { engine } = await makeEngine();
    await engine.loadModel({ kind: 'demo' }, undefined, { kv: 'f32' });
    await engine.startRun({ config, ...docs }, () => undefined);
    await engine.step();
    expect((await engine.autosave(null)).format).toEqual({ weights: 'bf16', kv: 'f32' });
    await engine.loadModel({ kind: 'demo' }, undefined, { kv: 'f16' });
    await expect(engine.resumeSavedRun(() => undefined)).rejects.toThrow(
      'the autosaved run was trained on tiny-test with bf16 weights, f32 KV cache; load it that way to resume (loaded: bf16 weights, f16 KV cache)',
    );
    await engine.loadModel({ kind: 'demo' }, undefined, { kv: 'f32' });
    expect((await engine.resumeSavedRun(() => undefined)).round).toBe(1);
    engine.dispose();
  });

  it('checks an uploaded PEFT zip against the loaded model and starts the next run from it', async () => {
    const { engine, created } = await makeEngine();
    const info = await engine.loadModel({ kind: 'demo' });
    const lora = loraConfig({ r: 3, alpha: 6, targetModules: ['q_proj', 'v_proj'] });
    const zip = zipFiles({ ...writeAdapter(lora, initLora(info.cfg, lora, 1), info.cfg) });
    const adapter = await engine.loadAdapter([new File([zip as Uint8Array<ArrayBuffer>], 'my-adapter.zip')]);
    expect(adapter).toMatchObject({
      name: 'my-adapter.zip',
      r: 3,
      alpha: 6,
      targetModules: ['q_proj', 'v_proj'],
      hasOptimizerState: false,
    });
    await engine.startRun({ config, ...docs }, () => undefined);
    expect(Object.keys(created[0]!.resume!).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);

    const bad = zipFiles({ 'adapter_config.json': '{}' });
    await expect(engine.loadAdapter([new File([bad as Uint8Array<ArrayBuffer>], 'bad.zip')])).rejects.toThrow(
      'adapter_model.safetensors',
    );
    engine.dispose();
  });

  it("applies the load's kernel variants, resets the rest to 'auto', and refuses one the GPU cannot run", async () => {
    const { engine } = await makeEngine();
    try {
      const info = await engine.loadModel(
        { kind: 'demo' },
        undefined,
        {},
        { matmul: 'tiled', attentionBackward: 'row' },
      );
      expect(info.kernels).toEqual({ matmul: 'tiled', attentionBackward: 'row' });
      expect(tuning).toEqual({ ...TUNING_DEFAULTS, matmul: 'tiled', attentionBackward: 'row' });
      const again = await engine.loadModel({ kind: 'demo' }, undefined, {}, { gemmF16: 'off' });
      expect(again.kernels).toEqual({ gemmF16: 'off' });
      expect(tuning).toEqual({ ...TUNING_DEFAULTS, gemmF16: 'off' });
      expect((await engine.loadModel({ kind: 'demo' })).kernels).toEqual({});
      expect(tuning).toEqual(TUNING_DEFAULTS);
      // SwiftShader has no shader-f16; lavapipe has, and loads.
      const f16 = engine.loadModel({ kind: 'demo' }, undefined, {}, { gemmF16: 'on' });
      if (again.gpu.f16) {
        expect((await f16).kernels).toEqual({ gemmF16: 'on' });
      } else {
        await expect(f16).rejects.toThrow(
          /^Kernel variants: gemmF16=on needs shader-f16, which this GPU \(.+\) lacks$/,
        );
        expect(engine.modelInfo()?.kernels).toEqual({}); // refused before the loaded model went
        const fresh = (await makeEngine()).engine; // nothing loaded: refused once the GPU is up
        await expect(fresh.loadModel({ kind: 'demo' }, undefined, {}, { gemmF16: 'on' })).rejects.toThrow(
          /^Kernel variants: gemmF16=on needs shader-f16/,
        );
        expect(fresh.modelInfo()).toBeNull();
        fresh.dispose();
      }
    } finally {
      resetTuning();
      engine.dispose();
    }
  });

  it('names the file when a model cannot load, and a model is required to start', async () => {
    const { engine } = await makeEngine();
    await expect(engine.startRun({ config, ...docs }, () => undefined)).rejects.toThrow('no model loaded');
    await expect(engine.loadModel({ kind: 'hub', repo: 'not a repo' })).rejects.toThrow('not a Hugging Face repo id');
    const broken = new File(['{"model_type": "llama"}'], 'config.json');
    await expect(engine.loadModel({ kind: 'files', files: [broken] })).rejects.toThrow('config.json');
  });
});

describe('app store', () => {
  it('steps a round through the engine: round view, reveal data, series, autosave; reset clears it', async () => {
    const { engine, storage } = await makeEngine();
    const saved: string[] = [];
    const store = createAppStore({
      engine: engine as unknown as EngineApi,
      callback: (f) => f,
      hasWebGpu: true,
      loadBundledDocuments: async () => ({ train: docs.train, eval: [] }),
      saveFile: (name) => saved.push(name),
    });
    const s = () => store.getState();
    await s().loadBundled();
    expect(await s().loadModel({ kind: 'demo' })).toBe(true);
    s().setConfig(config);
    s().setField('groupSize', 'three');
    expect(s().configResult.error?.field).toBe('groupSize');
    await s().step();
    expect(s().runError).toContain('groupSize');
    s().setField('groupSize', '3');
    await s().step();
    expect(s().runStatus).toBe('paused');
    expect(s().round).toBe(1);
    const view = s().roundsState.rounds[0]!;
    expect(view.summaries).toEqual(['summary 0', 'summary 1', 'summary 2']);
    expect(view.votes).toHaveLength(3);
    expect(view.reveal).toEqual({ caught: true, rewards: [1.5, -0.5, 1.5] });
    expect(s().series.rounds).toEqual([
      {
        round: 1,
        civilianReward: 0.5,
        spyReward: -0.5,
        caught: 1,
        caughtRate: 1,
        voteAccuracy: 1,
        tokensPerSecond: 42,
        prefillSeconds: 0.01,
        decodeSeconds: 0.03,
        voteSeconds: 0.02,
        updateSeconds: 0.03,
      },
    ]);
    expect(s().series.updates).toHaveLength(1);
    expect((await storage.meta())?.round).toBe(1);

    await s().downloadAdapter();
    expect(saved).toEqual(['spyrl-adapter-tiny-test-round1.zip']);
    await s().reset();
    expect(s().runStatus).toBe('none');
    expect(s().series.rounds).toEqual([]);
    expect(await storage.meta()).toBeNull();
    engine.dispose();
  });

  it("resume after a reload loads the model as the run held it, whatever the panel's choices", async () => {
    const { engine, storage } = await makeEngine();
    const deps = {
      engine: engine as unknown as EngineApi,
      callback: <F>(f: F) => f,
      hasWebGpu: true,
      loadBundledDocuments: async () => ({ train: docs.train, eval: [] }),
      saveFile: () => undefined,
    };
    const first = createAppStore(deps);
    await first.getState().loadBundled();
    first.getState().setKv('f32');
    first.getState().setKernelSpec('attentionBackward=row');
    expect(await first.getState().loadModel({ kind: 'demo' })).toBe(true);
    first.getState().setConfig(config);
    await first.getState().step();
    expect(first.getState().runError).toBeNull();
    expect((await storage.meta())?.format).toEqual({ weights: 'bf16', kv: 'f32' });
    expect((await storage.meta())?.kernels).toBe('attentionBackward=row');

    // A reload: a new store with the panel at its defaults (f16 KV), the same model loaded that way.
    const s = () => store.getState();
    const store = createAppStore(deps);
    await s().loadBundled();
    expect(s().kvType).toBe('f16');
    expect(await s().loadModel({ kind: 'demo' })).toBe(true);
    expect(s().model?.format.kv).toBe('f16');
    expect(s().model?.kernels).toEqual({});
    await s().checkSaved();
    await s().resume();
    expect(s().runError).toBeNull();
    expect(s().model?.format).toEqual({ weights: 'bf16', kv: 'f32' });
    expect(s().kvType).toBe('f32'); // the panel shows what is loaded
    // The run's kernel variant overrides came back with it (the panel named none), and show there.
    expect(s().model?.kernels).toEqual({ attentionBackward: 'row' });
    expect(tuning.attentionBackward).toBe('row');
    expect(s().kernelSpec).toBe('attentionBackward=row');
    expect(s().round).toBe(1);
    await s().step();
    expect(s().round).toBe(2);

    // Kernel variants named in the panel win over the run's: the model is reloaded with them.
    s().setKernelSpec('matmul=tiled');
    await s().checkSaved();
    await s().resume();
    expect(s().runError).toBeNull();
    expect(s().model?.kernels).toEqual({ matmul: 'tiled' });
    expect(s().round).toBe(2);

    // A save whose kernels field is malformed is refused, naming it, before anything is unloaded.
    await storage.save(await storage.files(), { ...(await storage.meta())!, kernels: 'gemmF16=maybe' });
    await s().resume();
    expect(s().runError).toBe(
      'Could not resume: the autosave\'s meta.json field "kernels": gemmF16 must be one of auto, on, off (got "maybe"), got "gemmF16=maybe"',
    );
    expect(s().model?.kernels).toEqual({ matmul: 'tiled' }); // still loaded
    await storage.save(await storage.files(), { ...(await storage.meta())!, kernels: 'attentionBackward=row' });

    // A save whose format is malformed is refused before anything is unloaded.
    await storage.save(await storage.files(), {
      ...(await storage.meta())!,
      format: { weights: 'q8', kv: 'f32' } as never,
    });
    await s().resume();
    expect(s().runError).toMatch(/meta\.json field "format" must be .*"q8"/);
    expect(s().model?.format).toEqual({ weights: 'bf16', kv: 'f32' }); // still loaded
    resetTuning();
    engine.dispose();
  });

  it('passes the kernel variants to the load; a malformed text is refused before anything is unloaded', async () => {
    const { engine } = await makeEngine();
    const store = createAppStore({
      engine: engine as unknown as EngineApi,
      callback: (f) => f,
      hasWebGpu: true,
      loadBundledDocuments: async () => ({ train: docs.train, eval: [] }),
      saveFile: () => undefined,
    });
    const s = () => store.getState();
    try {
      s().setKernelSpec(' attentionBackward=row , matmul=tiled');
      expect(kernelSpecProblem(s().kernelSpec)).toBeNull();
      expect(await s().loadModel({ kind: 'demo' })).toBe(true);
      expect(s().model?.kernels).toEqual({ attentionBackward: 'row', matmul: 'tiled' });
      expect(tuning.attentionBackward).toBe('row');

      s().setKernelSpec('gemmF16=maybe');
      expect(kernelSpecProblem(s().kernelSpec)).toBe('gemmF16 must be one of auto, on, off (got "maybe")');
      expect(await s().loadModel({ kind: 'demo' })).toBe(false);
      expect(s().modelError).toBe('Kernel variants: gemmF16 must be one of auto, on, off (got "maybe")');
      expect(s().model?.kernels).toEqual({ attentionBackward: 'row', matmul: 'tiled' }); // still loaded
      expect(await engine.modelInfo()).not.toBeNull();

      s().setKernelSpec('');
      expect(await s().loadModel({ kind: 'demo' })).toBe(true);
      expect(s().model?.kernels).toEqual({});
      expect(tuning).toEqual(TUNING_DEFAULTS);
    } finally {
      resetTuning();
      engine.dispose();
    }
  });
});
