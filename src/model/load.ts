// Loads a Hugging Face-layout Qwen3 checkpoint onto the GPU: config.json, validated safetensors
// (single or sharded) streamed tensor by tensor in chunks, so the model never sits in JS memory.
// With weights 'q4' (docs/ENGINE.md, "q4 weights") each quantized tensor streams, whole rows at a
// time, through one small bf16 staging buffer into the quantize kernel, so no bf16 copy of it is
// ever on the GPU; or, from a q4 store (src/model/q4Store.ts), its packed words are uploaded as is.
import type { Gpu } from '../gpu/index.ts';
import * as K from '../ops/index.ts';
import { EMBED, loadQwen3Config, validateWeights, weightNames, type Qwen3Config } from './config.ts';
import { ModelLoadError } from './errors.ts';
import { isQ4Tensor, LAYER_TENSORS, openQ4Store, Q4_STORE_FILE, validateQ4Store } from './q4Store.ts';
import {
  INDEX_FILE,
  openSafetensorsModel,
  SINGLE_FILE,
  type SafetensorsModel,
  type TensorChunk,
} from './safetensors.ts';
import type { ModelSource } from './sources.ts';
import { loadTokenizer, type Qwen3Tokenizer } from './tokenizer.ts';
import { Qwen3Model, type LayerWeights, type Qwen3Weights } from './qwen3.ts';

export interface UploadProgress {
  tensor: string;
  /** Bytes of weights read so far, of `total` (the checkpoint's, or the q4 store's, tensor bytes). */
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
  /**
   * With weights 'q4': a source holding a q4 store of this model (Q4_STORE_FILE, written from
   * q4SafetensorsFile); its weights are uploaded as stored, and `source` provides only config.json.
   */
  prequantized?: Pick<ModelSource, 'exists' | 'open'>;
  /** Bytes of the bf16 staging buffer of q4 quantization (default Q4_STAGING_BYTES; at least one row). */
  q4StagingBytes?: number;
}

/** Staging for q4 quantization: a few MiB of whole bf16 rows per dispatch. */
export const Q4_STAGING_BYTES = 4 << 20;

export interface LoadedModel {
  model: Qwen3Model;
  cfg: Qwen3Config;
  source: ModelSource;
}

function checkBindingSize(gpu: Gpu, file: string, name: string, bytes: number): void {
  if (bytes > gpu.limits.maxStorageBufferBindingSize) {
    throw new ModelLoadError(
      file,
      `${bytes} bytes exceeds this GPU's maxStorageBufferBindingSize (${gpu.limits.maxStorageBufferBindingSize})`,
      name,
    );
  }
}

/** Copies a tensor's bytes as they are: bf16 weights, and the packed words of a q4 store. */
async function uploadTensor(
  gpu: Gpu,
  st: SafetensorsModel,
  name: string,
  onBytes: (n: number) => void,
): Promise<GPUBuffer> {
  const info = st.tensors.get(name);
  if (!info) throw new ModelLoadError(st.name, 'missing', name);
  checkBindingSize(gpu, info.file, name, info.byteLength);
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

/**
 * Regroups a tensor's chunks (consecutive, any sizes) into batches of whole rows, at most maxRows
 * each. Chunks that hold whole rows pass through as views; a row split across chunks is carried
 * in a buffer that the next batch reuses, so consume each batch before asking for the next.
 */
export async function* wholeRows(
  chunks: AsyncIterable<TensorChunk>,
  rowBytes: number,
  maxRows: number,
): AsyncGenerator<{ row0: number; rows: number; bytes: Uint8Array }> {
  const cap = maxRows * rowBytes;
  let carry: Uint8Array | null = null;
  let fill = 0; // bytes in carry
  let row0 = 0;
  let offset = 0;
  for await (const c of chunks) {
    if (c.offset !== offset) throw new RangeError(`wholeRows: chunk at byte ${c.offset}, expected ${offset}`);
    offset += c.bytes.byteLength;
    let b = c.bytes;
    while (b.byteLength > 0) {
      if (fill === 0 && b.byteLength >= rowBytes) {
        const rows = Math.min(maxRows, Math.floor(b.byteLength / rowBytes));
        yield { row0, rows, bytes: b.subarray(0, rows * rowBytes) };
        row0 += rows;
        b = b.subarray(rows * rowBytes);
      } else {
        carry ??= new Uint8Array(cap);
        const n = Math.min(b.byteLength, cap - fill);
        carry.set(b.subarray(0, n), fill);
        fill += n;
        b = b.subarray(n);
        if (fill === cap) {
          yield { row0, rows: maxRows, bytes: carry };
          row0 += maxRows;
          fill = 0;
        }
      }
    }
  }
  if (fill % rowBytes !== 0) throw new RangeError(`wholeRows: the data ends ${fill % rowBytes} bytes into a row`);
  if (fill > 0) yield { row0, rows: fill / rowBytes, bytes: carry!.subarray(0, fill) };
}

/**
 * Quantizes bf16 tensors to q4 on the GPU while they stream in: one staging buffer for all of
 * them, and one status word per tensor for the groups the kernel refuses (NaN, scale beyond f16),
 * read once by `check` after the last upload.
 */
class Q4Quantizer {
  private readonly slots = new Map<string, number>();
  private constructor(
    private readonly gpu: Gpu,
    private readonly st: SafetensorsModel,
    private readonly staging: GPUBuffer, // (rows, K) bf16, whole rows of the tensor being quantized
    private readonly status: GPUBuffer, // (tensors) u32 first bad group, K.Q4_STATUS_OK if none
    names: string[],
  ) {
    names.forEach((n, i) => this.slots.set(n, i));
  }

  /** Refuses, before allocating anything, a tensor whose last dimension is not a multiple of 32 or whose q4 buffer is too big. */
  static create(gpu: Gpu, st: SafetensorsModel, names: string[], stagingBytes = Q4_STAGING_BYTES): Q4Quantizer {
    let maxRow = 0,
      maxTensor = 0;
    for (const name of names) {
      const info = st.tensors.get(name)!;
      const [N, Kd] = info.shape as [number, number];
      if (Kd % 32 !== 0) {
        throw new ModelLoadError(
          info.file,
          `shape ${JSON.stringify(info.shape)}: q4 needs the last dimension to be a multiple of 32 (groups of 32), ${Kd} is not; load this model with bf16 weights`,
          name,
        );
      }
      checkBindingSize(gpu, info.file, name, K.q4Words(N, Kd) * 4);
      maxRow = Math.max(maxRow, Kd * 2);
      maxTensor = Math.max(maxTensor, info.byteLength);
    }
    // At least one row, at most the largest tensor (tiny models stay tiny).
    const bytes = Math.min(Math.max(stagingBytes, maxRow), maxTensor);
    const staging = gpu.createBuffer(Math.max(4, bytes), 'q4 staging');
    const status = gpu.createBuffer(Math.max(1, names.length) * 4, 'q4 status');
    gpu.write(status, new Uint32Array(Math.max(1, names.length)).fill(K.Q4_STATUS_OK));
    return new Q4Quantizer(gpu, st, staging, status, names);
  }

  async upload(name: string, onBytes: (n: number) => void): Promise<K.Q4Weight> {
    const { gpu, st } = this;
    const info = st.tensors.get(name)!;
    const [N, Kd] = info.shape as [number, number];
    const rowBytes = Kd * 2;
    const maxRows = Math.floor(this.staging.size / rowBytes);
    const buf = gpu.createBuffer(K.q4Words(N, Kd) * 4, name); // q4Words(N, K) u32
    try {
      const counted = async function* (chunks: AsyncIterable<TensorChunk>) {
        for await (const c of chunks) {
          onBytes(c.bytes.byteLength);
          yield c;
        }
      };
      // Chunks of whole rows from the file: batches pass straight from the read to the staging buffer.
      for await (const batch of wholeRows(counted(st.streamTensor(name, maxRows * rowBytes)), rowBytes, maxRows)) {
        gpu.write(this.staging, batch.bytes); // ordered after the previous batch's dispatch (write flushes)
        K.quantizeQ4(gpu, buf, this.status, this.staging, batch.row0, batch.rows, N, Kd, this.slots.get(name)!);
      }
    } catch (e) {
      gpu.releaseBuffer(buf);
      throw e;
    }
    return { format: 'q4', buf, N, K: Kd };
  }

  /** Throws a ModelLoadError naming the first tensor (in load order) with a refused group. */
  async check(): Promise<void> {
    const status = await this.gpu.readU32(this.status, this.slots.size);
    for (const [name, slot] of this.slots) {
      const info = this.st.tensors.get(name)!;
      const bad = K.q4StatusGroup(status[slot]!, info.shape[1]!);
      if (!bad) continue;
      const where = `row ${bad.row}, columns ${bad.col}..${bad.col + 31}`;
      throw new ModelLoadError(
        info.file,
        bad.nan
          ? `NaN at ${where}: cannot be quantized to q4`
          : `max |w| at ${where} needs a q4 scale beyond f16 (max |w| / 7 >= 65520); load this model with bf16 weights`,
        name,
      );
    }
  }

  release(): void {
    this.gpu.releaseBuffer(this.staging);
    this.gpu.releaseBuffer(this.status);
  }
}

/** A source holding a q4 store (Q4_STORE_FILE) and no bf16 safetensors (`spyrl quantize`'s output). */
export async function isQ4StoreOnly(source: Pick<ModelSource, 'exists'>): Promise<boolean> {
  return (
    (await source.exists(Q4_STORE_FILE)) && !(await source.exists(SINGLE_FILE)) && !(await source.exists(INDEX_FILE))
  );
}

/**
 * Reads config.json, checks every tensor's name, shape and dtype, then uploads the weights. A
 * source with a q4 store and no bf16 weights (isQ4StoreOnly) loads from its store.
 */
export async function loadQwen3(gpu: Gpu, source: ModelSource, opts: LoadOptions = {}): Promise<LoadedModel> {
  const cfg = await loadQwen3Config(source);
  const q4 = (opts.weights ?? 'bf16') === 'q4';
  if (opts.prequantized && !q4) throw new RangeError("loadQwen3: a prequantized (q4 store) source needs weights: 'q4'");
  // A folder (or repo) written by `spyrl quantize`: config, tokenizer and the q4 store, no bf16
  // weights. It loads as q4 from its store; bf16 would need the checkpoint it was made from.
  if (!opts.prequantized && (await isQ4StoreOnly(source))) {
    if (!q4)
      throw new ModelLoadError(
        Q4_STORE_FILE,
        `${source.name} holds q4 weights only (no ${SINGLE_FILE}): load it with q4 weights (spyrl: --weights q4); bf16 needs the original checkpoint`,
      );
    opts = { ...opts, prequantized: source };
  }
  const st = opts.prequantized ? await openQ4Store(opts.prequantized) : await openSafetensorsModel(source);
  const { lmHead } = opts.prequantized ? validateQ4Store(cfg, st) : validateWeights(cfg, st);

  const expected = weightNames(cfg, { lmHead: lmHead !== EMBED });
  const shapes = new Map(expected.map((w) => [w.name, w.shape]));
  const names = expected.map((w) => w.name);
  const total = names.reduce((n, t) => n + st.tensors.get(t)!.byteLength, 0);
  const quantizer =
    q4 && !opts.prequantized ? Q4Quantizer.create(gpu, st, names.filter(isQ4Tensor), opts.q4StagingBytes) : null;
  let loaded = 0;
  const uploaded: K.Weight[] = [];
  const up = async (name: string): Promise<K.Weight> => {
    const onBytes = (n: number) => {
      loaded += n;
      opts.onProgress?.({ tensor: name, loaded, total });
    };
    let w: K.Weight;
    if (q4 && isQ4Tensor(name)) {
      const [N, Kd] = shapes.get(name)! as [number, number];
      w = quantizer
        ? await quantizer.upload(name, onBytes)
        : { format: 'q4', buf: await uploadTensor(gpu, st, name, onBytes), N, K: Kd };
    } else {
      w = await uploadTensor(gpu, st, name, onBytes);
    }
    uploaded.push(w);
    return w;
  };
  const bf16 = async (name: string): Promise<GPUBuffer> => K.weightBuffer(await up(name)); // norms
  try {
    const embed = await up(EMBED);
    const layers: LayerWeights[] = [];
    for (let l = 0; l < cfg.numLayers; l++) {
      const p = `model.layers.${l}.`;
      const t = LAYER_TENSORS;
      layers.push({
        inputNorm: await bf16(p + t.inputNorm),
        qProj: await up(p + t.qProj),
        kProj: await up(p + t.kProj),
        vProj: await up(p + t.vProj),
        qNorm: await bf16(p + t.qNorm),
        kNorm: await bf16(p + t.kNorm),
        oProj: await up(p + t.oProj),
        postNorm: await bf16(p + t.postNorm),
        gateProj: await up(p + t.gateProj),
        upProj: await up(p + t.upProj),
        downProj: await up(p + t.downProj),
      });
    }
    const norm = await bf16('model.norm.weight');
    const head = lmHead === EMBED ? embed : await up(lmHead); // tied: one buffer (bf16 or q4) serves both
    await quantizer?.check();
    await gpu.sync();
    const weights: Qwen3Weights = { embed, layers, norm, lmHead: head };
    return { model: new Qwen3Model(gpu, cfg, weights, { chunk: opts.chunk, kv: opts.kv }), cfg, source };
  } catch (e) {
    for (const w of uploaded) gpu.releaseBuffer(K.weightBuffer(w));
    throw e;
  } finally {
    quantizer?.release();
  }
}

/** The model and, when the folder has tokenizer files, its tokenizer. */
export async function loadQwen3WithTokenizer(
  gpu: Gpu,
  source: ModelSource,
  opts: LoadOptions = {},
): Promise<LoadedModel & { tokenizer: Qwen3Tokenizer | null }> {
  const tokenizer = (await source.exists('tokenizer.json')) ? await loadTokenizer(source) : null;
  return { ...(await loadQwen3(gpu, source, opts)), tokenizer };
}
