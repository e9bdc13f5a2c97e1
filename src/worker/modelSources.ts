// A ModelChoice (bundled demo, Hub repo, picked folder) turned into a ModelSource, its name and
// the reference an autosave keeps.
import { parseQwen3Config, type Qwen3Config } from '../model/config.ts';
import { filesSource, hubSource, urlSource, type DownloadProgress, type HubCache, type ModelSource } from '../model/sources.ts';
import type { ModelChoice, ModelRef } from './protocol.ts';

export interface SourceDeps {
  /** Base URL of the bundled tiny demo checkpoint (public/tiny-demo/). */
  demoUrl: string;
  fetch?: typeof fetch;
  hubCache?: HubCache;
}

export interface ResolvedSource {
  source: ModelSource;
  name: string;
  ref: ModelRef;
}

export async function resolveSource(choice: ModelChoice, deps: SourceDeps, onDownload?: (p: DownloadProgress) => void): Promise<ResolvedSource> {
  const doFetch = deps.fetch ?? ((input: RequestInfo | URL, init?: RequestInit) => fetch(input, init));
  switch (choice.kind) {
    case 'demo': {
      const res = await doFetch(new URL('manifest.json', deps.demoUrl).href);
      if (!res.ok) throw new Error(`the bundled demo model is missing (HTTP ${res.status} for tiny-demo/manifest.json): run \`npm start\`, which generates it`);
      const manifest = (await res.json()) as { name: string; files: string[] };
      return { source: urlSource(manifest.name, deps.demoUrl, manifest.files, { fetch: doFetch }), name: manifest.name, ref: { kind: 'demo' } };
    }
    case 'hub': {
      const repo = choice.repo.trim();
      if (!/^[\w.-]+\/[\w.-]+$/.test(repo)) throw new Error(`"${repo}" is not a Hugging Face repo id (owner/name)`);
      const revision = choice.revision ?? 'main';
      const source = hubSource(repo, { revision, fetch: doFetch, cache: deps.hubCache, onProgress: onDownload, progressIntervalMs: 250 });
      return { source, name: repo, ref: { kind: 'hub', repo, revision } };
    }
    case 'files': {
      if (choice.files.length === 0) throw new Error('the picked folder is empty');
      const source = filesSource(choice.files);
      return { source, name: source.name, ref: { kind: 'files', name: source.name } };
    }
  }
}

export async function readModelConfig(source: ModelSource): Promise<Qwen3Config> {
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
