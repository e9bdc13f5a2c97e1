// LoRA adapters in Hugging Face PEFT's on-disk format (adapter_config.json +
// adapter_model.safetensors), PEFT's default initialisation, and the AdamW state files a run
// needs to resume exactly. Pure data: no GPU, no fs (folders on disk: peft.node.ts).
import type { Qwen3Config } from './config.ts';
import { ModelLoadError } from './errors.ts';
import { LORA_TARGETS, targetDims, type LoraTarget } from './loraTargets.ts';
import {
  bf16BytesToF32,
  readSafetensorsHeader,
  readTensor,
  writeSafetensors,
  type SafetensorsFile,
} from './safetensors.ts';
import { readJson, type ModelSource } from './sources.ts';
import { mulberry32 } from './prng.ts';

export const ADAPTER_CONFIG_FILE = 'adapter_config.json';
export const ADAPTER_WEIGHTS_FILE = 'adapter_model.safetensors';
export const OPTIMIZER_FILE = 'optimizer.safetensors';
export const TRAINER_STATE_FILE = 'trainer_state.json';

// ---------------------------------------------------------------------------------------------
// 1. Config, scale, tensor table.

export { LORA_TARGETS, targetDims, type LoraTarget } from './loraTargets.ts';

export interface LoraConfig {
  r: number;
  alpha: number;
  /** Subset of LORA_TARGETS, kept in LORA_TARGETS order. */
  targetModules: LoraTarget[];
  /** Rank-stabilised LoRA: scale alpha / sqrt(r) instead of alpha / r. */
  useRslora: boolean;
  /** PEFT's base_model_name_or_path (a hub id or a folder); null when unknown. */
  baseModel: string | null;
}

/**
 * Bounds on a LoRA's rank and alpha (the game config has the same, src/game/config.ts): r above
 * 256 is no longer low-rank and only sizes buffers from a hostile file; alpha <= 0 turns the
 * update off or flips its sign.
 */
export const MAX_LORA_R = 256;
export const MAX_LORA_ALPHA = 1e4;

/** Fills defaults (all seven targets, no rsLoRA, unknown base) and puts targets in module order. */
export function loraConfig(c: Pick<LoraConfig, 'r' | 'alpha'> & Partial<LoraConfig>): LoraConfig {
  const targets = c.targetModules ?? LORA_TARGETS;
  for (const t of targets)
    if (!isTarget(t)) throw new RangeError(`unknown LoRA target "${t}" (supported: ${LORA_TARGETS.join(', ')})`);
  if (!Number.isSafeInteger(c.r) || c.r <= 0 || c.r > MAX_LORA_R)
    throw new RangeError(`LoRA rank r must be a positive integer, got ${c.r} (allowed range 1..${MAX_LORA_R})`);
  if (!Number.isFinite(c.alpha) || c.alpha <= 0 || c.alpha > MAX_LORA_ALPHA)
    throw new RangeError(`lora alpha must be a number > 0, got ${c.alpha} (allowed range (0, ${MAX_LORA_ALPHA}])`);
  if (targets.length === 0) throw new RangeError('LoRA needs at least one target module');
  return {
    r: c.r,
    alpha: c.alpha,
    targetModules: LORA_TARGETS.filter((t) => targets.includes(t)),
    useRslora: c.useRslora ?? false,
    baseModel: c.baseModel ?? null,
  };
}

function isTarget(x: unknown): x is LoraTarget {
  return (LORA_TARGETS as readonly unknown[]).includes(x);
}

/** PEFT's scaling s in y = x W^T + s (x A^T) B^T. */
export function loraScale(cfg: Pick<LoraConfig, 'r' | 'alpha' | 'useRslora'>): number {
  return cfg.useRslora ? cfg.alpha / Math.sqrt(cfg.r) : cfg.alpha / cfg.r;
}

function blockOf(t: LoraTarget): 'self_attn' | 'mlp' {
  return t === 'gate_proj' || t === 'up_proj' || t === 'down_proj' ? 'mlp' : 'self_attn';
}

/** PEFT's module path of a target: `base_model.model.model.layers.{i}.self_attn.q_proj`. */
export function loraPrefix(layer: number, t: LoraTarget): string {
  return `base_model.model.model.layers.${layer}.${blockOf(t)}.${t}`;
}

export interface LoraTensorShape {
  layer: number;
  target: LoraTarget;
  prefix: string;
  aKey: string; // `${prefix}.lora_A.weight`
  bKey: string; // `${prefix}.lora_B.weight`
  aShape: [number, number]; // (r, in)
  bShape: [number, number]; // (out, r)
}

/** Every LoRA pair of the adapter, layer-major, targets in module order. */
export function loraShapes(modelCfg: Qwen3Config, lora: Pick<LoraConfig, 'r' | 'targetModules'>): LoraTensorShape[] {
  const out: LoraTensorShape[] = [];
  for (let layer = 0; layer < modelCfg.numLayers; layer++) {
    for (const target of LORA_TARGETS) {
      if (!lora.targetModules.includes(target)) continue;
      const d = targetDims(modelCfg, target);
      const prefix = loraPrefix(layer, target);
      out.push({
        layer,
        target,
        prefix,
        aKey: `${prefix}.lora_A.weight`,
        bKey: `${prefix}.lora_B.weight`,
        aShape: [lora.r, d.in],
        bShape: [d.out, lora.r],
      });
    }
  }
  return out;
}

/** A key of adapter_model.safetensors, parsed. Accepts PEFT's in-memory form `lora_A.default.weight` too. */
interface ParsedKey {
  layer: number;
  block: string;
  target: string;
  which: 'A' | 'B';
  /** The key in PEFT's saved form (no adapter name). */
  canonical: string;
}

const KEY_RE = /^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.([a-z_]+)\.lora_(A|B)(\.default)?\.weight$/;

function parseKey(key: string): ParsedKey | null {
  const m = KEY_RE.exec(key);
  if (!m) return null;
  const [, layer, block, target, which] = m as unknown as [string, string, string, string, 'A' | 'B'];
  return {
    layer: Number(layer),
    block,
    target,
    which,
    canonical: `base_model.model.model.layers.${layer}.${block}.${target}.lora_${which}.weight`,
  };
}

// ---------------------------------------------------------------------------------------------
// 2. adapter_config.json

/**
 * The adapter_config.json object PEFT (0.18) saves for this config: every LoraConfig field with its
 * default, minus peft_version (we are not PEFT). PEFT drops fields it does not know with a warning,
 * so older versions read it too.
 */
export function adapterConfig(lora: LoraConfig): Record<string, unknown> {
  const cfg: Record<string, unknown> = {
    alora_invocation_tokens: null,
    alpha_pattern: {},
    arrow_config: null,
    auto_mapping: null,
    base_model_name_or_path: lora.baseModel,
    bias: 'none',
    corda_config: null,
    ensure_weight_tying: false,
    eva_config: null,
    exclude_modules: null,
    fan_in_fan_out: false,
    inference_mode: true,
    init_lora_weights: true,
    layer_replication: null,
    layers_pattern: null,
    layers_to_transform: null,
    loftq_config: {},
    lora_alpha: lora.alpha,
    lora_bias: false,
    lora_dropout: 0,
    megatron_config: null,
    megatron_core: 'megatron.core',
    modules_to_save: null,
    peft_type: 'LORA',
    qalora_group_size: 16,
    r: lora.r,
    rank_pattern: {},
    revision: null,
    target_modules: LORA_TARGETS.filter((t) => lora.targetModules.includes(t)),
    target_parameters: null,
    task_type: 'CAUSAL_LM',
    trainable_token_indices: null,
    use_dora: false,
    use_qalora: false,
    use_rslora: lora.useRslora,
  };
  return cfg;
}

/** adapter_config.json text, formatted as PEFT writes it (sorted keys, indent 2, no final newline). */
export function adapterConfigJson(lora: LoraConfig): string {
  const cfg = adapterConfig(lora);
  const sorted = Object.fromEntries(
    Object.keys(cfg)
      .sort()
      .map((k) => [k, cfg[k]]),
  );
  return JSON.stringify(sorted, null, 2);
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function isEmpty(v: unknown): boolean {
  return (
    v === undefined ||
    v === null ||
    v === false ||
    (Array.isArray(v) && v.length === 0) ||
    (isRecord(v) && Object.keys(v).length === 0)
  );
}

// Fields that change what the adapter computes or which tensors it holds; each must be at its default.
const UNSUPPORTED_FIELDS: [field: string, why: string][] = [
  ['use_dora', 'DoRA is not supported'],
  ['lora_bias', 'LoRA biases are not supported'],
  ['use_qalora', 'QA-LoRA is not supported'],
  ['modules_to_save', 'fully trained extra modules (modules_to_save) are not supported, only LoRA pairs'],
  ['trainable_token_indices', 'trainable token embeddings are not supported'],
  ['target_parameters', 'LoRA on raw parameters is not supported'],
  ['layers_to_transform', 'LoRA on a subset of layers is not supported; every layer must be adapted'],
  ['layer_replication', 'layer replication is not supported'],
  ['rank_pattern', 'per-module ranks are not supported'],
  ['alpha_pattern', 'per-module alphas are not supported'],
  ['exclude_modules', 'exclude_modules is not supported'],
  ['alora_invocation_tokens', 'activated LoRA (aLoRA) is not supported'],
];

/** Validates a parsed adapter_config.json and returns the LoRA it describes. */
export function parseAdapterConfig(json: unknown): LoraConfig {
  const fail = (field: string, msg: string): never => {
    throw new ModelLoadError(ADAPTER_CONFIG_FILE, `field "${field}" ${msg}`);
  };
  if (!isRecord(json)) throw new ModelLoadError(ADAPTER_CONFIG_FILE, 'is not a JSON object');
  const c = json;
  if (c['peft_type'] !== 'LORA')
    fail('peft_type', `is ${JSON.stringify(c['peft_type'])}; only "LORA" adapters are supported`);
  const task = c['task_type'];
  if (task !== undefined && task !== null && task !== 'CAUSAL_LM')
    fail('task_type', `is ${JSON.stringify(task)}; expected "CAUSAL_LM" (keys base_model.model.model.layers.*)`);

  const r = c['r'];
  if (typeof r !== 'number' || !Number.isSafeInteger(r) || r <= 0 || r > MAX_LORA_R)
    fail('r', `must be a positive integer, got ${JSON.stringify(r)} (allowed range 1..${MAX_LORA_R})`);
  const alpha = c['lora_alpha'];
  if (typeof alpha !== 'number' || !Number.isFinite(alpha))
    fail('lora_alpha', `must be a number, got ${JSON.stringify(alpha)}`);
  if ((alpha as number) <= 0 || (alpha as number) > MAX_LORA_ALPHA)
    fail('lora_alpha', `must be > 0, got ${JSON.stringify(alpha)} (allowed range (0, ${MAX_LORA_ALPHA}])`);
  const useRslora = c['use_rslora'] ?? false;
  if (typeof useRslora !== 'boolean') fail('use_rslora', `must be true or false, got ${JSON.stringify(useRslora)}`);
  const bias = c['bias'] ?? 'none';
  if (bias !== 'none') fail('bias', `is ${JSON.stringify(bias)}; only "none" is supported (biases are frozen)`);
  if ((c['fan_in_fan_out'] ?? false) !== false)
    fail('fan_in_fan_out', `is ${JSON.stringify(c['fan_in_fan_out'])}; must be false for nn.Linear (Qwen3)`);
  for (const [field, why] of UNSUPPORTED_FIELDS) {
    if (!isEmpty(c[field])) fail(field, `is ${JSON.stringify(c[field])}: ${why}`);
  }

  let targets: unknown = c['target_modules'];
  if (targets === 'all-linear')
    targets = [...LORA_TARGETS]; // PEFT's wildcard: every Linear but lm_head
  else if (typeof targets === 'string')
    fail(
      'target_modules',
      `is the regex ${JSON.stringify(targets)}; only a list of module names (${LORA_TARGETS.join(', ')}) is supported`,
    );
  if (!Array.isArray(targets) || targets.length === 0)
    fail('target_modules', `must be a non-empty list of module names, got ${JSON.stringify(targets)}`);
  for (const t of targets as unknown[]) {
    if (!isTarget(t))
      fail('target_modules', `has unsupported module ${JSON.stringify(t)} (supported: ${LORA_TARGETS.join(', ')})`);
  }
  const base = c['base_model_name_or_path'] ?? null;
  if (base !== null && typeof base !== 'string')
    fail('base_model_name_or_path', `must be a string or null, got ${JSON.stringify(base)}`);

  return loraConfig({
    r: r as number,
    alpha: alpha as number,
    targetModules: targets as LoraTarget[],
    useRslora: useRslora as boolean,
    baseModel: base as string | null,
  });
}

// ---------------------------------------------------------------------------------------------
// 3. adapter_model.safetensors

export type LoraTensors = Map<string, Float32Array>;

export interface AdapterFiles {
  'adapter_config.json': string;
  'adapter_model.safetensors': Uint8Array;
}

function f32Bytes(x: Float32Array): Uint8Array {
  return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
}

/**
 * Serialises an adapter as PEFT saves it: F32 tensors sorted by key, metadata {"format":"pt"}.
 * Shapes come from the key (A is (r, n/r), B is (n/r, r)); pass modelCfg to check every tensor too.
 */
export function writeAdapter(
  lora: LoraConfig,
  tensors: ReadonlyMap<string, Float32Array>,
  modelCfg?: Qwen3Config,
): AdapterFiles {
  const shapes = new Map<string, number[]>();
  if (modelCfg) {
    for (const s of loraShapes(modelCfg, lora)) {
      shapes.set(s.aKey, s.aShape);
      shapes.set(s.bKey, s.bShape);
    }
    for (const key of shapes.keys()) if (!tensors.has(key)) throw new RangeError(`adapter tensor ${key} is missing`);
  }
  const out = [...tensors.keys()].sort().map((key) => {
    const data = tensors.get(key)!;
    const p = parseKey(key);
    if (!p || p.canonical !== key || !isTarget(p.target) || blockOf(p.target) !== p.block) {
      throw new RangeError(
        `adapter tensor ${key}: not a PEFT LoRA key (base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_{A|B}.weight)`,
      );
    }
    if (!lora.targetModules.includes(p.target))
      throw new RangeError(`adapter tensor ${key}: ${p.target} is not in targetModules`);
    const twin = key.replace(/lora_[AB]\.weight$/, p.which === 'A' ? 'lora_B.weight' : 'lora_A.weight');
    if (!tensors.has(twin)) throw new RangeError(`adapter tensor ${key}: its pair ${twin} is missing`);
    const known = shapes.get(key);
    if (modelCfg && !known)
      throw new RangeError(`adapter tensor ${key}: not part of this model (${modelCfg.numLayers} layers)`);
    const n = data.length / lora.r;
    const shape = known ? [...known] : p.which === 'A' ? [lora.r, n] : [n, lora.r];
    if (!Number.isInteger(n) || shape[0]! * shape[1]! !== data.length) {
      throw new RangeError(
        `adapter tensor ${key}: ${data.length} values do not fit shape ${JSON.stringify(shape)} (r=${lora.r})`,
      );
    }
    return { name: key, dtype: 'F32' as const, shape, data: f32Bytes(data) };
  });
  return {
    [ADAPTER_CONFIG_FILE]: adapterConfigJson(lora),
    [ADAPTER_WEIGHTS_FILE]: writeSafetensors(out, { format: 'pt' }),
  };
}

/** IEEE half -> f32 (exact: every f16 is an f32). */
function f16ToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

async function readF32(file: SafetensorsFile, name: string): Promise<Float32Array> {
  const info = file.tensors.get(name)!;
  const bytes = await readTensor(file, name);
  switch (info.dtype) {
    case 'F32':
      return new Float32Array(bytes.slice().buffer);
    case 'BF16':
      return bf16BytesToF32(bytes);
    case 'F16': {
      const out = new Float32Array(bytes.byteLength >>> 1);
      for (let i = 0; i < out.length; i++) out[i] = f16ToF32(bytes[2 * i]! | (bytes[2 * i + 1]! << 8));
      return out;
    }
    default:
      throw new ModelLoadError(
        file.source.name,
        `dtype ${info.dtype} is not a LoRA weight type (F32, BF16 or F16)`,
        name,
      );
  }
}

function unknownKeyReason(key: string, modelCfg: Qwen3Config, lora: LoraConfig): string {
  if (key.includes('lora_embedding')) return 'LoRA on embeddings (lora_embedding_A/B) is not supported';
  if (key.includes('modules_to_save')) return 'modules_to_save tensors are not supported, only LoRA pairs';
  if (key.includes('lora_magnitude_vector')) return 'DoRA magnitude vectors are not supported';
  const p = parseKey(key);
  if (!p)
    return 'not a LoRA tensor of a Qwen3 decoder layer (expected base_model.model.model.layers.{i}.{self_attn|mlp}.{target}.lora_{A|B}.weight)';
  if (!isTarget(p.target)) return `unknown module ${p.target} (supported: ${LORA_TARGETS.join(', ')})`;
  if (blockOf(p.target) !== p.block) return `${p.target} belongs under ${blockOf(p.target)}, not ${p.block}`;
  if (p.layer >= modelCfg.numLayers)
    return `layer ${p.layer} but the base model has ${modelCfg.numLayers} layers (config.json)`;
  if (!lora.targetModules.includes(p.target)) return `${p.target} is not in target_modules of ${ADAPTER_CONFIG_FILE}`;
  return 'unexpected tensor';
}

/** Reads and validates a PEFT LoRA adapter folder against the base model's config. Tensors come back f32, keyed in PEFT's saved form. */
export async function readAdapter(
  source: Pick<ModelSource, 'open' | 'readText'>,
  modelCfg: Qwen3Config,
): Promise<{ lora: LoraConfig; tensors: LoraTensors }> {
  const lora = parseAdapterConfig(await readJson(source, ADAPTER_CONFIG_FILE));
  const file = await readSafetensorsHeader(await source.open(ADAPTER_WEIGHTS_FILE));
  const fileName = file.source.name;

  const expected = new Map<string, { s: LoraTensorShape; which: 'A' | 'B' }>();
  for (const s of loraShapes(modelCfg, lora)) {
    expected.set(s.aKey, { s, which: 'A' });
    expected.set(s.bKey, { s, which: 'B' });
  }
  const stored = new Map<string, string>(); // canonical key -> key in the file
  for (const key of file.tensors.keys()) {
    const canonical = parseKey(key)?.canonical ?? key;
    if (!expected.has(canonical)) throw new ModelLoadError(fileName, unknownKeyReason(key, modelCfg, lora), key);
    const twin = stored.get(canonical);
    if (twin !== undefined) throw new ModelLoadError(fileName, `present twice, also as ${twin}`, key);
    stored.set(canonical, key);
  }

  const tensors: LoraTensors = new Map();
  for (const [canonical, { s, which }] of expected) {
    const key = stored.get(canonical);
    if (key === undefined)
      throw new ModelLoadError(
        fileName,
        `missing; expected shape ${JSON.stringify(which === 'A' ? s.aShape : s.bShape)} for ${s.target} of layer ${s.layer}`,
        canonical,
      );
    const info = file.tensors.get(key)!;
    const want = which === 'A' ? s.aShape : s.bShape;
    const dims = targetDims(modelCfg, s.target);
    if (info.shape.length !== 2)
      throw new ModelLoadError(
        fileName,
        `shape ${JSON.stringify(info.shape)} is not 2-D; expected ${JSON.stringify(want)}`,
        key,
      );
    const [d0, d1] = info.shape as [number, number];
    const rank = which === 'A' ? d0 : d1;
    if (rank !== lora.r)
      throw new ModelLoadError(
        fileName,
        `rank ${rank} (shape ${JSON.stringify(info.shape)}) does not match r=${lora.r} in ${ADAPTER_CONFIG_FILE}`,
        key,
      );
    if (which === 'A' && d1 !== dims.in) {
      throw new ModelLoadError(
        fileName,
        `in-features ${d1} (shape ${JSON.stringify(info.shape)}) do not match the base model's ${s.target} in-features ${dims.in} (config.json); adapter for another model?`,
        key,
      );
    }
    if (which === 'B' && d0 !== dims.out) {
      throw new ModelLoadError(
        fileName,
        `out-features ${d0} (shape ${JSON.stringify(info.shape)}) do not match the base model's ${s.target} out-features ${dims.out} (config.json); adapter for another model?`,
        key,
      );
    }
    const data = await readF32(file, key);
    for (let i = 0; i < data.length; i++) {
      if (!Number.isFinite(data[i]!)) throw new ModelLoadError(fileName, `element ${i} is ${data[i]}`, key);
    }
    tensors.set(canonical, data);
  }
  return { lora, tensors };
}

// ---------------------------------------------------------------------------------------------
// 4. Initialisation

/**
 * PEFT's default init (init_lora_weights=True): A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)),
 * B = 0, so the adapted model starts as the base model. One seeded stream over the A tensors in loraShapes order.
 */
export function initLora(modelCfg: Qwen3Config, lora: LoraConfig, seed: number): LoraTensors {
  if (!Number.isSafeInteger(seed) || seed < 0) throw new RangeError(`seed must be an integer >= 0, got ${seed}`);
  const rand = mulberry32(seed);
  const out: LoraTensors = new Map();
  for (const s of loraShapes(modelCfg, lora)) {
    const bound = 1 / Math.sqrt(s.aShape[1]);
    const a = new Float32Array(s.aShape[0] * s.aShape[1]);
    for (let i = 0; i < a.length; i++) a[i] = (2 * rand() - 1) * bound;
    out.set(s.aKey, a);
    out.set(s.bKey, new Float32Array(s.bShape[0] * s.bShape[1]));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// 5. Optimizer state: AdamW moments (optimizer.safetensors) + step, RNG and run settings (trainer_state.json).

export interface OptimizerState {
  /** AdamW steps taken (the next step is step + 1). */
  step: number;
  /** First moments, keyed like the adapter tensors. */
  m: Map<string, Float32Array>;
  /** Second moments, same keys and lengths as m. */
  v: Map<string, Float32Array>;
  /** Sampler/shuffle RNG state; must survive JSON exactly. */
  rng?: unknown;
  /** Anything else the run needs to continue (hyperparameters, schedule position, data cursor). */
  extra?: Record<string, unknown>;
}

/** What readOptimizerState returns: rng is null and extra {} when the run saved none. */
export type SavedOptimizerState = Required<OptimizerState>;

export interface OptimizerFiles {
  'optimizer.safetensors': Uint8Array;
  'trainer_state.json': string;
}

const TRAINER_STATE_FORMAT = 'spyrl-trainer-state';
const TRAINER_STATE_VERSION = 1;
const M_PREFIX = 'exp_avg.'; // torch AdamW's state names
const V_PREFIX = 'exp_avg_sq.';

/** Throws unless JSON.parse(JSON.stringify(x)) gives back x exactly (no NaN, undefined, BigInt, class instances). */
function checkJsonExact(x: unknown, path: string): void {
  if (x === null || typeof x === 'string' || typeof x === 'boolean') return;
  if (typeof x === 'number') {
    if (!Number.isFinite(x)) throw new RangeError(`${path} is ${x}, which JSON cannot hold`);
    return;
  }
  if (Array.isArray(x)) {
    x.forEach((v, i) => checkJsonExact(v, `${path}[${i}]`));
    return;
  }
  if (typeof x === 'object' && Object.getPrototypeOf(x) === Object.prototype) {
    for (const [k, v] of Object.entries(x)) checkJsonExact(v, `${path}.${k}`);
    return;
  }
  throw new RangeError(
    `${path} is a ${typeof x === 'object' ? ((x as object).constructor?.name ?? 'object') : typeof x}, which JSON cannot hold exactly`,
  );
}

/**
 * The first problem in AdamW moments, or null: every value must be finite and every second
 * moment >= 0 (a NaN, an Inf or a negative v would turn the next step into NaN weights).
 */
export function badMoment(
  m: ReadonlyMap<string, Float32Array>,
  v: ReadonlyMap<string, Float32Array>,
): { tensor: string; message: string } | null {
  for (const [key, x] of m) {
    const i = x.findIndex((e) => !Number.isFinite(e));
    if (i >= 0)
      return { tensor: M_PREFIX + key, message: `value ${x[i]} at index ${i}: optimizer moments must be finite` };
  }
  for (const [key, x] of v) {
    const i = x.findIndex((e) => !Number.isFinite(e) || e < 0);
    if (i >= 0)
      return { tensor: V_PREFIX + key, message: `value ${x[i]} at index ${i}: second moments must be finite and >= 0` };
  }
  return null;
}

/** Moments go in as flat F32 tensors `exp_avg.<key>` / `exp_avg_sq.<key>`; the step is also in the safetensors metadata so mismatched files are caught. */
export function writeOptimizerState(state: OptimizerState): OptimizerFiles {
  const { step, m, v } = state;
  if (!Number.isSafeInteger(step) || step < 0) throw new RangeError(`step must be an integer >= 0, got ${step}`);
  for (const [key, mk] of m) {
    const vk = v.get(key);
    if (!vk) throw new RangeError(`optimizer state: ${key} has a first moment but no second moment`);
    if (vk.length !== mk.length)
      throw new RangeError(`optimizer state: ${key} has m of ${mk.length} values but v of ${vk.length}`);
  }
  for (const key of v.keys())
    if (!m.has(key)) throw new RangeError(`optimizer state: ${key} has a second moment but no first moment`);
  if (state.rng !== undefined) checkJsonExact(state.rng, 'rng');
  if (state.extra !== undefined) checkJsonExact(state.extra, 'extra');

  const tensors = [...m.keys()].sort().flatMap((key) => [
    { name: M_PREFIX + key, dtype: 'F32' as const, shape: [m.get(key)!.length], data: f32Bytes(m.get(key)!) },
    { name: V_PREFIX + key, dtype: 'F32' as const, shape: [v.get(key)!.length], data: f32Bytes(v.get(key)!) },
  ]);
  const trainerState = {
    format: TRAINER_STATE_FORMAT,
    version: TRAINER_STATE_VERSION,
    global_step: step,
    optimizer: 'adamw',
    optimizer_file: OPTIMIZER_FILE,
    params: m.size,
    rng_state: state.rng ?? null,
    extra: state.extra ?? {},
  };
  return {
    [OPTIMIZER_FILE]: writeSafetensors(tensors, { format: 'pt', global_step: String(step) }),
    [TRAINER_STATE_FILE]: JSON.stringify(trainerState, null, 2) + '\n',
  };
}

/**
 * Reads what writeOptimizerState wrote. `expected` (key -> element count, e.g. from the adapter
 * tensors) checks that the moments belong to the adapter being resumed.
 */
export async function readOptimizerState(
  source: Pick<ModelSource, 'open' | 'readText'>,
  expected?: ReadonlyMap<string, number | Float32Array>,
): Promise<SavedOptimizerState> {
  const fail = (field: string, msg: string): never => {
    throw new ModelLoadError(TRAINER_STATE_FILE, `field "${field}" ${msg}`);
  };
  const json = await readJson(source, TRAINER_STATE_FILE);
  if (!isRecord(json)) throw new ModelLoadError(TRAINER_STATE_FILE, 'is not a JSON object');
  if (json['format'] !== TRAINER_STATE_FORMAT)
    fail('format', `is ${JSON.stringify(json['format'])}, expected "${TRAINER_STATE_FORMAT}"`);
  if (json['version'] !== TRAINER_STATE_VERSION)
    fail('version', `is ${JSON.stringify(json['version'])}; this build reads version ${TRAINER_STATE_VERSION}`);
  const step = json['global_step'];
  if (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 0)
    fail('global_step', `must be an integer >= 0, got ${JSON.stringify(step)}`);
  const extra = json['extra'] ?? {};
  if (!isRecord(extra)) fail('extra', `must be an object, got ${JSON.stringify(extra)}`);

  const file = await readSafetensorsHeader(await source.open(OPTIMIZER_FILE));
  const fileName = file.source.name;
  if (file.metadata['global_step'] !== String(step)) {
    throw new ModelLoadError(
      fileName,
      `metadata global_step ${JSON.stringify(file.metadata['global_step'])} does not match global_step ${step} in ${TRAINER_STATE_FILE}: files from different checkpoints?`,
    );
  }
  const m = new Map<string, Float32Array>();
  const v = new Map<string, Float32Array>();
  for (const [name, info] of file.tensors) {
    const into = name.startsWith(M_PREFIX) ? m : name.startsWith(V_PREFIX) ? v : null;
    if (!into)
      throw new ModelLoadError(fileName, `unexpected tensor (names start with "${M_PREFIX}" or "${V_PREFIX}")`, name);
    if (info.dtype !== 'F32')
      throw new ModelLoadError(fileName, `dtype ${info.dtype}; optimizer moments must be F32 to resume exactly`, name);
    into.set(name.slice(into === m ? M_PREFIX.length : V_PREFIX.length), await readF32(file, name));
  }
  for (const [key, mk] of m) {
    const vk = v.get(key);
    if (!vk) throw new ModelLoadError(fileName, 'second moment missing', V_PREFIX + key);
    if (vk.length !== mk.length)
      throw new ModelLoadError(fileName, `${vk.length} values but the first moment has ${mk.length}`, V_PREFIX + key);
  }
  for (const key of v.keys())
    if (!m.has(key)) throw new ModelLoadError(fileName, 'first moment missing', M_PREFIX + key);
  const bad = badMoment(m, v);
  if (bad) throw new ModelLoadError(fileName, bad.message, bad.tensor);
  if (json['params'] !== m.size)
    fail('params', `is ${JSON.stringify(json['params'])} but ${OPTIMIZER_FILE} holds ${m.size} parameters`);
  if (expected) {
    for (const [key, want] of expected) {
      const n = typeof want === 'number' ? want : want.length;
      const got = m.get(key);
      if (!got)
        throw new ModelLoadError(
          fileName,
          'missing: the adapter has this tensor but the optimizer state does not',
          M_PREFIX + key,
        );
      if (got.length !== n)
        throw new ModelLoadError(fileName, `${got.length} values but the adapter tensor has ${n}`, M_PREFIX + key);
    }
    for (const key of m.keys())
      if (!expected.has(key))
        throw new ModelLoadError(fileName, 'no such tensor in the adapter being resumed', M_PREFIX + key);
  }
  return { step: step as number, m, v, rng: json['rng_state'] ?? null, extra: extra as Record<string, unknown> };
}
