// The q4 store: a loaded q4 model's weights as one safetensors file, so the browser can cache the
// result of quantizing (OPFS) and load it later without the bf16 checkpoint and without
// quantizing again (loadQwen3(gpu, source, { weights: 'q4', prequantized: store })).
// The file, model.q4.safetensors: each quantized tensor (isQ4Tensor) under its Hugging Face name
// as dtype U32, shape [q4Words(N, K)], the packed words of docs/ENGINE.md "q4 weights"
// (little-endian); the norms as BF16 of their config shape; metadata {"format": "spyrl-q4",
// "group": "32", "version": "1"}. A tied model stores the embedding once and no lm_head.weight.
// The weights' shapes (N, K) come from config.json, which the store's source must hold too.
import type { Gpu } from '../gpu/index.ts';
import { isQ4, q4Words, type Weight } from '../ops/common.ts';
import { EMBED, LM_HEAD, weightNames, type Qwen3Config } from './config.ts';
import { ModelLoadError } from './errors.ts';
import type { Qwen3Model, LayerWeights } from './qwen3.ts';
import { modelOf, readSafetensorsHeader, safetensorsHeader, type Dtype, type SafetensorsModel } from './safetensors.ts';
import type { ModelSource } from './sources.ts';

/** The store's file name in its source (the q4 entry of the Hub cache, `spyrl quantize`'s folder). */
export const Q4_STORE_FILE = 'model.q4.safetensors';
/**
 * The checkpoint files a load reads besides the weights (config, sampling defaults, tokenizer),
 * copied beside a q4 store so that it loads on its own, without the bf16 checkpoint.
 */
export const Q4_SIDE_FILES: readonly string[] = [
  'config.json',
  'generation_config.json',
  'tokenizer.json',
  'tokenizer_config.json',
];
/** The layout version: bumped whenever the packed layout or this file's layout changes. */
export const Q4_STORE_VERSION = 1;
export const Q4_STORE_METADATA: Readonly<Record<string, string>> = {
  format: 'spyrl-q4',
  group: '32',
  version: String(Q4_STORE_VERSION),
};

/** Every Linear weight (*_proj.weight), the embedding and an untied LM head are q4; norms stay bf16. */
export function isQ4Tensor(name: string): boolean {
  return name.endsWith('_proj.weight') || name === EMBED || name === LM_HEAD;
}

/** The Hugging Face name below `model.layers.{l}.` of each LayerWeights field. */
export const LAYER_TENSORS: Readonly<Record<keyof LayerWeights, string>> = {
  inputNorm: 'input_layernorm.weight',
  qProj: 'self_attn.q_proj.weight',
  kProj: 'self_attn.k_proj.weight',
  vProj: 'self_attn.v_proj.weight',
  qNorm: 'self_attn.q_norm.weight',
  kNorm: 'self_attn.k_norm.weight',
  oProj: 'self_attn.o_proj.weight',
  postNorm: 'post_attention_layernorm.weight',
  gateProj: 'mlp.gate_proj.weight',
  upProj: 'mlp.up_proj.weight',
  downProj: 'mlp.down_proj.weight',
};

export interface StoredTensor {
  name: string;
  dtype: Extract<Dtype, 'U32' | 'BF16'>;
  /** In the file: [q4Words(N, K)] for U32, the config shape for BF16. */
  shape: number[];
  /** The weight's own shape. */
  weightShape: number[];
}

/** The store's tensors in file order (weightNames order); `lmHead`: an untied LM head is stored. */
export function q4StoreLayout(cfg: Qwen3Config, opts: { lmHead: boolean }): StoredTensor[] {
  return weightNames(cfg, { lmHead: opts.lmHead }).map(({ name, shape }) =>
    isQ4Tensor(name)
      ? { name, dtype: 'U32', shape: [q4Words(shape[0]!, shape[1]!)], weightShape: shape }
      : { name, dtype: 'BF16', shape, weightShape: shape },
  );
}

/** Hugging Face name -> the model's weight; the tied LM head is not listed twice. */
function modelTensors(model: Qwen3Model): Map<string, Weight> {
  const w = model.weights;
  const out = new Map<string, Weight>([[EMBED, w.embed]]);
  w.layers.forEach((lw, l) => {
    for (const [field, name] of Object.entries(LAYER_TENSORS))
      out.set(`model.layers.${l}.${name}`, lw[field as keyof LayerWeights]);
  });
  out.set('model.norm.weight', w.norm);
  if (w.lmHead !== w.embed) out.set(LM_HEAD, w.lmHead);
  return out;
}

function storeLayoutOf(model: Qwen3Model): StoredTensor[] {
  const layout = q4StoreLayout(model.cfg, { lmHead: model.weights.lmHead !== model.weights.embed });
  const tensors = modelTensors(model);
  for (const t of layout) {
    if (t.dtype === 'U32' && !isQ4(tensors.get(t.name)!)) {
      throw new Error(`exportQuantized: ${t.name} is bf16; load the model with weights: 'q4' to export its q4 weights`);
    }
  }
  return layout;
}

/** Readback granularity: bounds the GPU staging buffer of each read (a 4B q4 embedding is ~220 MB). */
export const READ_PIECE_BYTES = 16 << 20;

export interface ExportOptions {
  /** Bytes read back per GPU read (a multiple of 4; default READ_PIECE_BYTES). */
  pieceBytes?: number;
}

/** Each tensor of the store with its bytes read back in pieces of at most pieceBytes. */
async function* storedTensors(
  gpu: Gpu,
  model: Qwen3Model,
  pieceBytes = READ_PIECE_BYTES,
): AsyncGenerator<{ name: string; bytes: number; pieces: AsyncGenerator<Uint8Array> }> {
  const tensors = modelTensors(model);
  for (const t of storeLayoutOf(model)) {
    const w = tensors.get(t.name)!;
    const buf = isQ4(w) ? w.buf : w;
    const bytes = t.shape.reduce((a, b) => a * b, 1) * (t.dtype === 'U32' ? 4 : 2);
    async function* pieces() {
      for (let at = 0; at < bytes; at += pieceBytes)
        yield new Uint8Array(await gpu.read(buf, Math.min(pieceBytes, bytes - at), at));
    }
    yield { name: t.name, bytes, pieces: pieces() };
  }
}

function checkPiece(pieceBytes = READ_PIECE_BYTES): number {
  if (!Number.isSafeInteger(pieceBytes) || pieceBytes <= 0 || pieceBytes % 4 !== 0)
    throw new RangeError(`pieceBytes must be a positive multiple of 4, got ${pieceBytes}`);
  return pieceBytes;
}

/**
 * Reads back every tensor of a q4 model, in q4StoreLayout order: the packed words of the q4
 * tensors, the bf16 bytes of the norms. One tensor is in JS memory at a time.
 */
export async function* exportQuantized(
  gpu: Gpu,
  model: Qwen3Model,
  opts: ExportOptions = {},
): AsyncIterable<{ name: string; bytes: Uint8Array }> {
  for await (const t of storedTensors(gpu, model, checkPiece(opts.pieceBytes))) {
    const bytes = new Uint8Array(t.bytes);
    let at = 0;
    for await (const p of t.pieces) {
      bytes.set(p, at);
      at += p.byteLength;
    }
    yield { name: t.name, bytes };
  }
}

/**
 * The q4 store file (Q4_STORE_FILE) of a q4 model as consecutive pieces to append to a file: the
 * header, then each tensor in pieces of at most 16 MiB, so the file never sits in memory.
 */
export async function* q4SafetensorsFile(
  gpu: Gpu,
  model: Qwen3Model,
  opts: ExportOptions = {},
): AsyncIterable<Uint8Array> {
  const pieceBytes = checkPiece(opts.pieceBytes);
  yield safetensorsHeader(storeLayoutOf(model), { ...Q4_STORE_METADATA });
  for await (const t of storedTensors(gpu, model, pieceBytes)) yield* t.pieces;
}

/** Opens the store file of a source (its header only; validateQ4Store checks it against the config). */
export async function openQ4Store(source: Pick<ModelSource, 'exists' | 'open'>): Promise<SafetensorsModel> {
  if (!(await source.exists(Q4_STORE_FILE)))
    throw new ModelLoadError(Q4_STORE_FILE, 'not found in the q4 store source');
  const file = await readSafetensorsHeader(await source.open(Q4_STORE_FILE));
  return modelOf(Q4_STORE_FILE, [file], file.tensors);
}

/**
 * Checks a q4 store against the config: its metadata, and every tensor's presence, dtype and
 * size. Returns the tensor serving as the LM head (lm_head.weight when stored, else the embedding).
 */
export function validateQ4Store(
  cfg: Qwen3Config,
  st: Pick<SafetensorsModel, 'name' | 'tensors' | 'files'>,
): { lmHead: string } {
  for (const f of st.files) {
    for (const [key, want] of Object.entries(Q4_STORE_METADATA)) {
      if (f.metadata[key] !== want) {
        throw new ModelLoadError(
          f.source.name,
          `not a q4 store: metadata "${key}" is ${JSON.stringify(f.metadata[key])}, expected "${want}"`,
        );
      }
    }
  }
  const hasLmHead = st.tensors.has(LM_HEAD);
  for (const t of q4StoreLayout(cfg, { lmHead: hasLmHead || !cfg.tieWordEmbeddings })) {
    const info = st.tensors.get(t.name);
    const what = t.dtype === 'U32' ? `q4 words of a ${JSON.stringify(t.weightShape)} weight` : 'a bf16 norm';
    if (!info)
      throw new ModelLoadError(
        st.name,
        `missing from the q4 store; expected ${t.dtype} ${JSON.stringify(t.shape)} (${what})`,
        t.name,
      );
    if (info.dtype !== t.dtype || info.shape.length !== t.shape.length || info.shape.some((d, i) => d !== t.shape[i])) {
      throw new ModelLoadError(
        info.file,
        `${info.dtype} ${JSON.stringify(info.shape)} in the q4 store, expected ${t.dtype} ${JSON.stringify(t.shape)} (${what}): stored from another model?`,
        t.name,
      );
    }
  }
  return { lmHead: hasLmHead ? LM_HEAD : EMBED };
}
