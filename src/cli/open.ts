// Opening a model folder or Hub repo (and optionally a PEFT adapter) for a command.
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { ModelLoadError } from '../model/errors.ts';
import { checkRelativePath } from '../model/paths.ts';
import type { HubRevision, ModelSource } from '../model/sources.ts';
import { checkIds, str, tokenList, UsageError, type EngineOptions, type Flags } from './args.ts';

export async function requireDir(dir: string, what = 'model folder'): Promise<void> {
  const s = await stat(dir).catch(() => null);
  if (!s) throw new ModelLoadError(dir, `${what} not found`);
  if (!s.isDirectory()) throw new ModelLoadError(dir, 'is not a folder');
}

/**
 * The model a `--model` (or `--compare-model`) flag names: a local folder when one exists at that
 * path, else a Hub repo `owner/name[@revision]` read through the Hugging Face cache (cliHubSource),
 * else the folder error.
 */
export async function modelSource(spec: string, what = 'model folder'): Promise<ModelSource> {
  const { nodeFolderSource } = await import('../model/sources.node.ts');
  const local = await stat(spec).catch(() => null);
  const hub = local ? null : await parseHubSpec(spec);
  if (!hub) {
    await requireDir(spec, what);
    return nodeFolderSource(spec);
  }
  return cliHubSource(hub.repo, hub.revision, { localPath: spec });
}

/** Opens a model (a folder, a Hub repo `owner/name[@revision]`, or a source) and an optional PEFT adapter folder. */
export async function openModel(model: string | ModelSource, adapterDir?: string, engine?: EngineOptions) {
  return openModelSource(typeof model === 'string' ? await modelSource(model) : model, adapterDir, engine);
}

/** `owner/name` or `owner/name@revision` (default main) when it is a valid Hub repo id, else null. */
export async function parseHubSpec(spec: string): Promise<{ repo: string; revision: string } | null> {
  const { invalidRepoIdReason } = await import('../model/sources.ts');
  const at = spec.indexOf('@');
  const repo = at < 0 ? spec : spec.slice(0, at);
  const revision = at < 0 ? 'main' : spec.slice(at + 1);
  return revision !== '' && invalidRepoIdReason(repo) === null ? { repo, revision } : null;
}

export interface CliHubOptions {
  env?: Record<string, string | undefined>;
  /** Where progress and notices go (default stderr). */
  log?: NodeJS.WritableStream & { isTTY?: boolean };
  /** The flag's text, named in a "not found" error (it may have been meant as a folder). */
  localPath?: string;
}

/**
 * A Hub repo as the CLI reads it, through the shared loader (src/model/sources.ts hubSource):
 * - the Hub at HF_ENDPOINT (default https://huggingface.co);
 * - HF_TOKEN (else the token file of `huggingface-cli login`) sent as a bearer token to that host
 *   only, never printed;
 * - files in the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else
 *   ~/.cache/huggingface/hub) laid out as huggingface_hub does (hfCache.ts), so either tool
 *   reuses the other's downloads;
 * - HF_HUB_OFFLINE: no network; the revision from refs/, the files from snapshots/.
 * The revision is resolved here, before any GPU work, so a bad repo fails first.
 */
export async function cliHubSource(repo: string, revision: string, opts: CliHubOptions = {}): Promise<ModelSource> {
  const env = opts.env ?? process.env;
  const log = opts.log ?? process.stderr;
  const [{ hubSource, resolveHubRevision, isCommitSha }, hf, { hubFetch, progressPrinter }] = await Promise.all([
    import('../model/sources.ts'),
    import('./hfCache.ts'),
    import('./hubFetch.ts'),
  ]);
  const root = hf.hfHubCacheDir(env);
  const offline = hf.hfOffline(env);
  const token = await hf.hfToken(env);
  const net = hubFetch({ endpoint: env.HF_ENDPOINT, token, offline });
  const cache = hf.hfHubCache(root, { etagFor: net.etagFor });
  const repoDir = hf.hfRepoDir(root, repo);
  // The shared loader names huggingface.co URLs: say which host was really asked.
  const askedHost = (text: string) =>
    env.HF_ENDPOINT ? text.replaceAll('https://huggingface.co', env.HF_ENDPOINT.replace(/\/+$/, '')) : text;
  const snapshotList = (sha: string) => hf.snapshotFiles(join(repoDir, 'snapshots', sha)).catch(() => null);

  let resolved: HubRevision;
  if (offline) {
    const badRevision = (why: string) => new ModelLoadError(`${repo}@${revision}`, `not a revision name: ${why}`);
    const ref = join(repoDir, 'refs', ...checkRelativePath(revision, badRevision).split('/'));
    const sha = isCommitSha(revision) ? revision : (await readFile(ref, 'utf8').catch(() => '')).trim();
    const files = isCommitSha(sha) ? await snapshotList(sha) : null;
    if (!files)
      throw new ModelLoadError(
        `${repo}@${revision}`,
        `HF_HUB_OFFLINE is set and this revision is not in the Hugging Face cache ${root} (${
          isCommitSha(sha) ? `no folder ${join(repoDir, 'snapshots', sha)}` : `no commit in ${ref}`
        }): download it once online, or unset HF_HUB_OFFLINE`,
      );
    resolved = { repo, revision, sha, files };
  } else {
    try {
      resolved = await resolveHubRevision(repo, revision, { fetch: net.fetch, cache });
    } catch (e) {
      if (e instanceof Error) e.message = askedHost(e.message);
      if (e instanceof Error && e.message.includes('cached to use offline'))
        e.message += ` (Hugging Face cache ${root})`;
      throw hubError(e, repo, revision, token !== undefined, opts.localPath);
    }
    if (resolved.offline) log.write(`spyrl: warning: ${resolved.repo}: ${askedHost(resolved.offline)}\n`);
    // Hub unreachable: what the snapshot folder holds is the file list.
    if (!resolved.files) resolved = { ...resolved, files: await snapshotList(resolved.sha) };
  }
  return hubSource(repo, {
    resolved,
    fetch: net.fetch,
    cache,
    onProgress: progressPrinter(log, `${repo}@${resolved.sha.slice(0, 7)}`),
  });
}

/** The shared loader's "no such revision" error, in the CLI's terms (token, local folder). */
function hubError(e: unknown, repo: string, revision: string, withToken: boolean, localPath?: string): unknown {
  if (!(e instanceof ModelLoadError)) return e;
  const status = /HTTP (\d{3})/.exec(e.message)?.[1];
  if (status === '401' || status === '403') {
    const why = withToken
      ? 'the token (HF_TOKEN or the huggingface-cli login token file) does not give access to it'
      : 'a gated or private repo needs a token: set HF_TOKEN (or run huggingface-cli login) with access to it';
    return new ModelLoadError(`${repo}@${revision}`, `HTTP ${status} from the Hub: ${why}`);
  }
  if (status === '404' && localPath !== undefined)
    return new ModelLoadError(
      `${repo}@${revision}`,
      `HTTP 404 from the Hub: no such repo or revision (nor a local folder "${localPath}")`,
    );
  return e;
}

/** A local model folder, or a Hub repo `owner/name[@revision]` (kept for callers of the old name). */
export async function openModelOrRepo(spec: string, engine?: EngineOptions) {
  return openModel(spec, undefined, engine);
}

async function openModelSource(source: ModelSource, adapterDir?: string, engine?: EngineOptions) {
  if (adapterDir) await requireDir(adapterDir, 'adapter folder');
  const [{ createGpu }, { nodeFolderSource }, { loadQwen3WithTokenizer }] = await Promise.all([
    import('../gpu/index.ts'),
    import('../model/sources.node.ts'),
    import('../model/load.ts'),
  ]);
  const { resetTuning, tuningProblem } = await import('../ops/common.ts');
  resetTuning(engine?.kernels);
  const gpu = await createGpu();
  try {
    const problem = engine?.kernels ? tuningProblem(gpu, engine.kernels) : null;
    if (problem) throw new UsageError(`--kernels: ${problem}`);
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
