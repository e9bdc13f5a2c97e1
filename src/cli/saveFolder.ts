// Node-only: output folders of the CLI. A non-empty --out is refused unless --force, and every
// save (tiny model, sft adapter, train checkpoint-N and final folder) is written whole into a
// temporary sibling folder and renamed into place, so a crash mid-save leaves the previous
// folder as it was: never a new adapter beside an old optimizer, never a stale shard index.
import { randomBytes } from 'node:crypto';
import { mkdir, open, readdir, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { UsageError } from './args.ts';

/** A file's content: whole, or as consecutive pieces (a file too large to hold in memory). */
export type FileData = string | Uint8Array | AsyncIterable<Uint8Array>;
export type FolderFiles = Readonly<Record<string, FileData>>;

/** Refuses an --out that exists and is not an empty folder, unless `force`. */
export async function checkOutDir(dir: string, force: boolean, flag = '--out'): Promise<void> {
  const s = await stat(dir).catch(() => null);
  if (!s) return;
  if (!s.isDirectory()) throw new UsageError(`${flag} ${dir} is a file, not a folder`);
  const entries = await readdir(dir);
  if (entries.length === 0 || force) return;
  const shown = entries.slice(0, 5).join(', ') + (entries.length > 5 ? `, ... (${entries.length} entries)` : '');
  throw new UsageError(`${flag} ${dir} is not empty (${shown}); pass --force to replace it, or choose a new folder`);
}

export interface SaveFolderOptions {
  /** Entries of the existing folder to carry over into the new one (e.g. this run's checkpoint-N folders). */
  keep?: readonly string[];
  /** Writes one file; tests inject a failure here to prove a crash mid-save loses nothing. */
  writeFile?: (path: string, data: FileData) => Promise<void>;
}

/** Writes and fsyncs one file, so the rename below never publishes data still in the page cache. */
async function durableWrite(path: string, data: FileData): Promise<void> {
  const fh = await open(path, 'wx');
  try {
    if (typeof data === 'string' || data instanceof Uint8Array) await fh.writeFile(data);
    else
      for await (const piece of data) {
        // A write may take fewer bytes than it was given: loop until the piece is all out.
        for (let off = 0; off < piece.byteLength;)
          off += (await fh.write(piece, off, piece.byteLength - off)).bytesWritten;
      }
    await fh.sync();
  } finally {
    await fh.close();
  }
}

async function syncDir(dir: string): Promise<void> {
  const fh = await open(dir, 'r').catch(() => null); // not every platform opens folders
  if (!fh) return;
  try {
    await fh.sync();
  } catch {
    /* best effort */
  } finally {
    await fh.close();
  }
}

function checkName(name: string): void {
  if (!name || name === '.' || name === '..' || name.includes('/') || name.includes('\\') || name.includes('\0')) {
    throw new Error(
      `refusing to write the file name ${JSON.stringify(name)}: only plain file names are allowed in a saved folder`,
    );
  }
}

/**
 * Replaces `dir` with a folder holding exactly `files` (plus the `keep` entries of the old one).
 * The files go to `<dir>.partial-<tag>` first; only when all are written is the old folder moved
 * to `<dir>.old-<tag>`, the new one renamed to `dir`, and the old one deleted. A failure while
 * writing removes the partial folder and leaves `dir` untouched.
 */
export async function saveFolder(dir: string, files: FolderFiles, opts: SaveFolderOptions = {}): Promise<void> {
  const target = resolve(dir);
  await mkdir(dirname(target), { recursive: true });
  const tag = `${process.pid}-${randomBytes(4).toString('hex')}`;
  const tmp = join(dirname(target), `${basename(target)}.partial-${tag}`);
  await mkdir(tmp);
  try {
    const write = opts.writeFile ?? durableWrite;
    for (const [name, content] of Object.entries(files)) {
      checkName(name);
      await write(join(tmp, name), content);
    }
    await syncDir(tmp);
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    throw e;
  }
  const existing = await stat(target).catch(() => null);
  if (!existing) {
    await rename(tmp, target);
    await syncDir(dirname(target));
    return;
  }
  for (const name of opts.keep ?? []) {
    if (name in files) continue;
    await rename(join(target, name), join(tmp, name)).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'ENOENT') throw e;
    });
  }
  const old = join(dirname(target), `${basename(target)}.old-${tag}`);
  await rename(target, old);
  await rename(tmp, target);
  await syncDir(dirname(target));
  await rm(old, { recursive: true, force: true });
}
