import { describe, expect, it } from 'vitest';
import { mkdtemp, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ModelLoadError } from '../../src/model/errors.ts';
import { openSafetensorsModel, writeSafetensors } from '../../src/model/safetensors.ts';
import {
  deleteCachedModel,
  filesSource,
  hubFileUrl,
  hubSource,
  listCachedModels,
  memoryHubCache,
  memorySource,
  type DownloadProgress,
} from '../../src/model/sources.ts';
import { nodeFolderHubCache, nodeFolderSource } from '../../src/model/sources.node.ts';

const REPO = 'Qwen/Qwen3-0.6B';
/** The commit main resolves to on the fake Hub. */
const SHA = 'c0ffee'.padEnd(40, '0');
const weights = writeSafetensors([
  { name: 'w', dtype: 'F32', shape: [4096], data: Uint8Array.from({ length: 16384 }, (_, i) => i % 251) },
]);
const repoFiles = new Map<string, Uint8Array>([
  ['config.json', new TextEncoder().encode('{"model_type":"qwen3"}')],
  ['model.safetensors', weights],
]);

const API_MAIN = `GET https://huggingface.co/api/models/${REPO}/revision/main`;

/** A fake Hub: serves repoFiles at commit SHA in 1000-byte chunks with Content-Length, and the
 *  model-info API (main -> SHA). */
function fakeHub(files = repoFiles) {
  const calls: string[] = [];
  const fetchFn = (async (input: RequestInfo | URL, init?: RequestInit) => {
    const url = String(input);
    calls.push(`${init?.method ?? 'GET'} ${url}`);
    if (
      url === `https://huggingface.co/api/models/${REPO}/revision/main` ||
      url === `https://huggingface.co/api/models/${REPO}/revision/${SHA}`
    ) {
      return Response.json({ sha: SHA, siblings: [...files.keys()].map((rfilename) => ({ rfilename })) });
    }
    const prefix = `https://huggingface.co/${REPO}/resolve/${SHA}/`;
    const bytes = url.startsWith(prefix) ? files.get(url.slice(prefix.length)) : undefined;
    if (!bytes) return new Response('Entry not found', { status: 404, statusText: 'Not Found' });
    let at = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        if (at >= bytes.length) return c.close();
        c.enqueue(bytes.slice(at, at + 1000));
        at += 1000;
      },
    });
    return new Response(body, { headers: { 'content-length': String(bytes.length) } });
  }) as typeof fetch;
  return { fetch: fetchFn, calls };
}

describe('memorySource and filesSource', () => {
  it('serves files by name and says what is missing', async () => {
    const s = memorySource(
      'mem',
      new Map<string, Uint8Array | string>([
        ['a.txt', 'hello'],
        ['b.bin', new Uint8Array([1, 2, 3])],
      ]),
    );
    expect(await s.readText('a.txt')).toBe('hello');
    expect(await (await s.open('b.bin')).read(1, 2)).toEqual(new Uint8Array([2, 3]));
    expect(await s.exists('c')).toBe(false);
    await expect(s.readText('c')).rejects.toThrow(/c: not found in mem/);
  });

  it('matches picked files by relative path below the folder, then by basename', async () => {
    const withPath = (f: File, rel: string) => Object.defineProperty(f, 'webkitRelativePath', { value: rel });
    const s = filesSource([
      withPath(new File(['{"x":1}'], 'config.json'), 'Qwen3-0.6B/config.json'),
      withPath(new File([weights as Uint8Array<ArrayBuffer>], 'model.safetensors'), 'Qwen3-0.6B/model.safetensors'),
      new File(['dropped'], 'notes.txt'),
    ]);
    expect(s.name).toBe('Qwen3-0.6B');
    expect(await s.readText('config.json')).toBe('{"x":1}');
    expect(await s.readText('notes.txt')).toBe('dropped');
    expect(await s.exists('tokenizer.json')).toBe(false);
    const model = await openSafetensorsModel(s);
    expect((await model.readTensor('w')).byteLength).toBe(16384);
    await expect(s.open('tokenizer.json')).rejects.toBeInstanceOf(ModelLoadError);
  });
});

describe('hubSource', () => {
  it('reports monotone progress reaching the total, then reads from the cache', async () => {
    const hub = fakeHub();
    const cache = memoryHubCache();
    const events: DownloadProgress[] = [];
    const source = hubSource(REPO, {
      fetch: hub.fetch,
      cache,
      onProgress: (p) => events.push(p),
      progressIntervalMs: 0,
    });
    const bytes = await source.open('model.safetensors');
    expect(bytes.size).toBe(weights.length);
    expect(await bytes.read(100, 50)).toEqual(weights.subarray(100, 150));

    const mine = events.filter((e) => e.file === 'model.safetensors');
    expect(mine.length).toBeGreaterThan(10);
    for (let i = 1; i < mine.length; i++) expect(mine[i]!.loaded).toBeGreaterThanOrEqual(mine[i - 1]!.loaded);
    expect(mine.at(-1)).toMatchObject({ loaded: weights.length, total: weights.length, etaSeconds: 0 });
    expect(mine.every((e) => e.total === weights.length && e.bytesPerSecond >= 0)).toBe(true);
    expect(hub.calls).toEqual([API_MAIN, `GET ${hubFileUrl(REPO, SHA, 'model.safetensors')}`]);
  });

  it('loads a whole model the second time with one request (main -> commit) and no download', async () => {
    const hub = fakeHub();
    const cache = memoryHubCache();
    const load = async () => {
      const source = hubSource(REPO, { fetch: hub.fetch, cache });
      const model = await openSafetensorsModel(source);
      return { config: await source.readText('config.json'), w: await model.readTensor('w') };
    };
    const first = await load();
    const fetchesFirst = hub.calls.length;
    expect(fetchesFirst).toBeGreaterThan(0);
    const second = await load();
    expect(hub.calls.slice(fetchesFirst)).toEqual([API_MAIN]);
    expect(second).toEqual(first);
    expect(second.w).toEqual(weights.subarray(weights.length - 16384));
  });

  it('names the URL and file on HTTP 404', async () => {
    const source = hubSource(REPO, { fetch: fakeHub().fetch, cache: memoryHubCache() });
    const e = (await source.open('missing.safetensors').catch((x: unknown) => x)) as ModelLoadError;
    expect(e).toBeInstanceOf(ModelLoadError);
    expect(e.file).toBe('missing.safetensors');
    expect(e.message).toContain(
      `HTTP 404 Not Found fetching https://huggingface.co/${REPO}/resolve/${SHA}/missing.safetensors`,
    );
    expect(await source.exists('missing.safetensors')).toBe(false);
    expect(await source.exists('config.json')).toBe(true);
  });

  it('fails a download that ends early and caches nothing', async () => {
    const short = fakeHub();
    const cache = memoryHubCache();
    const lying = (async (input: RequestInfo | URL) => {
      const res = await short.fetch(input);
      return new Response(res.body, { headers: { 'content-length': String(weights.length + 10) } });
    }) as typeof fetch;
    await expect(hubSource(REPO, { fetch: lying, cache }).open('model.safetensors')).rejects.toThrow(
      /ended at \d+ of \d+ bytes/,
    );
    expect((await cache.entries()).filter((e) => e.key.includes('model.safetensors'))).toEqual([]);
    expect(await listCachedModels(cache)).toEqual([]);
  });

  it('lists cached models with sizes and deletes one', async () => {
    const cache = memoryHubCache();
    const source = hubSource(REPO, { fetch: fakeHub().fetch, cache });
    await source.readText('config.json');
    await source.open('model.safetensors');
    const models = await listCachedModels(cache);
    expect(models).toHaveLength(1);
    expect(models[0]).toMatchObject({ repo: REPO, revision: SHA, branches: ['main'], bytes: weights.length + 22 });
    expect(models[0]!.files.map((f) => f.file).sort()).toEqual(['config.json', 'model.safetensors']);
    await deleteCachedModel(REPO, SHA, cache);
    expect(await listCachedModels(cache)).toEqual([]);
    // Nothing of the commit is left, its branch pointer included.
    expect(await cache.entries()).toEqual([]);
  });

  it('can cache into a Node folder', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'hub-'));
    try {
      const hub = fakeHub();
      const first = hubSource(REPO, { fetch: hub.fetch, cache: nodeFolderHubCache(dir) });
      await first.open('model.safetensors');
      const n = hub.calls.length;
      const again = hubSource(REPO, { fetch: hub.fetch, cache: nodeFolderHubCache(dir) });
      expect(await (await again.open('model.safetensors')).read(8, 4)).toEqual(weights.subarray(8, 12));
      expect(hub.calls.slice(n)).toEqual([API_MAIN]);
      expect((await listCachedModels(nodeFolderHubCache(dir)))[0]!.bytes).toBe(weights.length);
    } finally {
      await rm(dir, { recursive: true });
    }
  });
});

describe('nodeFolderSource', () => {
  it('lists, reads and reports missing files', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'folder-'));
    try {
      await mkdir(join(dir, 'sub'));
      await writeFile(join(dir, 'config.json'), '{}');
      await writeFile(join(dir, 'sub', 'x.bin'), new Uint8Array([9, 8, 7]));
      const s = nodeFolderSource(dir);
      expect(await s.list!()).toEqual(['config.json', 'sub/x.bin']);
      expect(await (await s.open('sub/x.bin')).read(1, 2)).toEqual(new Uint8Array([8, 7]));
      expect(await s.exists('nope')).toBe(false);
      await expect(s.readText('nope.json')).rejects.toThrow(/nope\.json: not found in/);
      await expect((await s.open('sub/x.bin')).read(2, 5)).rejects.toThrow(/past the end/);
    } finally {
      await rm(dir, { recursive: true });
    }
  });
});
