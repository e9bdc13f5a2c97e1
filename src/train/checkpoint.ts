// What a saved run must look like before any of it is used: the run stamp (format, version, run
// id) of a checkpoint, the trainer state, pending rounds, run log and config of a SpyRL
// checkpoint, the run settings of an sft checkpoint, and the autosave's meta and documents.
// Pure: no GPU, no fs. Every refusal is one CheckpointError naming the file and the field.
// (Optimizer moments are checked where they are read: readOptimizerState in src/model/peft.ts.)
import { INITIAL_SPY_BASELINE, type SpyBaselineState } from '../game/advantages.ts';
import { configLeaves, validateConfig, ConfigError, type SpyRLConfig } from '../game/config.ts';
import type { SpyDocument } from '../game/documents.ts';
import type { PolicySample } from '../game/round.ts';
import { ModelLoadError } from '../model/errors.ts';
import type { ModelFormat } from '../model/format.ts';
import { parseTuning, type Tuning } from '../ops/tuning.ts';

/** Written into every checkpoint and autosave; a reader refuses any other format or version. */
export const RUN_FORMAT = 'spyrl-run';
export const RUN_VERSION = 1;

/** Identifies a run from its creation on; a resumed run keeps it. */
export interface RunStamp {
  format: typeof RUN_FORMAT;
  version: typeof RUN_VERSION;
  runId: string;
}

export class CheckpointError extends ModelLoadError {
  readonly field: string;
  constructor(file: string, field: string, detail: string) {
    super(file, `field "${field}" ${detail}`);
    this.name = 'CheckpointError';
    this.field = field;
  }
}

/** A fresh run id (random; never derived from the seed, so two runs with one config differ). */
export function newRunId(): string {
  return globalThis.crypto.randomUUID();
}

export function runStamp(runId: string = newRunId()): RunStamp {
  return { format: RUN_FORMAT, version: RUN_VERSION, runId };
}

// ---- field checks ---------------------------------------------------------------------------

const show = (x: unknown) => (x === undefined ? 'missing' : (JSON.stringify(x)?.slice(0, 80) ?? String(x)));

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

class Fields {
  constructor(
    readonly file: string,
    readonly prefix = '',
  ) {}
  fail(field: string, detail: string): never {
    throw new CheckpointError(this.file, this.prefix + field, detail);
  }
  at(field: string): Fields {
    return new Fields(this.file, `${this.prefix}${field}.`);
  }
  record(o: Record<string, unknown>, field: string): Record<string, unknown> {
    const v = o[field];
    if (!isRecord(v)) this.fail(field, `must be an object, got ${show(v)}`);
    return v;
  }
  int(o: Record<string, unknown>, field: string, min = 0): number {
    const v = o[field];
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min)
      this.fail(field, `must be an integer >= ${min}, got ${show(v)}`);
    return v;
  }
  finite(o: Record<string, unknown>, field: string, min = -Infinity): number {
    const v = o[field];
    if (typeof v !== 'number' || !Number.isFinite(v) || v < min)
      this.fail(field, `must be a finite number${min > -Infinity ? ` >= ${min}` : ''}, got ${show(v)}`);
    return v;
  }
  string(o: Record<string, unknown>, field: string): string {
    const v = o[field];
    if (typeof v !== 'string' || v === '') this.fail(field, `must be a non-empty string, got ${show(v)}`);
    return v;
  }
  oneOf<T extends string>(o: Record<string, unknown>, field: string, values: readonly T[]): T {
    const v = o[field];
    if (!values.includes(v as T))
      this.fail(field, `must be one of ${values.map((x) => `"${x}"`).join(', ')}, got ${show(v)}`);
    return v as T;
  }
  ints(o: Record<string, unknown>, field: string, vocab = Infinity): number[] {
    const v = o[field];
    if (!Array.isArray(v) || !v.every((x) => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0 && x < vocab)) {
      this.fail(field, `must be a list of token ids${vocab < Infinity ? ` in 0..${vocab - 1}` : ''}, got ${show(v)}`);
    }
    return v as number[];
  }
}

function parseJson(text: string, file: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ModelLoadError(file, `not valid JSON (${(e as Error).message})`);
  }
}

/** The run stamp at `o[field]`: format, a version this build reads, a run id. */
export function parseRunStamp(o: Record<string, unknown>, field: string, file: string, prefix = ''): RunStamp {
  const f = new Fields(file, prefix);
  if (o[field] === undefined)
    f.fail(field, `is missing: the save has no run format and version (saved by an older build?); start a new run`);
  const s = f.record(o, field);
  const g = f.at(field);
  if (s['format'] !== RUN_FORMAT) g.fail('format', `is ${show(s['format'])}, expected "${RUN_FORMAT}"`);
  if (s['version'] !== RUN_VERSION)
    g.fail('version', `is ${show(s['version'])}; this build reads version ${RUN_VERSION}`);
  return runStamp(g.string(s, 'runId'));
}

// ---- SpyRL checkpoint -----------------------------------------------------------------------

export interface SpyRLTrainerState {
  round: number;
  spyBaseline: SpyBaselineState;
  pending: { round: number; samples: PolicySample[] }[];
}

/** trainer_state.json's `extra` as SpyRLTrainer.checkpointFiles writes it: { run, trainer }. */
export function parseTrainerExtra(
  extra: Record<string, unknown>,
  file = 'trainer_state.json',
): { stamp: RunStamp; state: SpyRLTrainerState } {
  const f = new Fields(file, 'extra.');
  const stamp = parseRunStamp(extra, 'run', file, 'extra.');
  const t = f.record(extra, 'trainer');
  const ft = f.at('trainer');
  const round = ft.int(t, 'round');
  const b = t['spyBaseline'] === undefined ? { ...INITIAL_SPY_BASELINE } : ft.record(t, 'spyBaseline');
  const fb = ft.at('spyBaseline');
  const spyBaseline = { count: fb.int(b, 'count'), mean: fb.finite(b, 'mean'), variance: fb.finite(b, 'variance', 0) };
  return { stamp, state: { round, spyBaseline, pending: [] } };
}

function parseSample(x: unknown, f: Fields, field: string, vocab: number): PolicySample {
  if (!isRecord(x)) return f.fail(field, `must be an object, got ${show(x)}`);
  const g = f.at(field);
  const completionTokenIds = g.ints(x, 'completionTokenIds', vocab);
  const lp = x['oldLogprobs'];
  if (
    !Array.isArray(lp) ||
    lp.length !== completionTokenIds.length ||
    !lp.every((v) => typeof v === 'number' && Number.isFinite(v) && v <= 0)
  ) {
    g.fail(
      'oldLogprobs',
      `must be ${completionTokenIds.length} finite log-probs <= 0 (one per completion token), got ${show(lp)}`,
    );
  }
  const cand = x['candidateTokenIds'];
  return {
    stage: g.oneOf(x, 'stage', ['summary', 'vote'] as const),
    seat: g.int(x, 'seat'),
    promptTokenIds: g.ints(x, 'promptTokenIds', vocab),
    completionTokenIds,
    oldLogprobs: lp as number[],
    advantage: g.finite(x, 'advantage'),
    candidateTokenIds: cand === null || cand === undefined ? null : g.ints(x, 'candidateTokenIds', vocab),
  };
}

/** pending_samples.json: the rounds played since the last update, with their samples. */
export function parsePending(
  text: string,
  vocab = Infinity,
  file = 'pending_samples.json',
): SpyRLTrainerState['pending'] {
  const json = parseJson(text, file);
  const f = new Fields(file);
  if (!Array.isArray(json)) throw new ModelLoadError(file, `must be a list of pending rounds, got ${show(json)}`);
  return json.map((p, i) => {
    if (!isRecord(p)) return f.fail(`[${i}]`, `must be an object, got ${show(p)}`);
    const g = f.at(`[${i}]`);
    const samples = p['samples'];
    if (!Array.isArray(samples)) g.fail('samples', `must be a list, got ${show(samples)}`);
    return {
      round: g.int(p, 'round'),
      samples: (samples as unknown[]).map((s, j) => parseSample(s, g, `samples[${j}]`, vocab)),
    };
  });
}

/** run.jsonl: one JSON object per line (returned parsed), naming the first bad line. */
export function parseRunLog(text: string, file = 'run.jsonl'): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  text.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    let rec: unknown;
    try {
      rec = JSON.parse(line);
    } catch (e) {
      throw new ModelLoadError(file, `line ${i + 1} is not valid JSON (${(e as Error).message})`);
    }
    if (!isRecord(rec)) throw new ModelLoadError(file, `line ${i + 1} is not a JSON object`);
    if (typeof rec['round'] !== 'number' || !Number.isSafeInteger(rec['round']) || rec['round'] < 0)
      throw new ModelLoadError(file, `line ${i + 1}: field "round" must be an integer >= 0, got ${show(rec['round'])}`);
    out.push(rec);
  });
  return out;
}

/** A saved spyrl_config.json (text or parsed): JSON that validateConfig accepts. */
export function parseSavedConfig(json: unknown, file = 'spyrl_config.json'): SpyRLConfig {
  const raw = typeof json === 'string' ? parseJson(json, file) : json;
  try {
    return validateConfig(raw);
  } catch (e) {
    if (e instanceof ConfigError) throw new CheckpointError(file, e.field, e.message.replace(/^config\.[^:]*: /, ''));
    throw e;
  }
}

/** Setting paths (`optimizer.lr`, `seed`, ...) whose values differ between two configs. */
export function configDiff(saved: SpyRLConfig, asked: SpyRLConfig): string[] {
  const want = new Map(configLeaves(asked).map(([k, v]) => [k, JSON.stringify(v)]));
  return configLeaves(saved)
    .filter(([k, v]) => want.get(k) !== JSON.stringify(v))
    .map(([k]) => k);
}

/** "seed (saved 7, asked 8), groupSize (saved 3, asked 4)" for the settings that differ. */
export function describeDiff(
  saved: Record<string, unknown>,
  asked: Record<string, unknown>,
  keys: readonly string[],
): string {
  return keys.map((k) => `${k} (saved ${show(saved[k])}, asked ${show(asked[k])})`).join(', ');
}

/** Leaf values of a config by path, for describeDiff. */
export function configValues(c: SpyRLConfig): Record<string, unknown> {
  return Object.fromEntries(configLeaves(c));
}

// ---- sft checkpoint -------------------------------------------------------------------------

/** Everything that fixes an sft run's data order and updates; a resume must not change any. */
export interface SftRunSettings {
  seed: number;
  seqLen: number;
  batch: number;
  lr: number;
  schedule: 'constant' | 'cosine';
  warmup: number;
  /** The cosine schedule's length (--steps of the first run); null for constant. */
  scheduleSteps: number | null;
  maxGradNorm: number;
  weightDecay: number;
  /** SHA-256 (hex) of the training text, so a changed --text-file is caught. */
  textSha256: string;
  /** How the base was held (--weights): the adapter was trained against it. Absent in
   *  checkpoints from before it was recorded. */
  weights?: 'bf16' | 'q4';
}

export const SFT_SETTING_FLAGS: Record<keyof SftRunSettings, string> = {
  seed: '--seed',
  seqLen: '--seq-len',
  batch: '--batch',
  lr: '--lr',
  schedule: '--schedule',
  warmup: '--warmup',
  scheduleSteps: '--steps (cosine length)',
  maxGradNorm: '--max-grad-norm',
  weightDecay: '--weight-decay',
  textSha256: '--text-file (contents)',
  weights: '--weights',
};

/** trainer_state.json's `extra` of an sft run: { run, sft: SftRunSettings & { textFile } }. */
export function parseSftExtra(
  extra: Record<string, unknown>,
  file = 'trainer_state.json',
): { stamp: RunStamp; settings: SftRunSettings; textFile: string } {
  const stamp = parseRunStamp(extra, 'run', file, 'extra.');
  const f = new Fields(file, 'extra.');
  const s = f.record(extra, 'sft');
  const g = f.at('sft');
  const schedule = g.oneOf(s, 'schedule', ['constant', 'cosine'] as const);
  const lr = g.finite(s, 'lr');
  if (!(lr > 0)) g.fail('lr', `must be > 0, got ${lr}`);
  const hash = g.string(s, 'textSha256');
  if (!/^[0-9a-f]{64}$/.test(hash)) g.fail('textSha256', `must be 64 hex digits, got ${show(hash)}`);
  return {
    stamp,
    textFile: g.string(s, 'textFile'),
    settings: {
      seed: g.int(s, 'seed'),
      seqLen: g.int(s, 'seqLen', 2),
      batch: g.int(s, 'batch', 1),
      lr,
      schedule,
      warmup: g.int(s, 'warmup'),
      scheduleSteps: schedule === 'cosine' ? g.int(s, 'scheduleSteps', 1) : null,
      maxGradNorm: g.finite(s, 'maxGradNorm', 0),
      weightDecay: g.finite(s, 'weightDecay', 0),
      textSha256: hash,
      ...(s['weights'] === undefined ? {} : { weights: g.oneOf(s, 'weights', ['bf16', 'q4'] as const) }),
    },
  };
}

/** The settings given on the command line that differ from the saved ones. */
export function changedSettings<T extends object>(saved: T, asked: Partial<T>): (keyof T & string)[] {
  return (Object.keys(asked) as (keyof T & string)[]).filter((k) => asked[k] !== undefined && asked[k] !== saved[k]);
}

// ---- autosave -------------------------------------------------------------------------------

export const AUTOSAVE_META = 'meta.json';

/** The autosave's meta.json as the engine wrote it: stamp, round, model, config, file list. */
export function parseAutosaveMeta(
  meta: unknown,
  file = AUTOSAVE_META,
): {
  stamp: RunStamp;
  round: number;
  config: SpyRLConfig;
  format: ModelFormat | undefined;
  kernels: Partial<Tuning>;
} {
  if (!isRecord(meta)) throw new ModelLoadError(file, `is not a JSON object`);
  const f = new Fields(file);
  if (meta['version'] !== RUN_VERSION)
    f.fail('version', `is ${show(meta['version'])}; this build reads autosaves of version ${RUN_VERSION}`);
  const runId = f.string(meta, 'runId');
  const round = f.int(meta, 'round');
  f.finite(meta, 'savedAt', 0);
  f.string(meta, 'modelName');
  const model = f.record(meta, 'model');
  f.at('model').oneOf(model, 'kind', ['demo', 'hub', 'files'] as const);
  // How the base was held (absent in saves from before formats existed).
  let format: ModelFormat | undefined;
  if (meta['format'] !== undefined) {
    const fm = f.record(meta, 'format');
    format = {
      weights: f.at('format').oneOf(fm, 'weights', ['bf16', 'q4'] as const),
      kv: f.at('format').oneOf(fm, 'kv', ['f32', 'f16'] as const),
    };
  }
  // The kernel variant overrides the model was loaded with (absent in older saves: none).
  let kernels: Partial<Tuning> = {};
  if (meta['kernels'] !== undefined) {
    const spec = meta['kernels'];
    if (typeof spec !== 'string') f.fail('kernels', `must be a string (name=value,...), got ${show(spec)}`);
    try {
      kernels = parseTuning(spec as string);
    } catch (e) {
      f.fail('kernels', (e as Error).message);
    }
  }
  const files = meta['files'];
  if (!Array.isArray(files)) f.fail('files', `must be a list, got ${show(files)}`);
  (files as unknown[]).forEach((x, i) => {
    if (!isRecord(x)) return f.fail(`files[${i}]`, `must be an object, got ${show(x)}`);
    f.at(`files[${i}]`).string(x, 'name');
    f.at(`files[${i}]`).int(x, 'size');
  });
  if (meta['config'] === undefined) f.fail('config', 'is missing');
  let config: SpyRLConfig;
  try {
    config = validateConfig(meta['config']);
  } catch (e) {
    if (e instanceof ConfigError)
      throw new CheckpointError(file, `config.${e.field}`, e.message.replace(/^config\.[^:]*: /, ''));
    throw e;
  }
  return { stamp: runStamp(runId), round, config, format, kernels };
}

/** documents.json of an autosave: { train: SpyDocument[] (non-empty), evalDocs?: SpyDocument[] }. */
export function parseRunDocuments(
  text: string | undefined,
  file = 'documents.json',
): { train: SpyDocument[]; evalDocs: SpyDocument[] } {
  if (text === undefined) throw new ModelLoadError(file, 'is missing from the save: it cannot be resumed');
  const json = parseJson(text, file);
  if (!isRecord(json)) throw new ModelLoadError(file, 'is not a JSON object');
  const f = new Fields(file);
  const docs = (field: string, required: boolean): SpyDocument[] => {
    const v = json[field];
    if (v === undefined && !required) return [];
    if (!Array.isArray(v) || (required && v.length === 0))
      f.fail(field, `must be a ${required ? 'non-empty ' : ''}list of documents, got ${show(v)}`);
    return (v as unknown[]).map((d, i) => {
      if (!isRecord(d)) return f.fail(`${field}[${i}]`, `must be an object, got ${show(d)}`);
      const g = f.at(`${field}[${i}]`);
      const out: SpyDocument = { id: g.string(d, 'id'), report: g.string(d, 'report') };
      if (d['source'] !== undefined) out.source = g.string(d, 'source');
      if (d['summary'] !== undefined) out.summary = g.string(d, 'summary');
      return out;
    });
  };
  return { train: docs('train', true), evalDocs: docs('evalDocs', false) };
}
