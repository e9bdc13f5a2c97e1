// Node-only sources: a checkpoint folder on disk, and a folder-backed hub cache.
import { openAsBlob } from 'node:fs';
import { open as openFile, readFile, readdir, stat, mkdir, rm, rename } from 'node:fs/promises';
import { join, relative, sep, dirname } from 'node:path';
import { randomBytes } from 'node:crypto';
import { ModelLoadError } from './errors.ts';
import { checkRelativePath } from './paths.ts';
import type { ByteSource } from './safetensors.ts';
import type { HubCache, ModelSource } from './sources.ts';

/** Ranged reads through a FileHandle opened per read, so no descriptor outlives a call. */
export async function nodeFileSource(path: string, name = path): Promise<ByteSource> {
  const size = (await stat(path)).size;
  return {
    name,
    size,
    async read(offset, length) {
      if (offset < 0 || length < 0 || offset + length > size) {
        throw new ModelLoadError(
          name,
          `read of ${length} bytes at offset ${offset} is past the end of the file (${size} bytes): file truncated?`,
        );
      }
      const out = new Uint8Array(length);
      const fh = await openFile(path, 'r');
      try {
        let done = 0;
        while (done < length) {
          const { bytesRead } = await fh.read(out, done, length - done, offset + done);
          if (bytesRead === 0)
            throw new ModelLoadError(name, `short read at offset ${offset + done}: file shrank while reading?`);
          done += bytesRead;
        }
      } finally {
        await fh.close();
      }
      return out;
    },
  };
}

async function walk(dir: string, root: string, out: string[]): Promise<void> {
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) await walk(p, root, out);
    else if (e.isFile()) out.push(relative(root, p).split(sep).join('/'));
  }
}

export function nodeFolderSource(dir: string): ModelSource {
  // Names come from index files and manifests: none may step outside `dir`.
  const path = (file: string) =>
    join(
      dir,
      ...checkRelativePath(file, (why) => new ModelLoadError(file, `not a file inside ${dir}: ${why}`)).split('/'),
    );
  const missing = (file: string, e: unknown): never => {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new ModelLoadError(file, `not found in ${dir}`);
    throw e;
  };
  return {
    name: dir,
    async list() {
      const out: string[] = [];
      await walk(dir, dir, out);
      return out.sort();
    },
    open: async (file) => nodeFileSource(path(file), file).catch((e) => missing(file, e)),
    readText: async (file) => readFile(path(file), 'utf8').catch((e) => missing(file, e)),
    exists: async (file) =>
      stat(path(file)).then(
        (s) => s.isFile(),
        () => false,
      ),
  };
}

/** A download in progress: `${final}.part-<16 hex>`, so two writers of one key never share a file. */
const PART = '.part';
const isPart = (file: string) => /\.part-[0-9a-f]{16}$/.test(file);

/**
 * Hub cache for Node: files under `dir`. Each writer streams into its own temporary file and
 * renames it over the key on completion, so an abort (or a second process downloading the same
 * file) removes only its own partial file, never a finished entry.
 */
export function nodeFolderHubCache(dir: string): HubCache {
  const path = (key: string) =>
    join(dir, ...checkRelativePath(key, (why) => new ModelLoadError(key, `not a valid cache key: ${why}`)).split('/'));
  return {
    kind: 'node-folder',
    async get(key) {
      try {
        return await openAsBlob(path(key)); // file-backed: nothing is read until sliced
      } catch {
        return null;
      }
    },
    async create(key) {
      const final = path(key);
      const part = `${final}${PART}-${randomBytes(8).toString('hex')}`;
      await mkdir(dirname(final), { recursive: true });
      const fh = await openFile(part, 'w');
      return {
        write: async (chunk) => void (await fh.write(chunk)),
        close: async () => {
          await fh.close();
          await rename(part, final);
        },
        abort: async () => {
          await fh.close().catch(() => undefined);
          await rm(part, { force: true });
        },
      };
    },
    async entries() {
      const files: string[] = [];
      await walk(dir, dir, files).catch(() => undefined);
      const out: { key: string; size: number }[] = [];
      for (const key of files) if (!isPart(key)) out.push({ key, size: (await stat(path(key))).size });
      return out;
    },
    async delete(key) {
      await rm(path(key), { force: true });
    },
  };
}
