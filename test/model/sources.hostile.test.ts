// Issue 9, rows "sharded index or Hub file name with '..', a leading '/', '\', or a URL", "Hub
// revision given as a branch", and (Node side) "a finished Hub download is never deleted by
// another tab's abort". The browser caches (OPFS, Cache Storage) are covered in e2e/hub.spec.ts.
import { describe, expect, it } from 'vitest';
import { mkdtemp, rm, writeFile, mkdir, readFile, readdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ModelLoadError } from '../../src/model/errors.ts';
import { INDEX_FILE, openSafetensorsModel, writeSafetensors } from '../../src/model/safetensors.ts';
import {
  hubFileUrl,
  hubSource,
  listCachedModels,
  memoryHubCache,
  memorySource,
  resolveHubRevision,
  writeQuantizedCache,
  type HubCache,
} from '../../src/model/sources.ts';
import { nodeFolderHubCache, nodeFolderSource } from '../../src/model/sources.node.ts';
import { HubRevisionMemo, openQuantizedEntry, resolveSource } from '../../src/worker/modelSources.ts';
import { Q4_STORE_VERSION } from '../../src/model/q4Store.ts';

const REPO = 'spyrl-test/tiny';
const OTHER = 'spyrl-test/victim';
const SHA_A = 'a'.repeat(40);
const SHA_B = 'b'.repeat(40);
const shard = writeSafetensors([{ name: 'w', dtype: 'F32', shape: [4], data: new Uint8Array(16).fill(7) }]);
const enc = new TextEncoder();

const HOSTILE = [
  '../x.safetensors',
  'sub/../../x.safetensors',
  '/etc/x.safetensors',
  'sub\\x.safetensors',
  'C:/x.safetensors',
  'https://evil.example/x.safetensors',
  'file:x.safetensors',
  './x.safetensors',
  'a//x.safetensors',
];

/** A fake Hub whose `main` can move: commits map to file sets; every request is recorded. */
function movingHub(commits: Record<string, Map<string, Uint8Array>>, main: { sha: string }) {
  const calls: string[] = [];
  let offline = false;
  const fetchFn = (async (input: RequestInfo | URL) => {
    const url = String(input);
    calls.push(url);
    if (offline) throw new TypeError('fetch failed');
    const api = url.match(/^https:\/\/huggingface\.co\/api\/models\/([^/]+\/[^/]+)\/revision\/(.+)$/);
    if (api) {
      const rev = decodeURIComponent(api[2]!);
      const sha = rev === 'main' ? main.sha : rev;
      const files = api[1] === REPO ? commits[sha] : undefined;
      if (!files) return new Response('{"error":"Revision Not Found"}', { status: 404, statusText: 'Not Found' });
      return Response.json({ sha, siblings: [...files.keys(), '../escape.json'].map((rfilename) => ({ rfilename })) });
    }
    const m = url.match(/^https:\/\/huggingface\.co\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/);
    const body = m && m[1] === REPO ? commits[m[2]!]?.get(decodeURIComponent(m[3]!)) : undefined;
    return body
      ? new Response(body as BodyInit, { headers: { 'content-length': String(body.length) } })
      : new Response('Entry not found', { status: 404 });
  }) as typeof fetch;
  return { fetch: fetchFn, calls, setOffline: (v: boolean) => void (offline = v) };
}

const files = (config: string) =>
  new Map<string, Uint8Array>([
    ['config.json', enc.encode(config)],
    ['model.safetensors', shard],
    ['tokenizer.json', enc.encode('{}')],
  ]);

async function withDir<T>(body: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'hostile-sources-'));
  try {
    return await body(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const message = (p: Promise<unknown>) =>
  p.then(
    () => '(accepted)',
    (e: unknown) => (e as Error).message,
  );

describe('issue 9 row: sharded index or Hub file name with "..", "/", "\\", a drive letter or a URL', () => {
  it('index row: a weight_map shard that leaves the model folder is refused, naming the index and the tensor', async () => {
    for (const bad of HOSTILE) {
      const source = memorySource(
        'm',
        new Map<string, Uint8Array | string>([
          [INDEX_FILE, JSON.stringify({ weight_map: { w: bad } })],
          [bad, shard],
        ]),
      );
      const e = (await openSafetensorsModel(source).catch((x: unknown) => x)) as ModelLoadError;
      expect(e).toBeInstanceOf(ModelLoadError);
      expect(e.file).toBe(INDEX_FILE);
      expect(e.tensor).toBe('w');
      expect(e.message).toContain(
        `weight_map names the shard ${JSON.stringify(bad)}, which is not a file inside the model folder`,
      );
    }
  });

  it('index row: a model folder on disk cannot load a shard from beside it through "../"', async () => {
    await withDir(async (dir) => {
      await mkdir(join(dir, 'model'));
      await writeFile(join(dir, 'outside.safetensors'), shard); // exists: only the path check stops it
      await writeFile(join(dir, 'model', INDEX_FILE), JSON.stringify({ weight_map: { w: '../outside.safetensors' } }));
      const source = nodeFolderSource(join(dir, 'model'));
      expect(await message(openSafetensorsModel(source))).toContain(
        'weight_map names the shard "../outside.safetensors"',
      );
      // The folder source itself refuses such a name too, whoever asks.
      expect(await message(source.open('../outside.safetensors'))).toContain(
        '../outside.safetensors: not a file inside',
      );
      expect(await message(source.readText('/etc/hostname'))).toContain('absolute path');
      expect(await source.exists('../outside.safetensors').catch(() => 'refused')).toBe('refused');
    });
  });

  it('Hub file name row: a hostile file name is refused naming the file, before any request', async () => {
    const hub = movingHub({ [SHA_A]: files('{}') }, { sha: SHA_A });
    const source = hubSource(REPO, { fetch: hub.fetch, cache: memoryHubCache() });
    for (const bad of HOSTILE) {
      const e = (await source.open(bad).catch((x: unknown) => x)) as ModelLoadError;
      expect(e).toBeInstanceOf(ModelLoadError);
      expect(e.file).toBe(bad);
      expect(e.message).toContain(`not a file name inside ${REPO}`);
    }
    expect(hub.calls).toEqual([]);
    // The Hub's own listing of such a name is dropped: it never reaches list() or exists().
    expect(await source.list!()).not.toContain('../escape.json');
  });

  it('Hub file name row: each path segment is URL-encoded, the "/" between folders kept', () => {
    expect(hubFileUrl(REPO, SHA_A, 'sub dir/a#b?c%d.json')).toBe(
      `https://huggingface.co/${REPO}/resolve/${SHA_A}/sub%20dir/a%23b%3Fc%25d.json`,
    );
    expect(hubFileUrl(REPO, 'refs/pr/1', 'config.json')).toBe(
      `https://huggingface.co/${REPO}/resolve/refs%2Fpr%2F1/config.json`,
    );
  });

  it('Hub file name row: repo ids that are not owner/name are refused', async () => {
    for (const bad of ['../..', 'a/b/c', '.x/y', 'x/..', 'x/y..z', 'x', 'a/b\\c']) {
      expect(() => hubSource(bad)).toThrow(/not a Hugging Face repo id/);
      expect(await message(resolveSource({ kind: 'hub', repo: bad }, { demoUrl: 'http://x.invalid/' }))).toMatch(
        /is not a Hugging Face repo id/,
      );
    }
  });

  it("cache key row: a crafted name cannot reach another repo's cache entry (Node folder cache)", async () => {
    await withDir(async (dir) => {
      const cache = nodeFolderHubCache(dir);
      const victim = join(dir, ...OTHER.split('/'), SHA_A, 'config.json');
      await mkdir(join(victim, '..'), { recursive: true });
      await writeFile(victim, '{"victim": true}');
      const hub = movingHub({ [SHA_A]: files('{"evil": true}') }, { sha: SHA_A });
      const evil = hubSource(REPO, { fetch: hub.fetch, cache });
      for (const crafted of [`../victim/${SHA_A}/config.json`, `../../${OTHER}/${SHA_A}/config.json`]) {
        expect(await message(evil.readText(crafted))).toContain('not a file name inside');
      }
      // Nor a cache key built by hand.
      expect(await message(cache.create(`${REPO}/${SHA_A}/../../victim/${SHA_A}/config.json`))).toContain(
        'not a valid cache key',
      );
      expect(await readFile(victim, 'utf8')).toBe('{"victim": true}');
    });
  });
});

describe('issue 9 row: Hub revision given as a branch', () => {
  it('branch row: main is resolved to its commit once per load, files fetched from /resolve/{sha}/ and cached under the sha', async () => {
    const hub = movingHub({ [SHA_A]: files('{"v":"a"}') }, { sha: SHA_A });
    const cache = memoryHubCache();
    const source = hubSource(REPO, { fetch: hub.fetch, cache });
    expect(await source.readText('config.json')).toBe('{"v":"a"}');
    await openSafetensorsModel(source);
    expect(await source.exists('tokenizer.json')).toBe(true);
    expect(hub.calls).toEqual([
      `https://huggingface.co/api/models/${REPO}/revision/main`,
      `https://huggingface.co/${REPO}/resolve/${SHA_A}/config.json`,
      `https://huggingface.co/${REPO}/resolve/${SHA_A}/model.safetensors`,
    ]);
    expect(
      (await cache.entries())
        .map((e) => e.key)
        .filter((k) => !k.includes('+meta/'))
        .sort(),
    ).toEqual([`${REPO}/${SHA_A}/config.json`, `${REPO}/${SHA_A}/model.safetensors`]);
    expect(await listCachedModels(cache)).toMatchObject([{ repo: REPO, revision: SHA_A, branches: ['main'] }]);
  });

  it('branch row: a later load of main that moved refetches; the old commit stays readable by its sha with no request', async () => {
    const main = { sha: SHA_A };
    const hub = movingHub({ [SHA_A]: files('{"v":"a"}'), [SHA_B]: files('{"v":"b"}') }, main);
    const cache = memoryHubCache();
    expect(await hubSource(REPO, { fetch: hub.fetch, cache }).readText('config.json')).toBe('{"v":"a"}');
    main.sha = SHA_B;
    hub.calls.length = 0;
    expect(await hubSource(REPO, { fetch: hub.fetch, cache }).readText('config.json')).toBe('{"v":"b"}');
    expect(hub.calls).toEqual([
      `https://huggingface.co/api/models/${REPO}/revision/main`,
      `https://huggingface.co/${REPO}/resolve/${SHA_B}/config.json`,
    ]);
    hub.calls.length = 0;
    expect(await hubSource(REPO, { revision: SHA_A, fetch: hub.fetch, cache }).readText('config.json')).toBe(
      '{"v":"a"}',
    );
    expect(hub.calls).toEqual([]);
    const listed = await listCachedModels(cache);
    expect(listed.map((m) => [m.revision, m.branches])).toEqual([
      [SHA_A, []],
      [SHA_B, ['main']],
    ]);
  });

  it('branch row: the q4 cache is keyed by the sha too, so a moved main does not get the old q4 weights', async () => {
    const main = { sha: SHA_A };
    const hub = movingHub({ [SHA_A]: files('{"v":"a"}'), [SHA_B]: files('{"v":"b"}') }, main);
    const cache = memoryHubCache();
    const deps = { demoUrl: 'http://x.invalid/', fetch: hub.fetch, hubCache: cache };
    const first = await resolveSource({ kind: 'hub', repo: REPO }, deps);
    expect(first.ref).toEqual({ kind: 'hub', repo: REPO, revision: SHA_A });
    await writeQuantizedCache(cache, REPO, SHA_A, 'q4', Q4_STORE_VERSION, [
      { name: 'config.json', bytes: enc.encode('{"v":"a"}') },
    ]);
    expect(await openQuantizedEntry(first.ref, cache)).not.toBeNull();
    main.sha = SHA_B;
    const second = await resolveSource({ kind: 'hub', repo: REPO }, deps);
    expect(second.ref).toEqual({ kind: 'hub', repo: REPO, revision: SHA_B });
    expect(await openQuantizedEntry(second.ref, cache)).toBeNull();
    expect(await second.source.readText('config.json')).toBe('{"v":"b"}');
  });

  it('branch row: inspect and the load after it ask the Hub once; the next load asks again', async () => {
    const main = { sha: SHA_A };
    const hub = movingHub({ [SHA_A]: files('{}'), [SHA_B]: files('{}') }, main);
    let now = 0;
    const memo = new HubRevisionMemo(60_000, () => now);
    const deps = { demoUrl: 'http://x.invalid/', fetch: hub.fetch, hubCache: memoryHubCache(), hubRevisions: memo };
    const api = () => hub.calls.filter((c) => c.includes('/api/')).length;
    await resolveSource({ kind: 'hub', repo: REPO }, deps); // the config check
    await resolveSource({ kind: 'hub', repo: REPO }, deps); // the load
    expect(api()).toBe(1);
    memo.clear(); // what the engine does once a load has its commit
    main.sha = SHA_B;
    expect((await resolveSource({ kind: 'hub', repo: REPO }, deps)).ref).toMatchObject({ revision: SHA_B });
    expect(api()).toBe(2);
    now += 61_000; // a stale answer is not reused either
    await resolveSource({ kind: 'hub', repo: REPO }, deps);
    expect(api()).toBe(3);
  });

  it('branch row: offline, a cached branch loads its last commit and says so; with nothing cached the error says what failed', async () => {
    const hub = movingHub({ [SHA_A]: files('{"v":"a"}') }, { sha: SHA_A });
    const cache = memoryHubCache();
    const deps = { demoUrl: 'http://x.invalid/', fetch: hub.fetch, hubCache: cache };
    await (await resolveSource({ kind: 'hub', repo: REPO }, deps)).source.readText('config.json');
    hub.setOffline(true);
    const offline = await resolveSource({ kind: 'hub', repo: REPO }, deps);
    expect(offline.ref).toEqual({ kind: 'hub', repo: REPO, revision: SHA_A });
    expect(offline.name).toBe(
      `${REPO} (the Hub could not be reached (https://huggingface.co/api/models/${REPO}/revision/main could not be reached: fetch failed); using commit aaaaaaa, what "main" was on an earlier load here, which may be out of date)`,
    );
    expect(await offline.source.readText('config.json')).toBe('{"v":"a"}');
    expect(await message(resolveSource({ kind: 'hub', repo: REPO, revision: 'dev' }, deps))).toBe(
      `${REPO}: cannot resolve revision "dev" to a commit (https://huggingface.co/api/models/${REPO}/revision/dev could not be reached: fetch failed), and no earlier load of ${REPO}@dev is cached to use offline`,
    );
  });

  it('branch row: a revision the Hub does not have is an error, not a fall back to the cache', async () => {
    const hub = movingHub({ [SHA_A]: files('{}') }, { sha: SHA_A });
    expect(await message(resolveHubRevision(REPO, 'nope', { fetch: hub.fetch, cache: memoryHubCache() }))).toContain(
      'the Hub has no revision "nope" of spyrl-test/tiny that this browser may read (HTTP 404 Not Found',
    );
  });
});

describe("issue 9 row: a finished Hub download is never deleted by another download's abort", () => {
  async function twoWriters(cache: HubCache) {
    const key = `${REPO}/${SHA_A}/model.safetensors`;
    const a = await cache.create(key);
    const b = await cache.create(key);
    await a.write(enc.encode('AAAA'));
    await b.write(enc.encode('BB'));
    await a.close(); // A's download finished
    await b.abort(); // B's failed (a network error, a closed tab)
    return (await cache.get(key))?.text();
  }

  it('abort row: memory cache keeps the finished entry', async () => {
    expect(await twoWriters(memoryHubCache())).toBe('AAAA');
  });

  it('abort row: Node folder cache keeps the finished entry, and the aborted writer leaves no partial file', async () => {
    await withDir(async (dir) => {
      expect(await twoWriters(nodeFolderHubCache(dir))).toBe('AAAA');
      expect(await readdir(join(dir, ...REPO.split('/'), SHA_A))).toEqual(['model.safetensors']);
    });
  });

  it('abort row: a download that fails mid-stream leaves the copy another source finished', async () => {
    await withDir(async (dir) => {
      const hub = movingHub({ [SHA_A]: files('{"v":"a"}') }, { sha: SHA_A });
      let failNext = false;
      const flaky = (async (input: RequestInfo | URL, init?: RequestInit) => {
        const res = await hub.fetch(input, init);
        if (!failNext || !String(input).endsWith('/config.json')) return res;
        // Half the body, then the connection drops.
        const body = new Uint8Array(await res.arrayBuffer());
        const stream = new ReadableStream<Uint8Array>({
          start(c) {
            c.enqueue(body.subarray(0, 3));
            c.error(new TypeError('network connection lost'));
          },
        });
        return new Response(stream, { headers: { 'content-length': String(body.length) } });
      }) as typeof fetch;
      // Both start before either finishes: the failing one is still open when the other commits.
      const ok = hubSource(REPO, { fetch: hub.fetch, cache: nodeFolderHubCache(dir) });
      await ok.resolve();
      failNext = true;
      const failing = hubSource(REPO, { fetch: flaky, cache: nodeFolderHubCache(dir) });
      await failing.resolve();
      const [good, bad] = await Promise.allSettled([ok.readText('config.json'), failing.readText('config.json')]);
      expect(good).toEqual({ status: 'fulfilled', value: '{"v":"a"}' });
      expect(bad.status).toBe('rejected');
      expect(
        await hubSource(REPO, { revision: SHA_A, cache: nodeFolderHubCache(dir), fetch: hub.fetch }).readText(
          'config.json',
        ),
      ).toBe('{"v":"a"}');
    });
  });
});
