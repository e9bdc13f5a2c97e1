// Opening a model folder or Hub repo (and optionally a PEFT adapter) for a command.
import { stat } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { ModelLoadError } from '../model/errors.ts';
import type { ModelSource } from '../model/sources.ts';
import { checkIds, str, tokenList, UsageError, type EngineOptions, type Flags } from './args.ts';

export async function requireDir(dir: string, what = 'model folder'): Promise<void> {
  const s = await stat(dir).catch(() => null);
  if (!s) throw new ModelLoadError(dir, `${what} not found`);
  if (!s.isDirectory()) throw new ModelLoadError(dir, 'is not a folder');
}

export async function openModel(dir: string, adapterDir?: string, engine?: EngineOptions) {
  await requireDir(dir);
  const { nodeFolderSource } = await import('../model/sources.node.ts');
  return openModelSource(nodeFolderSource(dir), adapterDir, engine);
}

/** `owner/name` or `owner/name@revision` (default main) when it is a valid Hub repo id, else null. */
export async function parseHubSpec(spec: string): Promise<{ repo: string; revision: string } | null> {
  const { invalidRepoIdReason } = await import('../model/sources.ts');
  const at = spec.indexOf('@');
  const repo = at < 0 ? spec : spec.slice(0, at);
  const revision = at < 0 ? 'main' : spec.slice(at + 1);
  return revision !== '' && invalidRepoIdReason(repo) === null ? { repo, revision } : null;
}

const HUB = 'https://huggingface.co';

/**
 * A Hub repo as the CLI reads it: the Hub at HF_ENDPOINT (default https://huggingface.co);
 * HF_TOKEN, when set, sent as a bearer token to that host only (never printed); each file
 * downloaded once into SPYRL_HUB_CACHE (default $XDG_CACHE_HOME/spyrl/hub, else ~/.cache/spyrl/hub)
 * under the commit the revision resolves to (src/model/sources.ts hubSource).
 */
export async function cliHubSource(repo: string, revision: string): Promise<ModelSource> {
  const [{ hubSource }, { nodeFolderHubCache }] = await Promise.all([
    import('../model/sources.ts'),
    import('../model/sources.node.ts'),
  ]);
  const endpoint = (process.env.HF_ENDPOINT || HUB).replace(/\/+$/, '');
  const token = process.env.HF_TOKEN;
  const doFetch: typeof fetch = (input, init) => {
    let url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
    if (url.startsWith(HUB)) url = endpoint + url.slice(HUB.length);
    const headers = new Headers(init?.headers);
    if (token && new URL(url).origin === new URL(endpoint).origin) headers.set('authorization', `Bearer ${token}`);
    return fetch(url, { ...init, headers });
  };
  const cacheDir =
    process.env.SPYRL_HUB_CACHE || join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'spyrl', 'hub');
  return hubSource(repo, { revision, fetch: doFetch, cache: nodeFolderHubCache(cacheDir) });
}

/** A local model folder when `spec` names one, else a Hub repo `owner/name[@revision]` (cliHubSource). */
export async function openModelOrRepo(spec: string, engine?: EngineOptions) {
  const isDir = (await stat(spec).catch(() => null))?.isDirectory() ?? false;
  const hub = isDir ? null : await parseHubSpec(spec);
  if (!hub) return openModel(spec, undefined, engine); // a folder, or the folder error
  return openModelSource(await cliHubSource(hub.repo, hub.revision), undefined, engine);
}

async function openModelSource(source: ModelSource, adapterDir?: string, engine?: EngineOptions) {
  if (adapterDir) await requireDir(adapterDir, 'adapter folder');
  const [{ createGpu }, { nodeFolderSource }, { loadQwen3WithTokenizer }] = await Promise.all([
    import('../gpu/index.ts'),
    import('../model/sources.node.ts'),
    import('../model/load.ts'),
  ]);
  const gpu = await createGpu();
  try {
    const loaded = await loadQwen3WithTokenizer(gpu, source, { weights: engine?.weights, kv: engine?.kv });
    if (adapterDir) {
      const [{ readAdapter }, { LoraAdapter }] = await Promise.all([
        import('../model/peft.ts'),
        import('../model/lora.ts'),
      ]);
      const { lora, tensors } = await readAdapter(nodeFolderSource(adapterDir), loaded.cfg);
      const adapter = new LoraAdapter(gpu, loaded.cfg, lora);
      adapter.setWeights(tensors);
      loaded.model.lora = adapter;
    }
    return { gpu, ...loaded };
  } catch (e) {
    gpu.destroy();
    throw e;
  }
}

/** Token ids from --tokens or (with the model's tokenizer) --text. */
export function inputIds(
  f: Flags,
  tokenizer: { encode(t: string): number[] } | null,
  dir: string,
  V: number,
): number[] {
  const tokensArg = str(f, 'tokens');
  const text = f.text === undefined ? undefined : String(f.text);
  if ((tokensArg === undefined) === (text === undefined))
    throw new UsageError('give exactly one of --tokens or --text');
  let ids: number[];
  if (tokensArg !== undefined) ids = tokenList(tokensArg, 'tokens');
  else {
    if (!tokenizer)
      throw new ModelLoadError(
        'tokenizer.json',
        `not found in ${dir}: --text needs the tokenizer files (or use --tokens)`,
      );
    ids = tokenizer.encode(text!);
    if (ids.length === 0) throw new UsageError('--text encodes to no tokens');
  }
  checkIds(ids, V);
  return ids;
}
