// Issue 9, row "adapter zip with entries other than the PEFT files, an oversized entry, duplicate
// names, or nested folders that collide": only known names are inflated, each entry's size is
// checked from the central directory before inflating and again while inflating, duplicates and
// colliding folders are refused, and every error names the entry.
import { describe, expect, it } from 'vitest';
import { inflateSync, zipSync } from 'fflate';
import {
  ADAPTER_UPLOAD_LIMITS,
  readAdapterUpload,
  zipFiles,
  type AdapterUploadLimits,
} from '../../src/worker/adapterZip.ts';

const MiB = 2 ** 20;
const enc = new TextEncoder();
const CONFIG = '{"r": 2, "lora_alpha": 4}';
const WEIGHTS = Uint8Array.from({ length: 4096 }, (_, i) => (i * 7) % 256);

function crc32(data: Uint8Array): number {
  let c = 0xffffffff;
  for (const byte of data) {
    c ^= byte;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  }
  return (c ^ 0xffffffff) >>> 0;
}

/**
 * A raw deflate stream that inflates to `n` zero bytes, written by hand with fixed Huffman codes:
 * one literal 0, then matches of length 258 at distance 1 (13 bits each). 300 MB of zeros costs
 * 2 MB and a few milliseconds, where deflating a real 300 MB buffer would take seconds.
 */
function zeroBomb(n: number): Uint8Array {
  const out = new Uint8Array(Math.ceil((3 + 8 + Math.ceil(n / 258) * 13 + 7 + 8) / 8) + 8);
  let bit = 0;
  const put = (value: number, bits: number, reversed = false) => {
    for (let i = 0; i < bits; i++) {
      const b = reversed ? (value >> (bits - 1 - i)) & 1 : (value >> i) & 1;
      out[bit >> 3]! |= b << (bit & 7);
      bit++;
    }
  };
  put(1, 1); // BFINAL
  put(1, 2); // BTYPE = 01, fixed Huffman
  put(0b00110000, 8, true); // literal 0
  let left = n - 1;
  const match = (len: number) => {
    // Lengths 3..258 as fixed codes: 257..279 are 7 bits, 280..285 are 8 bits (Huffman codes MSB first).
    const [code, base, extra] = lengthCode(len);
    if (code <= 279) put(code - 256, 7, true);
    else put(0b11000000 + (code - 280), 8, true);
    put(len - base, extra);
    put(0, 5, true); // distance code 0: distance 1
  };
  while (left >= 258) {
    match(258);
    left -= 258;
  }
  while (left >= 3) {
    const len = Math.min(left, 257);
    match(len);
    left -= len;
  }
  for (; left > 0; left--) put(0b00110000, 8, true);
  put(0, 7, true); // end of block (256)
  return out.subarray(0, (bit + 7) >> 3);
}

let bomb300: Uint8Array | undefined;
/** 300 MB of zeros as deflate data, built once for the file. */
const bomb300MB = () => (bomb300 ??= zeroBomb(300 * MiB));

function lengthCode(len: number): [number, number, number] {
  const table: [number, number, number][] = [];
  const extra = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5];
  let base = 3;
  for (let i = 0; i < 28; i++) {
    table.push([257 + i, base, extra[i]!]);
    base += 1 << extra[i]!;
  }
  if (len === 258) return [285, 258, 0];
  return table.findLast(([, b]) => b <= len)!;
}

interface RawEntry {
  name: string;
  data: Uint8Array;
  method: 0 | 8;
  /** Declared uncompressed size. */
  size: number;
  crc: number;
}

/** A zip written byte by byte, so that sizes, names and duplicates can be whatever a test needs. */
function rawZip(entries: RawEntry[]): Uint8Array {
  const parts: Uint8Array[] = [];
  const central: Uint8Array[] = [];
  let offset = 0;
  for (const e of entries) {
    const name = enc.encode(e.name);
    const local = new DataView(new ArrayBuffer(30));
    local.setUint32(0, 0x04034b50, true);
    local.setUint16(4, 20, true);
    local.setUint16(6, 0x800, true);
    local.setUint16(8, e.method, true);
    local.setUint32(14, e.crc, true);
    local.setUint32(18, e.data.length, true);
    local.setUint32(22, e.size, true);
    local.setUint16(26, name.length, true);
    const cd = new DataView(new ArrayBuffer(46));
    cd.setUint32(0, 0x02014b50, true);
    cd.setUint16(4, 20, true);
    cd.setUint16(6, 20, true);
    cd.setUint16(8, 0x800, true);
    cd.setUint16(10, e.method, true);
    cd.setUint32(16, e.crc, true);
    cd.setUint32(20, e.data.length, true);
    cd.setUint32(24, e.size, true);
    cd.setUint16(28, name.length, true);
    cd.setUint32(42, offset, true);
    parts.push(new Uint8Array(local.buffer), name, e.data);
    central.push(new Uint8Array(cd.buffer), name);
    offset += 30 + name.length + e.data.length;
  }
  const cdSize = central.reduce((a, p) => a + p.length, 0);
  const end = new DataView(new ArrayBuffer(22));
  end.setUint32(0, 0x06054b50, true);
  end.setUint16(8, entries.length, true);
  end.setUint16(10, entries.length, true);
  end.setUint32(12, cdSize, true);
  end.setUint32(16, offset, true);
  const all = [...parts, ...central, new Uint8Array(end.buffer)];
  const out = new Uint8Array(all.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of all) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const stored = (name: string, data: Uint8Array | string): RawEntry => {
  const bytes = typeof data === 'string' ? enc.encode(data) : data;
  return { name, data: bytes, method: 0, size: bytes.length, crc: crc32(bytes) };
};
const zipFile = (bytes: Uint8Array, name = 'adapter.zip') => new File([bytes as Uint8Array<ArrayBuffer>], name);
const limits = (files: Record<string, number>, total = ADAPTER_UPLOAD_LIMITS.total): AdapterUploadLimits => ({
  ...ADAPTER_UPLOAD_LIMITS,
  files: { ...ADAPTER_UPLOAD_LIMITS.files, ...files },
  total,
});
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => '(accepted)',
    (e: unknown) => (e as Error).message,
  );

describe('issue 9 row: adapter zip — only known names inflated, caps before inflating, duplicates refused', () => {
  it('adapter zip row: a zip from zipFiles reads back whole (text as text, weights as bytes)', async () => {
    const zip = zipFiles({
      'adapter_config.json': CONFIG,
      'adapter_model.safetensors': WEIGHTS,
      'README.md': '# card',
    });
    const read = await readAdapterUpload([zipFile(zip)]);
    expect(read).toEqual({
      'adapter_config.json': CONFIG,
      'adapter_model.safetensors': WEIGHTS,
      'README.md': '# card',
    });
  });

  it('adapter zip row: entries other than the PEFT files are skipped without being inflated', async () => {
    // notes.bin's "deflate data" is garbage: inflating it would throw. evil.bin declares 4 GiB.
    const garbage = Uint8Array.from({ length: 64 }, () => 0xff);
    const zip = rawZip([
      stored('my-adapter/adapter_config.json', CONFIG),
      stored('my-adapter/adapter_model.safetensors', WEIGHTS),
      { name: 'my-adapter/notes.bin', data: garbage, method: 8, size: 1000, crc: 0 },
      { name: 'evil.bin', data: bomb300MB(), method: 8, size: 0xfffffffe, crc: 0 },
      { name: '__MACOSX/my-adapter/._adapter_config.json', data: garbage, method: 8, size: 10, crc: 0 },
      stored('my-adapter/', ''),
    ]);
    const t = performance.now();
    const read = await readAdapterUpload([zipFile(zip)]);
    expect(Object.keys(read).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
    expect(read['adapter_model.safetensors']).toEqual(WEIGHTS);
    expect(performance.now() - t).toBeLessThan(2000);
  });

  it('adapter zip row: a zip bomb (a 300 MB entry in a 2 MB zip) is refused from its declared size before inflating', async () => {
    const bomb = bomb300MB();
    expect(bomb.length).toBeLessThan(3 * MiB);
    const real = inflateSync(zeroBomb(1_000_003)); // the bomb is real deflate
    expect([real.length, real.every((b) => b === 0)]).toEqual([1_000_003, true]);
    // The data is cut after 1 KiB: had the reader started inflating, it would fail on the data,
    // not on the size.
    const zip = rawZip([
      stored('adapter_model.safetensors', WEIGHTS),
      { name: 'adapter_config.json', data: bomb.subarray(0, 1024), method: 8, size: 300 * MiB, crc: 0 },
    ]);
    expect(await refusal(readAdapterUpload([zipFile(zip)]))).toBe(
      'adapter.zip: entry "adapter_config.json" declares 300.0 MiB, over the 1.0 MiB cap for adapter_config.json',
    );
  });

  it('adapter zip row: with a 10 MB cap declared, a 50 MB weights entry is refused without being inflated', async () => {
    const zip = rawZip([
      stored('adapter_config.json', CONFIG),
      {
        name: 'adapter_model.safetensors',
        data: zeroBomb(50 * MiB).subarray(0, 100),
        method: 8,
        size: 50 * MiB,
        crc: 0,
      },
    ]);
    const msg = await refusal(readAdapterUpload([zipFile(zip)], limits({ 'adapter_model.safetensors': 10 * MiB })));
    expect(msg).toBe(
      'adapter.zip: entry "adapter_model.safetensors" declares 50.0 MiB, over the 10.0 MiB cap for adapter_model.safetensors',
    );
    // The same entry under the default caps is admitted, and then fails on its cut data: so the
    // refusal above came before any inflating.
    expect(await refusal(readAdapterUpload([zipFile(zip)]))).toMatch(
      /entry "adapter_model.safetensors" (is not valid deflate data|inflates to \d+ bytes)/,
    );
  });

  it('adapter zip row: an entry that inflates past its declared size stops there and is refused (the cap holds on the actual output)', async () => {
    // Declares 1000 bytes, inflates to 300 MB: memory stays at the declared 1000 bytes and the
    // inflater stops after the first piece of input.
    const zip = rawZip([
      stored('adapter_model.safetensors', WEIGHTS),
      { name: 'adapter_config.json', data: bomb300MB(), method: 8, size: 1000, crc: 0 },
    ]);
    const t = performance.now();
    const msg = await refusal(readAdapterUpload([zipFile(zip)]));
    expect(msg).toBe(
      'adapter.zip: entry "adapter_config.json" inflates past the 1000 bytes its zip directory declares: refused (a zip bomb?)',
    );
    expect(performance.now() - t).toBeLessThan(2000);
  });

  it('adapter zip row: the total of the known files is capped too', async () => {
    const zip = rawZip([stored('adapter_config.json', CONFIG), stored('adapter_model.safetensors', WEIGHTS)]);
    expect(await refusal(readAdapterUpload([zipFile(zip)], limits({}, 1000)))).toBe(
      `adapter.zip: entry "adapter_model.safetensors" takes the adapter's files to ${WEIGHTS.length + CONFIG.length} bytes, over the 1000 bytes cap`,
    );
  });

  it('adapter zip row: a duplicate entry name is refused, naming it', async () => {
    const zip = rawZip([
      stored('adapter_config.json', CONFIG),
      stored('adapter_model.safetensors', WEIGHTS),
      stored('adapter_config.json', '{"r": 64}'),
    ]);
    expect(await refusal(readAdapterUpload([zipFile(zip)]))).toBe(
      'adapter.zip: entry "adapter_config.json" appears twice; an adapter has one adapter_config.json',
    );
  });

  it('adapter zip row: nested folders that flatten onto one name are refused, naming both entries', async () => {
    const zip = zipSync({
      'run-a/adapter_config.json': enc.encode(CONFIG),
      'run-b/adapter_config.json': enc.encode('{"r": 8}'),
      'run-a/adapter_model.safetensors': WEIGHTS,
    });
    expect(await refusal(readAdapterUpload([zipFile(zip)]))).toBe(
      'adapter.zip: entries "run-a/adapter_config.json" and "run-b/adapter_config.json" both hold adapter_config.json; an adapter has one (zip one adapter folder)',
    );
    // Across two uploaded zips too.
    const one = zipSync({ 'adapter_config.json': enc.encode(CONFIG) });
    expect(await refusal(readAdapterUpload([zipFile(one, 'a.zip'), zipFile(one, 'b.zip')]))).toBe(
      'b.zip: entry "adapter_config.json" appears twice; an adapter has one adapter_config.json',
    );
  });

  it('adapter zip row: a known file under "..", "/" or a drive letter is refused, naming the entry', async () => {
    for (const name of [
      '../adapter_config.json',
      '/adapter_config.json',
      'C:/adapter_config.json',
      'a\\..\\adapter_config.json',
    ]) {
      const msg = await refusal(readAdapterUpload([zipFile(rawZip([stored(name, CONFIG)]))]));
      expect(msg).toContain(`entry "${name.replaceAll('\\', '/')}" is refused`);
    }
  });

  it('adapter zip row: a damaged entry fails its CRC-32 check, naming it', async () => {
    const good = stored('adapter_model.safetensors', WEIGHTS);
    const zip = rawZip([stored('adapter_config.json', CONFIG), { ...good, crc: good.crc ^ 1 }]);
    expect(await refusal(readAdapterUpload([zipFile(zip)]))).toBe(
      'adapter.zip: entry "adapter_model.safetensors" fails its CRC-32 check: the zip is damaged',
    );
  });

  it('adapter zip row: a zip listing more entries than the cap is refused before reading them', async () => {
    const zip = rawZip(Array.from({ length: 20 }, (_, i) => stored(`f${i}.txt`, 'x')));
    expect(await refusal(readAdapterUpload([zipFile(zip)], { ...ADAPTER_UPLOAD_LIMITS, entries: 10 }))).toBe(
      'adapter.zip: not a readable zip (20 entries; an adapter zip holds a handful (at most 10))',
    );
  });

  it('adapter zip row: a picked folder reads only the known files, and refuses an oversized one from its size without reading it', async () => {
    const pick = (rel: string, body: string | Uint8Array, readable = true) => {
      const f = new File([body as BlobPart], rel.split('/').at(-1)!);
      Object.defineProperty(f, 'webkitRelativePath', { value: rel });
      if (!readable)
        Object.defineProperty(f, 'arrayBuffer', {
          value: () => Promise.reject(new Error('read a file it should have skipped')),
        });
      return f;
    };
    const folder = [
      pick('run/adapter_config.json', CONFIG),
      pick('run/adapter_model.safetensors', WEIGHTS),
      pick('run/model-00001-of-00002.safetensors', WEIGHTS, false),
    ];
    expect(Object.keys(await readAdapterUpload(folder)).sort()).toEqual([
      'adapter_config.json',
      'adapter_model.safetensors',
    ]);
    const big = [
      pick('run/adapter_config.json', CONFIG),
      pick('run/adapter_model.safetensors', new Uint8Array(2 * MiB), false),
    ];
    expect(await refusal(readAdapterUpload(big, limits({ 'adapter_model.safetensors': MiB })))).toBe(
      'the picked files: entry "run/adapter_model.safetensors" declares 2.0 MiB, over the 1.0 MiB cap for adapter_model.safetensors',
    );
  });
});
