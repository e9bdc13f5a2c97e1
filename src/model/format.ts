// How a model is held on the GPU: the weights format (bf16 as downloaded, or q4) and the KV-cache
// element type. Pure functions of config.json, shared by the engine, the CLI, the store and the UI
// (moved out of src/worker/ so the UI reaches them without the worker).
import { paramCount, type Qwen3Config } from './config.ts';
import type { KvDtype } from './kvLayout.ts';
import { Q4_GROUP } from './q4.ts';

/** The same union as src/train/memory.ts's WeightsFormat (model/ does not import train/). */
export type WeightsFormat = 'bf16' | 'q4';
export type KvType = KvDtype;

export interface ModelFormat {
  weights: WeightsFormat;
  kv: KvType;
}

/** From this size on q4 is the default: below it bf16 fits most GPUs and q4 saves little. */
export const Q4_DEFAULT_MIN_PARAMS = 1.5e9;
/** Half the KV memory of f32 for a rounding error far below q4's. */
export const DEFAULT_KV: KvType = 'f16';

/** Why q4 cannot hold this model, or null: every Linear's input dimension (the dimension the
 *  groups of 32 run along) and the embedding's hidden size must be multiples of 32. */
export function q4Problem(cfg: Qwen3Config): string | null {
  const dims: [string, number][] = [
    ['hidden_size', cfg.hiddenSize],
    ['num_attention_heads x head_dim', cfg.numHeads * cfg.headDim],
    ['intermediate_size', cfg.intermediateSize],
  ];
  const bad = dims.filter(([, d]) => d % Q4_GROUP !== 0);
  if (bad.length === 0) return null;
  return `q4 needs the Linear input sizes to be multiples of ${Q4_GROUP}: ${bad.map(([name, d]) => `${name} is ${d}`).join(', ')}`;
}

/** q4 for models of 1.5B parameters and more (when q4 can hold them), else bf16. */
export function defaultWeights(cfg: Qwen3Config): WeightsFormat {
  return paramCount(cfg) >= Q4_DEFAULT_MIN_PARAMS && q4Problem(cfg) === null ? 'q4' : 'bf16';
}

export function defaultFormat(cfg: Qwen3Config): ModelFormat {
  return { weights: defaultWeights(cfg), kv: DEFAULT_KV };
}

/** Checks a requested format against the model; throws naming the model and the reason. */
export function checkFormat(cfg: Qwen3Config, format: ModelFormat, name: string): void {
  if (format.weights !== 'bf16' && format.weights !== 'q4')
    throw new Error(`weights must be bf16 or q4 (got "${String(format.weights)}")`);
  if (format.kv !== 'f32' && format.kv !== 'f16')
    throw new Error(`the KV cache must be f32 or f16 (got "${String(format.kv)}")`);
  const problem = format.weights === 'q4' ? q4Problem(cfg) : null;
  if (problem) throw new Error(`${name} cannot load as q4: ${problem}`);
}

export function sameFormat(a: ModelFormat, b: ModelFormat): boolean {
  return a.weights === b.weights && a.kv === b.kv;
}

/** "bf16 weights, f32 KV cache": how a message names a format. */
export function describeFormat(f: ModelFormat): string {
  return `${f.weights} weights, ${f.kv} KV cache`;
}

/**
 * The fields where `asked` differs from `saved` (a resumed run's format), "weights (saved bf16,
 * asked q4)", or [] when they agree.
 */
export function formatDiff(saved: ModelFormat, asked: ModelFormat): string[] {
  return (['weights', 'kv'] as const)
    .filter((k) => saved[k] !== asked[k])
    .map((k) => `${k} (saved ${saved[k]}, asked ${asked[k]})`);
}

/** `x` as a ModelFormat when it is one (a saved run's "format" field), else null. */
export function asModelFormat(x: unknown): ModelFormat | null {
  if (typeof x !== 'object' || x === null) return null;
  const { weights, kv } = x as Record<string, unknown>;
  return (weights === 'bf16' || weights === 'q4') && (kv === 'f32' || kv === 'f16') ? { weights, kv } : null;
}
