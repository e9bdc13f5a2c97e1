import { describe, expect, it } from 'vitest';
import {
  QWEN3_PRESETS,
  gpuMemoryBytes,
  memoryTable,
  paramCount,
  parseQwen3Config,
  validateWeights,
  weightNames,
  type Qwen3Config,
} from '../../src/model/config.ts';
import { ModelLoadError } from '../../src/model/errors.ts';
import { openSafetensorsModel } from '../../src/model/safetensors.ts';
import { memorySource } from '../../src/model/sources.ts';
import { makeTinyCheckpoint } from '../../src/model/tinyModel.ts';

// config.json of Qwen/Qwen3-0.6B on the Hub.
const qwen3_06b = {
  architectures: ['Qwen3ForCausalLM'],
  attention_bias: false,
  attention_dropout: 0.0,
  bos_token_id: 151643,
  eos_token_id: 151645,
  head_dim: 128,
  hidden_act: 'silu',
  hidden_size: 1024,
  initializer_range: 0.02,
  intermediate_size: 3072,
  max_position_embeddings: 40960,
  max_window_layers: 28,
  model_type: 'qwen3',
  num_attention_heads: 16,
  num_hidden_layers: 28,
  num_key_value_heads: 8,
  rms_norm_eps: 1e-6,
  rope_scaling: null,
  rope_theta: 1000000,
  sliding_window: null,
  tie_word_embeddings: true,
  torch_dtype: 'bfloat16',
  transformers_version: '4.51.0',
  use_cache: true,
  use_sliding_window: false,
  vocab_size: 151936,
};

function configError(json: unknown): ModelLoadError {
  try {
    parseQwen3Config(json);
  } catch (e) {
    expect(e).toBeInstanceOf(ModelLoadError);
    expect((e as ModelLoadError).file).toBe('config.json');
    return e as ModelLoadError;
  }
  throw new Error('expected a ModelLoadError');
}

describe('parseQwen3Config', () => {
  it('parses the official Qwen3-0.6B config into the preset', () => {
    expect(parseQwen3Config(JSON.stringify(qwen3_06b))).toEqual(QWEN3_PRESETS['Qwen/Qwen3-0.6B']);
  });

  it('defaults head_dim to hidden/heads and accepts rope_parameters', () => {
    const { head_dim: _, rope_theta: __, ...rest } = qwen3_06b;
    const cfg = parseQwen3Config({
      ...rest,
      rope_parameters: { rope_type: 'default', rope_theta: 5e6 },
      eos_token_id: [1, 2],
    });
    expect(cfg.headDim).toBe(64);
    expect(cfg.ropeTheta).toBe(5e6);
    expect(cfg.eosTokenIds).toEqual([1, 2]);
  });

  it('rejects other model types', () => {
    expect(configError({ ...qwen3_06b, model_type: 'llama' }).message).toMatch(
      /config\.json: field "model_type" is "llama"/,
    );
    expect(configError({ ...qwen3_06b, model_type: 'qwen3_moe' }).message).toMatch(/qwen3_moe/);
  });

  it('rejects missing and invalid fields, naming them', () => {
    const { hidden_size: _, ...noHidden } = qwen3_06b;
    expect(configError(noHidden).message).toMatch(/field "hidden_size" is missing/);
    expect(configError({ ...qwen3_06b, num_hidden_layers: 2.5 }).message).toMatch(
      /"num_hidden_layers" must be a positive integer/,
    );
    expect(configError({ ...qwen3_06b, num_key_value_heads: 3 }).message).toMatch(/"num_key_value_heads"/);
    expect(configError({ ...qwen3_06b, rms_norm_eps: 'x' }).message).toMatch(/"rms_norm_eps"/);
    expect(configError({ ...qwen3_06b, tie_word_embeddings: 'yes' }).message).toMatch(/"tie_word_embeddings"/);
    expect(configError('{not json').message).toMatch(/config\.json: not valid JSON/);
  });

  it('rejects rope_scaling other than null', () => {
    const e = configError({ ...qwen3_06b, rope_scaling: { rope_type: 'yarn', factor: 4 } });
    expect(e.message).toMatch(/"rope_scaling".*not supported, only null/);
    expect(configError({ ...qwen3_06b, rope_parameters: { rope_type: 'yarn', rope_theta: 1e6 } }).message).toMatch(
      /rope_type/,
    );
  });
});

describe('weights', () => {
  it('lists 11 tensors per layer plus embed, norm and an untied head', () => {
    const cfg = QWEN3_PRESETS['Qwen/Qwen3-8B'];
    const names = weightNames(cfg);
    expect(names.length).toBe(36 * 11 + 3);
    expect(names.at(-1)).toEqual({ name: 'lm_head.weight', shape: [151936, 4096] });
    expect(names).toContainEqual({ name: 'model.layers.35.self_attn.k_proj.weight', shape: [1024, 4096] });
    expect(names).toContainEqual({ name: 'model.layers.0.self_attn.o_proj.weight', shape: [4096, 4096] });
    expect(weightNames(QWEN3_PRESETS['Qwen/Qwen3-0.6B']).some((w) => w.name === 'lm_head.weight')).toBe(false);
  });

  it('matches the published parameter counts (non-embedding, in billions)', () => {
    const nonEmbedding = (cfg: Qwen3Config) =>
      (paramCount(cfg, { lmHead: false }) - cfg.vocabSize * cfg.hiddenSize) / 1e9;
    expect(nonEmbedding(QWEN3_PRESETS['Qwen/Qwen3-0.6B'])).toBeCloseTo(0.44, 2);
    expect(nonEmbedding(QWEN3_PRESETS['Qwen/Qwen3-1.7B'])).toBeCloseTo(1.4, 1);
    expect(nonEmbedding(QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'])).toBeCloseTo(3.6, 1);
    expect(nonEmbedding(QWEN3_PRESETS['Qwen/Qwen3-8B'])).toBeCloseTo(6.95, 2);
  });

  async function tinyModel() {
    const { files, config } = makeTinyCheckpoint({ vocab: 256 });
    return { config, model: await openSafetensorsModel(memorySource('tiny', files)) };
  }

  it('accepts the tiny checkpoint and uses the embedding as head when tied', async () => {
    const { config, model } = await tinyModel();
    expect(validateWeights(config, model)).toEqual({ lmHead: 'model.embed_tokens.weight' });
  });

  it('prefers lm_head.weight when present even if the config says tied', async () => {
    const { config, model } = await tinyModel();
    const tensors = new Map(model.tensors);
    tensors.set('lm_head.weight', { ...tensors.get('model.embed_tokens.weight')!, name: 'lm_head.weight' });
    expect(validateWeights(config, { name: model.name, tensors })).toEqual({ lmHead: 'lm_head.weight' });
  });

  it('reports a missing tensor with file, tensor and expected shape', async () => {
    const { config, model } = await tinyModel();
    const tensors = new Map(model.tensors);
    tensors.delete('model.layers.1.mlp.up_proj.weight');
    const e = (() => {
      try {
        validateWeights(config, { name: model.name, tensors });
      } catch (x) {
        return x as ModelLoadError;
      }
    })()!;
    expect(e).toBeInstanceOf(ModelLoadError);
    expect(e.message).toBe(
      'model.safetensors: tensor "model.layers.1.mlp.up_proj.weight": missing; expected shape [128,64]',
    );
    expect(() => validateWeights({ ...config, tieWordEmbeddings: false }, model)).toThrow(
      /lm_head\.weight.*tie_word_embeddings=false/,
    );
  });

  it('reports a wrong shape with expected and actual', async () => {
    const { config, model } = await tinyModel();
    const tensors = new Map(model.tensors);
    tensors.set('model.norm.weight', { ...tensors.get('model.norm.weight')!, shape: [32] });
    expect(() => validateWeights(config, { name: model.name, tensors })).toThrow(
      /model\.safetensors: tensor "model\.norm\.weight": wrong shape: expected \[64\] from config\.json, got \[32\]/,
    );
  });

  it('requires bf16 weights', async () => {
    const { config, model } = await tinyModel();
    const tensors = new Map(model.tensors);
    tensors.set('model.norm.weight', { ...tensors.get('model.norm.weight')!, dtype: 'F32' });
    expect(() => validateWeights(config, { name: model.name, tensors })).toThrow(
      /"model\.norm\.weight": dtype F32, expected BF16/,
    );
  });
});

describe('gpuMemoryBytes', () => {
  it('adds bf16 weights, f32 KV cache and activations', () => {
    const cfg = QWEN3_PRESETS['Qwen/Qwen3-0.6B'];
    const m = gpuMemoryBytes(cfg, { maxT: 1024, slots: 4, tokensPerCall: 256 });
    expect(m.weights).toBe(paramCount(cfg) * 2);
    expect(m.kvCache).toBe(2 * 28 * 4 * 1024 * 8 * 128 * 4);
    expect(m.activations).toBe((256 * (3 * 1024 + 2 * 2048 + 2 * 1024 + 3 * 3072) + 4 * 151936) * 4);
    expect(m.total).toBe(m.weights + m.kvCache + m.activations);
  });

  it('has a row per preset, growing with model size', () => {
    const rows = memoryTable({ maxT: 2048, slots: 8 });
    expect(rows.map((r) => r.repo)).toEqual([
      'Qwen/Qwen3-0.6B',
      'Qwen/Qwen3-1.7B',
      'Qwen/Qwen3-4B-Instruct-2507',
      'Qwen/Qwen3-8B',
    ]);
    for (let i = 1; i < rows.length; i++) expect(rows[i]!.total).toBeGreaterThan(rows[i - 1]!.total);
    expect(rows[3]!.weights / 2 ** 30).toBeCloseTo(15.26, 1); // 8.19B params * 2 bytes
  });
});
