// Safetensors reader (header + ranged tensor streaming, single file or sharded) and writer.
// Format: u64 LE header length N, N bytes of UTF-8 JSON, then the tensor data block.
// https://github.com/huggingface/safetensors#format
import { ModelLoadError } from './errors.ts';
import { unsafePathReason } from './paths.ts';
import type { ModelSource } from './sources.ts';

// ---------------------------------------------------------------------------------------------
// 1. Byte sources: ranged reads so a multi-GB file never sits in JS memory.

export interface ByteSource {
  name: string;
  size: number;
  /** Exactly `length` bytes at `offset`; throws ModelLoadError if the range is past the end. */
  read(offset: number, length: number): Promise<Uint8Array>;
}

function checkRange(name: string, size: number, offset: number, length: number): void {
  if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(length) || offset < 0 || length < 0) {
    throw new ModelLoadError(name, `invalid read range offset=${offset} length=${length}`);
  }
  if (offset + length > size) {
    throw new ModelLoadError(
      name,
      `read of ${length} bytes at offset ${offset} is past the end of the file (${size} bytes): file truncated?`,
    );
  }
}

export function bytesSource(name: string, bytes: Uint8Array): ByteSource {
  return {
    name,
    size: bytes.byteLength,
    async read(offset, length) {
      checkRange(name, bytes.byteLength, offset, length);
      return bytes.subarray(offset, offset + length);
    },
  };
}

/** Browser `File`/`Blob` (also the OPFS / Cache Storage entries of the hub cache). */
export function blobSource(blob: Blob, name = (blob as Partial<File>).name ?? 'blob'): ByteSource {
  return {
    name,
    size: blob.size,
    async read(offset, length) {
      checkRange(name, blob.size, offset, length);
      const bytes = new Uint8Array(await blob.slice(offset, offset + length).arrayBuffer());
      if (bytes.byteLength !== length) {
        throw new ModelLoadError(
          name,
          `short read: wanted ${length} bytes at offset ${offset}, got ${bytes.byteLength}`,
        );
      }
      return bytes;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// 2. Header parsing and validation.

export type Dtype = 'BF16' | 'F16' | 'F32' | 'U32'; // U32: packed q4 words (src/model/q4Store.ts)
export const DTYPE_BYTES: Record<Dtype, number> = { BF16: 2, F16: 2, F32: 4, U32: 4 };
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

export interface TensorInfo {
  name: string;
  dtype: Dtype;
  shape: number[];
  /** The safetensors file holding the tensor. */
  file: string;
  /** Absolute byte offset of the tensor's data in `file`. */
  fileOffset: number;
  byteLength: number;
}

export interface SafetensorsFile {
  source: ByteSource;
  metadata: Record<string, string>;
  headerLength: number;
  tensors: Map<string, TensorInfo>;
}

export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function isNonNegInt(x: unknown): x is number {
  return typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;
}

export async function readSafetensorsHeader(source: ByteSource): Promise<SafetensorsFile> {
  const file = source.name;
  if (source.size < 8)
    throw new ModelLoadError(file, `file is ${source.size} bytes, too short for the 8-byte header length: truncated`);
  const lenBytes = await source.read(0, 8);
  const headerLenBig = new DataView(lenBytes.buffer, lenBytes.byteOffset, 8).getBigUint64(0, true);
  if (headerLenBig > BigInt(MAX_HEADER_BYTES)) {
    throw new ModelLoadError(
      file,
      `header length ${headerLenBig} exceeds the ${MAX_HEADER_BYTES}-byte limit: not a safetensors file?`,
    );
  }
  const headerLength = Number(headerLenBig);
  if (headerLength < 2) throw new ModelLoadError(file, `header length ${headerLength} is too small`);
  if (8 + headerLength > source.size) {
    throw new ModelLoadError(
      file,
      `header length ${headerLength} runs past the end of the file (${source.size} bytes): truncated or not a safetensors file`,
    );
  }

  let json: unknown;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(await source.read(8, headerLength));
    json = JSON.parse(text);
  } catch (e) {
    throw new ModelLoadError(file, `header is not valid UTF-8 JSON (${(e as Error).message})`);
  }
  if (!isRecord(json)) throw new ModelLoadError(file, 'header JSON is not an object');

  const metadata: Record<string, string> = {};
  const rawMeta = json['__metadata__'];
  if (rawMeta !== undefined && rawMeta !== null) {
    if (!isRecord(rawMeta)) throw new ModelLoadError(file, '__metadata__ is not an object');
    for (const [k, v] of Object.entries(rawMeta)) {
      if (typeof v !== 'string') throw new ModelLoadError(file, `__metadata__["${k}"] is not a string`);
      metadata[k] = v;
    }
  }

  const dataStart = 8 + headerLength;
  const dataLength = source.size - dataStart;
  const spans: { name: string; start: number; end: number }[] = [];
  const tensors = new Map<string, TensorInfo>();
  for (const [name, entry] of Object.entries(json)) {
    if (name === '__metadata__') continue;
    if (!isRecord(entry)) throw new ModelLoadError(file, 'header entry is not an object', name);
    const { dtype, shape, data_offsets: offsets } = entry;
    if (typeof dtype !== 'string') throw new ModelLoadError(file, 'missing dtype', name);
    if (!(dtype in DTYPE_BYTES)) {
      throw new ModelLoadError(
        file,
        `unsupported dtype ${dtype} (supported: ${Object.keys(DTYPE_BYTES).join(', ')})`,
        name,
      );
    }
    if (!Array.isArray(shape) || !shape.every(isNonNegInt)) {
      throw new ModelLoadError(file, `shape ${JSON.stringify(shape)} is not a list of non-negative integers`, name);
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isNonNegInt) || offsets[1] < offsets[0]) {
      throw new ModelLoadError(
        file,
        `data_offsets ${JSON.stringify(offsets)} is not [begin, end] with begin <= end`,
        name,
      );
    }
    const [start, end] = offsets as [number, number];
    const expected = numel(shape) * DTYPE_BYTES[dtype as Dtype];
    if (end - start !== expected) {
      throw new ModelLoadError(
        file,
        `size mismatch: data_offsets [${start}, ${end}] span ${end - start} bytes but ${dtype} ${JSON.stringify(shape)} needs ${expected}`,
        name,
      );
    }
    spans.push({ name, start, end });
    tensors.set(name, {
      name,
      dtype: dtype as Dtype,
      shape: [...shape],
      file,
      fileOffset: dataStart + start,
      byteLength: expected,
    });
  }

  spans.sort((a, b) => a.start - b.start || a.end - b.end);
  let cursor = 0;
  for (const s of spans) {
    if (s.start > cursor)
      throw new ModelLoadError(file, `gap in data_offsets: bytes [${cursor}, ${s.start}) belong to no tensor`, s.name);
    if (s.start < cursor)
      throw new ModelLoadError(
        file,
        `data_offsets [${s.start}, ${s.end}] overlap the previous tensor (ends at ${cursor})`,
        s.name,
      );
    cursor = s.end;
  }
  if (cursor > dataLength) {
    const cut = spans.find((s) => s.end > dataLength)!;
    throw new ModelLoadError(
      file,
      `data ends at byte ${cut.end} but the file holds only ${dataLength} data bytes: truncated`,
      cut.name,
    );
  }
  if (cursor < dataLength) {
    throw new ModelLoadError(
      file,
      `file holds ${dataLength} data bytes but tensors cover only ${cursor}: trailing bytes`,
      spans.at(-1)?.name,
    );
  }
  return { source, metadata, headerLength, tensors };
}

// ---------------------------------------------------------------------------------------------
// 3. Streaming tensor data.

export interface TensorChunk {
  /** Byte offset of `bytes` within the tensor (where to write it in a GPU buffer). */
  offset: number;
  bytes: Uint8Array;
}

export const DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024;

function tensorOf(file: SafetensorsFile, name: string): TensorInfo {
  const info = file.tensors.get(name);
  if (!info) throw new ModelLoadError(file.source.name, 'no such tensor', name);
  return info;
}

async function* streamRange(source: ByteSource, info: TensorInfo, chunkBytes: number): AsyncGenerator<TensorChunk> {
  if (!(chunkBytes > 0)) throw new RangeError(`chunkBytes must be positive, got ${chunkBytes}`);
  for (let offset = 0; offset < info.byteLength; offset += chunkBytes) {
    const length = Math.min(chunkBytes, info.byteLength - offset);
    let bytes: Uint8Array;
    try {
      bytes = await source.read(info.fileOffset + offset, length);
    } catch (e) {
      // Name the tensor too: the source only knows the file.
      if (e instanceof ModelLoadError && e.tensor === undefined)
        throw new ModelLoadError(info.file, e.message.slice(e.file.length + 2), info.name);
      throw e;
    }
    yield { offset, bytes };
  }
}

export function streamTensor(
  file: SafetensorsFile,
  name: string,
  chunkBytes = DEFAULT_CHUNK_BYTES,
): AsyncIterable<TensorChunk> {
  return streamRange(file.source, tensorOf(file, name), chunkBytes);
}

async function collect(chunks: AsyncIterable<TensorChunk>, byteLength: number): Promise<Uint8Array> {
  const out = new Uint8Array(byteLength);
  for await (const c of chunks) out.set(c.bytes, c.offset);
  return out;
}

export function readTensor(file: SafetensorsFile, name: string): Promise<Uint8Array> {
  return collect(streamTensor(file, name), tensorOf(file, name).byteLength);
}

// ---------------------------------------------------------------------------------------------
// 4. A model's weights: `model.safetensors`, or shards listed by `model.safetensors.index.json`.

export const SINGLE_FILE = 'model.safetensors';
export const INDEX_FILE = 'model.safetensors.index.json';

export interface SafetensorsModel {
  /** The file that lists the tensors (index or single file); used in error messages. */
  name: string;
  files: SafetensorsFile[];
  tensors: Map<string, TensorInfo>;
  has(name: string): boolean;
  streamTensor(name: string, chunkBytes?: number): AsyncIterable<TensorChunk>;
  readTensor(name: string): Promise<Uint8Array>;
}

/** A model over already-read files; `name` is the file that lists the tensors. */
export function modelOf(name: string, files: SafetensorsFile[], tensors: Map<string, TensorInfo>): SafetensorsModel {
  const byFile = new Map(files.map((f) => [f.source.name, f]));
  const info = (t: string): TensorInfo => {
    const i = tensors.get(t);
    if (!i) throw new ModelLoadError(name, 'no such tensor', t);
    return i;
  };
  return {
    name,
    files,
    tensors,
    has: (t) => tensors.has(t),
    streamTensor: (t, chunkBytes = DEFAULT_CHUNK_BYTES) => {
      const i = info(t);
      return streamRange(byFile.get(i.file)!.source, i, chunkBytes);
    },
    readTensor: (t) => {
      const i = info(t);
      return collect(streamRange(byFile.get(i.file)!.source, i, DEFAULT_CHUNK_BYTES), i.byteLength);
    },
  };
}

/** Opens a model's weights from a source, preferring the shard index when present. */
export async function openSafetensorsModel(
  source: Pick<ModelSource, 'exists' | 'open' | 'readText'>,
): Promise<SafetensorsModel> {
  if (!(await source.exists(INDEX_FILE))) {
    if (!(await source.exists(SINGLE_FILE))) {
      throw new ModelLoadError(SINGLE_FILE, `not found (and no ${INDEX_FILE} either)`);
    }
    const file = await readSafetensorsHeader(await source.open(SINGLE_FILE));
    return modelOf(SINGLE_FILE, [file], file.tensors);
  }

  let index: unknown;
  try {
    index = JSON.parse(await source.readText(INDEX_FILE));
  } catch (e) {
    throw new ModelLoadError(INDEX_FILE, `not valid JSON (${(e as Error).message})`);
  }
  const weightMap = isRecord(index) ? index['weight_map'] : undefined;
  if (!isRecord(weightMap)) throw new ModelLoadError(INDEX_FILE, 'missing "weight_map" object');
  const shardNames = new Set<string>();
  for (const [tensor, shard] of Object.entries(weightMap)) {
    if (typeof shard !== 'string') throw new ModelLoadError(INDEX_FILE, 'weight_map entry is not a file name', tensor);
    // A shard lives beside the index: "../x.safetensors", "/etc/x" or "https://..." would reach
    // outside the model folder (or the repo) through the source.
    const unsafe = unsafePathReason(shard);
    if (unsafe)
      throw new ModelLoadError(
        INDEX_FILE,
        `weight_map names the shard ${JSON.stringify(shard)}, which is not a file inside the model folder: ${unsafe}`,
        tensor,
      );
    shardNames.add(shard);
  }
  for (const shard of shardNames) {
    if (!(await source.exists(shard))) {
      const tensor = Object.keys(weightMap).find((t) => weightMap[t] === shard);
      throw new ModelLoadError(INDEX_FILE, `shard ${shard} is missing`, tensor);
    }
  }
  const files: SafetensorsFile[] = [];
  for (const shard of shardNames) files.push(await readSafetensorsHeader(await source.open(shard)));
  const byName = new Map(files.map((f) => [f.source.name, f]));

  const tensors = new Map<string, TensorInfo>();
  for (const [tensor, shard] of Object.entries(weightMap) as [string, string][]) {
    const info = byName.get(shard)!.tensors.get(tensor);
    if (!info) throw new ModelLoadError(shard, `listed in ${INDEX_FILE} but absent from the shard`, tensor);
    tensors.set(tensor, info);
  }
  return modelOf(INDEX_FILE, files, tensors);
}

// ---------------------------------------------------------------------------------------------
// 5. Writer and bf16 helpers.

export interface TensorToWrite {
  name: string;
  dtype: Dtype;
  shape: number[];
  data: Uint8Array;
}

/**
 * The first 8 + headerLength bytes of a safetensors file holding `tensors` in the given order
 * (their data follows, back to back); the header is space-padded to 8-byte alignment as HF does.
 * For writers that stream the data (a model-sized file need not sit in memory).
 */
export function safetensorsHeader(
  tensors: readonly Omit<TensorToWrite, 'data'>[],
  metadata?: Record<string, string>,
): Uint8Array {
  const header: Record<string, unknown> = {};
  if (metadata) header['__metadata__'] = metadata;
  let offset = 0;
  for (const t of tensors) {
    const bytes = numel(t.shape) * DTYPE_BYTES[t.dtype];
    if (t.name in header) throw new RangeError(`tensor ${t.name} given twice`);
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  const json = new TextEncoder().encode(JSON.stringify(header));
  const headerLength = Math.ceil(json.byteLength / 8) * 8;
  const out = new Uint8Array(8 + headerLength);
  new DataView(out.buffer).setBigUint64(0, BigInt(headerLength), true);
  out.set(json, 8);
  out.fill(0x20, 8 + json.byteLength, 8 + headerLength);
  return out;
}

/** Serialises tensors in the given order (header as safetensorsHeader). */
export function writeSafetensors(tensors: readonly TensorToWrite[], metadata?: Record<string, string>): Uint8Array {
  let dataBytes = 0;
  for (const t of tensors) {
    const expected = numel(t.shape) * DTYPE_BYTES[t.dtype];
    if (t.data.byteLength !== expected) {
      throw new RangeError(
        `tensor ${t.name}: ${t.data.byteLength} bytes given but ${t.dtype} ${JSON.stringify(t.shape)} needs ${expected}`,
      );
    }
    dataBytes += expected;
  }
  const header = safetensorsHeader(tensors, metadata);
  const out = new Uint8Array(header.byteLength + dataBytes);
  out.set(header);
  let at = header.byteLength;
  for (const t of tensors) {
    out.set(t.data, at);
    at += t.data.byteLength;
  }
  return out;
}

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** f32 -> bf16 bits, round-to-nearest-even; NaN stays a (quiet) NaN. */
export function f32ToBf16(x: number): number {
  f32Scratch[0] = x;
  const bits = u32Scratch[0]!;
  if ((bits & 0x7fffffff) > 0x7f800000) return ((bits >>> 16) | 0x0040) & 0xffff;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bf16ToF32(bits: number): number {
  u32Scratch[0] = (bits & 0xffff) << 16;
  return f32Scratch[0]!;
}

export function f32ArrayToBf16(x: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = f32ToBf16(x[i]!);
  return out;
}

/** `bytes` are little-endian bf16 as stored in safetensors. */
export function bf16BytesToF32(bytes: Uint8Array): Float32Array {
  const n = bytes.byteLength >>> 1;
  const out = new Float32Array(n);
  const u = new Uint32Array(out.buffer);
  for (let i = 0; i < n; i++) u[i] = (bytes[2 * i]! | (bytes[2 * i + 1]! << 8)) << 16;
  return out;
}

export function bf16ArrayToF32(x: Uint16Array): Float32Array {
  const out = new Float32Array(x.length);
  const u = new Uint32Array(out.buffer);
  for (let i = 0; i < x.length; i++) u[i] = x[i]! << 16;
  return out;
}
