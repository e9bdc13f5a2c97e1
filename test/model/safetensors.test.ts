import { describe, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { mkdtemp, writeFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ModelLoadError } from '../../src/model/errors.ts';
import {
  bf16ArrayToF32,
  bf16BytesToF32,
  bf16ToF32,
  blobSource,
  bytesSource,
  f32ArrayToBf16,
  f32ToBf16,
  openSafetensorsModel,
  readSafetensorsHeader,
  readTensor,
  streamTensor,
  writeSafetensors,
  type TensorToWrite,
} from '../../src/model/safetensors.ts';
import { memorySource } from '../../src/model/sources.ts';
import { nodeFileSource, nodeFolderSource } from '../../src/model/sources.node.ts';

const enc = new TextEncoder();

function seq(n: number, start = 0): Uint8Array {
  return Uint8Array.from({ length: n }, (_, i) => (start + i * 7) & 0xff);
}

const sample: TensorToWrite[] = [
  { name: 'a', dtype: 'BF16', shape: [2, 3], data: seq(12) },
  { name: 'b', dtype: 'F32', shape: [5], data: seq(20, 3) },
  { name: 'c', dtype: 'F16', shape: [1, 1, 2], data: seq(4, 9) },
  { name: 'empty', dtype: 'F32', shape: [0, 4], data: new Uint8Array(0) },
];

/** A file with an arbitrary header (not validated) followed by `dataLength` bytes. */
function rawFile(header: unknown, dataLength: number, headerText?: string): Uint8Array {
  const json = enc.encode(headerText ?? JSON.stringify(header));
  const out = new Uint8Array(8 + json.length + dataLength);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  return out;
}

async function loadError(bytes: Uint8Array, name = 'bad.safetensors'): Promise<ModelLoadError> {
  try {
    await readSafetensorsHeader(bytesSource(name, bytes));
  } catch (e) {
    expect(e).toBeInstanceOf(ModelLoadError);
    return e as ModelLoadError;
  }
  throw new Error('expected a ModelLoadError');
}

describe('writer -> reader round trip', () => {
  it('keeps names, dtypes, shapes, bytes and metadata', async () => {
    const bytes = writeSafetensors(sample, { format: 'pt', note: 'hi' });
    const file = await readSafetensorsHeader(bytesSource('x.safetensors', bytes));
    expect(file.metadata).toEqual({ format: 'pt', note: 'hi' });
    expect(file.headerLength % 8).toBe(0);
    for (const t of sample) {
      const info = file.tensors.get(t.name)!;
      expect(info).toMatchObject({
        dtype: t.dtype,
        shape: t.shape,
        byteLength: t.data.byteLength,
        file: 'x.safetensors',
      });
      expect(await readTensor(file, t.name)).toEqual(t.data);
    }
  });

  it('pads the header with spaces to 8-byte alignment', () => {
    const bytes = writeSafetensors([sample[0]!]);
    const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    expect(n % 8).toBe(0);
    const header = new TextDecoder().decode(bytes.subarray(8, 8 + n));
    expect(header.trimEnd()).toBe(JSON.stringify({ a: { dtype: 'BF16', shape: [2, 3], data_offsets: [0, 12] } }));
    expect(/^[^ ]*\}( *)$/.test(header)).toBe(true);
  });

  it('streams a tensor in chunks with offsets', async () => {
    const big: TensorToWrite = { name: 'w', dtype: 'F32', shape: [25], data: seq(100) };
    const file = await readSafetensorsHeader(bytesSource('s', writeSafetensors([sample[1]!, big])));
    const chunks: { offset: number; length: number }[] = [];
    const out = new Uint8Array(100);
    for await (const c of streamTensor(file, 'w', 32)) {
      chunks.push({ offset: c.offset, length: c.bytes.length });
      out.set(c.bytes, c.offset);
    }
    expect(chunks).toEqual([
      { offset: 0, length: 32 },
      { offset: 32, length: 32 },
      { offset: 64, length: 32 },
      { offset: 96, length: 4 },
    ]);
    expect(out).toEqual(big.data);
  });

  it('reads through a Blob and a Node file handle the same way', async () => {
    const bytes = writeSafetensors(sample);
    const dir = await mkdtemp(join(tmpdir(), 'st-'));
    try {
      await writeFile(join(dir, 'm.safetensors'), bytes);
      for (const source of [
        blobSource(new Blob([bytes as Uint8Array<ArrayBuffer>]), 'm.safetensors'),
        await nodeFileSource(join(dir, 'm.safetensors'), 'm.safetensors'),
      ]) {
        const file = await readSafetensorsHeader(source);
        expect(await readTensor(file, 'b')).toEqual(sample[1]!.data);
      }
    } finally {
      await rm(dir, { recursive: true });
    }
  });

  it.skipIf(!existsSync('test/fixtures/golden/tied/model.safetensors'))(
    'reads a file written by Python safetensors',
    async () => {
      const model = await openSafetensorsModel(nodeFolderSource('test/fixtures/golden/tied'));
      expect(model.has('model.embed_tokens.weight')).toBe(true);
      const info = model.tensors.get('model.embed_tokens.weight')!;
      expect(info.dtype).toBe('BF16');
      expect((await model.readTensor(info.name)).byteLength).toBe(info.byteLength);
    },
  );
});

describe('header validation', () => {
  it('rejects a file shorter than the length prefix', async () => {
    const e = await loadError(new Uint8Array(5));
    expect(e.file).toBe('bad.safetensors');
    expect(e.message).toMatch(/bad\.safetensors.*truncated/);
  });

  it('rejects an absurd header length', async () => {
    const bytes = new Uint8Array(64);
    new DataView(bytes.buffer).setBigUint64(0, 1n << 40n, true);
    expect((await loadError(bytes)).message).toMatch(/bad\.safetensors: header length \d+ exceeds/);
  });

  it('rejects a header length past the end of the file', async () => {
    const bytes = rawFile({}, 0);
    new DataView(bytes.buffer).setBigUint64(0, 1000n, true);
    expect((await loadError(bytes)).message).toMatch(/runs past the end/);
  });

  it('rejects bad JSON', async () => {
    expect((await loadError(rawFile(null, 0, '{"a": [1, 2'))).message).toMatch(
      /bad\.safetensors: header is not valid UTF-8 JSON/,
    );
  });

  it('rejects a truncated data block, naming the last tensor', async () => {
    const bytes = writeSafetensors(sample);
    const e = await loadError(bytes.subarray(0, bytes.length - 3));
    expect(e.tensor).toBe('c');
    expect(e.message).toMatch(/truncated/);
  });

  it('rejects trailing bytes', async () => {
    const e = await loadError(rawFile({ a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] } }, 8));
    expect(e.message).toMatch(/trailing bytes/);
  });

  it('rejects a gap in data_offsets', async () => {
    const e = await loadError(
      rawFile(
        {
          a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] },
          b: { dtype: 'F32', shape: [1], data_offsets: [8, 12] },
        },
        12,
      ),
    );
    expect(e.tensor).toBe('b');
    expect(e.message).toMatch(/bad\.safetensors: tensor "b": gap in data_offsets/);
  });

  it('rejects overlapping data_offsets', async () => {
    const e = await loadError(
      rawFile(
        {
          a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] },
          b: { dtype: 'F32', shape: [1], data_offsets: [4, 8] },
        },
        8,
      ),
    );
    expect(e.tensor).toBe('b');
    expect(e.message).toMatch(/overlap/);
  });

  it('rejects a size that does not match dtype and shape', async () => {
    const e = await loadError(rawFile({ w: { dtype: 'BF16', shape: [3, 2], data_offsets: [0, 24] } }, 24));
    expect(e.tensor).toBe('w');
    expect(e.message).toMatch(/size mismatch.*needs 12/);
  });

  it('rejects an unsupported dtype, naming tensor and dtype', async () => {
    const e = await loadError(rawFile({ ids: { dtype: 'I64', shape: [1], data_offsets: [0, 8] } }, 8));
    expect(e.tensor).toBe('ids');
    expect(e.message).toMatch(/bad\.safetensors: tensor "ids": unsupported dtype I64/);
  });

  it('rejects a malformed shape and non-string metadata', async () => {
    expect((await loadError(rawFile({ w: { dtype: 'F32', shape: [-1], data_offsets: [0, 0] } }, 0))).tensor).toBe('w');
    expect((await loadError(rawFile({ __metadata__: { n: 1 } }, 0))).message).toMatch(/__metadata__\["n"\]/);
  });
});

describe('sharded models', () => {
  const shard1 = writeSafetensors([sample[0]!, sample[1]!]);
  const shard2 = writeSafetensors([sample[2]!]);
  const index = {
    metadata: { total_size: 36 },
    weight_map: { a: 'm-1.safetensors', b: 'm-1.safetensors', c: 'm-2.safetensors' },
  };

  it('presents the shards as one model', async () => {
    const source = memorySource(
      'mem',
      new Map<string, Uint8Array | string>([
        ['model.safetensors.index.json', JSON.stringify(index)],
        ['m-1.safetensors', shard1],
        ['m-2.safetensors', shard2],
      ]),
    );
    const model = await openSafetensorsModel(source);
    expect(model.name).toBe('model.safetensors.index.json');
    expect([...model.tensors.keys()].sort()).toEqual(['a', 'b', 'c']);
    expect(model.tensors.get('c')!.file).toBe('m-2.safetensors');
    expect(await model.readTensor('c')).toEqual(sample[2]!.data);
    expect(await model.readTensor('a')).toEqual(sample[0]!.data);
    expect(model.has('zzz')).toBe(false);
  });

  it('rejects a missing shard', async () => {
    const source = memorySource(
      'mem',
      new Map<string, Uint8Array | string>([
        ['model.safetensors.index.json', JSON.stringify(index)],
        ['m-1.safetensors', shard1],
      ]),
    );
    const e = await openSafetensorsModel(source).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ModelLoadError);
    expect((e as ModelLoadError).file).toBe('model.safetensors.index.json');
    expect((e as ModelLoadError).tensor).toBe('c');
    expect((e as Error).message).toMatch(/shard m-2\.safetensors is missing/);
  });

  it('rejects an index entry whose shard lacks the tensor', async () => {
    const source = memorySource(
      'mem',
      new Map<string, Uint8Array | string>([
        [
          'model.safetensors.index.json',
          JSON.stringify({ weight_map: { ...index.weight_map, ghost: 'm-2.safetensors' } }),
        ],
        ['m-1.safetensors', shard1],
        ['m-2.safetensors', shard2],
      ]),
    );
    const e = (await openSafetensorsModel(source).catch((x: unknown) => x)) as ModelLoadError;
    expect(e).toBeInstanceOf(ModelLoadError);
    expect(e.file).toBe('m-2.safetensors');
    expect(e.tensor).toBe('ghost');
  });

  it('rejects an index without weight_map and a model with no weights', async () => {
    const bad = memorySource('mem', new Map([['model.safetensors.index.json', '{"metadata": {}}']]));
    await expect(openSafetensorsModel(bad)).rejects.toThrow(/model\.safetensors\.index\.json: missing "weight_map"/);
    await expect(openSafetensorsModel(memorySource('mem', new Map()))).rejects.toThrow(ModelLoadError);
  });

  it('names file and tensor when a shard is cut short after the header was read', async () => {
    const bytes = writeSafetensors(sample);
    const file = await readSafetensorsHeader({ ...bytesSource('cut.safetensors', bytes), size: bytes.length });
    const cut = { ...file, source: bytesSource('cut.safetensors', bytes.subarray(0, bytes.length - 10)) };
    const e = (await readTensor(cut, 'c').catch((x: unknown) => x)) as ModelLoadError;
    expect(e).toBeInstanceOf(ModelLoadError);
    expect(e.file).toBe('cut.safetensors');
    expect(e.tensor).toBe('c');
  });
});

describe('bf16', () => {
  it('rounds to nearest even', () => {
    expect(f32ToBf16(1)).toBe(0x3f80);
    expect(f32ToBf16(-2)).toBe(0xc000);
    expect(f32ToBf16(1 + 2 ** -8)).toBe(0x3f80); // tie, round down to even
    expect(f32ToBf16(1 + 3 * 2 ** -8)).toBe(0x3f82); // tie, round up to even
    expect(f32ToBf16(1 + 2 ** -8 + 2 ** -20)).toBe(0x3f81); // above the tie
    expect(f32ToBf16(Infinity)).toBe(0x7f80);
    expect(f32ToBf16(-0)).toBe(0x8000);
    expect(f32ToBf16(3.4e38)).toBe(0x7f80); // rounds past the largest bf16
    expect(Number.isNaN(bf16ToF32(f32ToBf16(NaN)))).toBe(true);
  });

  it('is exact for values representable in bf16', () => {
    const xs = [0, 1, -1, 0.5, 3.140625, -1024, 2 ** -126, 1.5e-40];
    for (const x of xs.slice(0, 7)) expect(bf16ToF32(f32ToBf16(x))).toBe(x);
    expect(Array.from(bf16ArrayToF32(f32ArrayToBf16(xs.slice(0, 7))))).toEqual(xs.slice(0, 7));
  });

  it('decodes little-endian bytes', () => {
    const bits = f32ArrayToBf16([1, -2, 0.5]);
    expect(Array.from(bf16BytesToF32(new Uint8Array(bits.buffer)))).toEqual([1, -2, 0.5]);
  });
});
