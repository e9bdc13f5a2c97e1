// The quantized entries of the Hub cache: stored beside the download under their own key,
// complete only once the manifest is written, listed and deleted per format.
import { describe, expect, it } from 'vitest';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  deleteCachedModel,
  listCachedModels,
  memoryHubCache,
  quantizedCacheSource,
  writeQuantizedCache,
  type HubCache,
  type QuantizedFile,
} from '../../src/model/sources.ts';
import { nodeFolderHubCache } from '../../src/model/sources.node.ts';

const REPO = 'spyrl-test/tiny';
const bytes = (n: number, seed: number) => Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) % 256);
const weights = bytes(1152, 1);
async function* pieces(data: Uint8Array, size: number): AsyncIterable<Uint8Array> {
  for (let at = 0; at < data.length; at += size) yield data.slice(at, at + size);
}
const config: QuantizedFile = { name: 'config.json', bytes: new TextEncoder().encode('{"model_type":"qwen3"}') };
const files = (): QuantizedFile[] => [
  config,
  { name: 'model.q4.safetensors', bytes: pieces(weights, 500) }, // streamed: 500 + 500 + 152
  { name: 'tokenizer.json', bytes: [bytes(100, 2), bytes(28, 3)] },
];
const NAMES = ['config.json', 'model.q4.safetensors', 'tokenizer.json'];

/** A download entry the way hubSource writes it: `${repo}/${revision}/${file}`. */
async function putDownload(cache: HubCache, revision: string, file: string, data: Uint8Array) {
  const w = await cache.create(`${REPO}/${encodeURIComponent(revision)}/${file}`);
  await w.write(data);
  await w.close();
}

describe('quantized cache entries', () => {
  it.each([
    ['memory', async () => ({ cache: memoryHubCache(), done: async () => undefined })],
    [
      'node folder',
      async () => {
        const dir = await mkdtemp(join(tmpdir(), 'q4cache-'));
        return { cache: nodeFolderHubCache(dir), done: () => rm(dir, { recursive: true }) };
      },
    ],
  ])('%s: stores, reads back, lists beside the download and deletes per format', async (_kind, make) => {
    const { cache, done } = await make();
    try {
      await putDownload(cache, 'main', 'model.safetensors', bytes(5000, 3));
      expect(await quantizedCacheSource(cache, REPO, 'main', 'q4', 1)).toBeNull();
      const seen: string[] = [];
      const stored = await writeQuantizedCache(cache, REPO, 'main', 'q4', 1, files(), (p) =>
        seen.push(`${p.file} ${p.written}`),
      );
      expect(stored).toBe(22 + 1152 + 128);
      expect(seen).toEqual([
        'config.json 22',
        'model.q4.safetensors 522',
        'model.q4.safetensors 1022',
        'model.q4.safetensors 1174',
        'tokenizer.json 1274',
        'tokenizer.json 1302',
      ]);

      const src = (await quantizedCacheSource(cache, REPO, 'main', 'q4', 1))!;
      expect(src).toMatchObject({ repo: REPO, revision: 'main', format: 'q4', bytes: stored });
      expect((await src.list!()).sort()).toEqual(NAMES);
      expect(await src.readText('config.json')).toBe('{"model_type":"qwen3"}');
      const st = await src.open('model.q4.safetensors');
      expect(st.size).toBe(1152);
      expect(await st.read(490, 20)).toEqual(weights.subarray(490, 510));
      expect(await src.exists('model.safetensors')).toBe(false); // the download is not part of the q4 entry
      await expect(src.open('lm_head.weight')).rejects.toThrow('lm_head.weight');
      // Another layout version or revision is another entry.
      expect(await quantizedCacheSource(cache, REPO, 'main', 'q4', 2)).toBeNull();
      expect(await quantizedCacheSource(cache, REPO, 'v1.0', 'q4', 1)).toBeNull();

      const listed = await listCachedModels(cache);
      expect(
        listed.map(({ repo, revision, format, complete, bytes: b }) => ({
          repo,
          revision,
          format,
          complete,
          bytes: b,
        })),
      ).toEqual([
        { repo: REPO, revision: 'main', format: 'bf16', complete: true, bytes: 5000 },
        { repo: REPO, revision: 'main', format: 'q4', complete: true, bytes: stored },
      ]);
      expect(listed[1]!.files.map((f) => f.file).sort()).toEqual(NAMES);

      await deleteCachedModel(REPO, 'main', cache, 'bf16');
      expect((await listCachedModels(cache)).map((m) => m.format)).toEqual(['q4']);
      expect(await quantizedCacheSource(cache, REPO, 'main', 'q4', 1)).not.toBeNull();
      await deleteCachedModel(REPO, 'main', cache, 'q4');
      expect(await listCachedModels(cache)).toEqual([]);
    } finally {
      await done();
    }
  });

  it('a write that fails leaves no entry; a rewrite replaces the old one', async () => {
    const cache = memoryHubCache();
    async function* failing(): AsyncIterable<QuantizedFile> {
      yield config;
      yield {
        name: 'model.q4.safetensors',
        bytes: (async function* () {
          yield weights.subarray(0, 500);
          throw new Error('QuotaExceededError: no room');
        })(),
      };
    }
    await expect(writeQuantizedCache(cache, REPO, 'main', 'q4', 1, failing())).rejects.toThrow('no room');
    expect(await cache.entries()).toEqual([]);

    await writeQuantizedCache(cache, REPO, 'main', 'q4', 1, files());
    await writeQuantizedCache(cache, REPO, 'main', 'q4', 1, files().slice(0, 2));
    expect((await (await quantizedCacheSource(cache, REPO, 'main', 'q4', 1))!.list!()).sort()).toEqual([
      'config.json',
      'model.q4.safetensors',
    ]);
    await expect(writeQuantizedCache(cache, REPO, 'main', 'q4', 1, [config, config])).rejects.toThrow('config.json');
    await expect(
      writeQuantizedCache(cache, REPO, 'main', 'q4', 1, [{ name: 'a/b', bytes: new Uint8Array(1) }]),
    ).rejects.toThrow('a/b');
  });

  it('an entry without its manifest, or with a file of the wrong size, is not read', async () => {
    const cache = memoryHubCache();
    await writeQuantizedCache(cache, REPO, 'main', 'q4', 1, files());
    const key = `${REPO}/main+q4/tokenizer.json`;
    const w = await cache.create(key);
    await w.write(bytes(64, 9)); // shorter than the manifest says
    await w.close();
    expect(await quantizedCacheSource(cache, REPO, 'main', 'q4', 1)).toBeNull();

    await cache.delete(`${REPO}/main+q4/.manifest.json`);
    const [entry] = await listCachedModels(cache);
    expect(entry).toMatchObject({ format: 'q4', complete: false });
  });

  it('keys revisions with odd characters apart from the format suffix', async () => {
    const cache = memoryHubCache();
    await putDownload(cache, 'refs/pr/1+x', 'config.json', bytes(10, 0));
    await writeQuantizedCache(cache, REPO, 'refs/pr/1+x', 'q4', 1, files());
    const listed = await listCachedModels(cache);
    expect(listed.map((m) => [m.revision, m.format])).toEqual([
      ['refs/pr/1+x', 'bf16'],
      ['refs/pr/1+x', 'q4'],
    ]);
    await deleteCachedModel(REPO, 'refs/pr/1+x', cache, 'q4');
    expect((await listCachedModels(cache)).map((m) => m.format)).toEqual(['bf16']);
  });
});
