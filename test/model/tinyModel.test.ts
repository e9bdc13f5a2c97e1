import { describe, expect, it } from 'vitest';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseQwen3Config, validateWeights, weightNames } from '../../src/model/config.ts';
import { bf16BytesToF32, openSafetensorsModel, type SafetensorsModel } from '../../src/model/safetensors.ts';
import { memorySource } from '../../src/model/sources.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { loadTokenizer } from '../../src/model/tokenizer.ts';
import { makeTinyCheckpoint } from '../../src/model/tinyModel.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';

function stats(x: Float32Array): { mean: number; std: number } {
  let s = 0;
  let s2 = 0;
  for (const v of x) {
    s += v;
    s2 += v * v;
  }
  const mean = s / x.length;
  return { mean, std: Math.sqrt(s2 / x.length - mean * mean) };
}

async function allTensors(model: SafetensorsModel): Promise<Map<string, Uint8Array>> {
  const out = new Map<string, Uint8Array>();
  for (const name of model.tensors.keys()) out.set(name, await model.readTensor(name));
  return out;
}

describe('makeTinyCheckpoint', () => {
  it('writes a valid HF-layout Qwen3 with the default shape', async () => {
    const { files, config } = makeTinyCheckpoint();
    expect([...files.keys()].sort()).toEqual(['config.json', 'generation_config.json', 'model.safetensors']);
    const raw = JSON.parse(files.get('config.json') as string) as Record<string, unknown>;
    expect(raw).toMatchObject({
      model_type: 'qwen3',
      architectures: ['Qwen3ForCausalLM'],
      torch_dtype: 'bfloat16',
      vocab_size: 151936,
    });
    expect(parseQwen3Config(raw)).toEqual(config);
    expect(config).toMatchObject({
      numLayers: 2,
      hiddenSize: 64,
      numHeads: 4,
      numKvHeads: 2,
      headDim: 16,
      intermediateSize: 128,
      tieWordEmbeddings: true,
    });
    const model = await openSafetensorsModel(memorySource('tiny', files));
    expect(validateWeights(config, model).lmHead).toBe('model.embed_tokens.weight');
    expect(model.tensors.size).toBe(weightNames(config).length);
  });

  it('is deterministic in the seed', () => {
    const a = makeTinyCheckpoint({ vocab: 512, seed: 3 }).files.get('model.safetensors') as Uint8Array;
    const b = makeTinyCheckpoint({ vocab: 512, seed: 3 }).files.get('model.safetensors') as Uint8Array;
    const c = makeTinyCheckpoint({ vocab: 512, seed: 4 }).files.get('model.safetensors') as Uint8Array;
    expect(a).toEqual(b);
    expect(a).not.toEqual(c);
  });

  it('initialises unit-scale embeddings, 1/sqrt(K) matrices (4x for residual writers) and norms near (not at) 1', async () => {
    const { files } = makeTinyCheckpoint({ vocab: 4096 });
    const model = await openSafetensorsModel(memorySource('tiny', files));
    const read = async (n: string) => stats(bf16BytesToF32(await model.readTensor(n)));
    expect((await read('model.embed_tokens.weight')).std).toBeCloseTo(1, 1);
    expect((await read('model.layers.0.mlp.gate_proj.weight')).std).toBeCloseTo(1 / Math.sqrt(64), 2);
    expect((await read('model.layers.0.mlp.down_proj.weight')).std).toBeCloseTo(4 / Math.sqrt(128), 1);
    const norm = await read('model.layers.1.self_attn.k_norm.weight');
    expect(Math.abs(norm.mean - 1)).toBeLessThan(0.1);
    expect(norm.std).toBeGreaterThan(0.05);
  });

  it('reads the same tensors from 3 shards as from one file, untied head included', async () => {
    const opts = { vocab: 1000, tied: false, layers: 3 };
    const single = makeTinyCheckpoint(opts);
    const sharded = makeTinyCheckpoint({ ...opts, shards: 3 });
    expect([...sharded.files.keys()].filter((f) => f.endsWith('.safetensors')).sort()).toEqual([
      'model-00001-of-00003.safetensors',
      'model-00002-of-00003.safetensors',
      'model-00003-of-00003.safetensors',
    ]);
    const index = JSON.parse(sharded.files.get('model.safetensors.index.json') as string) as {
      metadata: { total_size: number };
      weight_map: Record<string, string>;
    };
    const a = await openSafetensorsModel(memorySource('single', single.files));
    const b = await openSafetensorsModel(memorySource('sharded', sharded.files));
    expect(index.metadata.total_size).toBe([...a.tensors.values()].reduce((n, t) => n + t.byteLength, 0));
    expect(Object.keys(index.weight_map).sort()).toEqual([...a.tensors.keys()].sort());
    expect(validateWeights(sharded.config, b).lmHead).toBe('lm_head.weight');
    expect(await allTensors(b)).toEqual(await allTensors(a));
  });

  it('writes a folder with the real tokenizer that loads back', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'tiny-'));
    try {
      const { config } = await writeTinyCheckpoint(dir, { shards: 2 });
      const source = nodeFolderSource(dir);
      expect((await source.list!()).sort()).toEqual([
        'config.json',
        'generation_config.json',
        'model-00001-of-00002.safetensors',
        'model-00002-of-00002.safetensors',
        'model.safetensors.index.json',
        'tokenizer.json',
        'tokenizer_config.json',
      ]);
      validateWeights(config, await openSafetensorsModel(source));
      const tok = await loadTokenizer(source);
      expect(tok.stopIds.sort()).toEqual([151643, 151645]);
      expect(tok.encode('Hello')).toEqual([9707]);
    } finally {
      await rm(dir, { recursive: true });
    }
  });
});
