// Loads a Hugging Face-layout Qwen3 checkpoint onto the GPU: config.json, validated safetensors
// (single or sharded) streamed tensor by tensor in chunks, so the model never sits in JS memory.
import type { Gpu } from '../gpu/index.ts';
import { EMBED, loadQwen3Config, validateWeights, weightNames, type Qwen3Config } from './config.ts';
import { ModelLoadError } from './errors.ts';
import { openSafetensorsModel, type SafetensorsModel } from './safetensors.ts';
import type { ModelSource } from './sources.ts';
import { loadTokenizer, type Qwen3Tokenizer } from './tokenizer.ts';
import { Qwen3Model, type LayerWeights, type Qwen3Weights } from './qwen3.ts';

export interface UploadProgress {
  tensor: string;
  /** Bytes of weights on the GPU so far, of `total`. */
  loaded: number;
  total: number;
}

export interface LoadOptions {
  onProgress?: (p: UploadProgress) => void;
  /** Tokens per forward chunk (activation memory bound). */
  chunk?: number;
  /** Base weights on the GPU (default bf16): q4 quantizes Linear weights and the embedding while loading. */
  weights?: 'bf16' | 'q4';
  /** KV-cache element type (default f32). */
  kv?: 'f32' | 'f16';
}

export interface LoadedModel {
  model: Qwen3Model;
  cfg: Qwen3Config;
  source: ModelSource;
}

async function uploadTensor(gpu: Gpu, st: SafetensorsModel, name: string, onBytes: (n: number) => void): Promise<GPUBuffer> {
  const info = st.tensors.get(name);
  if (!info) throw new ModelLoadError(st.name, 'missing', name);
  if (info.byteLength > gpu.limits.maxStorageBufferBindingSize) {
    throw new ModelLoadError(info.file, `${info.byteLength} bytes exceeds this GPU's maxStorageBufferBindingSize (${gpu.limits.maxStorageBufferBindingSize})`, name);
  }
  const buf = gpu.createBuffer(info.byteLength, name);
  try {
    for await (const chunk of st.streamTensor(name)) {
      gpu.write(buf, chunk.bytes, chunk.offset);
      onBytes(chunk.bytes.byteLength);
    }
  } catch (e) {
    gpu.releaseBuffer(buf);
    throw e;
  }
  return buf;
}

/** Reads config.json, checks every tensor's name, shape and dtype, then uploads the weights. */
export async function loadQwen3(gpu: Gpu, source: ModelSource, opts: LoadOptions = {}): Promise<LoadedModel> {
  const cfg = await loadQwen3Config(source);
  const st = await openSafetensorsModel(source);
  const { lmHead } = validateWeights(cfg, st);

  const names = weightNames(cfg, { lmHead: lmHead !== EMBED }).map((w) => w.name);
  const total = names.reduce((n, t) => n + st.tensors.get(t)!.byteLength, 0);
  let loaded = 0;
  const uploaded: GPUBuffer[] = [];
  const up = async (name: string): Promise<GPUBuffer> => {
    const buf = await uploadTensor(gpu, st, name, (n) => {
      loaded += n;
      opts.onProgress?.({ tensor: name, loaded, total });
    });
    uploaded.push(buf);
    return buf;
  };
  try {
    const embed = await up(EMBED);
    const layers: LayerWeights[] = [];
    for (let l = 0; l < cfg.numLayers; l++) {
      const p = `model.layers.${l}.`;
      layers.push({
        inputNorm: await up(`${p}input_layernorm.weight`),
        qProj: await up(`${p}self_attn.q_proj.weight`),
        kProj: await up(`${p}self_attn.k_proj.weight`),
        vProj: await up(`${p}self_attn.v_proj.weight`),
        qNorm: await up(`${p}self_attn.q_norm.weight`),
        kNorm: await up(`${p}self_attn.k_norm.weight`),
        oProj: await up(`${p}self_attn.o_proj.weight`),
        postNorm: await up(`${p}post_attention_layernorm.weight`),
        gateProj: await up(`${p}mlp.gate_proj.weight`),
        upProj: await up(`${p}mlp.up_proj.weight`),
        downProj: await up(`${p}mlp.down_proj.weight`),
      });
    }
    const norm = await up('model.norm.weight');
    const head = lmHead === EMBED ? embed : await up(lmHead);
    await gpu.sync();
    const weights: Qwen3Weights = { embed, layers, norm, lmHead: head };
    return { model: new Qwen3Model(gpu, cfg, weights, { chunk: opts.chunk, kv: opts.kv }), cfg, source };
  } catch (e) {
    for (const b of uploaded) gpu.releaseBuffer(b);
    throw e;
  }
}

/** The model and, when the folder has tokenizer files, its tokenizer. */
export async function loadQwen3WithTokenizer(gpu: Gpu, source: ModelSource, opts: LoadOptions = {}): Promise<LoadedModel & { tokenizer: Qwen3Tokenizer | null }> {
  const tokenizer = (await source.exists('tokenizer.json')) ? await loadTokenizer(source) : null;
  return { ...(await loadQwen3(gpu, source, opts)), tokenizer };
}
