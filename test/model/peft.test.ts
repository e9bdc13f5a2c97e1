// PEFT adapter files (src/model/peft.ts): exact keys, shapes and adapter_config.json fields,
// round trips, one test per validation error, optimizer-state files, and the adapters that
// scripts/golden_lora.py wrote with its own writer (test/fixtures/golden-lora). A float64 CPU
// forward here checks those fixtures without PyTorch or a GPU: logits with the adapter, and
// the stored gradients against central differences of the stated loss. That the fixtures are
// what PEFT itself makes (golden_lora.py --impl peft) is checked by scripts/oracles.mjs in npm test.
import { mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadQwen3Config, parseQwen3Config, type Qwen3Config } from '../../src/model/config.ts';
import { ModelLoadError } from '../../src/model/errors.ts';
import {
  ADAPTER_CONFIG_FILE,
  ADAPTER_WEIGHTS_FILE,
  adapterConfig,
  adapterConfigJson,
  initLora,
  loraConfig,
  loraScale,
  loraShapes,
  readAdapter,
  readOptimizerState,
  writeAdapter,
  writeOptimizerState,
  type LoraConfig,
  type LoraTensors,
} from '../../src/model/peft.ts';
import { writeFolder } from '../../src/model/peft.node.ts';
import {
  bf16BytesToF32,
  bytesSource,
  f32ArrayToBf16,
  openSafetensorsModel,
  readSafetensorsHeader,
  readTensor,
  writeSafetensors,
  type Dtype,
} from '../../src/model/safetensors.ts';
import { memorySource, type ModelSource } from '../../src/model/sources.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';

const ROOT = join(import.meta.dirname, '../..');
const FIXTURES = join(ROOT, 'test/fixtures/golden-lora');
const VARIANTS = ['tied-all', 'untied-rslora'] as const;

// C=8, NH*HD=12 (!= C), NKV*HD=6, I=10: every target has its own (out, in).
const tiny: Qwen3Config = parseQwen3Config({
  model_type: 'qwen3',
  hidden_size: 8,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 6,
  intermediate_size: 10,
  vocab_size: 16,
});

function filesOf(files: object): ModelSource {
  return memorySource('adapter', new Map(Object.entries(files)));
}

/** Arange-like values so a transposed or shuffled tensor can't pass. */
function filled(n: number, base: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => base + i / 64);
}

function tinyTensors(lora: LoraConfig): LoraTensors {
  const out: LoraTensors = new Map();
  loraShapes(tiny, lora).forEach((s, i) => {
    out.set(s.aKey, filled(s.aShape[0] * s.aShape[1], i));
    out.set(s.bKey, filled(s.bShape[0] * s.bShape[1], -i));
  });
  return out;
}

async function loadError(p: Promise<unknown>): Promise<ModelLoadError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(ModelLoadError);
    return e as ModelLoadError;
  }
  throw new Error('expected a ModelLoadError');
}

describe('LoRA tensor table', () => {
  it('all seven targets: PEFT keys, A (r, in), B (out, r), layer-major in module order', () => {
    const shapes = loraShapes(tiny, loraConfig({ r: 3, alpha: 6 }));
    expect(shapes.map((s) => [s.aKey, s.aShape, s.bKey, s.bShape])).toEqual(
      [0, 1].flatMap((i) => [
        [
          `base_model.model.model.layers.${i}.self_attn.q_proj.lora_A.weight`,
          [3, 8],
          `base_model.model.model.layers.${i}.self_attn.q_proj.lora_B.weight`,
          [12, 3],
        ],
        [
          `base_model.model.model.layers.${i}.self_attn.k_proj.lora_A.weight`,
          [3, 8],
          `base_model.model.model.layers.${i}.self_attn.k_proj.lora_B.weight`,
          [6, 3],
        ],
        [
          `base_model.model.model.layers.${i}.self_attn.v_proj.lora_A.weight`,
          [3, 8],
          `base_model.model.model.layers.${i}.self_attn.v_proj.lora_B.weight`,
          [6, 3],
        ],
        [
          `base_model.model.model.layers.${i}.self_attn.o_proj.lora_A.weight`,
          [3, 12],
          `base_model.model.model.layers.${i}.self_attn.o_proj.lora_B.weight`,
          [8, 3],
        ],
        [
          `base_model.model.model.layers.${i}.mlp.gate_proj.lora_A.weight`,
          [3, 8],
          `base_model.model.model.layers.${i}.mlp.gate_proj.lora_B.weight`,
          [10, 3],
        ],
        [
          `base_model.model.model.layers.${i}.mlp.up_proj.lora_A.weight`,
          [3, 8],
          `base_model.model.model.layers.${i}.mlp.up_proj.lora_B.weight`,
          [10, 3],
        ],
        [
          `base_model.model.model.layers.${i}.mlp.down_proj.lora_A.weight`,
          [3, 10],
          `base_model.model.model.layers.${i}.mlp.down_proj.lora_B.weight`,
          [8, 3],
        ],
      ]),
    );
    expect(shapes[3]).toMatchObject({
      layer: 0,
      target: 'o_proj',
      prefix: 'base_model.model.model.layers.0.self_attn.o_proj',
    });
  });

  it('a subset keeps module order whatever order it was given in', () => {
    const lora = loraConfig({ r: 2, alpha: 16, targetModules: ['down_proj', 'q_proj', 'v_proj'] });
    expect(lora.targetModules).toEqual(['q_proj', 'v_proj', 'down_proj']);
    expect(loraShapes(tiny, lora).map((s) => `${s.prefix} ${s.aShape} ${s.bShape}`)).toEqual([
      'base_model.model.model.layers.0.self_attn.q_proj 2,8 12,2',
      'base_model.model.model.layers.0.self_attn.v_proj 2,8 6,2',
      'base_model.model.model.layers.0.mlp.down_proj 2,10 8,2',
      'base_model.model.model.layers.1.self_attn.q_proj 2,8 12,2',
      'base_model.model.model.layers.1.self_attn.v_proj 2,8 6,2',
      'base_model.model.model.layers.1.mlp.down_proj 2,10 8,2',
    ]);
  });

  it('scale is alpha / r, or alpha / sqrt(r) with rsLoRA', () => {
    expect(loraScale(loraConfig({ r: 4, alpha: 8 }))).toBe(2);
    expect(loraScale(loraConfig({ r: 4, alpha: 8, useRslora: true }))).toBe(4);
    expect(loraScale({ r: 2, alpha: 16, useRslora: true })).toBe(16 / Math.SQRT2);
  });

  it('loraConfig rejects bad settings', () => {
    expect(() => loraConfig({ r: 0, alpha: 1 })).toThrow(/positive integer/);
    expect(() => loraConfig({ r: 2.5, alpha: 1 })).toThrow(/positive integer/);
    expect(() => loraConfig({ r: 2, alpha: 1, targetModules: ['lm_head' as never] })).toThrow(
      /unknown LoRA target "lm_head"/,
    );
    expect(() => loraConfig({ r: 2, alpha: 1, targetModules: [] })).toThrow(/at least one/);
  });
});

describe('adapter_config.json', () => {
  it('has exactly the fields PEFT saves, with PEFT defaults', () => {
    const lora = loraConfig({
      r: 4,
      alpha: 8,
      targetModules: ['v_proj', 'q_proj'],
      baseModel: 'Qwen/Qwen3-4B-Instruct-2507',
    });
    expect(adapterConfig(lora)).toEqual({
      alora_invocation_tokens: null,
      alpha_pattern: {},
      arrow_config: null,
      auto_mapping: null,
      base_model_name_or_path: 'Qwen/Qwen3-4B-Instruct-2507',
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
      lora_alpha: 8,
      lora_bias: false,
      lora_dropout: 0,
      megatron_config: null,
      megatron_core: 'megatron.core',
      modules_to_save: null,
      peft_type: 'LORA',
      qalora_group_size: 16,
      r: 4,
      rank_pattern: {},
      revision: null,
      target_modules: ['q_proj', 'v_proj'],
      target_parameters: null,
      task_type: 'CAUSAL_LM',
      trainable_token_indices: null,
      use_dora: false,
      use_qalora: false,
      use_rslora: false,
    });
  });

  it('is formatted as PEFT writes it: sorted keys, indent 2, no final newline', () => {
    const text = adapterConfigJson(loraConfig({ r: 2, alpha: 16, useRslora: true }));
    const keys = Object.keys(JSON.parse(text));
    expect(keys).toEqual([...keys].sort());
    expect(text).toMatch(/^\{\n {2}"alora_invocation_tokens": null,\n/);
    expect(text.endsWith('}')).toBe(true);
    expect(JSON.parse(text)).toMatchObject({ r: 2, lora_alpha: 16, use_rslora: true, base_model_name_or_path: null });
  });
});

describe('writeAdapter -> readAdapter', () => {
  it.each([
    ['all seven targets', loraConfig({ r: 3, alpha: 6, baseModel: 'tiny' })],
    [
      'a subset with rsLoRA',
      loraConfig({ r: 2, alpha: 16, targetModules: ['q_proj', 'v_proj', 'down_proj'], useRslora: true }),
    ],
  ])('%s: same config, same tensors, bit for bit', async (_, lora) => {
    const tensors = tinyTensors(lora);
    const files = writeAdapter(lora, tensors, tiny);
    expect(Object.keys(files).sort()).toEqual([ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]);
    const back = await readAdapter(filesOf(files), tiny);
    expect(back.lora).toEqual(lora);
    expect([...back.tensors.keys()].sort()).toEqual([...tensors.keys()].sort());
    for (const [k, v] of tensors) expect(back.tensors.get(k), k).toEqual(v);
  });

  it('writes F32, sorted keys, metadata {"format":"pt"}, PEFT shapes', async () => {
    const lora = loraConfig({ r: 2, alpha: 4, targetModules: ['o_proj'] });
    const file = await readSafetensorsHeader(
      bytesSource('a', writeAdapter(lora, tinyTensors(lora))[ADAPTER_WEIGHTS_FILE]),
    );
    expect(file.metadata).toEqual({ format: 'pt' });
    expect([...file.tensors.values()].map((t) => [t.name, t.dtype, t.shape])).toEqual([
      ['base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight', 'F32', [2, 12]],
      ['base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight', 'F32', [8, 2]],
      ['base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight', 'F32', [2, 12]],
      ['base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight', 'F32', [8, 2]],
    ]);
  });

  it('writeAdapter rejects tensors that do not fit', () => {
    const lora = loraConfig({ r: 2, alpha: 4, targetModules: ['q_proj'] });
    const t = tinyTensors(lora);
    expect(() => writeAdapter(loraConfig({ r: 2, alpha: 4, targetModules: ['k_proj'] }), t)).toThrow(
      /q_proj is not in targetModules/,
    );
    expect(() =>
      writeAdapter(lora, new Map([...t, ['model.layers.0.self_attn.q_proj.weight', new Float32Array(2)]])),
    ).toThrow(/not a PEFT LoRA key/);
    expect(() =>
      writeAdapter(lora, new Map([...t].filter(([k]) => !k.endsWith('1.self_attn.q_proj.lora_B.weight')))),
    ).toThrow(/pair .*layers\.1\.self_attn\.q_proj\.lora_B\.weight is missing/);
    const odd = new Map(t).set('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight', new Float32Array(15));
    expect(() => writeAdapter(lora, odd)).toThrow(/15 values do not fit/);
    expect(() => writeAdapter(lora, odd, tiny)).toThrow(/15 values do not fit shape \[2,8\]/);
    expect(() => writeAdapter(lora, new Map([...t].slice(2)), tiny)).toThrow(
      /layers\.0\.self_attn\.q_proj\.lora_A\.weight is missing/,
    );
  });

  it('reads BF16 and F16 tensors as f32, and PEFT in-memory keys with the ".default" adapter name', async () => {
    const lora = loraConfig({ r: 1, alpha: 1, targetModules: ['k_proj'] });
    const halfs = [0.5, -2, 0.333251953125, 65504, 2 ** -24, -0]; // f16 bits: 0x3800 0xc000 0x3555 0x7bff 0x0001 0x8000
    const f16 = new Uint8Array(new Uint16Array([0x3800, 0xc000, 0x3555, 0x7bff, 0x0001, 0x8000]).buffer);
    const aVals = Float32Array.from({ length: 8 }, (_, i) => (i - 3.3) / 7);
    const bf16 = new Uint8Array(f32ArrayToBf16(aVals).buffer);
    const weights = writeSafetensors([
      {
        name: 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.default.weight',
        dtype: 'BF16',
        shape: [1, 8],
        data: bf16,
      },
      {
        name: 'base_model.model.model.layers.0.self_attn.k_proj.lora_B.default.weight',
        dtype: 'F16',
        shape: [6, 1],
        data: f16,
      },
      {
        name: 'base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight',
        dtype: 'BF16',
        shape: [1, 8],
        data: bf16,
      },
      {
        name: 'base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight',
        dtype: 'F16',
        shape: [6, 1],
        data: f16,
      },
    ]);
    const { tensors } = await readAdapter(
      filesOf({ [ADAPTER_CONFIG_FILE]: adapterConfigJson(lora), [ADAPTER_WEIGHTS_FILE]: weights }),
      tiny,
    );
    expect([...tensors.keys()].sort()).toEqual(
      loraShapes(tiny, lora)
        .flatMap((s) => [s.aKey, s.bKey])
        .sort(),
    );
    expect(tensors.get('base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight')).toEqual(bf16BytesToF32(bf16));
    expect([...tensors.get('base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight')!]).toEqual(halfs);
  });
});

describe('readAdapter names the file and the field or tensor it rejects', () => {
  const lora = loraConfig({ r: 2, alpha: 4, targetModules: ['q_proj', 'down_proj'] });
  const good = writeAdapter(lora, tinyTensors(lora), tiny);
  const cfgJson = JSON.parse(good[ADAPTER_CONFIG_FILE]) as Record<string, unknown>;

  async function configError(patch: Record<string, unknown>): Promise<ModelLoadError> {
    const files = { ...good, [ADAPTER_CONFIG_FILE]: JSON.stringify({ ...cfgJson, ...patch }) };
    return loadError(readAdapter(filesOf(files), tiny));
  }

  it.each<[string, Record<string, unknown>, RegExp]>([
    ['peft_type', { peft_type: 'IA3' }, /only "LORA"/],
    ['task_type', { task_type: 'SEQ_CLS' }, /expected "CAUSAL_LM"/],
    ['r', { r: 0 }, /positive integer, got 0/],
    ['r', { r: 2.5 }, /positive integer, got 2.5/],
    ['lora_alpha', { lora_alpha: '16' }, /must be a number, got "16"/],
    ['use_rslora', { use_rslora: 'yes' }, /true or false/],
    ['bias', { bias: 'lora_only' }, /only "none"/],
    ['fan_in_fan_out', { fan_in_fan_out: true }, /must be false/],
    [
      'target_modules',
      { target_modules: '.*\\.(q|v)_proj' },
      /regex ".*\\\\.\(q\|v\)_proj"; only a list of module names/,
    ],
    ['target_modules', { target_modules: ['q_proj', 'lm_head'] }, /unsupported module "lm_head"/],
    ['target_modules', { target_modules: [] }, /non-empty list/],
    ['target_modules', { target_modules: null }, /non-empty list/],
    ['use_dora', { use_dora: true }, /DoRA is not supported/],
    ['modules_to_save', { modules_to_save: ['lm_head'] }, /modules_to_save\) are not supported/],
    ['rank_pattern', { rank_pattern: { q_proj: 8 } }, /per-module ranks/],
    ['alpha_pattern', { alpha_pattern: { q_proj: 8 } }, /per-module alphas/],
    ['layers_to_transform', { layers_to_transform: [0] }, /every layer must be adapted/],
    ['lora_bias', { lora_bias: true }, /biases are not supported/],
    ['base_model_name_or_path', { base_model_name_or_path: 7 }, /string or null/],
  ])('adapter_config.json field %s (%j)', async (field, patch, msg) => {
    const e = await configError(patch);
    expect(e.file).toBe(ADAPTER_CONFIG_FILE);
    expect(e.message).toContain(`field "${field}"`);
    expect(e.message).toMatch(msg);
  });

  it('adapter_config.json: not JSON, not an object', async () => {
    let e = await loadError(readAdapter(filesOf({ ...good, [ADAPTER_CONFIG_FILE]: '{"r": 2,' }), tiny));
    expect(e.file).toBe(ADAPTER_CONFIG_FILE);
    expect(e.message).toMatch(/not valid JSON/);
    e = await loadError(readAdapter(filesOf({ ...good, [ADAPTER_CONFIG_FILE]: '[1]' }), tiny));
    expect(e.message).toBe('adapter_config.json: is not a JSON object');
  });

  it('accepts target_modules "all-linear" as all seven', async () => {
    const all = loraConfig({ r: 1, alpha: 1 });
    const files = writeAdapter(all, tinyTensors(all));
    const cfg = { ...JSON.parse(files[ADAPTER_CONFIG_FILE]), target_modules: 'all-linear' };
    const { lora: back } = await readAdapter(filesOf({ ...files, [ADAPTER_CONFIG_FILE]: JSON.stringify(cfg) }), tiny);
    expect(back.targetModules).toHaveLength(7);
  });

  type Entry = { name: string; dtype?: Dtype; shape: number[]; data?: Uint8Array };
  const baseEntries = (): Entry[] =>
    loraShapes(tiny, lora).flatMap((s) => [
      { name: s.aKey, shape: s.aShape },
      { name: s.bKey, shape: s.bShape },
    ]);
  async function tensorError(edit: (entries: Entry[]) => Entry[], modelCfg = tiny): Promise<ModelLoadError> {
    const entries = edit(baseEntries()).map((t) => {
      const dtype = t.dtype ?? 'F32';
      const n = t.shape.reduce((a, b) => a * b, 1);
      return { name: t.name, dtype, shape: t.shape, data: t.data ?? new Uint8Array(n * (dtype === 'F32' ? 4 : 2)) };
    });
    const files = {
      [ADAPTER_CONFIG_FILE]: good[ADAPTER_CONFIG_FILE],
      [ADAPTER_WEIGHTS_FILE]: writeSafetensors(entries),
    };
    const e = await loadError(readAdapter(filesOf(files), modelCfg));
    expect(e.file).toBe(ADAPTER_WEIGHTS_FILE);
    return e;
  }
  const Q0A = 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight';
  const D1B = 'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight';
  const replace = (name: string, patch: Partial<Entry>) => (es: Entry[]) =>
    es.map((t) => (t.name === name ? { ...t, ...patch } : t));

  it.each<[string, (es: Entry[]) => Entry[], string, RegExp]>([
    [
      'a missing tensor',
      (es) => es.filter((t) => t.name !== D1B),
      D1B,
      /missing; expected shape \[8,2\] for down_proj of layer 1/,
    ],
    [
      'an embedding LoRA',
      (es) => [...es, { name: 'base_model.model.model.embed_tokens.lora_embedding_A', shape: [2, 16] }],
      'base_model.model.model.embed_tokens.lora_embedding_A',
      /LoRA on embeddings .* not supported/,
    ],
    [
      'a modules_to_save tensor',
      (es) => [...es, { name: 'base_model.model.lm_head.modules_to_save.weight', shape: [16, 8] }],
      'base_model.model.lm_head.modules_to_save.weight',
      /modules_to_save tensors are not supported/,
    ],
    [
      'a DoRA magnitude',
      (es) => [...es, { name: 'base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector', shape: [12] }],
      'base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector',
      /DoRA/,
    ],
    [
      'a target not in target_modules',
      (es) => [...es, { name: 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight', shape: [2, 8] }],
      'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight',
      /k_proj is not in target_modules of adapter_config.json/,
    ],
    [
      'a layer the model lacks',
      (es) => [...es, { name: 'base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight', shape: [2, 8] }],
      'base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight',
      /layer 2 but the base model has 2 layers/,
    ],
    [
      'a module in the wrong block',
      (es) => [...es, { name: 'base_model.model.model.layers.0.mlp.q_proj.lora_A.weight', shape: [2, 8] }],
      'base_model.model.model.layers.0.mlp.q_proj.lora_A.weight',
      /q_proj belongs under self_attn, not mlp/,
    ],
    [
      'an unknown module',
      (es) => [...es, { name: 'base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight', shape: [2, 8] }],
      'base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight',
      /unknown module qkv_proj/,
    ],
    [
      'keys without the base_model.model prefix',
      (es) => es.map((t) => ({ ...t, name: t.name.replace('base_model.model.', '') })),
      'model.layers.0.self_attn.q_proj.lora_A.weight',
      /not a LoRA tensor of a Qwen3 decoder layer/,
    ],
    [
      'a tensor stored twice',
      (es) => [...es, { name: Q0A.replace('lora_A.weight', 'lora_A.default.weight'), shape: [2, 8] }],
      Q0A.replace('lora_A.weight', 'lora_A.default.weight'),
      /present twice, also as base_model\.model\.model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight$/,
    ],
    [
      'a rank that is not r',
      replace(Q0A, { shape: [3, 8] }),
      Q0A,
      /rank 3 \(shape \[3,8\]\) does not match r=2 in adapter_config.json/,
    ],
    ['B rank that is not r', replace(D1B, { shape: [8, 4] }), D1B, /rank 4 \(shape \[8,4\]\) does not match r=2/],
    [
      'A in-features from another model',
      replace(Q0A, { shape: [2, 16] }),
      Q0A,
      /in-features 16 .* q_proj in-features 8 \(config.json\)/,
    ],
    [
      'B out-features from another model',
      replace(D1B, { shape: [16, 2] }),
      D1B,
      /out-features 16 .* down_proj out-features 8 \(config.json\)/,
    ],
    ['a 1-D tensor', replace(Q0A, { shape: [16] }), Q0A, /not 2-D; expected \[2,8\]/],
    [
      'a NaN',
      replace(Q0A, {
        data: new Uint8Array(new Float32Array([0, 0, NaN, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).buffer),
      }),
      Q0A,
      /element 2 is NaN/,
    ],
  ])('%s', async (_, edit, tensor, msg) => {
    const e = await tensorError(edit);
    expect(e.tensor).toBe(tensor);
    expect(e.message).toContain(`${ADAPTER_WEIGHTS_FILE}: tensor "${tensor}"`);
    expect(e.message).toMatch(msg);
  });

  it('an adapter made for a bigger model', async () => {
    const wide = parseQwen3Config({
      model_type: 'qwen3',
      hidden_size: 16,
      num_hidden_layers: 2,
      num_attention_heads: 2,
      num_key_value_heads: 1,
      head_dim: 6,
      intermediate_size: 10,
      vocab_size: 16,
    });
    const e = await loadError(readAdapter(filesOf(writeAdapter(lora, tinyTensors(lora))), wide));
    expect(e.file).toBe(ADAPTER_WEIGHTS_FILE);
    expect(e.tensor).toBe(Q0A);
    expect(e.message).toMatch(/in-features 8 .* in-features 16 \(config.json\); adapter for another model\?/);
  });

  it('missing files are named', async () => {
    let e = await loadError(readAdapter(filesOf({ [ADAPTER_CONFIG_FILE]: good[ADAPTER_CONFIG_FILE] }), tiny));
    expect(e.file).toBe(ADAPTER_WEIGHTS_FILE);
    e = await loadError(readAdapter(filesOf({ [ADAPTER_WEIGHTS_FILE]: good[ADAPTER_WEIGHTS_FILE] }), tiny));
    expect(e.file).toBe(ADAPTER_CONFIG_FILE);
  });
});

describe('initLora', () => {
  const lora = loraConfig({ r: 4, alpha: 8 });

  it('PEFT init: A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0', () => {
    const t = initLora(tiny, lora, 7);
    for (const s of loraShapes(tiny, lora)) {
      const a = t.get(s.aKey)!;
      const bound = 1 / Math.sqrt(s.aShape[1]);
      expect(a).toHaveLength(s.aShape[0] * s.aShape[1]);
      expect(Math.max(...a.map(Math.abs))).toBeLessThanOrEqual(bound);
      expect(Math.max(...a.map(Math.abs))).toBeGreaterThan(0.5 * bound);
      expect(t.get(s.bKey)).toEqual(new Float32Array(s.bShape[0] * s.bShape[1]));
    }
  });

  it('is deterministic per seed and looks uniform', () => {
    const big = parseQwen3Config({
      model_type: 'qwen3',
      hidden_size: 256,
      num_hidden_layers: 1,
      num_attention_heads: 4,
      num_key_value_heads: 2,
      head_dim: 64,
      intermediate_size: 512,
      vocab_size: 16,
    });
    const a = initLora(big, lora, 1).get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')!;
    expect(initLora(big, lora, 1).get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')).toEqual(a);
    expect(initLora(big, lora, 2).get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')).not.toEqual(a);
    const bound = 1 / 16;
    const mean = a.reduce((s, x) => s + x, 0) / a.length;
    const variance = a.reduce((s, x) => s + x * x, 0) / a.length;
    expect(Math.abs(mean)).toBeLessThan(0.1 * bound); // 1024 samples: sd of the mean ~ 0.018 bound
    expect(variance / ((bound * bound) / 3)).toBeGreaterThan(0.9);
    expect(variance / ((bound * bound) / 3)).toBeLessThan(1.1);
  });

  it('round-trips through writeAdapter / readAdapter', async () => {
    const t = initLora(tiny, lora, 3);
    const back = await readAdapter(filesOf(writeAdapter(lora, t, tiny)), tiny);
    for (const [k, v] of t) expect(back.tensors.get(k)).toEqual(v);
  });
});

describe('optimizer state', () => {
  const lora = loraConfig({ r: 2, alpha: 4, targetModules: ['q_proj'] });
  const params = tinyTensors(lora);
  const moments = (sign: number) => new Map([...params].map(([k, v]) => [k, v.map((x) => sign * x * 1e-3 + 1e-9)]));
  // AdamW's second moments are averages of squares: >= 0 (readOptimizerState refuses negative v).
  const squares = new Map([...params].map(([k, v]) => [k, v.map((x) => x * x * 1e-3 + 1e-9)]));
  const state = {
    step: 17,
    m: moments(-1),
    v: squares,
    rng: { s: [1, 2, 3, 4294967295] },
    extra: { lr: 2e-4, schedule: 'cosine', cursor: 41 },
  };

  it('round-trips step, m, v, rng and extra exactly', async () => {
    const files = writeOptimizerState(state);
    expect(Object.keys(files).sort()).toEqual(['optimizer.safetensors', 'trainer_state.json']);
    const back = await readOptimizerState(filesOf(files), params);
    expect(back.step).toBe(17);
    expect(back.rng).toEqual(state.rng);
    expect(back.extra).toEqual(state.extra);
    for (const [k, v] of state.m) expect(back.m.get(k)).toEqual(v);
    for (const [k, v] of state.v) expect(back.v.get(k)).toEqual(v);
    const file = await readSafetensorsHeader(bytesSource('o', files['optimizer.safetensors']));
    expect(file.metadata).toEqual({ format: 'pt', global_step: '17' });
    expect([...file.tensors.keys()][0]).toBe('exp_avg.base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight');
  });

  it('write refuses state that would not resume exactly', () => {
    expect(() => writeOptimizerState({ ...state, step: -1 })).toThrow(/step/);
    expect(() => writeOptimizerState({ ...state, rng: { s: [1, NaN] } })).toThrow(/rng\.s\[1\] is NaN/);
    expect(() => writeOptimizerState({ ...state, rng: { s: 1n } })).toThrow(/rng\.s is a bigint/);
    expect(() => writeOptimizerState({ ...state, extra: { when: new Date(0) } })).toThrow(/extra\.when is a Date/);
    expect(() => writeOptimizerState({ ...state, v: new Map([...state.v].slice(1)) })).toThrow(/no second moment/);
  });

  it('read names the file and field or tensor it rejects', async () => {
    const files = writeOptimizerState(state);
    const other = writeOptimizerState({ ...state, step: 18 });
    let e = await loadError(
      readOptimizerState(filesOf({ ...files, 'optimizer.safetensors': other['optimizer.safetensors'] })),
    );
    expect(e.message).toMatch(
      /^optimizer\.safetensors: metadata global_step "18" does not match global_step 17 in trainer_state.json/,
    );
    const ts = JSON.parse(files['trainer_state.json']);
    e = await loadError(
      readOptimizerState(filesOf({ ...files, 'trainer_state.json': JSON.stringify({ ...ts, global_step: 'x' }) })),
    );
    expect(e.message).toMatch(/^trainer_state\.json: field "global_step" must be an integer/);
    e = await loadError(
      readOptimizerState(filesOf({ ...files, 'trainer_state.json': JSON.stringify({ ...ts, version: 2 }) })),
    );
    expect(e.message).toMatch(/^trainer_state\.json: field "version" is 2/);
    const fewer = new Map([...params].slice(1));
    e = await loadError(readOptimizerState(filesOf(files), fewer));
    expect(e.message).toMatch(/no such tensor in the adapter being resumed/);
    expect(e.tensor).toBe('exp_avg.base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight');
    const resized = new Map(params).set(
      'base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight',
      new Float32Array(3),
    );
    e = await loadError(readOptimizerState(filesOf(files), resized));
    expect(e.message).toMatch(/24 values but the adapter tensor has 3/);
    const bf16 = writeSafetensors([{ name: 'exp_avg.k', dtype: 'BF16', shape: [1], data: new Uint8Array(2) }], {
      format: 'pt',
      global_step: '17',
    });
    e = await loadError(readOptimizerState(filesOf({ ...files, 'optimizer.safetensors': bf16 })));
    expect(e.message).toMatch(/tensor "exp_avg\.k": dtype BF16; optimizer moments must be F32/);
  });

  it('writeFolder puts the files on disk for nodeFolderSource', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'peft-'));
    try {
      await writeFolder(dir, { ...writeAdapter(lora, params, tiny), ...writeOptimizerState(state) });
      expect((await readdir(dir)).sort()).toEqual([
        ADAPTER_CONFIG_FILE,
        ADAPTER_WEIGHTS_FILE,
        'optimizer.safetensors',
        'trainer_state.json',
      ]);
      const { tensors } = await readAdapter(nodeFolderSource(dir), tiny);
      expect((await readOptimizerState(nodeFolderSource(dir), tensors)).step).toBe(17);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

// ---------------------------------------------------------------------------------------------
// The PyTorch-written fixtures.

interface LossJson {
  model_dir: string;
  tokens: number[];
  loss: number;
  scale: number;
  r: number;
  lora_alpha: number;
  use_rslora: boolean;
  target_modules: string[];
  logits_shape: [number, number];
  max_abs_logit: number;
  grad_max_abs: Record<string, number>;
  model_sha256: Record<string, string>;
  reference_checks: {
    grads_f32_vs_f64_max_rel_err: number;
    plain_torch_vs_peft: { max_abs_diff_logits: number; abs_diff_loss: number; max_rel_diff_grads: number } | null;
  };
  impl: string;
  peft_version: string | null;
  transformers_version: string | null;
  torch_version: string;
}

async function fixture(variant: string) {
  const dir = join(FIXTURES, variant);
  const meta = JSON.parse(await readFile(join(dir, 'loss.json'), 'utf8')) as LossJson;
  const modelDir = join(ROOT, meta.model_dir);
  const cfg = await loadQwen3Config(nodeFolderSource(modelDir));
  return { dir, meta, modelDir, cfg };
}

async function f32File(path: string): Promise<Float32Array> {
  const b = await readFile(path);
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
}

/** Base weights as f64 (bf16 upcast is exact). */
async function baseWeights(modelDir: string): Promise<Map<string, Float64Array>> {
  const model = await openSafetensorsModel(nodeFolderSource(modelDir));
  const out = new Map<string, Float64Array>();
  for (const name of model.tensors.keys())
    out.set(name, Float64Array.from(bf16BytesToF32(await model.readTensor(name))));
  return out;
}

/**
 * Float64 Qwen3 forward with LoRA, y = x W^T + s (x A^T) B^T: logits (T, V). Written from the
 * HF model definition for this test only; shares nothing with the engine or the Python script.
 */
function forwardF64(
  cfg: Qwen3Config,
  W: Map<string, Float64Array>,
  lora: Map<string, Float64Array>,
  s: number,
  ids: number[],
): Float64Array {
  const {
    hiddenSize: C,
    numHeads: NH,
    numKvHeads: NKV,
    headDim: HD,
    intermediateSize: I,
    vocabSize: V,
    rmsNormEps: eps,
  } = cfg;
  const T = ids.length;
  const w = (n: string) => W.get(n)!;
  const linear = (x: Float64Array, name: string, N: number, K: number, prefix?: string) => {
    const y = new Float64Array(T * N);
    const Wt = w(name);
    for (let t = 0; t < T; t++)
      for (let n = 0; n < N; n++) {
        let acc = 0;
        for (let k = 0; k < K; k++) acc += x[t * K + k]! * Wt[n * K + k]!;
        y[t * N + n] = acc;
      }
    const A = prefix && lora.get(`${prefix}.lora_A.weight`);
    if (A) {
      const B = lora.get(`${prefix}.lora_B.weight`)!;
      const r = A.length / K;
      for (let t = 0; t < T; t++) {
        const u = new Float64Array(r);
        for (let j = 0; j < r; j++) for (let k = 0; k < K; k++) u[j]! += x[t * K + k]! * A[j * K + k]!;
        for (let n = 0; n < N; n++) {
          let acc = 0;
          for (let j = 0; j < r; j++) acc += u[j]! * B[n * r + j]!;
          y[t * N + n]! += s * acc;
        }
      }
    }
    return y;
  };
  const rms = (x: Float64Array, g: Float64Array, D: number) => {
    const y = new Float64Array(x.length);
    for (let row = 0; row < x.length / D; row++) {
      let ss = 0;
      for (let i = 0; i < D; i++) ss += x[row * D + i]! ** 2;
      const k = 1 / Math.sqrt(ss / D + eps);
      for (let i = 0; i < D; i++) y[row * D + i] = g[i]! * x[row * D + i]! * k;
    }
    return y;
  };
  const rope = (x: Float64Array, H: number) => {
    for (let t = 0; t < T; t++)
      for (let h = 0; h < H; h++)
        for (let i = 0; i < HD / 2; i++) {
          const ang = t / cfg.ropeTheta ** ((2 * i) / HD);
          const o = (t * H + h) * HD;
          const [a, b] = [x[o + i]!, x[o + i + HD / 2]!];
          x[o + i] = a * Math.cos(ang) - b * Math.sin(ang);
          x[o + i + HD / 2] = b * Math.cos(ang) + a * Math.sin(ang);
        }
  };
  let x = new Float64Array(T * C);
  ids.forEach((id, t) => x.set(w('model.embed_tokens.weight').subarray(id * C, (id + 1) * C), t * C));
  for (let l = 0; l < cfg.numLayers; l++) {
    const p = `model.layers.${l}.`;
    const lp = (m: string) => `base_model.model.${p}${m}`;
    let h = rms(x, w(`${p}input_layernorm.weight`), C);
    const q = rms(
      linear(h, `${p}self_attn.q_proj.weight`, NH * HD, C, lp('self_attn.q_proj')),
      w(`${p}self_attn.q_norm.weight`),
      HD,
    );
    const k = rms(
      linear(h, `${p}self_attn.k_proj.weight`, NKV * HD, C, lp('self_attn.k_proj')),
      w(`${p}self_attn.k_norm.weight`),
      HD,
    );
    const v = linear(h, `${p}self_attn.v_proj.weight`, NKV * HD, C, lp('self_attn.v_proj'));
    rope(q, NH);
    rope(k, NKV);
    const att = new Float64Array(T * NH * HD);
    for (let t = 0; t < T; t++)
      for (let hh = 0; hh < NH; hh++) {
        const kv = Math.floor(hh / (NH / NKV));
        const sc = Array.from({ length: t + 1 }, (_, j) => {
          let d = 0;
          for (let i = 0; i < HD; i++) d += q[(t * NH + hh) * HD + i]! * k[(j * NKV + kv) * HD + i]!;
          return d / Math.sqrt(HD);
        });
        const m = Math.max(...sc);
        const e = sc.map((z) => Math.exp(z - m));
        const sum = e.reduce((a, b) => a + b, 0);
        for (let j = 0; j <= t; j++)
          for (let i = 0; i < HD; i++) att[(t * NH + hh) * HD + i]! += (e[j]! / sum) * v[(j * NKV + kv) * HD + i]!;
      }
    const o = linear(att, `${p}self_attn.o_proj.weight`, C, NH * HD, lp('self_attn.o_proj'));
    x = x.map((xi, i) => xi + o[i]!);
    h = rms(x, w(`${p}post_attention_layernorm.weight`), C);
    const g = linear(h, `${p}mlp.gate_proj.weight`, I, C, lp('mlp.gate_proj'));
    const u = linear(h, `${p}mlp.up_proj.weight`, I, C, lp('mlp.up_proj'));
    const act = g.map((gi, i) => (gi / (1 + Math.exp(-gi))) * u[i]!);
    const d = linear(act, `${p}mlp.down_proj.weight`, C, I, lp('mlp.down_proj'));
    x = x.map((xi, i) => xi + d[i]!);
  }
  x = rms(x, w('model.norm.weight'), C);
  return linear(x, W.has('lm_head.weight') ? 'lm_head.weight' : 'model.embed_tokens.weight', V, C);
}

function nextTokenLoss(logits: Float64Array, ids: number[], V: number): number {
  let total = 0;
  for (let t = 0; t + 1 < ids.length; t++) {
    const row = logits.subarray(t * V, (t + 1) * V);
    const m = Math.max(...row);
    const lse = m + Math.log(row.reduce((a, z) => a + Math.exp(z - m), 0));
    total += lse - row[ids[t + 1]!]!;
  }
  return total / (ids.length - 1);
}

describe.each(VARIANTS)('PyTorch-written PEFT adapter: %s', (variant) => {
  it('records that PEFT made its numbers, with versions, and that plain PyTorch autograd agreed within 1e-4', async () => {
    const { meta } = await fixture(variant);
    expect(meta.impl).toBe('peft');
    expect(meta.peft_version).toMatch(/^\d+\.\d+/);
    expect(meta.transformers_version).toMatch(/^\d+\.\d+/);
    expect(meta.torch_version).toMatch(/^\d+\.\d+/);
    const cross = meta.reference_checks.plain_torch_vs_peft!;
    expect(cross.max_abs_diff_logits).toBeLessThanOrEqual(1e-4 * meta.max_abs_logit);
    expect(cross.abs_diff_loss).toBeLessThanOrEqual(1e-4 * meta.loss);
    expect(cross.max_rel_diff_grads).toBeLessThanOrEqual(1e-4);
  });

  it('reads with the stated config, and rewrites to the same bytes', async () => {
    const { dir, meta, cfg } = await fixture(variant);
    const { lora, tensors } = await readAdapter(nodeFolderSource(dir), cfg);
    expect(lora).toMatchObject({
      r: meta.r,
      alpha: meta.lora_alpha,
      useRslora: meta.use_rslora,
      targetModules: meta.target_modules,
      baseModel: meta.model_dir,
    });
    expect(loraScale(lora)).toBe(meta.scale);
    const files = writeAdapter(lora, tensors, cfg);
    expect(files[ADAPTER_CONFIG_FILE]).toBe(await readFile(join(dir, ADAPTER_CONFIG_FILE), 'utf8'));
    expect(
      Buffer.compare(Buffer.from(files[ADAPTER_WEIGHTS_FILE]), await readFile(join(dir, ADAPTER_WEIGHTS_FILE))),
    ).toBe(0);
  });

  it('grads.safetensors holds one F32 gradient per adapter tensor, all non-trivial', async () => {
    const { dir, meta, cfg } = await fixture(variant);
    const { lora } = await readAdapter(nodeFolderSource(dir), cfg);
    const grads = await readSafetensorsHeader(await nodeFolderSource(dir).open('grads.safetensors'));
    const shapes = loraShapes(cfg, lora).flatMap(
      (s) =>
        [
          [s.aKey, s.aShape],
          [s.bKey, s.bShape],
        ] as const,
    );
    expect([...grads.tensors.values()].map((t) => [t.name, t.shape]).sort()).toEqual(
      shapes.map(([k, s]) => [k, [...s]]).sort(),
    );
    for (const [k] of shapes) {
      const g = new Float32Array((await readTensor(grads, k)).buffer);
      const maxAbs = g.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
      expect(maxAbs, k).toBe(Math.fround(meta.grad_max_abs[k]!));
      expect(maxAbs, k).toBeGreaterThan(1e-6);
    }
    expect(meta.reference_checks.grads_f32_vs_f64_max_rel_err).toBeLessThan(1e-4); // leaves the 1e-3 budget to the engine
  });

  it('the golden checkpoint it points at is unchanged', async () => {
    const { meta, modelDir } = await fixture(variant);
    const { createHash } = await import('node:crypto');
    for (const [f, sha] of Object.entries(meta.model_sha256)) {
      expect(
        createHash('sha256')
          .update(await readFile(join(modelDir, f)))
          .digest('hex'),
        f,
      ).toBe(sha);
    }
  });

  it('float64 CPU forward: logits with the adapter and loss match; gradients match central differences', async () => {
    const { dir, meta, modelDir, cfg } = await fixture(variant);
    const { lora, tensors } = await readAdapter(nodeFolderSource(dir), cfg);
    const W = await baseWeights(modelDir);
    const L = new Map([...tensors].map(([k, v]) => [k, Float64Array.from(v)]));
    const s = loraScale(lora);
    const [T, V] = meta.logits_shape;
    const logits = forwardF64(cfg, W, L, s, meta.tokens);
    const ref = await f32File(join(dir, 'logits.f32'));
    expect(ref.length).toBe(T * V);
    let maxDiff = 0;
    for (let i = 0; i < ref.length; i++) maxDiff = Math.max(maxDiff, Math.abs(logits[i]! - ref[i]!));
    expect(maxDiff).toBeLessThan(1e-5 * meta.max_abs_logit); // f32 PyTorch vs f64 here: ~1e-6 relative
    const loss = nextTokenLoss(logits, meta.tokens, V);
    expect(Math.abs(loss - meta.loss)).toBeLessThan(1e-5 * meta.loss);

    // Central differences at the largest-gradient element of a few tensors: A and B, attention and MLP.
    const gradsFile = await readSafetensorsHeader(await nodeFolderSource(dir).open('grads.safetensors'));
    const shapes = loraShapes(cfg, lora);
    const picks = [shapes[0]!.aKey, shapes[0]!.bKey, shapes.at(-1)!.aKey, shapes.at(-1)!.bKey];
    for (const key of picks) {
      const g = new Float32Array((await readTensor(gradsFile, key)).buffer);
      let idx = 0;
      for (let i = 1; i < g.length; i++) if (Math.abs(g[i]!) > Math.abs(g[idx]!)) idx = i;
      const h = 1e-4;
      const p = L.get(key)!;
      const orig = p[idx]!;
      p[idx] = orig + h;
      const up = nextTokenLoss(forwardF64(cfg, W, L, s, meta.tokens), meta.tokens, V);
      p[idx] = orig - h;
      const down = nextTokenLoss(forwardF64(cfg, W, L, s, meta.tokens), meta.tokens, V);
      p[idx] = orig;
      const fd = (up - down) / (2 * h);
      expect(Math.abs(fd - g[idx]!) / Math.abs(g[idx]!), `${key}[${idx}]: fd ${fd} vs ${g[idx]}`).toBeLessThan(1e-4);
    }
  }, 60_000);
});
