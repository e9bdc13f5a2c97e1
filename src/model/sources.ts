// Where a checkpoint comes from: in-memory files, a browser folder pick, or the Hugging Face Hub
// (with a persistent browser cache). Node folders live in sources.node.ts so this file stays DOM/Node neutral.
import { ModelLoadError } from './errors.ts';
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
export function urlSource(name: string, baseUrl: string, files: readonly string[], opts: { fetch?: typeof fetch } = {}): ModelSource {
  const doFetch = opts.fetch ?? ((input, init) => fetch(input, init));
  const known = new Set(files);
  const blobs = new Map<string, Promise<Blob>>();
  const get = (file: string): Promise<Blob> => {
    if (!known.has(file)) return Promise.reject(notFound(name, file));
    let p = blobs.get(file);
    if (!p) {
      const url = new URL(file, baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`).href;
      p = doFetch(url).then(async (res) => {
        if (!res.ok) throw new ModelLoadError(file, `HTTP ${res.status} fetching ${url}`);
        return res.blob();
      }, (e: unknown) => {
        throw new ModelLoadError(file, `fetching ${url} failed: ${(e as Error).message}`);
      });
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
  abort(): Promise<void>;
}

/** Persistent store of downloaded files, one entry per key `${repo}/${revision}/${file}`, and of
 *  quantized weights under `${repo}/${revision}+q4/${file}` (cacheKey). */
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

/** Origin Private File System: one file per key (key URI-encoded since names cannot hold '/'). */
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
      // createWritable writes to a swap file; the entry only changes on close().
      const writable = await (await d.getFileHandle(name, { create: true })).createWritable();
      return {
        write: (chunk) => writable.write(chunk as Uint8Array<ArrayBuffer>),
        close: () => writable.close(),
        async abort() {
          await writable.abort();
          await d.removeEntry(name).catch(() => undefined);
        },
      };
    },
    async entries() {
      const out: { key: string; size: number }[] = [];
      const d = await dir();
      for await (const [name, handle] of (d as unknown as { entries(): AsyncIterable<[string, FileSystemHandle]> }).entries()) {
        if (handle.kind !== 'file') continue;
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

/** Cache Storage fallback (browsers without OPFS writables): the body streams into `cache.put`. */
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
          await writer.abort(new Error('download aborted')).catch(() => undefined);
          await put.catch(() => undefined);
          await cache.delete(url(key));
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

/** OPFS when it can write, else Cache Storage, else memory (Node: not persistent). */
export function defaultHubCache(): HubCache {
  const g = globalThis as { navigator?: Navigator; caches?: CacheStorage; FileSystemFileHandle?: { prototype: object } };
  if (typeof g.navigator?.storage?.getDirectory === 'function' && g.FileSystemFileHandle && 'createWritable' in g.FileSystemFileHandle.prototype) {
    return opfsHubCache();
  }
  if (g.caches) return cacheStorageHubCache();
  return memoryHubCache();
}

export const DEFAULT_HUB_REPO = 'Qwen/Qwen3-4B-Instruct-2507';
const HUB = 'https://huggingface.co';
/** Cache entry holding the repo's file list, so exists() needs no request on a second load. */
const LISTING = '.listing.json';

export interface HubSourceOptions {
  revision?: string;
  fetch?: typeof fetch;
  cache?: HubCache;
  onProgress?: (p: DownloadProgress) => void;
  /** Minimum milliseconds between progress events for one file (first and last are always sent). */
  progressIntervalMs?: number;
}

export function hubFileUrl(repo: string, revision: string, file: string): string {
  return `${HUB}/${repo}/resolve/${encodeURIComponent(revision)}/${file}`;
}

/** What a cache entry holds: the repo's files as downloaded (bf16 weights), or the weights
 *  quantized on a first load (q4) with the small files a load needs. */
export type CacheFormat = 'bf16' | 'q4';

/** `${repo}/${revision}/${file}`, or `${repo}/${revision}+q4/${file}`: '+' cannot come from the
 *  URI-encoded revision, so the two formats never share a prefix. */
function cacheKey(repo: string, revision: string, file: string, format: CacheFormat = 'bf16'): string {
  return `${repo}/${encodeURIComponent(revision)}${format === 'bf16' ? '' : `+${format}`}/${file}`;
}

export interface HubModelSource extends ModelSource {
  repo: string;
  revision: string;
  cache: HubCache;
}

export function hubSource(repo: string = DEFAULT_HUB_REPO, opts: HubSourceOptions = {}): HubModelSource {
  const revision = opts.revision ?? 'main';
  const cache = opts.cache ?? defaultHubCache();
  const doFetch = opts.fetch ?? ((input, init) => fetch(input, init));
  const interval = opts.progressIntervalMs ?? 100;
  const inflight = new Map<string, Promise<Blob>>();
  let listing: Promise<string[]> | undefined;

  async function download(file: string): Promise<Blob> {
    const url = hubFileUrl(repo, revision, file);
    let res: Response;
    try {
      res = await doFetch(url);
    } catch (e) {
      throw new ModelLoadError(file, `download from ${url} failed: ${(e as Error).message}`);
    }
    if (!res.ok) throw new ModelLoadError(file, `HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''} fetching ${url}`);
    let total = Number(res.headers.get('content-length') ?? 0) || 0;
    const key = cacheKey(repo, revision, file);
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
      const etaSeconds = total > 0 && bytesPerSecond > 0 ? Math.max(0, total - loaded) / bytesPerSecond : total > 0 && loaded >= total ? 0 : NaN;
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
      p = (async () => (await cache.get(cacheKey(repo, revision, file))) ?? download(file))();
      inflight.set(file, p);
      p.catch(() => inflight.delete(file));
    }
    return p;
  }

  async function loadListing(): Promise<string[]> {
    const key = cacheKey(repo, revision, LISTING);
    const cached = await cache.get(key);
    if (cached) return JSON.parse(await cached.text()) as string[];
    const url = `${HUB}/api/models/${repo}/revision/${encodeURIComponent(revision)}`;
    let res: Response;
    try {
      res = await doFetch(url);
    } catch (e) {
      throw new ModelLoadError(repo, `listing files from ${url} failed: ${(e as Error).message}`);
    }
    if (!res.ok) throw new ModelLoadError(repo, `HTTP ${res.status} listing files from ${url}`);
    const info = (await res.json()) as { siblings?: { rfilename?: unknown }[] };
    const files = (info.siblings ?? []).map((s) => s.rfilename).filter((f): f is string => typeof f === 'string');
    const w = await cache.create(key);
    await w.write(new TextEncoder().encode(JSON.stringify(files)));
    await w.close();
    return files;
  }

  const list = () => {
    listing ??= loadListing();
    listing.catch(() => (listing = undefined));
    return listing;
  };

  return {
    name: `${repo}@${revision}`,
    repo,
    revision,
    cache,
    list,
    open: async (file) => blobSource(await fetchBlob(file), file),
    readText: async (file) => (await fetchBlob(file)).text(),
    async exists(file) {
      if ((await cache.get(cacheKey(repo, revision, file))) !== null) return true;
      try {
        return (await list()).includes(file);
      } catch {
        // Listing API unreachable: ask for the file itself.
        const res = await doFetch(hubFileUrl(repo, revision, file), { method: 'HEAD' }).catch(() => null);
        return res?.ok ?? false;
      }
    },
  };
}

export interface CachedModel {
  repo: string;
  revision: string;
  format: CacheFormat;
  /** A q4 entry is complete once its manifest is written (last); bf16 files are committed one by one. */
  complete: boolean;
  files: { file: string; size: number }[];
  bytes: number;
}

export async function listCachedModels(cache: HubCache = defaultHubCache()): Promise<CachedModel[]> {
  const models = new Map<string, CachedModel>();
  for (const { key, size } of await cache.entries()) {
    const [owner, name, revAndFormat, ...rest] = key.split('/');
    if (!owner || !name || revAndFormat === undefined || rest.length === 0) continue;
    const [rev = '', fmt = 'bf16'] = revAndFormat.split('+');
    if (fmt !== 'bf16' && fmt !== 'q4') continue;
    const repo = `${owner}/${name}`;
    const id = `${repo}/${revAndFormat}`;
    let m = models.get(id);
    if (!m) models.set(id, (m = { repo, revision: decodeURIComponent(rev), format: fmt, complete: fmt === 'bf16', files: [], bytes: 0 }));
    const file = rest.join('/');
    if (file === LISTING) continue;
    if (file === QUANTIZED_MANIFEST) {
      m.complete = true;
      continue;
    }
    m.files.push({ file, size });
    m.bytes += size;
  }
  return [...models.values()].sort((a, b) => a.repo.localeCompare(b.repo) || a.revision.localeCompare(b.revision) || a.format.localeCompare(b.format));
}

/** Deletes one format's entry of a repo revision (the download, or the quantized weights). */
export async function deleteCachedModel(repo: string, revision = 'main', cache: HubCache = defaultHubCache(), format: CacheFormat = 'bf16'): Promise<void> {
  const prefix = cacheKey(repo, revision, '', format);
  for (const { key } of await cache.entries()) if (key.startsWith(prefix)) await cache.delete(key);
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
async function writeEntry(cache: HubCache, key: string, bytes: QuantizedFile['bytes'], onBytes?: (n: number) => void): Promise<number> {
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
  await deleteCachedModel(repo, revision, cache, format);
  const written: QuantizedManifest['files'] = [];
  let total = 0;
  try {
    for await (const f of files) {
      if (!f.name || f.name.includes('/') || f.name === QUANTIZED_MANIFEST || written.some((w) => w.name === f.name)) {
        throw new ModelLoadError(f.name || '(empty name)', `not a valid file name for the ${format} cache of ${repo}@${revision}`);
      }
      const size = await writeEntry(cache, cacheKey(repo, revision, f.name, format), f.bytes, (n) => {
        total += n;
        onWrite?.({ file: f.name, written: total });
      });
      written.push({ name: f.name, size });
    }
    const manifest: QuantizedManifest = { format, version, files: written };
    await writeEntry(cache, cacheKey(repo, revision, QUANTIZED_MANIFEST, format), new TextEncoder().encode(JSON.stringify(manifest)));
  } catch (e) {
    await deleteCachedModel(repo, revision, cache, format).catch(() => undefined);
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
