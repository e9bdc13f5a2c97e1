// The Hugging Face cache as huggingface_hub lays it out, behind the shared loader's HubCache
// interface, so `spyrl` reuses what `huggingface_hub` downloaded and `huggingface_hub` reuses
// what `spyrl` downloaded:
//   $HF_HUB_CACHE (or $HF_HOME/hub, or ~/.cache/huggingface/hub)
//     models--{owner}--{name}/
//       blobs/<etag>                   the bytes (etag: sha256 for LFS files, git blob sha1 else)
//       snapshots/<commit sha>/<file>  a relative symlink to ../../blobs/<etag> (a copy where
//                                      symlinks fail)
//       refs/<revision>                the commit sha the branch or tag last resolved to
import { createHash, randomBytes } from 'node:crypto';
import { openAsBlob } from 'node:fs';
import {
  copyFile,
  mkdir,
  open as openFile,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  symlink,
  writeFile,
} from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { ModelLoadError } from '../model/errors.ts';
import { checkRelativePath } from '../model/paths.ts';
import { checkRepoId, isCommitSha, type CacheWriter, type HubCache } from '../model/sources.ts';

type Env = Record<string, string | undefined>;

/** huggingface_hub's defaults: HF_HUB_CACHE, else HF_HOME/hub, HF_HOME defaulting to $XDG_CACHE_HOME/huggingface. */
export function hfHome(env: Env = process.env): string {
  return env.HF_HOME || join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'huggingface');
}

export function hfHubCacheDir(env: Env = process.env): string {
  return env.HF_HUB_CACHE || env.HUGGINGFACE_HUB_CACHE || join(hfHome(env), 'hub');
}

/** HF_HUB_OFFLINE as huggingface_hub reads it (1, ON, YES, TRUE). */
export function hfOffline(env: Env = process.env): boolean {
  return ['1', 'ON', 'YES', 'TRUE'].includes((env.HF_HUB_OFFLINE ?? '').toUpperCase());
}

/** HF_TOKEN, else the token file `huggingface-cli login` writes (HF_TOKEN_PATH, default $HF_HOME/token). */
export async function hfToken(env: Env = process.env): Promise<string | undefined> {
  const fromEnv = env.HF_TOKEN || env.HUGGING_FACE_HUB_TOKEN;
  if (fromEnv) return fromEnv.trim();
  const file = env.HF_TOKEN_PATH || join(hfHome(env), 'token');
  const text = await readFile(file, 'utf8').catch(() => '');
  return text.trim() || undefined;
}

/** `models--{owner}--{name}` under the cache root. */
export function hfRepoDir(root: string, repo: string): string {
  return join(root, `models--${checkRepoId(repo).replace('/', '--')}`);
}

/** `W/"abc"` -> `abc`, as huggingface_hub normalizes an ETag before naming a blob after it. */
export function normalizeEtag(etag: string | null): string | null {
  if (!etag) return null;
  const e = etag.replace(/^W\//, '').replace(/^"|"$/g, '');
  return /^[A-Za-z0-9._-]{1,128}$/.test(e) ? e : null;
}

/** Every file below a snapshot folder (symlinks to blobs included), as repo-relative names. */
export async function snapshotFiles(dir: string, prefix = ''): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const name = prefix + e.name;
    const s = await stat(join(dir, e.name)).catch(() => null); // follows the link; a dangling one is skipped
    if (s?.isDirectory()) out.push(...(await snapshotFiles(join(dir, e.name), `${name}/`)));
    else if (s?.isFile()) out.push(name);
  }
  return out.sort();
}

interface Key {
  repo: string;
  /** A snapshot file at a commit, or the commit a revision points at (refs/). */
  kind: 'file' | 'ref' | 'other';
  sha: string;
  revision: string;
  file: string;
}

/** The shared loader's keys: `{repo}/{sha}/{file}`, `{repo}/{revision}+meta/sha`, others (listings, q4). */
function parseKey(key: string): Key {
  const [owner = '', name = '', rev = '', ...rest] = key.split('/');
  const repo = checkRepoId(`${owner}/${name}`);
  const file = rest.join('/');
  if (isCommitSha(rev) && file !== '') return { repo, kind: 'file', sha: rev, revision: rev, file };
  if (rev.endsWith('+meta') && file === 'sha') {
    const revision = decodeURIComponent(rev.slice(0, -'+meta'.length));
    checkRelativePath(revision, (why) => new ModelLoadError(revision, `not a revision name for refs/: ${why}`));
    return { repo, kind: 'ref', sha: '', revision, file };
  }
  return { repo, kind: 'other', sha: '', revision: rev, file };
}

const tempName = (path: string) => `${path}.spyrl-${randomBytes(8).toString('hex')}.incomplete`;

async function writeAtomically(path: string, bytes: Uint8Array | string): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const tmp = tempName(path);
  try {
    await writeFile(tmp, bytes);
    await rename(tmp, path);
  } catch (e) {
    await rm(tmp, { force: true });
    throw e;
  }
}

/** Points `link` at `target` with a relative symlink (replacing what was there), or a copy where symlinks fail. */
async function linkInto(target: string, link: string): Promise<void> {
  await mkdir(dirname(link), { recursive: true });
  const tmp = tempName(link);
  try {
    try {
      await symlink(relative(dirname(link), target), tmp);
    } catch {
      await copyFile(target, tmp); // a file system without symlinks (huggingface_hub does the same)
    }
    await rename(tmp, link);
  } catch (e) {
    await rm(tmp, { force: true });
    throw e;
  }
}

export interface HfHubCacheOptions {
  /** The blob name for a snapshot key, from the Hub's X-Linked-Etag / ETag of that download. */
  etagFor?: (key: string) => string | null;
}

/**
 * The shared loader's cache (src/model/sources.ts HubCache) stored in the Hugging Face layout.
 * Only snapshot files and refs are stored; the loader's other entries (its copy of the file
 * list, quantized weights) are not kept: the list is asked from the Hub again, or read from the
 * snapshot folder when offline (open.ts).
 */
export function hfHubCache(root: string, opts: HfHubCacheOptions = {}): HubCache {
  const repoDir = (repo: string) => hfRepoDir(root, repo);
  const snapshotPath = (k: Key) =>
    join(
      repoDir(k.repo),
      'snapshots',
      k.sha,
      ...checkRelativePath(
        k.file,
        (why) => new ModelLoadError(k.file, `not a file name inside ${k.repo}: ${why}`),
      ).split('/'),
    );
  const refPath = (k: Key) => join(repoDir(k.repo), 'refs', ...k.revision.split('/'));

  const fileWriter = async (key: string, k: Key): Promise<CacheWriter> => {
    const blobs = join(repoDir(k.repo), 'blobs');
    await mkdir(blobs, { recursive: true });
    const tmp = join(blobs, `spyrl-${randomBytes(8).toString('hex')}.incomplete`);
    const fh = await openFile(tmp, 'w');
    const sha256 = createHash('sha256');
    let closed = false;
    return {
      async write(chunk) {
        sha256.update(chunk);
        await fh.write(chunk);
      },
      async close() {
        await fh.close();
        closed = true;
        const digest = sha256.digest('hex');
        const etag = normalizeEtag(opts.etagFor?.(key) ?? null) ?? digest;
        // An LFS file's ETag is the sha256 of its bytes: a mismatch is a corrupt download.
        if (/^[0-9a-f]{64}$/.test(etag) && etag !== digest) {
          await rm(tmp, { force: true });
          throw new ModelLoadError(k.file, `downloaded bytes have sha256 ${digest}, the Hub's ETag says ${etag}`);
        }
        const blob = join(blobs, etag);
        if (await stat(blob).catch(() => null)) await rm(tmp, { force: true });
        else await rename(tmp, blob);
        await linkInto(blob, snapshotPath(k));
      },
      async abort() {
        if (!closed) await fh.close().catch(() => undefined);
        await rm(tmp, { force: true });
      },
    };
  };

  const textWriter = (commit: (text: string) => Promise<void>): CacheWriter => {
    const chunks: Uint8Array[] = [];
    return {
      write: async (chunk) => void chunks.push(chunk.slice()),
      close: async () => commit(Buffer.concat(chunks).toString('utf8')),
      abort: async () => void (chunks.length = 0),
    };
  };

  return {
    kind: `huggingface cache ${root}`,
    async get(key) {
      const k = parseKey(key);
      try {
        if (k.kind === 'file') {
          const path = snapshotPath(k);
          return (await stat(path)).isFile() ? await openAsBlob(path) : null;
        }
        if (k.kind === 'ref') return new Blob([await readFile(refPath(k))]);
      } catch {
        return null;
      }
      return null;
    },
    async create(key) {
      const k = parseKey(key);
      if (k.kind === 'file') return fileWriter(key, k);
      // huggingface_hub keeps the ref as the bare sha, no newline.
      if (k.kind === 'ref') return textWriter((text) => writeAtomically(refPath(k), text.trim()));
      return textWriter(async () => undefined); // not kept (see above)
    },
    async entries() {
      const out: { key: string; size: number }[] = [];
      for (const dir of await readdir(root).catch(() => [] as string[])) {
        if (!dir.startsWith('models--')) continue;
        const repo = dir.slice('models--'.length).replace('--', '/');
        const snaps = join(root, dir, 'snapshots');
        for (const sha of await readdir(snaps).catch(() => [] as string[])) {
          if (!isCommitSha(sha)) continue;
          for (const file of await snapshotFiles(join(snaps, sha)).catch(() => [] as string[]))
            out.push({ key: `${repo}/${sha}/${file}`, size: (await stat(join(snaps, sha, file))).size });
        }
      }
      return out;
    },
    async delete(key) {
      const k = parseKey(key);
      if (k.kind === 'file')
        await rm(snapshotPath(k), { force: true }); // the blob may be shared
      else if (k.kind === 'ref') await rm(refPath(k), { force: true });
    },
  };
}
