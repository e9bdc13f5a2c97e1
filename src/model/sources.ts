// Where a checkpoint comes from: in-memory files, a browser folder pick, or the Hugging Face Hub
// (with a persistent browser cache). Node folders live in sources.node.ts so this file stays DOM/Node neutral.
import { ModelLoadError } from './errors.ts';
import { checkRelativePath, encodePathSegments, unsafePathReason } from './paths.ts';
import { blobSource, bytesSource, type ByteSource } from './safetensors.ts';

export interface ModelSource {
  name: string;
  /** Every file name the source holds, relative to the model root (e.g. "config.json"). */
  list?(): Promise<string[]>;
  open(file: string): Promise<ByteSource>;
  readText(file: string): Promise<string>;
  exists(file: string): Promise<boolean>;
}

/** Reads and parses a JSON file, naming the file on failure. */
export async function readJson(source: Pick<ModelSource, 'readText'>, file: string): Promise<unknown> {
  const text = await source.readText(file);
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ModelLoadError(file, `not valid JSON (${(e as Error).message})`);
  }
}

function notFound(source: string, file: string): ModelLoadError {
  return new ModelLoadError(file, `not found in ${source}`);
}

/** Files held in memory (tests, the tiny generated checkpoint). */
export function memorySource(name: string, files: ReadonlyMap<string, Uint8Array | string>): ModelSource {
  const bytes = (file: string): Uint8Array => {
    const f = files.get(file);
    if (f === undefined) throw notFound(name, file);
    return typeof f === 'string' ? new TextEncoder().encode(f) : f;
  };
  return {
    name,
    list: async () => [...files.keys()],
    open: async (file) => bytesSource(file, bytes(file)),
    readText: async (file) => {
      const f = files.get(file);
      return typeof f === 'string' ? f : new TextDecoder().decode(bytes(file));
    },
    exists: async (file) => files.has(file),
  };
}

/** A browser folder pick (`<input webkitdirectory>`) or drag-and-drop: files matched by path below the picked folder, then by basename. */
export function filesSource(files: Iterable<File>, name?: string): ModelSource {
  const byPath = new Map<string, File>();
  const byBase = new Map<string, File>();
  let folder: string | undefined;
  for (const f of files) {
    const rel = f.webkitRelativePath || f.name;
    const parts = rel.split('/');
    if (parts.length > 1) folder ??= parts[0];
    byPath.set(parts.length > 1 ? parts.slice(1).join('/') : rel, f);
    if (!byBase.has(f.name)) byBase.set(f.name, f);
  }
  const sourceName = name ?? folder ?? 'selected files';
  const find = (file: string): File | undefined => byPath.get(file) ?? byBase.get(file.split('/').at(-1)!);
  const get = (file: string): File => {
    const f = find(file);
    if (!f) throw notFound(sourceName, file);
    return f;
  };
  return {
    name: sourceName,
    list: async () => [...byPath.keys()],
    open: async (file) => blobSource(get(file), file),
    readText: async (file) => get(file).text(),
    exists: async (file) => find(file) !== undefined,
  };
}

/**
 * Files served over HTTP under one base URL with a known file list (the bundled demo model):
 * each file is fetched once, whole, when first opened.
 */
export function urlSource(
  name: string,
  baseUrl: string,
  files: readonly string[],
  opts: { fetch?: typeof fetch } = {},
): ModelSource {
  const doFetch = opts.fetch ?? ((input, init) => fetch(input, init));
  const known = new Set(files);
  const blobs = new Map<string, Promise<Blob>>();
  const get = (file: string): Promise<Blob> => {
    if (!known.has(file)) return Promise.reject(notFound(name, file));
    const unsafe = unsafePathReason(file);
    if (unsafe) return Promise.reject(new ModelLoadError(file, `not a file below ${baseUrl}: ${unsafe}`));
    let p = blobs.get(file);
    if (!p) {
      const url = new URL(encodePathSegments(file), baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`).href;
      p = doFetch(url).then(
        async (res) => {
          if (!res.ok) throw new ModelLoadError(file, `HTTP ${res.status} fetching ${url}`);
          return res.blob();
        },
        (e: unknown) => {
          throw new ModelLoadError(file, `fetching ${url} failed: ${(e as Error).message}`);
        },
      );
      p.catch(() => blobs.delete(file));
      blobs.set(file, p);
    }
    return p;
  };
  return {
    name,
    list: async () => [...files],
    open: async (file) => blobSource(await get(file), file),
    readText: async (file) => (await get(file)).text(),
    exists: async (file) => known.has(file),
  };
}

// ---------------------------------------------------------------------------------------------
// Hugging Face Hub with a persistent cache.

export interface DownloadProgress {
  file: string;
  loaded: number;
  /** From Content-Length; 0 when the server did not say. */
  total: number;
  bytesPerSecond: number;
  /** Seconds left at the current rate; NaN when unknown. */
  etaSeconds: number;
}

export interface CacheWriter {
  write(chunk: Uint8Array): Promise<void>;
  /** Commits the entry; until then `get` does not return it. */
  close(): Promise<void>;
  /** Drops what this writer wrote. Never touches a committed entry (another tab's finished
   *  download of the same key included): every cache writes beside the key and commits in one step. */
  abort(): Promise<void>;
}

/** Persistent store of downloaded files, one entry per key `${repo}/${sha}/${file}`, of quantized
 *  weights under `${repo}/${sha}+q4/${file}`, and of small facts about a revision under
 *  `${repo}/${revision}+meta/` (cacheKey, metaKey). */
export interface HubCache {
  kind: string;
  get(key: string): Promise<Blob | null>;
  create(key: string): Promise<CacheWriter>;
  entries(): Promise<{ key: string; size: number }[]>;
  delete(key: string): Promise<void>;
}

export function memoryHubCache(): HubCache {
  const store = new Map<string, Blob>();
  return {
    kind: 'memory',
    get: async (key) => store.get(key) ?? null,
    async create(key) {
      const chunks: Uint8Array[] = [];
      return {
        write: async (chunk) => void chunks.push(chunk.slice()),
        close: async () => void store.set(key, new Blob(chunks as BlobPart[])),
        abort: async () => void (chunks.length = 0),
      };
    },
    entries: async () => [...store].map(([key, blob]) => ({ key, size: blob.size })),
    delete: async (key) => void store.delete(key),
  };
}

const OPFS_DIR = 'spyrl-hub';
/** Marks a writer's temporary file. encodeURIComponent always encodes '#', so no key's file name has it. */
const OPFS_TEMP = '#part-';

function randomHex(bytes: number): string {
  return [...crypto.getRandomValues(new Uint8Array(bytes))].map((b) => b.toString(16).padStart(2, '0')).join('');
}

/** Origin Private File System: one file per key (key URI-encoded since names cannot hold '/').
 *  Each writer writes its own temporary file and moves it over the key on close. */
export function opfsHubCache(): HubCache {
  const dir = async () => (await navigator.storage.getDirectory()).getDirectoryHandle(OPFS_DIR, { create: true });
  return {
    kind: 'opfs',
    async get(key) {
      try {
        const file = await (await (await dir()).getFileHandle(encodeURIComponent(key))).getFile();
        // An entry being written (by another tab or source) is empty until its writable closes.
        return file.size > 0 ? file : null;
      } catch {
        return null;
      }
    },
    async create(key) {
      const d = await dir();
      const name = encodeURIComponent(key);
      // Not the key's own file: an abort that removed it could delete a download another tab
      // finished meanwhile. The temporary file is this writer's alone.
      const temp = `${name}${OPFS_TEMP}${randomHex(8)}`;
      const handle = await d.getFileHandle(temp, { create: true });
      const writable = await handle.createWritable();
      return {
        write: (chunk) => writable.write(chunk as Uint8Array<ArrayBuffer>),
        async close() {
          await writable.close();
          const movable = handle as FileSystemFileHandle & { move(name: string): Promise<void> };
          // move() replaces an existing entry in one step in Chromium (a reader sees the old file
          // or the new one). Where it refuses to overwrite, the old copy of the same file goes first.
          await movable.move(name).catch(async () => {
            await d.removeEntry(name).catch(() => undefined);
            await movable.move(name);
          });
        },
        async abort() {
          await writable.abort().catch(() => undefined);
          await d.removeEntry(temp).catch(() => undefined);
        },
      };
    },
    async entries() {
      const out: { key: string; size: number }[] = [];
      const d = await dir();
      for await (const [name, handle] of (
        d as unknown as { entries(): AsyncIterable<[string, FileSystemHandle]> }
      ).entries()) {
        if (handle.kind !== 'file' || name.includes(OPFS_TEMP)) continue;
        const size = (await (handle as FileSystemFileHandle).getFile()).size;
        if (size > 0) out.push({ key: decodeURIComponent(name), size });
      }
      return out;
    },
    async delete(key) {
      await (await dir()).removeEntry(encodeURIComponent(key)).catch(() => undefined);
    },
  };
}

const CACHE_NAME = 'spyrl-hub';
const CACHE_URL = 'https://spyrl-hub.invalid/';

/** Cache Storage fallback (browsers without OPFS writables): the body streams into `cache.put`,
 *  which stores the response only once its body has ended, so an aborted put leaves the key as it
 *  was (a finished download of it by another tab included). */
export function cacheStorageHubCache(): HubCache {
  const url = (key: string) => CACHE_URL + key.split('/').map(encodeURIComponent).join('/');
  return {
    kind: 'cache-storage',
    async get(key) {
      const res = await (await caches.open(CACHE_NAME)).match(url(key));
      return res ? res.blob() : null;
    },
    async create(key) {
      const cache = await caches.open(CACHE_NAME);
      // An identity TransformStream gives backpressure: write() waits while cache.put lags behind.
      const pipe = new TransformStream<Uint8Array<ArrayBuffer>, Uint8Array<ArrayBuffer>>();
      const writer = pipe.writable.getWriter();
      const put = cache.put(url(key), new Response(pipe.readable));
      put.catch(() => undefined); // surfaced by close()
      return {
        write: (chunk) => writer.write(chunk as Uint8Array<ArrayBuffer>),
        close: async () => {
          await writer.close();
          await put;
        },
        abort: async () => {
          // No cache.delete here: the key may hold another tab's finished download.
          await writer.abort(new Error('download aborted')).catch(() => undefined);
          await put.catch(() => undefined);
        },
      };
    },
    async entries() {
      const cache = await caches.open(CACHE_NAME);
      const out: { key: string; size: number }[] = [];
      for (const req of await cache.keys()) {
        const res = await cache.match(req);
        if (!res) continue;
        const key = req.url.slice(CACHE_URL.length).split('/').map(decodeURIComponent).join('/');
        out.push({ key, size: (await res.blob()).size });
      }
      return out;
    },
    async delete(key) {
      await (await caches.open(CACHE_NAME)).delete(url(key));
    },
  };
}

/** OPFS when it can write and move files, else Cache Storage, else memory (Node: not persistent). */
export function defaultHubCache(): HubCache {
  const g = globalThis as {
    navigator?: Navigator;
    caches?: CacheStorage;
    FileSystemFileHandle?: { prototype: object };
  };
  const handle = g.FileSystemFileHandle?.prototype;
  if (
    typeof g.navigator?.storage?.getDirectory === 'function' &&
    handle &&
    'createWritable' in handle &&
    'move' in handle
  ) {
    return opfsHubCache();
  }
  if (g.caches) return cacheStorageHubCache();
  return memoryHubCache();
}

export const DEFAULT_HUB_REPO = 'Qwen/Qwen3-4B-Instruct-2507';
const HUB = 'https://huggingface.co';
/** Legacy cache entry (before revisions were resolved) holding a revision's file list. */
const LEGACY_LISTING = '.listing.json';
/** Under `${repo}/${sha}+meta/`: the repo's file list at that commit. */
const META_LISTING = 'listing.json';
/** Under `${repo}/${branch}+meta/`: the commit the branch last resolved to here. */
const META_SHA = 'sha';

const COMMIT_SHA = /^[0-9a-f]{40}$/;

/** A full commit sha: a revision that names one commit forever, so it needs no resolving. */
export function isCommitSha(revision: string): boolean {
  return COMMIT_SHA.test(revision);
}

/** Why `repo` is not a Hub repo id (owner/name), or null. Each part: letters, digits, '-', '_',
 *  '.', starting and ending with a letter or digit, no '..' (so no part can be '.' or '..'). */
export function invalidRepoIdReason(repo: string): string | null {
  const parts = repo.split('/');
  if (parts.length !== 2) return 'a Hub repo id is owner/name';
  for (const p of parts) {
    if (!/^[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?$/.test(p))
      return `"${p}" is not a valid owner or name (letters, digits, '-', '_', '.'; at most 96)`;
    if (p.includes('..')) return `"${p}" holds ".."`;
  }
  return null;
}

export function checkRepoId(repo: string): string {
  const why = invalidRepoIdReason(repo);
  if (why) throw new ModelLoadError(repo, `not a Hugging Face repo id: ${why}`);
  return repo;
}

export interface HubSourceOptions {
  /** A branch, tag or commit sha (default main). A branch or tag is resolved to its commit once. */
  revision?: string;
  /** The revision already resolved (resolveHubRevision), e.g. by the config check before a load. */
  resolved?: HubRevision;
  fetch?: typeof fetch;
  cache?: HubCache;
  onProgress?: (p: DownloadProgress) => void;
  /** Minimum milliseconds between progress events for one file (first and last are always sent). */
  progressIntervalMs?: number;
}

/** `${HUB}/{repo}/resolve/{revision}/{file}`, the revision and each segment of the file encoded. */
export function hubFileUrl(repo: string, revision: string, file: string): string {
  return `${HUB}/${repo}/resolve/${encodeURIComponent(revision)}/${encodePathSegments(file)}`;
}

/** The model-info API for one revision: its commit `sha` and `siblings` (the file list). */
export function hubRevisionUrl(repo: string, revision: string): string {
  return `${HUB}/api/models/${repo}/revision/${encodeURIComponent(revision)}`;
}

/** What a cache entry holds: the repo's files as downloaded (bf16 weights), or the weights
 *  quantized on a first load (q4) with the small files a load needs. */
export type CacheFormat = 'bf16' | 'q4';

/** A Hub file name checked before it becomes a URL or a cache key: nothing that leaves the repo
 *  ("..", a leading "/", "\", "C:", "https:"). */
function checkHubFile(repo: string, file: string): string {
  return checkRelativePath(file, (why) => new ModelLoadError(file, `not a file name inside ${repo}: ${why}`));
}

/**
 * `${repo}/${revision}/${file}`, or `${repo}/${revision}+q4/${file}`: '+' cannot come from the
 * URI-encoded revision, so the formats never share a prefix. The repo id is two checked parts
 * and the file a checked relative path, so one repo's keys can never name another's entry.
 */
function cacheKey(repo: string, revision: string, file: string, format: CacheFormat = 'bf16'): string {
  if (file !== '') checkHubFile(repo, file);
  return `${checkRepoId(repo)}/${encodeURIComponent(revision)}${format === 'bf16' ? '' : `+${format}`}/${file}`;
}

/** `${repo}/${revision}+meta/${name}`: what we know about a revision (its commit, its file list). */
function metaKey(repo: string, revision: string, name: string): string {
  return `${checkRepoId(repo)}/${encodeURIComponent(revision)}+meta/${name}`;
}

/** A revision of a Hub repo pinned to its commit. */
export interface HubRevision {
  repo: string;
  /** As asked: a branch, a tag or a commit sha. */
  revision: string;
  /** The commit it names; files are fetched from and cached under this. */
  sha: string;
  /** The repo's files at that commit; null when unknown (offline, never listed here). */
  files: string[] | null;
  /** Set when the Hub could not be asked and the commit is the one this revision resolved to
   *  on an earlier load: says so, for the user. */
  offline?: string;
}

async function readCachedText(cache: HubCache, key: string): Promise<string | null> {
  const blob = await cache.get(key).catch(() => null);
  return blob ? blob.text() : null;
}

async function writeCachedText(cache: HubCache, key: string, text: string): Promise<void> {
  const w = await cache.create(key);
  try {
    await w.write(new TextEncoder().encode(text));
    await w.close();
  } catch (e) {
    await w.abort().catch(() => undefined);
    throw e;
  }
}

async function cachedListing(cache: HubCache, repo: string, sha: string): Promise<string[] | null> {
  const text =
    (await readCachedText(cache, metaKey(repo, sha, META_LISTING))) ??
    (await readCachedText(cache, cacheKey(repo, sha, LEGACY_LISTING)));
  if (text === null) return null;
  try {
    const files = JSON.parse(text) as unknown;
    return Array.isArray(files)
      ? files.filter((f): f is string => typeof f === 'string' && !unsafePathReason(f))
      : null;
  } catch {
    return null;
  }
}

/**
 * Pins a revision to its commit: one request to the model-info API, which also lists the files.
 * A commit sha whose file list is cached needs no request. When the Hub cannot be reached (or
 * answers with a server error), a branch falls back to the commit it resolved to on an earlier
 * load here, and `offline` says so; with no such commit the error says what failed.
 */
export async function resolveHubRevision(
  repo: string,
  revision: string,
  opts: { fetch?: typeof fetch; cache?: HubCache } = {},
): Promise<HubRevision> {
  checkRepoId(repo);
  const cache = opts.cache ?? defaultHubCache();
  const doFetch = opts.fetch ?? ((input, init) => fetch(input, init));
  if (isCommitSha(revision)) {
    const files = await cachedListing(cache, repo, revision);
    if (files) return { repo, revision, sha: revision, files };
  }
  const url = hubRevisionUrl(repo, revision);
  let failure: string;
  try {
    const res = await doFetch(url);
    if (res.ok) return await pinned(res, url);
    const status = `HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
    if (res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429) {
      throw new ModelLoadError(
        repo,
        `the Hub has no revision "${revision}" of ${repo} that this browser may read (${status} from ${url}; a private or gated repo answers this way too)`,
      );
    }
    failure = `${status} from ${url}`;
  } catch (e) {
    if (e instanceof ModelLoadError) throw e;
    failure = `${url} could not be reached: ${(e as Error).message}`;
  }
  if (isCommitSha(revision)) return { repo, revision, sha: revision, files: null };
  const sha = (await readCachedText(cache, metaKey(repo, revision, META_SHA)))?.trim() ?? '';
  if (!isCommitSha(sha)) {
    throw new ModelLoadError(
      repo,
      `cannot resolve revision "${revision}" to a commit (${failure}), and no earlier load of ${repo}@${revision} is cached to use offline`,
    );
  }
  return {
    repo,
    revision,
    sha,
    files: await cachedListing(cache, repo, sha),
    offline: `the Hub could not be reached (${failure}); using commit ${sha.slice(0, 7)}, what "${revision}" was on an earlier load here, which may be out of date`,
  };

  async function pinned(res: Response, url: string): Promise<HubRevision> {
    let info: { sha?: unknown; siblings?: { rfilename?: unknown }[] };
    try {
      info = (await res.json()) as typeof info;
    } catch (e) {
      throw new ModelLoadError(repo, `the Hub's answer from ${url} is not JSON (${(e as Error).message})`);
    }
    const sha = info.sha;
    if (typeof sha !== 'string' || !isCommitSha(sha))
      throw new ModelLoadError(repo, `the Hub's answer from ${url} has no commit sha`);
    if (isCommitSha(revision) && sha !== revision)
      throw new ModelLoadError(repo, `asked the Hub for commit ${revision} and it answered with ${sha}`);
    // A name that could leave the repo is dropped here and refused if a load asks for it.
    const files = (Array.isArray(info.siblings) ? info.siblings : [])
      .map((s) => s?.rfilename)
      .filter((f): f is string => typeof f === 'string' && !unsafePathReason(f));
    // Best effort: without these a later load only asks the Hub again (or cannot go offline).
    await writeCachedText(cache, metaKey(repo, sha, META_LISTING), JSON.stringify(files)).catch(() => undefined);
    if (!isCommitSha(revision))
      await writeCachedText(cache, metaKey(repo, revision, META_SHA), sha).catch(() => undefined);
    return { repo, revision, sha, files };
  }
}

export interface HubModelSource extends ModelSource {
  repo: string;
  /** As asked (a branch, tag or sha); `resolve()` gives the commit. */
  revision: string;
  cache: HubCache;
  /** The commit this source reads (resolved once, on first use). */
  resolve(): Promise<HubRevision>;
}

/**
 * A Hub repo at one commit, files downloaded on first use into the cache under that commit's
 * sha: a branch that moves on the Hub is a different entry, and two commits never mix.
 */
export function hubSource(repo: string = DEFAULT_HUB_REPO, opts: HubSourceOptions = {}): HubModelSource {
  checkRepoId(repo);
  const revision = opts.resolved?.revision ?? opts.revision ?? 'main';
  const cache = opts.cache ?? defaultHubCache();
  const doFetch = opts.fetch ?? ((input, init) => fetch(input, init));
  const interval = opts.progressIntervalMs ?? 100;
  const inflight = new Map<string, Promise<Blob>>();
  let pinned: Promise<HubRevision> | undefined = opts.resolved ? Promise.resolve(opts.resolved) : undefined;

  const resolve = (): Promise<HubRevision> => {
    if (!pinned) {
      const p = resolveHubRevision(repo, revision, { fetch: doFetch, cache });
      pinned = p;
      p.catch(() => {
        if (pinned === p) pinned = undefined;
      });
    }
    return pinned;
  };

  async function download(sha: string, file: string): Promise<Blob> {
    const url = hubFileUrl(repo, sha, file);
    let res: Response;
    try {
      res = await doFetch(url);
    } catch (e) {
      throw new ModelLoadError(file, `download from ${url} failed: ${(e as Error).message}`);
    }
    if (!res.ok)
      throw new ModelLoadError(file, `HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''} fetching ${url}`);
    let total = Number(res.headers.get('content-length') ?? 0) || 0;
    const key = cacheKey(repo, sha, file);
    const writer = await cache.create(key);
    const started = performance.now();
    let loaded = 0;
    let lastEmit = -Infinity;
    const emit = (force: boolean) => {
      const now = performance.now();
      if (!opts.onProgress || (!force && now - lastEmit < interval)) return;
      lastEmit = now;
      const seconds = (now - started) / 1000;
      const bytesPerSecond = seconds > 0 ? loaded / seconds : 0;
      const etaSeconds =
        total > 0 && bytesPerSecond > 0
          ? Math.max(0, total - loaded) / bytesPerSecond
          : total > 0 && loaded >= total
            ? 0
            : NaN;
      opts.onProgress({ file, loaded, total, bytesPerSecond, etaSeconds });
    };
    try {
      emit(true);
      if (res.body) {
        const reader = res.body.getReader();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          await writer.write(value);
          loaded += value.byteLength;
          emit(false);
        }
      } else {
        const bytes = new Uint8Array(await res.arrayBuffer());
        await writer.write(bytes);
        loaded = bytes.byteLength;
      }
      // Only a short body is an error: a gzip-encoded response may decode to more than its Content-Length.
      if (loaded < total) throw new ModelLoadError(file, `download from ${url} ended at ${loaded} of ${total} bytes`);
      total = Math.max(total, loaded);
      await writer.close();
    } catch (e) {
      // Drops only this download's partial bytes (see CacheWriter.abort).
      await writer.abort().catch(() => undefined);
      if (e instanceof ModelLoadError) throw e;
      throw new ModelLoadError(file, `download from ${url} failed: ${(e as Error).message}`);
    }
    emit(true);
    const blob = await cache.get(key);
    if (!blob) throw new ModelLoadError(file, `cache (${cache.kind}) lost the entry right after downloading it`);
    return blob;
  }

  function fetchBlob(file: string): Promise<Blob> {
    let p = inflight.get(file);
    if (!p) {
      p = (async () => {
        checkHubFile(repo, file);
        const { sha } = await resolve();
        return (await cache.get(cacheKey(repo, sha, file))) ?? download(sha, file);
      })();
      inflight.set(file, p);
      p.catch(() => inflight.delete(file));
    }
    return p;
  }

  async function list(): Promise<string[]> {
    const { files, sha } = await resolve();
    if (!files)
      throw new ModelLoadError(repo, `the file list of commit ${sha} is not cached and the Hub cannot be reached`);
    return [...files];
  }

  return {
    name: `${repo}@${revision}`,
    repo,
    revision,
    cache,
    resolve,
    list,
    open: async (file) => blobSource(await fetchBlob(file), file),
    readText: async (file) => (await fetchBlob(file)).text(),
    async exists(file) {
      checkHubFile(repo, file);
      const { sha, files } = await resolve();
      if ((await cache.get(cacheKey(repo, sha, file))) !== null) return true;
      if (files) return files.includes(file);
      // No file list (offline): ask for the file itself.
      const res = await doFetch(hubFileUrl(repo, sha, file), { method: 'HEAD' }).catch(() => null);
      return res?.ok ?? false;
    },
  };
}

export interface CachedModel {
  repo: string;
  /** The commit sha of the entry (or, for entries cached before revisions were resolved, a branch name). */
  revision: string;
  /** Branches that resolved to this commit on their last load here. */
  branches: string[];
  format: CacheFormat;
  /** A q4 entry is complete once its manifest is written (last); bf16 files are committed one by one. */
  complete: boolean;
  files: { file: string; size: number }[];
  bytes: number;
}

export async function listCachedModels(cache: HubCache = defaultHubCache()): Promise<CachedModel[]> {
  const models = new Map<string, CachedModel>();
  const pointers: { repo: string; branch: string; key: string }[] = [];
  for (const { key, size } of await cache.entries()) {
    const [owner, name, revAndFormat, ...rest] = key.split('/');
    if (!owner || !name || revAndFormat === undefined || rest.length === 0) continue;
    const [rev = '', fmt = 'bf16'] = revAndFormat.split('+');
    const repo = `${owner}/${name}`;
    if (fmt === 'meta' && rest.join('/') === META_SHA) pointers.push({ repo, branch: decodeURIComponent(rev), key });
    if (fmt !== 'bf16' && fmt !== 'q4') continue;
    const file = rest.join('/');
    if (file === LEGACY_LISTING) continue;
    const id = `${repo}/${revAndFormat}`;
    let m = models.get(id);
    if (!m)
      models.set(
        id,
        (m = {
          repo,
          revision: decodeURIComponent(rev),
          branches: [],
          format: fmt,
          complete: fmt === 'bf16',
          files: [],
          bytes: 0,
        }),
      );
    if (file === QUANTIZED_MANIFEST) {
      m.complete = true;
      continue;
    }
    m.files.push({ file, size });
    m.bytes += size;
  }
  for (const p of pointers) {
    const sha = (await readCachedText(cache, p.key))?.trim();
    for (const m of models.values()) if (m.repo === p.repo && m.revision === sha) m.branches.push(p.branch);
  }
  for (const m of models.values()) m.branches.sort();
  return [...models.values()]
    .filter((m) => m.files.length > 0)
    .sort(
      (a, b) =>
        a.repo.localeCompare(b.repo) || a.revision.localeCompare(b.revision) || a.format.localeCompare(b.format),
    );
}

async function deleteEntry(
  repo: string,
  revision: string,
  cache: HubCache,
  format: CacheFormat,
): Promise<{ key: string }[]> {
  const prefix = cacheKey(repo, revision, '', format);
  const entries = await cache.entries();
  for (const { key } of entries) if (key.startsWith(prefix)) await cache.delete(key);
  return entries.filter((e) => !e.key.startsWith(prefix));
}

/** Deletes one format's entry of a repo revision (the download, or the quantized weights). With
 *  neither format of that commit left, its file list and the branch pointers to it go too. */
export async function deleteCachedModel(
  repo: string,
  revision = 'main',
  cache: HubCache = defaultHubCache(),
  format: CacheFormat = 'bf16',
): Promise<void> {
  const rest = await deleteEntry(repo, revision, cache, format);
  const other = cacheKey(repo, revision, '', format === 'bf16' ? 'q4' : 'bf16');
  if (rest.some((e) => e.key.startsWith(other))) return;
  const listing = metaKey(repo, revision, META_LISTING);
  for (const { key } of rest) {
    if (key === listing) await cache.delete(key);
    else if (
      key.startsWith(`${repo}/`) &&
      key.endsWith(`+meta/${META_SHA}`) &&
      (await readCachedText(cache, key))?.trim() === revision
    )
      await cache.delete(key);
  }
}

// ---------------------------------------------------------------------------------------------
// Quantized entries: the weights as the GPU holds them after a q4 load, so a later load reads
// those (about a quarter of the bf16 bytes) and neither downloads nor quantizes.

/** Written after every file of the entry: its presence is what makes the entry complete. */
const QUANTIZED_MANIFEST = '.manifest.json';

interface QuantizedManifest {
  format: CacheFormat;
  /** The packed layout's version: an entry written under another layout is not read. */
  version: number;
  files: { name: string; size: number }[];
}

/** One file of a quantized entry (the packed weights, or a small checkpoint file): its bytes
 *  whole, or as consecutive pieces so a file of gigabytes never sits in memory. */
export interface QuantizedFile {
  name: string;
  bytes: Uint8Array | AsyncIterable<Uint8Array> | Iterable<Uint8Array>;
}

/** Writes one cache entry from its pieces; returns its size. */
async function writeEntry(
  cache: HubCache,
  key: string,
  bytes: QuantizedFile['bytes'],
  onBytes?: (n: number) => void,
): Promise<number> {
  const w = await cache.create(key);
  let size = 0;
  try {
    for await (const piece of bytes instanceof Uint8Array ? [bytes] : bytes) {
      await w.write(piece);
      size += piece.byteLength;
      onBytes?.(piece.byteLength);
    }
    await w.close();
  } catch (e) {
    await w.abort().catch(() => undefined);
    throw e;
  }
  return size;
}

/**
 * Stores a quantized entry for a repo revision, replacing any earlier one: every file, then the
 * manifest. Returns the bytes stored; `onWrite` gets the running total after every piece. On
 * failure (e.g. the storage quota) the partial entry is deleted.
 */
export async function writeQuantizedCache(
  cache: HubCache,
  repo: string,
  revision: string,
  format: Exclude<CacheFormat, 'bf16'>,
  version: number,
  files: AsyncIterable<QuantizedFile> | Iterable<QuantizedFile>,
  onWrite?: (p: { file: string; written: number }) => void,
): Promise<number> {
  await deleteEntry(repo, revision, cache, format);
  const written: QuantizedManifest['files'] = [];
  let total = 0;
  try {
    for await (const f of files) {
      if (!f.name || f.name.includes('/') || f.name === QUANTIZED_MANIFEST || written.some((w) => w.name === f.name)) {
        throw new ModelLoadError(
          f.name || '(empty name)',
          `not a valid file name for the ${format} cache of ${repo}@${revision}`,
        );
      }
      const size = await writeEntry(cache, cacheKey(repo, revision, f.name, format), f.bytes, (n) => {
        total += n;
        onWrite?.({ file: f.name, written: total });
      });
      written.push({ name: f.name, size });
    }
    const manifest: QuantizedManifest = { format, version, files: written };
    await writeEntry(
      cache,
      cacheKey(repo, revision, QUANTIZED_MANIFEST, format),
      new TextEncoder().encode(JSON.stringify(manifest)),
    );
  } catch (e) {
    await deleteEntry(repo, revision, cache, format).catch(() => undefined);
    throw e;
  }
  return total;
}

export interface QuantizedCacheSource extends ModelSource {
  repo: string;
  revision: string;
  format: CacheFormat;
  /** Bytes of every stored file (what a load reads at most). */
  bytes: number;
}

/**
 * The quantized entry of a repo revision as a ModelSource over its files, or null when there is
 * none that is complete, of this layout version, and whole (every file at its recorded size).
 */
export async function quantizedCacheSource(
  cache: HubCache,
  repo: string,
  revision: string,
  format: Exclude<CacheFormat, 'bf16'>,
  version: number,
): Promise<QuantizedCacheSource | null> {
  const manifestBlob = await cache.get(cacheKey(repo, revision, QUANTIZED_MANIFEST, format));
  if (!manifestBlob) return null;
  let manifest: QuantizedManifest;
  try {
    manifest = JSON.parse(await manifestBlob.text()) as QuantizedManifest;
  } catch {
    return null;
  }
  if (manifest.format !== format || manifest.version !== version || !Array.isArray(manifest.files)) return null;
  const blobs = new Map<string, Blob>();
  for (const f of manifest.files) {
    const blob = await cache.get(cacheKey(repo, revision, f.name, format));
    if (!blob || blob.size !== f.size) return null;
    blobs.set(f.name, blob);
  }
  const name = `${repo}@${revision} (${format} cache)`;
  const get = (file: string): Blob => {
    const b = blobs.get(file);
    if (!b) throw notFound(name, file);
    return b;
  };
  return {
    name,
    repo,
    revision,
    format,
    bytes: manifest.files.reduce((n, f) => n + f.size, 0),
    list: async () => [...blobs.keys()],
    open: async (file) => blobSource(get(file), file),
    readText: async (file) => get(file).text(),
    exists: async (file) => blobs.has(file),
  };
}
