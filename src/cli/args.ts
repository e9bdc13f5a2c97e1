// Flag parsing for the spyrl command: one UsageError per bad flag.
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { parseTuning, type Tuning } from '../ops/tuning.ts';

export class UsageError extends Error {
  override name = 'UsageError';
}

export type Flags = Record<string, string | boolean | undefined>;

export function parse(args: string[], options: ParseArgsConfig['options']): Flags {
  try {
    return parseArgs({ args, options, strict: true, allowPositionals: false }).values as Flags;
  } catch (e) {
    throw new UsageError((e as Error).message.replace(/\. To specify a positional.*$/s, ''));
  }
}

export function str(flags: Flags, name: string, required = false): string | undefined {
  const v = flags[name];
  if (v === undefined || v === '') {
    if (required) throw new UsageError(`--${name} is required`);
    return undefined;
  }
  return String(v);
}

export function int(flags: Flags, name: string, fallback: number, min = 0): number {
  const v = str(flags, name);
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < min) throw new UsageError(`--${name} must be an integer >= ${min} (got "${v}")`);
  return n;
}

/** Bounds of a numeric flag; `above` is an open lower bound (x > above), `min` a closed one. */
export interface NumRange {
  min?: number;
  above?: number;
  max?: number;
}

function describeRange(r: NumRange): string {
  const lo = r.above !== undefined ? `> ${r.above}` : r.min !== undefined ? `>= ${r.min}` : '';
  const hi = r.max !== undefined ? `<= ${r.max}` : '';
  return [lo, hi].filter(Boolean).join(' and ');
}

export function num(flags: Flags, name: string, fallback: number, range: NumRange = {}): number {
  const v = str(flags, name);
  if (v === undefined) return fallback;
  const n = Number(v);
  const bounded = Object.keys(range).length > 0;
  if (!Number.isFinite(n))
    throw new UsageError(`--${name} must be a number${bounded ? ` ${describeRange(range)}` : ''} (got "${v}")`);
  if (
    (range.min !== undefined && n < range.min) ||
    (range.above !== undefined && n <= range.above) ||
    (range.max !== undefined && n > range.max)
  ) {
    throw new UsageError(`--${name} must be ${describeRange(range)} (got "${v}")`);
  }
  return n;
}

/** --gpu-memory GIB as bytes (undefined when not given): a positive number of GiB. */
export function gpuMemoryBudget(flags: Flags): number | undefined {
  return str(flags, 'gpu-memory') === undefined ? undefined : num(flags, 'gpu-memory', 0, { above: 0 }) * 2 ** 30;
}

/** --prefill-chunk TOKENS|auto: tokens per prefill chunk (RoundPlanOptions.forwardChunk); undefined for auto or left out. */
export const PREFILL_CHUNK_FLAG = { 'prefill-chunk': { type: 'string' } } as const;
export const prefillChunk = (flags: Flags): number | undefined => chunkFlag(flags, 'prefill-chunk', 'tokens');

/** --mlp-chunk ROWS|auto: rows of the update's MLP chunks (RoundPlanOptions.mlpChunk); undefined for auto or left out. */
export const MLP_CHUNK_FLAG = { 'mlp-chunk': { type: 'string' } } as const;
export const mlpChunk = (flags: Flags): number | undefined => chunkFlag(flags, 'mlp-chunk', 'rows');

function chunkFlag(flags: Flags, name: string, unit: string): number | undefined {
  const v = str(flags, name);
  if (v === undefined || v === 'auto') return undefined;
  const n = Number(v);
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(n) || n < 1)
    throw new UsageError(`--${name} must be auto or a positive integer of ${unit} (got "${v}")`);
  return n;
}

/** --force: replace a non-empty --out folder (a UsageError otherwise). */
export const FORCE_FLAG = { force: { type: 'boolean' } } as const;

export function bool(flags: Flags, name: string, fallback: boolean): boolean {
  const v = str(flags, name);
  if (v === undefined) return fallback;
  if (v === 'true' || v === '1') return true;
  if (v === 'false' || v === '0') return false;
  throw new UsageError(`--${name} must be true or false (got "${v}")`);
}

export function tokenList(v: string, flag: string): number[] {
  const parts = v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  if (parts.length === 0) throw new UsageError(`--${flag} is empty`);
  return parts.map((p) => {
    const n = Number(p);
    if (!Number.isSafeInteger(n) || n < 0) throw new UsageError(`--${flag}: "${p}" is not a token id`);
    return n;
  });
}

export function checkIds(ids: number[], V: number): void {
  const bad = ids.findIndex((id) => id >= V);
  if (bad >= 0)
    throw new UsageError(
      `token id ${ids[bad]} (index ${bad}) is out of range: the model's vocabulary has ${V} tokens (0..${V - 1})`,
    );
}

/** The engine's storage choices, shared by every command that loads a model. */
export interface EngineOptions {
  /** Base weights on the GPU: bf16 as in the checkpoint, or q4 (docs/ENGINE.md, "q4 weights"). */
  weights: 'bf16' | 'q4';
  /** KV-cache element type. */
  kv: 'f32' | 'f16';
  /** Kernel variant switches over their 'auto' choices (src/ops/common.ts tuning), from --kernels. */
  kernels?: Partial<Tuning>;
}

export const ENGINE_FLAGS = {
  weights: { type: 'string' },
  kv: { type: 'string' },
  kernels: { type: 'string' },
} as const;

/** --weights bf16|q4, --kv f32|f16 and --kernels NAME=VALUE,...; the CLI defaults stay bf16, f32 and auto. */
export function engineOptions(flags: Flags): EngineOptions {
  const weights = str(flags, 'weights') ?? 'bf16';
  if (weights !== 'bf16' && weights !== 'q4') throw new UsageError(`--weights must be bf16 or q4 (got "${weights}")`);
  const kv = str(flags, 'kv') ?? 'f32';
  if (kv !== 'f32' && kv !== 'f16') throw new UsageError(`--kv must be f32 or f16 (got "${kv}")`);
  const spec = str(flags, 'kernels');
  if (spec === undefined) return { weights, kv };
  try {
    return { weights, kv, kernels: parseTuning(spec) };
  } catch (e) {
    throw new UsageError(`--kernels: ${(e as Error).message}`);
  }
}
