// A ModelChoice (bundled demo, Hub repo, picked folder) turned into a ModelSource, its name and
// the reference an autosave keeps; and the q4 cache entry of a Hub model.
import { parseQwen3Config, type Qwen3Config } from '../model/config.ts';
import type { Gpu } from '../gpu/index.ts';
import { Q4_SIDE_FILES, Q4_STORE_FILE, Q4_STORE_VERSION, q4SafetensorsFile } from '../model/q4Store.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import {
  defaultHubCache,
  filesSource,
  hubSource,
  invalidRepoIdReason,
  resolveHubRevision,
  quantizedCacheSource,
  urlSource,
  writeQuantizedCache,
  type DownloadProgress,
  type HubCache,
  type HubRevision,
  type ModelSource,
  type QuantizedCacheSource,
  type QuantizedFile,
} from '../model/sources.ts';
import type { ModelChoice, ModelRef } from './protocol.ts';

export interface SourceDeps {
  /** Base URL of the bundled tiny demo checkpoint (public/tiny-demo/). */
  demoUrl: string;
  fetch?: typeof fetch;
  hubCache?: HubCache;
  /** Shares one resolution of a Hub branch between the config check and the load after it. */
  hubRevisions?: HubRevisionMemo;
}

export interface ResolvedSource {
  source: ModelSource;
  name: string;
  /** A Hub ref holds the commit sha the revision resolved to: the autosave, the q4 entry and a
   *  resume all name that commit, not a branch that may move. */
  ref: ModelRef;
}

/**
 * Hub revisions resolved to commits, kept for a short while so that the config check (inspect)
 * and the load that follows ask the Hub once; `clear()` after a load, so the next load asks again
 * and sees a branch that moved.
 */
export class HubRevisionMemo {
  private readonly memo = new Map<string, { at: number; pinned: Promise<HubRevision> }>();

  constructor(
    private readonly ttlMs = 60_000,
    private readonly now = () => Date.now(),
  ) {}

  resolve(repo: string, revision: string, opts: { fetch?: typeof fetch; cache?: HubCache }): Promise<HubRevision> {
    const id = `${repo}@${revision}`;
    const hit = this.memo.get(id);
    if (hit && this.now() - hit.at < this.ttlMs) return hit.pinned;
    const pinned = resolveHubRevision(repo, revision, opts);
    this.memo.set(id, { at: this.now(), pinned });
    pinned.catch(() => this.memo.get(id)?.pinned === pinned && this.memo.delete(id));
    return pinned;
  }

  clear(): void {
    this.memo.clear();
  }
}

export async function resolveSource(
  choice: ModelChoice,
  deps: SourceDeps,
  onDownload?: (p: DownloadProgress) => void,
): Promise<ResolvedSource> {
  const doFetch = deps.fetch ?? ((input: RequestInfo | URL, init?: RequestInit) => fetch(input, init));
  switch (choice.kind) {
    case 'demo': {
      const res = await doFetch(new URL('manifest.json', deps.demoUrl).href);
      if (!res.ok)
        throw new Error(
          `the bundled demo model is missing (HTTP ${res.status} for tiny-demo/manifest.json): run \`npm start\`, which generates it`,
        );
      const manifest = (await res.json()) as { name: string; files: string[] };
      return {
        source: urlSource(manifest.name, deps.demoUrl, manifest.files, { fetch: doFetch }),
        name: manifest.name,
        ref: { kind: 'demo' },
      };
    }
    case 'hub': {
      const repo = choice.repo.trim();
      const invalid = invalidRepoIdReason(repo);
      if (invalid) throw new Error(`"${repo}" is not a Hugging Face repo id (owner/name): ${invalid}`);
      const revision = choice.revision?.trim() || 'main';
      const cache = deps.hubCache ?? defaultHubCache();
      const opts = { fetch: doFetch, cache };
      const resolved = await (deps.hubRevisions
        ? deps.hubRevisions.resolve(repo, revision, opts)
        : resolveHubRevision(repo, revision, opts));
      const source = hubSource(repo, {
        resolved,
        fetch: doFetch,
        cache,
        onProgress: onDownload,
        progressIntervalMs: 250,
      });
      // Offline on a cached branch: the name carries the note, so the loaded-model line shows it.
      const name = resolved.offline ? `${repo} (${resolved.offline})` : repo;
      return { source, name, ref: { kind: 'hub', repo, revision: resolved.sha } };
    }
    case 'files': {
      if (choice.files.length === 0) throw new Error('the picked folder is empty');
      const source = filesSource(choice.files);
      return { source, name: source.name, ref: { kind: 'files', name: source.name } };
    }
  }
}

// ---- the q4 cache: a Hub model's q4 store (src/model/q4Store.ts) beside its download ----------

/** The complete q4 entry of a Hub model in the cache, or null (other sources have no stable key).
 *  It is a ModelSource holding the side files and Q4_STORE_FILE. */
export async function openQuantizedEntry(
  ref: ModelRef,
  cache: HubCache | undefined,
): Promise<QuantizedCacheSource | null> {
  if (ref.kind !== 'hub' || !cache) return null;
  return quantizedCacheSource(cache, ref.repo, ref.revision, 'q4', Q4_STORE_VERSION);
}

/** Stores the q4 store of a model loaded as q4 from a Hub repo, with the repo's side files. */
export async function storeQuantizedEntry(
  ref: Extract<ModelRef, { kind: 'hub' }>,
  cache: HubCache,
  source: ModelSource,
  gpu: Gpu,
  model: Qwen3Model,
  onWrite?: (p: { file: string; written: number }) => void,
): Promise<number> {
  async function* files(): AsyncIterable<QuantizedFile> {
    for (const name of Q4_SIDE_FILES) {
      if (!(await source.exists(name))) continue;
      const file = await source.open(name);
      yield { name, bytes: await file.read(0, file.size) };
    }
    yield { name: Q4_STORE_FILE, bytes: q4SafetensorsFile(gpu, model) };
  }
  return writeQuantizedCache(cache, ref.repo, ref.revision, 'q4', Q4_STORE_VERSION, files(), onWrite);
}

export async function readModelConfig(source: Pick<ModelSource, 'readText'>): Promise<Qwen3Config> {
  return parseQwen3Config(await source.readText('config.json'));
}

export function sameModel(a: ModelRef, b: ModelRef): boolean {
  if (a.kind !== b.kind) return false;
  if (a.kind === 'hub' && b.kind === 'hub') return a.repo === b.repo && a.revision === b.revision;
  if (a.kind === 'files' && b.kind === 'files') return a.name === b.name;
  return true;
}

const mib = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`;

/** One line for a file download: bytes, speed, ETA. */
export function describeDownload(p: DownloadProgress): string {
  const total = p.total ? ` of ${mib(p.total)}` : '';
  const eta = Number.isFinite(p.etaSeconds) ? `, ${Math.ceil(p.etaSeconds)} s left` : '';
  return `Downloading ${p.file}: ${mib(p.loaded)}${total} at ${mib(p.bytesPerSecond)}/s${eta}`;
}
