// Hugging Face config.json for Qwen3 dense models -> typed config, expected weights, memory estimate.
import { ModelLoadError } from './errors.ts';
import type { Dtype, SafetensorsModel } from './safetensors.ts';
import type { ModelSource } from './sources.ts';

const CONFIG_FILE = 'config.json';

export interface Qwen3Config {
  hiddenSize: number; // C
  numLayers: number; // L
  numHeads: number; // NH
  numKvHeads: number; // NKV
  headDim: number; // HD
  intermediateSize: number; // I
  vocabSize: number; // V
  ropeTheta: number;
  rmsNormEps: number;
  tieWordEmbeddings: boolean;
  maxPositionEmbeddings: number;
  torchDtype: string;
  bosTokenId: number | null;
  eosTokenIds: number[];
}

function fail(field: string, message: string): never {
  throw new ModelLoadError(CONFIG_FILE, `field "${field}" ${message}`);
}

/**
 * Sanity caps on every size, checked before anything is sized from them: a hostile or broken
 * config.json (num_hidden_layers: 2e8) must fail here, not run the process out of memory while
 * listing weights. Each cap is far above the largest dense Qwen3 (32B: 64 layers, hidden 5120,
 * intermediate 25600, 64 heads, 8 KV heads, head_dim 128, vocab 151936, 40960 positions) and the
 * 235B shapes (94 layers, hidden 4096, 64 heads, 4 KV heads).
 */
export const CONFIG_CAPS = {
  num_hidden_layers: 256,
  hidden_size: 65536,
  intermediate_size: 262144,
  vocab_size: 1 << 20,
  num_attention_heads: 1024,
  num_key_value_heads: 1024,
  head_dim: 1024,
  max_position_embeddings: 1 << 24,
} as const;

function posInt(raw: Record<string, unknown>, field: keyof typeof CONFIG_CAPS, fallback?: number): number {
  const v = raw[field] ?? fallback;
  const max = CONFIG_CAPS[field];
  if (v === undefined) fail(field, 'is missing');
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v <= 0 || v > max) {
    fail(field, `must be a positive integer in 1..${max}, got ${JSON.stringify(v)}`);
  }
  return v;
}

function posNumber(raw: Record<string, unknown>, field: string, fallback: number): number {
  const v = raw[field] ?? fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)
    fail(field, `must be a positive number, got ${JSON.stringify(v)}`);
  return v;
}

function tokenIds(raw: Record<string, unknown>, field: string): number[] {
  const v = raw[field];
  if (v === undefined || v === null) return [];
  const ids = Array.isArray(v) ? v : [v];
  if (!ids.every((x) => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0))
    fail(field, `must be a token id or a list of them, got ${JSON.stringify(v)}`);
  return ids as number[];
}

/** Parses config.json (text or parsed JSON). Defaults follow transformers' Qwen3Config where it has one. */
export function parseQwen3Config(json: unknown): Qwen3Config {
  let raw: unknown = json;
  if (typeof json === 'string') {
    try {
      raw = JSON.parse(json);
    } catch (e) {
      throw new ModelLoadError(CONFIG_FILE, `not valid JSON (${(e as Error).message})`);
    }
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw))
    throw new ModelLoadError(CONFIG_FILE, 'is not a JSON object');
  const r = raw as Record<string, unknown>;

  if (r['model_type'] !== 'qwen3') {
    fail('model_type', `is ${JSON.stringify(r['model_type'])}; only "qwen3" (dense Qwen3) is supported`);
  }
  // transformers >= 4.56 may nest RoPE settings in rope_parameters instead of rope_theta/rope_scaling.
  const ropeParams = r['rope_parameters'];
  let ropeTheta: number;
  if (typeof ropeParams === 'object' && ropeParams !== null) {
    const p = ropeParams as Record<string, unknown>;
    if (p['rope_type'] !== undefined && p['rope_type'] !== 'default') {
      fail(
        'rope_parameters.rope_type',
        `is ${JSON.stringify(p['rope_type'])}; only plain RoPE (no scaling) is supported`,
      );
    }
    ropeTheta = posNumber(p, 'rope_theta', posNumber(r, 'rope_theta', 10000));
  } else {
    ropeTheta = posNumber(r, 'rope_theta', 10000);
  }
  if (r['rope_scaling'] !== undefined && r['rope_scaling'] !== null) {
    fail(
      'rope_scaling',
      `is ${JSON.stringify(r['rope_scaling'])}; RoPE scaling (YaRN etc.) is not supported, only null`,
    );
  }
  if (r['use_sliding_window'] === true)
    fail('use_sliding_window', 'is true; sliding-window attention is not supported');
  if (r['attention_bias'] === true)
    fail('attention_bias', 'is true; Qwen3 attention has no biases and neither does this engine');
  if (r['hidden_act'] !== undefined && r['hidden_act'] !== 'silu')
    fail('hidden_act', `is ${JSON.stringify(r['hidden_act'])}; only "silu" is supported`);

  // Every size is range-checked here, before head_dim is derived or any list is built from them.
  const numLayers = posInt(r, 'num_hidden_layers');
  const intermediateSize = posInt(r, 'intermediate_size');
  const vocabSize = posInt(r, 'vocab_size');
  const maxPositionEmbeddings = posInt(r, 'max_position_embeddings', 32768);
  const hiddenSize = posInt(r, 'hidden_size');
  const numHeads = posInt(r, 'num_attention_heads');
  const numKvHeads = posInt(r, 'num_key_value_heads', numHeads);
  if (numHeads % numKvHeads !== 0)
    fail('num_key_value_heads', `(${numKvHeads}) must divide num_attention_heads (${numHeads})`);
  if (r['head_dim'] === undefined && hiddenSize % numHeads !== 0)
    fail(
      'head_dim',
      `is missing and hidden_size (${hiddenSize}) is not divisible by num_attention_heads (${numHeads})`,
    );
  const headDim = posInt(r, 'head_dim', hiddenSize / numHeads);
  if (headDim % 2 !== 0) fail('head_dim', `(${headDim}) must be even for rotate-half RoPE`);

  const tie = r['tie_word_embeddings'] ?? false;
  if (typeof tie !== 'boolean') fail('tie_word_embeddings', `must be true or false, got ${JSON.stringify(tie)}`);
  const dtype = r['torch_dtype'] ?? r['dtype'] ?? 'bfloat16';
  if (typeof dtype !== 'string') fail('torch_dtype', `must be a string, got ${JSON.stringify(dtype)}`);
  const bos = tokenIds(r, 'bos_token_id');

  return {
    hiddenSize,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    intermediateSize,
    vocabSize,
    ropeTheta,
    rmsNormEps: posNumber(r, 'rms_norm_eps', 1e-6),
    tieWordEmbeddings: tie,
    maxPositionEmbeddings,
    torchDtype: dtype,
    bosTokenId: bos[0] ?? null,
    eosTokenIds: tokenIds(r, 'eos_token_id'),
  };
}

export async function loadQwen3Config(source: Pick<ModelSource, 'readText'>): Promise<Qwen3Config> {
  return parseQwen3Config(await source.readText(CONFIG_FILE));
}

// ---------------------------------------------------------------------------------------------
// Expected weights.

export interface ExpectedWeight {
  name: string;
  shape: number[];
}

/** Every tensor a Qwen3 checkpoint holds, in load order. `lmHead` defaults to "untied". */
export function weightNames(cfg: Qwen3Config, opts: { lmHead?: boolean } = {}): ExpectedWeight[] {
  const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, vocabSize: V } = cfg;
  const out: ExpectedWeight[] = [{ name: 'model.embed_tokens.weight', shape: [V, C] }];
  for (let i = 0; i < cfg.numLayers; i++) {
    const p = `model.layers.${i}.`;
    out.push(
      { name: `${p}input_layernorm.weight`, shape: [C] },
      { name: `${p}self_attn.q_proj.weight`, shape: [NH * HD, C] },
      { name: `${p}self_attn.k_proj.weight`, shape: [NKV * HD, C] },
      { name: `${p}self_attn.v_proj.weight`, shape: [NKV * HD, C] },
      { name: `${p}self_attn.o_proj.weight`, shape: [C, NH * HD] },
      { name: `${p}self_attn.q_norm.weight`, shape: [HD] },
      { name: `${p}self_attn.k_norm.weight`, shape: [HD] },
      { name: `${p}post_attention_layernorm.weight`, shape: [C] },
      { name: `${p}mlp.gate_proj.weight`, shape: [I, C] },
      { name: `${p}mlp.up_proj.weight`, shape: [I, C] },
      { name: `${p}mlp.down_proj.weight`, shape: [C, I] },
    );
  }
  out.push({ name: 'model.norm.weight', shape: [C] });
  if (opts.lmHead ?? !cfg.tieWordEmbeddings) out.push({ name: 'lm_head.weight', shape: [V, C] });
  return out;
}

export const LM_HEAD = 'lm_head.weight';
export const EMBED = 'model.embed_tokens.weight';

/**
 * Checks a checkpoint's tensors against the config (names, shapes, dtype).
 * Returns the tensor to use as the LM head: lm_head.weight whenever present, even if the config says tied.
 */
export function validateWeights(
  cfg: Qwen3Config,
  model: Pick<SafetensorsModel, 'name' | 'tensors'>,
  opts: { dtype?: Dtype } = {},
): { lmHead: string } {
  const dtype = opts.dtype ?? 'BF16';
  const hasLmHead = model.tensors.has(LM_HEAD);
  for (const w of weightNames(cfg, { lmHead: hasLmHead || !cfg.tieWordEmbeddings })) {
    const t = model.tensors.get(w.name);
    if (!t) {
      const why = w.name === LM_HEAD ? ' (config has tie_word_embeddings=false)' : '';
      throw new ModelLoadError(model.name, `missing${why}; expected shape ${JSON.stringify(w.shape)}`, w.name);
    }
    if (t.shape.length !== w.shape.length || t.shape.some((d, i) => d !== w.shape[i])) {
      throw new ModelLoadError(
        t.file,
        `wrong shape: expected ${JSON.stringify(w.shape)} from config.json, got ${JSON.stringify(t.shape)}`,
        w.name,
      );
    }
    if (t.dtype !== dtype) throw new ModelLoadError(t.file, `dtype ${t.dtype}, expected ${dtype}`, w.name);
  }
  return { lmHead: hasLmHead ? LM_HEAD : EMBED };
}

// ---------------------------------------------------------------------------------------------
// Parameter count and GPU memory.

export function paramCount(cfg: Qwen3Config, opts: { lmHead?: boolean } = {}): number {
  return weightNames(cfg, opts).reduce((n, w) => n + w.shape.reduce((a, b) => a * b, 1), 0);
}

export interface MemoryEstimate {
  weights: number; // bf16 parameters
  kvCache: number; // f32 K and V, (L, S, maxT, NKV, HD) each
  activations: number; // f32 workspace for one forward chunk plus logits
  total: number;
}

/**
 * Bytes of GPU memory to run the model. Activations: one forward chunk of `tokensPerCall` tokens
 * (residual, normed, q, k, v, attention out, gate, up, silu*up) plus (slots, V) logits.
 */
export function gpuMemoryBytes(
  cfg: Qwen3Config,
  opts: { maxT: number; slots: number; tokensPerCall?: number },
): MemoryEstimate {
  const {
    hiddenSize: C,
    numHeads: NH,
    numKvHeads: NKV,
    headDim: HD,
    intermediateSize: I,
    vocabSize: V,
    numLayers: L,
  } = cfg;
  const T = opts.tokensPerCall ?? 256;
  const weights = paramCount(cfg) * 2;
  const kvCache = 2 * L * opts.slots * opts.maxT * NKV * HD * 4;
  const activations = (T * (3 * C + 2 * NH * HD + 2 * NKV * HD + 3 * I) + opts.slots * V) * 4;
  return { weights, kvCache, activations, total: weights + kvCache + activations };
}

const QWEN3_COMMON = {
  vocabSize: 151936,
  rmsNormEps: 1e-6,
  headDim: 128,
  numKvHeads: 8,
  ropeTheta: 1_000_000,
  maxPositionEmbeddings: 40960,
  torchDtype: 'bfloat16',
  bosTokenId: 151643,
} as const;

/** Official configs from the Hub (config.json of each repo). */
export const QWEN3_PRESETS = {
  'Qwen/Qwen3-0.6B': {
    ...QWEN3_COMMON,
    eosTokenIds: [151645],
    hiddenSize: 1024,
    numLayers: 28,
    numHeads: 16,
    intermediateSize: 3072,
    tieWordEmbeddings: true,
  },
  'Qwen/Qwen3-1.7B': {
    ...QWEN3_COMMON,
    eosTokenIds: [151645],
    hiddenSize: 2048,
    numLayers: 28,
    numHeads: 16,
    intermediateSize: 6144,
    tieWordEmbeddings: true,
  },
  'Qwen/Qwen3-4B-Instruct-2507': {
    ...QWEN3_COMMON,
    eosTokenIds: [151645],
    hiddenSize: 2560,
    numLayers: 36,
    numHeads: 32,
    intermediateSize: 9728,
    tieWordEmbeddings: true,
    ropeTheta: 5_000_000,
    maxPositionEmbeddings: 262144,
  },
  'Qwen/Qwen3-8B': {
    ...QWEN3_COMMON,
    eosTokenIds: [151645],
    hiddenSize: 4096,
    numLayers: 36,
    numHeads: 32,
    intermediateSize: 12288,
    tieWordEmbeddings: false,
  },
} satisfies Record<string, Qwen3Config>;

export type Qwen3PresetName = keyof typeof QWEN3_PRESETS;

export interface MemoryTableRow extends MemoryEstimate {
  repo: Qwen3PresetName;
  params: number;
}

export function memoryTable(opts: { maxT: number; slots: number; tokensPerCall?: number }): MemoryTableRow[] {
  return (Object.keys(QWEN3_PRESETS) as Qwen3PresetName[]).map((repo) => {
    const cfg: Qwen3Config = QWEN3_PRESETS[repo];
    return { repo, params: paramCount(cfg), ...gpuMemoryBytes(cfg, opts) };
  });
}
