// Model slice: WebGPU availability, which model to load, the memory check before loading,
// load/download progress, and the Hub cache.
import type { StateCreator } from 'zustand';
import { QWEN3_PRESETS, type Qwen3Config, type Qwen3PresetName } from '../model/config.ts';
import type { CachedModel } from '../model/sources.ts';
import { planRunMemory as planMemory, type MemoryCheck } from '../train/runPlan.ts';
import {
  DEFAULT_KV,
  defaultWeights,
  q4Problem,
  type KvType,
  type ModelFormat,
  type WeightsFormat,
} from '../model/format.ts';
import type { CacheFormat } from '../model/sources.ts';
import type { DownloadProgress, GpuProbe, LoadedModelInfo, LoadProgress, ModelChoice } from '../worker/protocol.ts';
import { errorMessage } from '../worker/protocol.ts';
import { parseTuning, type Tuning } from '../ops/tuning.ts';
import { onEngineStopped } from '../worker/client.ts';
import type { AppState, StoreDeps } from './store.ts';

export const DEFAULT_MODEL_OPTION = 'preset:Qwen/Qwen3-4B-Instruct-2507';

/** 'preset:<repo>' | 'hub' (any repo id) | 'demo' (the bundled tiny model). */
export type ModelOption = `preset:${Qwen3PresetName}` | 'hub' | 'demo';

export interface ModelSlice {
  webgpu: boolean;
  probe: GpuProbe | null;
  modelOption: ModelOption;
  customRepo: string;
  /** The user's GPU memory in GiB (WebGPU does not report it); '' = check hard limits only. */
  gpuBudgetGiB: string;
  /** The weights format the user picked; null = the model's default (defaultWeights). */
  weightsChoice: WeightsFormat | null;
  kvType: KvType;
  /** Kernel variant overrides for the next load, `name=value,...` (src/ops/tuning.ts); '' = all 'auto'. */
  kernelSpec: string;
  /** config.json of the selected option, once known (presets: immediately). */
  optionCfg: { option: string; cfg: Qwen3Config } | null;
  loadStatus: 'idle' | 'loading' | 'ready' | 'error';
  loadProgress: LoadProgress | null;
  downloads: Record<string, DownloadProgress>;
  model: LoadedModelInfo | null;
  modelError: string | null;
  cached: CachedModel[];
  lastChoice: ModelChoice | null;
  /** Set when the tokenizer watchdog stopped the engine worker: the message names the file. */
  engineStopped: string | null;

  probeGpu(): Promise<void>;
  selectModelOption(option: ModelOption): void;
  setCustomRepo(repo: string): void;
  setGpuBudget(gib: string): void;
  setWeights(w: WeightsFormat): void;
  setKv(kv: KvType): void;
  setKernelSpec(spec: string): void;
  inspectOption(): Promise<void>;
  /**
   * Loads `choice` (default: the selected option). `format` (a resumed run's) replaces the panel's
   * weights and KV choices, and the panel then shows it.
   */
  loadModel(choice?: ModelChoice, format?: ModelFormat): Promise<boolean>;
  refreshCache(): Promise<void>;
  deleteCached(repo: string, revision: string, format?: CacheFormat): Promise<void>;
}

export function choiceForOption(option: ModelOption, customRepo: string): ModelChoice {
  if (option === 'demo') return { kind: 'demo' };
  if (option === 'hub') return { kind: 'hub', repo: customRepo.trim() };
  return { kind: 'hub', repo: option.slice('preset:'.length) };
}

function optionKey(option: ModelOption, customRepo: string): string {
  return option === 'hub' ? `hub:${customRepo.trim()}` : option;
}

/** config.json of the selected option when known (presets: always). */
function optionConfig(s: AppState): Qwen3Config | null {
  const key = optionKey(s.modelOption, s.customRepo);
  return s.modelOption.startsWith('preset:')
    ? QWEN3_PRESETS[s.modelOption.slice(7) as Qwen3PresetName]
    : s.optionCfg?.option === key
      ? s.optionCfg.cfg
      : null;
}

/** Why the kernel variants text cannot be used (the parser's message), or null when it can. */
export function kernelSpecProblem(spec: string): string | null {
  try {
    parseTuning(spec);
    return null;
  } catch (e) {
    return errorMessage(e);
  }
}

/** The format a load would use: the user's pick, else the model's default. */
export function formatFor(cfg: Qwen3Config, s: Pick<AppState, 'weightsChoice' | 'kvType'>): ModelFormat {
  return { weights: s.weightsChoice ?? defaultWeights(cfg), kv: s.kvType };
}

/** The weights/KV choice of the selected option: weights null until its config.json is known. */
export function selectFormatInputs(s: AppState) {
  const cfg = optionConfig(s);
  return {
    cfg,
    weights: cfg ? formatFor(cfg, s).weights : s.weightsChoice,
    kv: s.kvType,
    q4Problem: cfg ? q4Problem(cfg) : null,
  };
}

/** What the memory check of the selected option depends on (stable references, for shallow
 *  selection); `weights` is null while the option's config.json is unknown. */
export function selectMemoryInputs(s: AppState) {
  const cfg = optionConfig(s);
  return {
    cfg,
    weights: cfg ? formatFor(cfg, s).weights : null,
    kv: s.kvType,
    run: s.configResult.config ?? s.runConfig,
    probe: s.probe,
    budget: s.gpuBudgetGiB,
  };
}

/** The memory plan of the selected option under the current config, when its config.json is known. */
export function memoryPlanOf(i: ReturnType<typeof selectMemoryInputs>): MemoryCheck | null {
  if (!i.cfg || !i.weights || !i.run || !i.probe?.available) return null;
  return planMemory(i.cfg, i.run, i.probe.limits, budgetBytes(i.budget), { weights: i.weights, kv: i.kv });
}

/** The model panel's "Your GPU memory" field in bytes; undefined when empty or not a positive number. */
export function budgetBytes(gib: string): number | undefined {
  const n = Number(gib);
  return gib.trim() !== '' && Number.isFinite(n) && n > 0 ? n * 2 ** 30 : undefined;
}

export const createModelSlice =
  (deps: StoreDeps): StateCreator<AppState, [], [], ModelSlice> =>
  (set, get) => {
    onEngineStopped((message) =>
      queueMicrotask(() =>
        set({
          engineStopped: message,
          modelError: message,
          loadStatus: get().loadStatus === 'loading' ? 'error' : get().loadStatus,
          loadProgress: null,
        }),
      ),
    );
    return {
      webgpu: deps.hasWebGpu,
      probe: null,
      modelOption: DEFAULT_MODEL_OPTION,
      customRepo: '',
      gpuBudgetGiB: '',
      weightsChoice: null,
      kvType: DEFAULT_KV,
      kernelSpec: '',
      optionCfg: null,
      loadStatus: 'idle',
      loadProgress: null,
      downloads: {},
      model: null,
      modelError: null,
      cached: [],
      lastChoice: null,
      engineStopped: null,

      async probeGpu() {
        try {
          set({ probe: await deps.engine.probeGpu() });
        } catch (e) {
          set({
            probe: {
              available: false,
              reason: errorMessage(e),
              description: '',
              limits: { maxBufferSize: 0, maxStorageBufferBindingSize: 0 },
              features: [],
            },
          });
        }
      },

      selectModelOption(option) {
        // Each model starts from its own default format (q4 from 1.5B parameters).
        if (option !== get().modelOption) set({ weightsChoice: null });
        set({ modelOption: option });
        if (option === 'demo') void get().inspectOption();
      },

      setCustomRepo: (repo) => set({ customRepo: repo }),
      setGpuBudget: (gib) => set({ gpuBudgetGiB: gib }),
      setWeights: (w) => set({ weightsChoice: w }),
      setKv: (kv) => set({ kvType: kv }),
      setKernelSpec: (spec) => set({ kernelSpec: spec }),

      async inspectOption() {
        const { modelOption, customRepo } = get();
        if (modelOption.startsWith('preset:')) return;
        const key = optionKey(modelOption, customRepo);
        try {
          const { cfg } = await deps.engine.inspectModel(choiceForOption(modelOption, customRepo));
          set({ optionCfg: { option: key, cfg }, modelError: null });
        } catch (e) {
          set({ modelError: errorMessage(e) });
        }
      },

      async loadModel(choice, asked) {
        const s = get();
        if (s.loadStatus === 'loading') return false;
        if (!['none', 'paused', 'lost'].includes(s.runStatus)) {
          set({ modelError: 'Pause the run before loading another model.' });
          return false;
        }
        const c = choice ?? choiceForOption(s.modelOption, s.customRepo);
        let kernels: Partial<Tuning>;
        try {
          kernels = parseTuning(s.kernelSpec);
        } catch (e) {
          set({ modelError: `Kernel variants: ${errorMessage(e)}` });
          return false;
        }
        set({
          loadStatus: 'loading',
          loadProgress: { stage: 'gpu', fraction: 0, text: 'Reading config.json' },
          downloads: {},
          modelError: null,
        });
        let loadStarted = false;
        try {
          // The memory check before any weight moves: refuse what cannot fit the adapter's limits.
          const { cfg, name, q4Only } = await deps.engine.inspectModel(c);
          // A folder written by `spyrl quantize` holds only q4 weights: q4 unless bf16 was picked.
          const picked = get().weightsChoice;
          const format = asked ?? { ...formatFor(cfg, get()), ...(q4Only && picked === null ? { weights: 'q4' } : {}) };
          const q4Why = format.weights === 'q4' ? q4Problem(cfg) : null;
          if (q4Why) throw new Error(`${name} cannot load as q4: ${q4Why}`);
          const run = get().configResult.config ?? get().runConfig;
          const probe = get().probe;
          if (run && probe?.available) {
            const plan = planMemory(cfg, run, probe.limits, budgetBytes(get().gpuBudgetGiB), format);
            if (plan.blocking) throw new Error(`${name} cannot train on this GPU: ${plan.problem}`);
          }
          loadStarted = true;
          const info = await deps.engine.loadModel(
            c,
            deps.callback((p: LoadProgress) =>
              set((st) => ({
                loadProgress: p,
                downloads: p.download ? { ...st.downloads, [p.download.file]: p.download } : st.downloads,
              })),
            ),
            format,
            kernels,
          );
          // A new model ends the run that was on the old one (the worker already dropped it).
          get().clearRunView();
          set({
            loadStatus: 'ready',
            model: info,
            loadProgress: null,
            lastChoice: c,
            ...(asked ? { weightsChoice: info.format.weights, kvType: info.format.kv } : {}),
          });
          void get().refreshCache();
          return true;
        } catch (e) {
          // The worker drops the old model (and its run) as soon as a load starts.
          if (loadStarted) {
            set({ model: null });
            get().clearRunView();
          }
          set({ loadStatus: get().model ? 'ready' : 'error', loadProgress: null, modelError: errorMessage(e) });
          return false;
        }
      },

      async refreshCache() {
        try {
          set({ cached: await deps.engine.listCachedModels() });
        } catch {
          set({ cached: [] });
        }
      },

      async deleteCached(repo, revision, format = 'bf16') {
        await deps.engine.deleteCachedModel(repo, revision, format);
        await get().refreshCache();
      },
    };
  };
