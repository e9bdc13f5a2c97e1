// What crosses the worker boundary: plain, structured-cloneable types shared by the engine
// (src/worker/engine.ts) and the UI store. No DOM, no React, no GPU objects.
import type { Qwen3Config } from '../model/config.ts';
import type { DownloadProgress } from '../model/sources.ts';
import type { SpyRLConfig } from '../game/config.ts';
import type { SpyDocument } from '../game/documents.ts';
import type { RoundRecord } from '../game/round.ts';
import type { EvalReport } from '../train/evaluate.ts';
import type { KvType, ModelFormat, WeightsFormat } from '../model/format.ts';
import type { Tuning } from '../ops/tuning.ts';

export type { DownloadProgress, KvType, ModelFormat, Tuning, WeightsFormat };

/** Where a model comes from. Files are File objects from a folder pick (they clone into the worker). */
export type ModelChoice =
  { kind: 'demo' } | { kind: 'hub'; repo: string; revision?: string } | { kind: 'files'; files: File[] };

/** A ModelChoice without its bytes: what an autosaved run remembers about its base model. */
export type ModelRef =
  { kind: 'demo' } | { kind: 'hub'; repo: string; revision: string } | { kind: 'files'; name: string };

export interface LoadProgress {
  /** 'cache': writing the quantized weights to the browser cache after a q4 load. */
  stage: 'gpu' | 'download' | 'upload' | 'cache';
  /** 0..1 over the whole load. */
  fraction: number;
  text: string;
  /** Per-file Hub download progress (bytes, speed, ETA). */
  download?: DownloadProgress;
}

export interface GpuProbe {
  available: boolean;
  /** Why no adapter, when unavailable. */
  reason?: string;
  description: string;
  limits: { maxBufferSize: number; maxStorageBufferBindingSize: number };
  features: string[];
}

export interface LoadedModelInfo {
  name: string;
  ref: ModelRef;
  cfg: Qwen3Config;
  gpu: { description: string; f16: boolean; subgroups: boolean };
  format: ModelFormat;
  /** Kernel variants forced for this model (the app's "Kernel variants" field); {} when all are 'auto'. */
  kernels: Partial<Tuning>;
  /** Hub q4 loads: read from the quantized cache ('hit'), or quantized and then stored
   *  ('stored'), or quantized but not stored (`error` says why); null for other loads. */
  quantizedCache: { status: 'hit' | 'stored' | 'not-stored'; bytes: number; error?: string } | null;
}

/** An adapter picked by the user to continue from (PEFT folder or zip), validated against the loaded model. */
export interface PendingAdapterInfo {
  name: string;
  files: string[];
  r: number;
  alpha: number;
  targetModules: string[];
  /** optimizer.safetensors + trainer_state.json present: the run continues exactly. */
  hasOptimizerState: boolean;
}

export interface RunOptions {
  config: SpyRLConfig;
  train: SpyDocument[];
  evalDocs: SpyDocument[];
  /**
   * The GPU memory the user gave in the model panel (bytes; absent: none): the update keeps as
   * many layers' activations as fit in 90% of it (src/train/memory.ts withKeptLayers). Advice, not
   * a refusal: the panel warns above it.
   */
  gpuMemoryBytes?: number;
}

/** The autosave's index: written last, so a present meta means a complete save. */
export interface SavedRunMeta {
  /** Autosave format version (RUN_VERSION in src/train/checkpoint.ts); another version is refused. */
  version: number;
  /** The run's id, from its start; kept across resumes. */
  runId: string;
  savedAt: number;
  round: number;
  model: ModelRef;
  modelName: string;
  /** How the base model was held (absent in saves from before formats existed). */
  format?: ModelFormat;
  /** The kernel variant overrides the model was loaded with (formatTuning; '' or absent: none). */
  kernels?: string;
  config: SpyRLConfig;
  files: { name: string; size: number }[];
  /** The UI's chart series (opaque to the worker) so a resumed run keeps its curves. */
  ui: unknown;
}

export type { EvalReport };

/** The paper's released model (a full fine-tune of Qwen3-4B-Instruct-2507): the compare column's preset. */
export const COMPARE_PRESET_REPO = 'SpyRL/SpyRL-Qwen3-4B-Summarization';

export interface EvalRequest {
  /** A third column: another checkpoint of the loaded model's architecture (null: base and adapter only). */
  compare: ModelChoice | null;
}

export interface EvalProgressInfo {
  stage: 'compare-load' | 'summaries';
  text: string;
  /** 0..1 within the stage. */
  fraction: number;
}

export interface StepResult {
  round: number;
  record: RoundRecord;
}

/** An error from the worker keeps its name, message and stack, and gains `kind` (src/worker/errors.ts). */
export function errorName(e: unknown): string {
  return e instanceof Error || (typeof e === 'object' && e !== null && 'name' in e)
    ? String((e as { name: unknown }).name)
    : 'Error';
}

export function errorMessage(e: unknown): string {
  return e instanceof Error || (typeof e === 'object' && e !== null && 'message' in e)
    ? String((e as { message: unknown }).message)
    : String(e);
}

/**
 * What kind of failure an engine error is, decided in the worker from the error's class (or a
 * class in its `cause` chain) where the GPU error classes are known; class names do not survive
 * minification and messages are not an API, so the page branches on this instead.
 */
export type ErrorKind = 'device-lost' | 'out-of-memory' | 'gpu-unavailable' | 'gpu-validation' | 'error';

export const ERROR_KINDS: readonly ErrorKind[] = [
  'device-lost',
  'out-of-memory',
  'gpu-unavailable',
  'gpu-validation',
  'error',
];

/** An Error as it crosses the worker boundary (comlink's 'throw' format, plus kind and reason). */
export interface SerializedError {
  name: string;
  message: string;
  stack?: string;
  kind: ErrorKind;
  /** GPUDeviceLostInfo.reason for a lost device ('destroyed', 'unknown'). */
  reason?: string;
}

/** An error thrown by the engine as the page receives it through comlink: its name, message and stack, typed. */
export class EngineError extends Error {
  readonly kind: ErrorKind;
  readonly reason?: string;

  constructor(e: SerializedError) {
    super(e.message);
    this.name = e.name;
    this.kind = e.kind;
    if (e.reason !== undefined) this.reason = e.reason;
    if (e.stack !== undefined) this.stack = e.stack;
  }
}

/** The typed kind of an error from the engine; 'error' for anything that did not cross the boundary typed. */
export function errorKind(e: unknown): ErrorKind {
  const kind = typeof e === 'object' && e !== null && 'kind' in e ? (e as { kind: unknown }).kind : undefined;
  return ERROR_KINDS.includes(kind as ErrorKind) ? (kind as ErrorKind) : 'error';
}
