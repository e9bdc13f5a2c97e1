// The pieces under `--model OWNER/NAME`, without a GPU: the Hugging Face cache adapter
// (src/cli/hfCache.ts), the Hub fetch (src/cli/hubFetch.ts) and the progress lines.
import { lstat, mkdtemp, readdir, readFile, readlink, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hfHubCache, hfHubCacheDir, hfOffline, hfToken, normalizeEtag } from '../../src/cli/hfCache.ts';
import { hubFetch, progressPrinter } from '../../src/cli/hubFetch.ts';
import { hubSource } from '../../src/model/sources.ts';
import { gitBlobSha1, sha256, startLoopbackHub, type LoopbackHub } from '../helpers/hubServer.ts';

const SHA = 'abcdef01'.repeat(5);
const enc = (s: string) => new TextEncoder().encode(s);
const weights = new Uint8Array(5000).map((_, i) => (i * 7) % 251);
let tmp: string, hub: LoopbackHub;

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-hfcache-'));
  const files = new Map([
    ['config.json', enc('{"a": 1}')],
    ['sub/dir/notes.txt', enc('nested')],
    ['model.safetensors', weights],
  ]);
  hub = await startLoopbackHub({ 'org/repo': { refs: { main: SHA, 'v1.0': SHA }, commits: { [SHA]: files } } });
});
afterAll(async () => {
  await hub.close();
  await rm(tmp, { recursive: true, force: true });
});

describe('hfHubCache', () => {
  it('lays out blobs by ETag, nested snapshot files as relative links, refs per revision', async () => {
    const root = join(tmp, 'a');
    const net = hubFetch({ endpoint: hub.endpoint, token: 'tok' });
    const src = hubSource('org/repo', { revision: 'v1.0', fetch: net.fetch, cache: hfHubCache(root, net) });
    expect(await src.readText('sub/dir/notes.txt')).toBe('nested');
    expect(new Uint8Array(await (await src.open('model.safetensors')).read(0, 5000))).toEqual(weights);
    const repo = join(root, 'models--org--repo');
    expect(await readFile(join(repo, 'refs', 'v1.0'), 'utf8')).toBe(SHA);
    expect(await readlink(join(repo, 'snapshots', SHA, 'sub/dir/notes.txt'))).toBe(
      `../../../../blobs/${gitBlobSha1(enc('nested'))}`,
    );
    expect(await readlink(join(repo, 'snapshots', SHA, 'model.safetensors'))).toBe(`../../blobs/${sha256(weights)}`);
    expect((await readdir(join(repo, 'blobs'))).sort()).toEqual(
      [gitBlobSha1(enc('nested')), sha256(weights)].sort(), // config.json was never read
    );
  });

  it('refuses an LFS download whose bytes do not match its sha256 ETag, leaving nothing behind', async () => {
    const root = join(tmp, 'b');
    const cache = hfHubCache(root, { etagFor: () => `"${'0'.repeat(64)}"` });
    const w = await cache.create(`org/repo/${SHA}/model.safetensors`);
    await w.write(weights);
    await expect(w.close()).rejects.toThrow(
      `model.safetensors: downloaded bytes have sha256 ${sha256(weights)}, the Hub's ETag says ${'0'.repeat(64)}`,
    );
    expect(await readdir(join(root, 'models--org--repo', 'blobs'))).toEqual([]);
    expect(await lstat(join(root, 'models--org--repo', 'snapshots')).catch(() => null)).toBeNull();
  });

  it('an aborted download leaves no file; a blob already there is kept and linked again', async () => {
    const root = join(tmp, 'c');
    const cache = hfHubCache(root);
    const w = await cache.create(`org/repo/${SHA}/x.bin`);
    await w.write(enc('part'));
    await w.abort();
    expect(await readdir(join(root, 'models--org--repo', 'blobs'))).toEqual([]);
    for (const file of ['x.bin', 'y.bin']) {
      const w2 = await cache.create(`org/repo/${SHA}/${file}`);
      await w2.write(enc('same bytes'));
      await w2.close();
    }
    expect(await readdir(join(root, 'models--org--repo', 'blobs'))).toEqual([sha256(enc('same bytes'))]);
    expect(await (await cache.get(`org/repo/${SHA}/y.bin`))!.text()).toBe('same bytes');
    expect((await cache.entries()).map((e) => e.key).sort()).toEqual([
      `org/repo/${SHA}/x.bin`,
      `org/repo/${SHA}/y.bin`,
    ]);
  });

  it('reads the environment as huggingface_hub does', async () => {
    expect(hfHubCacheDir({ HF_HUB_CACHE: '/c', HF_HOME: '/h' })).toBe('/c');
    expect(hfHubCacheDir({ HF_HOME: '/h', XDG_CACHE_HOME: '/x' })).toBe('/h/hub');
    expect(hfHubCacheDir({ XDG_CACHE_HOME: '/x' })).toBe('/x/huggingface/hub');
    expect(['1', 'true', 'YES', 'on'].map((v) => hfOffline({ HF_HUB_OFFLINE: v }))).toEqual([true, true, true, true]);
    expect(['0', '', 'no'].map((v) => hfOffline({ HF_HUB_OFFLINE: v }))).toEqual([false, false, false]);
    expect(await hfToken({ HF_TOKEN: 'hf_x', HF_HOME: '/nonexistent' })).toBe('hf_x');
    expect(await hfToken({ HF_HOME: '/nonexistent' })).toBeUndefined();
    expect(normalizeEtag('W/"abc"')).toBe('abc');
    expect(normalizeEtag('"../evil"')).toBeNull(); // never a path
  });
});

describe('hubFetch', () => {
  it('sends the token to the Hub host only and follows the CDN redirect itself; offline sends nothing', async () => {
    hub.requests.length = 0;
    const net = hubFetch({ endpoint: hub.endpoint, token: 'hf_tok' });
    const res = await net.fetch(`https://huggingface.co/org/repo/resolve/${SHA}/model.safetensors`);
    expect(new Uint8Array(await res.arrayBuffer())).toEqual(weights);
    expect(hub.requests.map((r) => [r.host, r.auth])).toEqual([
      ['hub', 'Bearer hf_tok'],
      ['cdn', undefined],
    ]);
    expect(net.etagFor(`org/repo/${SHA}/model.safetensors`)).toBe(sha256(weights)); // X-Linked-Etag, not the CDN's
    hub.requests.length = 0;
    const off = hubFetch({ endpoint: hub.endpoint, offline: true });
    await expect(off.fetch(`https://huggingface.co/api/models/org/repo/revision/main`)).rejects.toThrow(
      /HF_HUB_OFFLINE is set/,
    );
    expect(hub.requests).toEqual([]);
  });
});

describe('progressPrinter', () => {
  const sink = (isTTY: boolean) => {
    const out: string[] = [];
    return { isTTY, out, write: (s: string) => out.push(s) > 0 } as unknown as NodeJS.WritableStream & {
      isTTY: boolean;
      out: string[];
    };
  };
  const events = [0, 1e6, 2e6].map((loaded) => ({
    file: 'model.safetensors',
    loaded,
    total: 2e6,
    bytesPerSecond: 1e6,
    etaSeconds: (2e6 - loaded) / 1e6,
  }));

  it('a pipe gets a line when a file is done (and every few seconds before); a terminal one line updated in place', () => {
    const pipe = sink(false);
    const onPipe = progressPrinter(pipe, 'org/repo@abcdef0');
    events.forEach(onPipe);
    expect(pipe.out).toEqual(['spyrl: downloaded org/repo@abcdef0 model.safetensors: 2.0 MB of 2.0 MB (100%)\n']);
    const slow = sink(false);
    const onSlow = progressPrinter(slow, 'r', { everyMs: 0 });
    events.forEach(onSlow);
    expect(slow.out.length).toBe(3);
    const twice = sink(false);
    const onTwice = progressPrinter(twice, 'r');
    [...events, events[2]!].forEach(onTwice); // the last chunk, then the finished file
    expect(twice.out.length).toBe(1);
    const tty = sink(true);
    const onTty = progressPrinter(tty, 'r');
    events.forEach(onTty);
    expect(tty.out.every((l) => l.startsWith('\r\x1b[K'))).toBe(true);
    expect(tty.out[1]).toBe(
      '\r\x1b[Kspyrl: downloading r model.safetensors: 1.0 MB of 2.0 MB (50%), 1.0 MB/s, 1 s left',
    );
    expect(tty.out.at(-1)!.endsWith('\n')).toBe(true);
  });
});
