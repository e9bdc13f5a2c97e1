// The playground engine: everything that touches the GPU, behind the worker boundary
// (engine.worker.ts exposes one instance with comlink). The UI calls these methods; rounds,
// progress and errors come back as plain objects and events. A thin shell over the run core
// (src/train/run.ts, shared with `spyrl train` and `spyrl eval`): its memory plan, rounds,
// evaluation and exports; this file adds models, the autosave and the zip.
//
// 1. model: probe, inspect, load, cache
// 2. run: start, step, reset, adapter to continue from
// 3. autosave and resume
// 4. exports: adapter zip, run log
import { createGpu, type Gpu } from '../gpu/index.ts';
import { formatTuning, resetTuning, tuningProblem, type Tuning } from '../ops/common.ts';
import { isQ4StoreOnly, loadQwen3WithTokenizer } from '../model/load.ts';
import {
  deleteCachedModel,
  defaultHubCache,
  listCachedModels,
  type CacheFormat,
  type CachedModel,
  type HubCache,
} from '../model/sources.ts';
import { memorySource } from '../model/sources.ts';
import {
  readAdapter,
  ADAPTER_CONFIG_FILE,
  ADAPTER_WEIGHTS_FILE,
  OPTIMIZER_FILE,
  TRAINER_STATE_FILE,
} from '../model/peft.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import type { Qwen3Tokenizer } from '../model/tokenizer.ts';
import type { SpyRLConfig } from '../game/config.ts';
import type { SpyDocument } from '../game/documents.ts';
import type { RoundRecord } from '../game/round.ts';
import type { TrainEvent, TrainListener } from '../train/events.ts';
import { Run } from '../train/run.ts';
import { newRunId, parseAutosaveMeta, parseRunDocuments, RUN_VERSION } from '../train/checkpoint.ts';
import { architectureMismatch, type EvalProgress, type EvalReport, type EvalSystem } from '../train/evaluate.ts';
import { GpuPolicy } from '../train/policy.ts';
import { modelCard, readAdapterUpload, RunSummarizer, zipFiles } from './adapterZip.ts';
import {
  describeDownload,
  HubRevisionMemo,
  openQuantizedEntry,
  readModelConfig,
  resolveSource,
  sameModel,
  storeQuantizedEntry,
} from './modelSources.ts';
import { formatBytes, weightBytes } from '../train/memory.ts';
import { errorMessage, errorName } from './protocol.ts';
import { checkFormat, defaultFormat, describeFormat, sameFormat, type ModelFormat } from '../model/format.ts';
import { defaultRunStorage, type RunFiles, type RunStorage } from './runStorage.ts';
import type {
  EvalProgressInfo,
  EvalRequest,
  GpuProbe,
  LoadedModelInfo,
  LoadProgress,
  ModelChoice,
  ModelRef,
  PendingAdapterInfo,
  RunOptions,
  SavedRunMeta,
  StepResult,
} from './protocol.ts';

/** What the engine needs of a run (src/train/run.ts Run's surface; tests script it). */
export interface TrainerLike {
  readonly round: number;
  /** One round (Run.step). */
  step(): Promise<RoundRecord>;
  checkpointFiles(): Promise<RunFiles>;
  adapterFiles(): Promise<RunFiles>;
  runLogJsonl(): string;
  /** The run id the trainer keeps in its checkpoints (Run.runId); absent in scripted trainers. */
  readonly runId?: string;
  /** The held-out evaluation (Run.evaluate); absent in scripted trainers. */
  evaluate?(o: { compare?: EvalSystem; onProgress?: (p: EvalProgress) => void }): Promise<{ report: EvalReport }>;
  destroy(): void;
}

export interface TrainerCreateOptions {
  model: Qwen3Model;
  tokenizer: Qwen3Tokenizer;
  config: SpyRLConfig;
  train: SpyDocument[];
  evalDocs: SpyDocument[];
  resume?: RunFiles;
  onEvent?: TrainListener;
  now?: () => number;
  /** Base model name written into adapter_config.json. */
  baseModel?: string;
  /** The run's id: the autosave's when resuming it (the checkpoint must carry the same). */
  runId?: string;
  /** The model panel's GPU memory (RunOptions.gpuMemoryBytes): kept layers fill up to 90% of it. */
  keepBudgetBytes?: number;
}

export interface EngineDeps {
  createGpu: () => Promise<Gpu>;
  createTrainer: (opts: TrainerCreateOptions) => Promise<TrainerLike>;
  storage: RunStorage;
  hubCache: () => HubCache;
  demoUrl: () => string;
  fetch?: typeof fetch;
  gpuApi: () => GPU | undefined;
}

/** The documents of a run, saved beside the checkpoint so a resumed run plays the same rounds. */
const DOCUMENTS_FILE = 'documents.json';
const ADAPTER_README = 'README.md';

function browserDeps(): EngineDeps {
  return {
    createGpu: () => createGpu(),
    // The run core checks the round's memory plan against this device before the trainer exists.
    createTrainer: (opts) => Run.create(opts),
    storage: defaultRunStorage(),
    hubCache: () => defaultHubCache(),
    demoUrl: () => new URL('tiny-demo/', new URL(import.meta.env.BASE_URL, globalThis.location.href)).href,
    gpuApi: () => (typeof navigator !== 'undefined' ? navigator.gpu : undefined),
  };
}

interface LoadedModel {
  gpu: Gpu;
  model: Qwen3Model;
  tokenizer: Qwen3Tokenizer;
  info: LoadedModelInfo;
}

interface ActiveRun {
  trainer: TrainerLike;
  options: RunOptions;
  summarizer: RunSummarizer;
  /** Carried into every autosave (with RUN_VERSION) and checked on resume. */
  runId: string;
}

export class PlaygroundEngine {
  private readonly deps: EngineDeps;
  private loaded: LoadedModel | null = null;
  private run: ActiveRun | null = null;
  private pendingAdapter: { info: PendingAdapterInfo; files: RunFiles } | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  /** Hub branch -> commit, shared by inspectModel and the loadModel after it. */
  private readonly hubRevisions = new HubRevisionMemo();

  constructor(deps: Partial<EngineDeps> = {}) {
    this.deps = { ...browserDeps(), ...deps };
  }

  // ---- 1. model ------------------------------------------------------------------------------

  /** The adapter's name and limits, without creating a device. */
  async probeGpu(): Promise<GpuProbe> {
    const none = (reason: string): GpuProbe => ({
      available: false,
      reason,
      description: '',
      limits: { maxBufferSize: 0, maxStorageBufferBindingSize: 0 },
      features: [],
    });
    const api = this.deps.gpuApi();
    if (!api) return none('navigator.gpu is missing in the worker');
    const adapter = await api.requestAdapter({ powerPreference: 'high-performance' }).catch(() => null);
    if (!adapter) return none('WebGPU is present but no GPU adapter was found');
    const info = adapter.info as GPUAdapterInfo | undefined;
    return {
      available: true,
      description: info?.description || [info?.vendor, info?.architecture].filter(Boolean).join(' ') || 'GPU',
      limits: {
        maxBufferSize: adapter.limits.maxBufferSize,
        maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
      },
      features: [...adapter.features].map(String).sort(),
    };
  }

  /**
   * config.json of a choice (for the memory check before loading); q4Only: the source holds a q4
   * store and no bf16 weights (a folder written by `spyrl quantize`), so it loads only as q4.
   */
  async inspectModel(choice: ModelChoice): Promise<{ name: string; cfg: LoadedModelInfo['cfg']; q4Only: boolean }> {
    const cache = this.deps.hubCache();
    const { source, name, ref } = await resolveSource(choice, this.sourceDeps(cache));
    // A q4 entry holds config.json too: a repo whose download was deleted needs no request.
    const entry = await openQuantizedEntry(ref, cache);
    return { name, cfg: await readModelConfig(entry ?? source), q4Only: !entry && (await isQ4StoreOnly(source)) };
  }

  /**
   * Loads a model; `format` defaults per model (defaultFormat: q4 from 1.5B parameters, f16 KV).
   * `kernels` overrides kernel variants' automatic choices (src/ops/tuning.ts) for this model and
   * everything it runs; every switch not named goes back to 'auto'.
   */
  async loadModel(
    choice: ModelChoice,
    onProgress?: (p: LoadProgress) => void,
    format: Partial<ModelFormat> = {},
    kernels: Partial<Tuning> = {},
  ): Promise<LoadedModelInfo> {
    return this.exclusive(async () => {
      // Kernel variants the GPU cannot run are refused before the loaded model goes (same adapter).
      const early = this.loaded ? tuningProblem(this.loaded.gpu, kernels) : null;
      if (early) throw new Error(`Kernel variants: ${early}`);
      this.dropRun();
      this.unload();
      const report = (p: LoadProgress) => void onProgress?.(p);
      const cache = this.deps.hubCache();
      const resolved = await resolveSource(choice, this.sourceDeps(cache), (d) =>
        report({ stage: 'download', fraction: 0, text: describeDownload(d), download: d }),
      );
      this.hubRevisions.clear(); // this load used the commit; the next one asks the Hub again
      const entry = await openQuantizedEntry(resolved.ref, cache);
      const cfgJson = await readModelConfig(entry ?? resolved.source);
      // A q4-only source (`spyrl quantize`'s folder) defaults to q4; bf16 asked of it is the loader's error.
      const storeOnly = !entry && (await isQ4StoreOnly(resolved.source));
      const fmt: ModelFormat = { ...defaultFormat(cfgJson), ...(storeOnly ? { weights: 'q4' } : {}), ...format };
      checkFormat(cfgJson, fmt, resolved.name);
      // A q4 load of a Hub repo with a q4 entry reads only that entry: no download, no quantizing.
      const prequantized = fmt.weights === 'q4' ? entry : null;
      report({ stage: 'gpu', fraction: 0, text: 'Requesting the GPU' });
      const gpu = await this.deps.createGpu();
      try {
        const problem = tuningProblem(gpu, kernels);
        if (problem) throw new Error(`Kernel variants: ${problem}`);
        resetTuning(kernels);
        const verb = fmt.weights === 'q4' && !prequantized && !storeOnly ? 'Quantizing' : 'Uploading';
        const { model, cfg, tokenizer } = await loadQwen3WithTokenizer(gpu, prequantized ?? resolved.source, {
          weights: fmt.weights,
          kv: fmt.kv,
          prequantized: prequantized ?? undefined,
          onProgress: (p) =>
            report({ stage: 'upload', fraction: p.loaded / p.total, text: `${verb} ${p.tensor} to the GPU` }),
        }).catch((e: unknown) => {
          if (!prequantized) throw e;
          const err = new Error(
            `${errorMessage(e)} (in the q4 cache of ${resolved.name}: delete it under Cached models and load again)`,
            { cause: e },
          );
          err.name = errorName(e);
          throw err;
        });
        if (!tokenizer)
          throw new Error(`${resolved.name} has no tokenizer.json: the checkpoint needs its tokenizer files`);
        let quantizedCache: LoadedModelInfo['quantizedCache'] = null;
        if (prequantized) quantizedCache = { status: 'hit', bytes: prequantized.bytes };
        else if (fmt.weights === 'q4' && resolved.ref.kind === 'hub') {
          const ref = resolved.ref;
          const total = weightBytes(cfg, 'q4').total;
          try {
            const bytes = await storeQuantizedEntry(ref, cache, resolved.source, gpu, model, (p) =>
              report({
                stage: 'cache',
                fraction: Math.min(1, p.written / total),
                text: `Storing the q4 weights in this browser for the next load: ${formatBytes(p.written)}`,
              }),
            );
            quantizedCache = { status: 'stored', bytes };
          } catch (e) {
            // The model is loaded; only the next load's shortcut is lost (e.g. the storage quota).
            quantizedCache = { status: 'not-stored', bytes: 0, error: errorMessage(e) };
          }
        }
        const info: LoadedModelInfo = {
          name: resolved.name,
          ref: resolved.ref,
          cfg,
          gpu: {
            description: gpu.info.description || gpu.info.architecture || gpu.info.vendor || 'GPU',
            f16: gpu.features.f16,
            subgroups: gpu.features.subgroups,
          },
          format: fmt,
          kernels: { ...kernels },
          quantizedCache,
        };
        this.loaded = { gpu, model, tokenizer, info };
        return info;
      } catch (e) {
        gpu.destroy();
        throw e;
      }
    });
  }

  modelInfo(): LoadedModelInfo | null {
    return this.loaded?.info ?? null;
  }

  async listCachedModels(): Promise<CachedModel[]> {
    return listCachedModels(this.deps.hubCache());
  }

  /** Deletes one format's entry (the bf16 download or the q4 weights) of a cached repo revision. */
  async deleteCachedModel(repo: string, revision: string, format: CacheFormat = 'bf16'): Promise<void> {
    await deleteCachedModel(repo, revision, this.deps.hubCache(), format);
  }

  // ---- 2. run --------------------------------------------------------------------------------

  /** A PEFT adapter (folder or zip) to continue from; checked against the loaded model now, used by the next startRun. */
  async loadAdapter(files: File[]): Promise<PendingAdapterInfo> {
    const m = this.requireModel();
    const read = await readAdapterUpload(files);
    for (const need of [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]) {
      if (!(need in read))
        throw new Error(`the adapter needs ${need}; found ${Object.keys(read).join(', ') || 'no files'}`);
    }
    const { lora } = await readAdapter(memorySource('adapter', new Map(Object.entries(read))), m.info.cfg);
    const name = files.length === 1 ? files[0]!.name : (files[0]?.webkitRelativePath.split('/')[0] ?? 'adapter');
    const info: PendingAdapterInfo = {
      name,
      files: Object.keys(read).sort(),
      r: lora.r,
      alpha: lora.alpha,
      targetModules: [...lora.targetModules],
      hasOptimizerState: OPTIMIZER_FILE in read && TRAINER_STATE_FILE in read,
    };
    this.pendingAdapter = { info, files: read };
    return info;
  }

  clearAdapter(): void {
    this.pendingAdapter = null;
  }

  /** Creates the trainer (continuing from a loaded adapter when one is pending). */
  async startRun(options: RunOptions, onEvent: TrainListener): Promise<{ round: number }> {
    return this.exclusive(async () => {
      const m = this.requireModel();
      this.dropRun();
      const resume = this.pendingAdapter ? trainerFiles(this.pendingAdapter.files) : undefined;
      const trainer = await this.createTrainer(m, options, onEvent, resume);
      this.pendingAdapter = null;
      return { round: trainer.round };
    });
  }

  hasRun(): boolean {
    return this.run !== null;
  }

  /** Plays one round (and the update/eval it makes due). */
  async step(): Promise<StepResult> {
    return this.exclusive(async () => {
      const run = this.run;
      if (!run) throw new Error('no run: start one first');
      const record = await run.trainer.step();
      return { round: run.trainer.round, record };
    });
  }

  /** Ends the run and forgets its autosave. */
  async resetRun(): Promise<void> {
    return this.exclusive(async () => {
      this.dropRun();
      await this.deps.storage.clear();
    });
  }

  /**
   * The held-out evaluation of the run (src/train/evaluate.ts): base and adapter summaries side by
   * side, and a third column from another checkpoint of the same architecture when asked. That
   * checkpoint is loaded on its own device for the evaluation and freed after it.
   */
  async evaluate(req: EvalRequest, onProgress?: (p: EvalProgressInfo) => void): Promise<EvalReport> {
    return this.exclusive(async () => {
      const m = this.requireModel();
      const run = this.run;
      if (!run)
        throw new Error(
          'no run: start one (or play a round) first; the evaluation compares its adapter with the base model',
        );
      if (!run.trainer.evaluate) throw new Error('this trainer cannot evaluate');
      if (run.options.evalDocs.length === 0)
        throw new Error(
          'no held-out reports: the run has no held-out split (use the bundled sample with "Held-out reports" above 0)',
        );
      const report = (p: EvalProgressInfo) => void onProgress?.(p);
      const summaries = (p: EvalProgress) =>
        report({
          stage: 'summaries',
          text: `${p.system}: summary ${p.done} of ${p.total} (${p.documentId})`,
          fraction: p.done / p.total,
        });
      if (!req.compare) return (await run.trainer.evaluate({ onProgress: summaries })).report;
      const cache = this.deps.hubCache();
      const resolved = await resolveSource(req.compare, this.sourceDeps(cache), (d) =>
        report({ stage: 'compare-load', text: describeDownload(d), fraction: 0 }),
      );
      const gpu = await this.deps.createGpu();
      try {
        const { model, cfg, tokenizer } = await loadQwen3WithTokenizer(gpu, resolved.source, {
          weights: m.info.format.weights,
          kv: m.info.format.kv,
          onProgress: (p) =>
            report({
              stage: 'compare-load',
              text: `Uploading ${resolved.name}: ${p.tensor}`,
              fraction: p.loaded / p.total,
            }),
        });
        const mismatch = architectureMismatch(m.info.cfg, cfg);
        if (mismatch)
          throw new Error(
            `${resolved.name} is not a checkpoint of ${m.info.name}'s architecture: it differs in ${mismatch}`,
          );
        if (!tokenizer) throw new Error(`${resolved.name} has no tokenizer.json`);
        const policy = new GpuPolicy(model, tokenizer);
        const compare: EvalSystem = { key: 'compare', label: resolved.name, generate: (p, o) => policy.generate(p, o) };
        return (await run.trainer.evaluate({ compare, onProgress: summaries })).report;
      } finally {
        gpu.destroy();
      }
    });
  }

  // ---- 3. autosave and resume ----------------------------------------------------------------

  async autosave(ui: unknown): Promise<SavedRunMeta> {
    return this.exclusive(async () => {
      const run = this.run;
      const m = this.loaded;
      if (!run || !m) throw new Error('no run to save');
      const files: RunFiles = {
        ...(await run.trainer.checkpointFiles()),
        [DOCUMENTS_FILE]: JSON.stringify({ train: run.options.train, evalDocs: run.options.evalDocs }),
      };
      return this.deps.storage.save(files, {
        version: RUN_VERSION,
        runId: run.runId,
        savedAt: Date.now(),
        round: run.trainer.round,
        model: m.info.ref,
        modelName: m.info.name,
        format: m.info.format,
        kernels: formatTuning(m.info.kernels),
        config: run.options.config,
        ui,
      });
    });
  }

  async savedRun(): Promise<SavedRunMeta | null> {
    return this.deps.storage.meta();
  }

  async discardSavedRun(): Promise<void> {
    await this.deps.storage.clear();
  }

  /** Continues the autosaved run on the loaded model (which must be the one it was trained on). */
  async resumeSavedRun(
    onEvent: TrainListener,
    gpuMemoryBytes?: number,
  ): Promise<{ round: number; meta: SavedRunMeta; options: RunOptions }> {
    return this.exclusive(async () => {
      const m = this.requireModel();
      const meta = await this.deps.storage.meta();
      if (!meta) throw new Error('there is no autosaved run to resume');
      // Every field is checked (src/train/checkpoint.ts) before the run is touched; the trainer checks its own files.
      const { stamp, config, format } = parseAutosaveMeta(meta);
      if (!sameModel(meta.model, m.info.ref))
        throw new Error(
          `the autosaved run was trained on ${meta.modelName}; load that model to resume it (loaded: ${m.info.name})`,
        );
      // Its LoRA was trained against the base as held then: q4 and bf16 are different bases.
      if (format && !sameFormat(format, m.info.format))
        throw new Error(
          `the autosaved run was trained on ${meta.modelName} with ${describeFormat(format)}; load it that way to resume (loaded: ${describeFormat(m.info.format)})`,
        );
      const files = await this.deps.storage.files();
      const docs = parseRunDocuments(
        files[DOCUMENTS_FILE] === undefined ? undefined : String(files[DOCUMENTS_FILE]),
        DOCUMENTS_FILE,
      );
      const options: RunOptions = { config, train: docs.train, evalDocs: docs.evalDocs, gpuMemoryBytes };
      this.dropRun();
      const trainer = await this.createTrainer(m, options, onEvent, trainerFiles(files), stamp.runId);
      return { round: trainer.round, meta, options };
    });
  }

  // ---- 4. exports ----------------------------------------------------------------------------

  /** adapter_model.safetensors, adapter_config.json and README.md, zipped. */
  async adapterZip(): Promise<Uint8Array> {
    return this.exclusive(async () => {
      const run = this.run;
      const m = this.loaded;
      if (!run || !m) throw new Error('no adapter yet: start a run first');
      const files = await run.trainer.adapterFiles();
      const card = modelCard({
        baseModel: m.info.ref.kind === 'hub' ? m.info.ref.repo : m.info.name,
        baseIsHub: m.info.ref.kind === 'hub',
        config: run.options.config,
        summary: run.summarizer.summary(),
        date: new Date(),
      });
      return zipFiles({ ...files, [ADAPTER_README]: card });
    });
  }

  runLogJsonl(): string {
    if (!this.run) throw new Error('no run yet');
    return this.run.trainer.runLogJsonl();
  }

  /** Frees the GPU (page unload). */
  dispose(): void {
    this.dropRun();
    this.unload();
  }

  // ---- internals -----------------------------------------------------------------------------

  private async createTrainer(
    m: LoadedModel,
    options: RunOptions,
    onEvent: TrainListener,
    resume?: RunFiles,
    runId?: string,
  ): Promise<TrainerLike> {
    let summarizer = new RunSummarizer();
    const listener = (e: TrainEvent) => {
      summarizer.add(e);
      onEvent(e);
    };
    const trainer = await this.deps.createTrainer({
      model: m.model,
      tokenizer: m.tokenizer,
      config: options.config,
      train: options.train,
      evalDocs: options.evalDocs,
      keepBudgetBytes: options.gpuMemoryBytes,
      resume,
      onEvent: listener,
      now: () => performance.now(),
      baseModel: m.info.ref.kind === 'hub' ? m.info.ref.repo : m.info.name,
      runId,
    });
    if (trainer.round > 0) summarizer = new RunSummarizer(trainer.round);
    this.run = { trainer, options, summarizer, runId: runId ?? trainer.runId ?? newRunId() };
    return trainer;
  }

  private sourceDeps(hubCache: HubCache) {
    return { demoUrl: this.deps.demoUrl(), fetch: this.deps.fetch, hubCache, hubRevisions: this.hubRevisions };
  }

  private requireModel(): LoadedModel {
    if (!this.loaded) throw new Error('no model loaded: load one first');
    return this.loaded;
  }

  private dropRun(): void {
    this.run?.trainer.destroy();
    this.run = null;
  }

  private unload(): void {
    this.loaded?.gpu.destroy();
    this.loaded = null;
  }

  /** GPU jobs run one after another (a download asked for mid-round waits for the round). */
  private exclusive<T>(job: () => Promise<T>): Promise<T> {
    const next = this.queue.then(job, job);
    this.queue = next.catch(() => undefined);
    return next;
  }
}

/** The files the trainer resumes from (the run's own extras stripped). */
function trainerFiles(files: RunFiles): RunFiles {
  const out = { ...files };
  delete out[DOCUMENTS_FILE];
  delete out[ADAPTER_README];
  return out;
}

export type { ModelRef };
