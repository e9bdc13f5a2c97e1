// The autosaved run in browser storage (OPFS): the trainer's checkpoint files plus meta.json,
// written last so that a meta.json on disk always describes a complete save.
import type { SavedRunMeta } from './protocol.ts';

export type RunFiles = Record<string, Uint8Array | string>;

export interface RunStorage {
  save(files: RunFiles, meta: Omit<SavedRunMeta, 'files'>): Promise<SavedRunMeta>;
  meta(): Promise<SavedRunMeta | null>;
  /** The files of the save, checked against the sizes meta.json lists. */
  files(): Promise<RunFiles>;
  clear(): Promise<void>;
}

const META = 'meta.json';

/**
 * Web Lock around every read and write of the autosave: two tabs of the app share one OPFS
 * folder, and a save interleaved with another tab's save or resume would mix two runs. Saves
 * and clears are exclusive, reads shared. (The tab that owns the run also holds RUN_OWNER_LOCK,
 * src/store/tabLock.ts, so a second tab does not save at all.)
 */
export const AUTOSAVE_LOCK = 'spyrl-autosave';

function withAutosaveLock<T>(mode: LockMode, fn: () => Promise<T>): Promise<T> {
  const locks = (globalThis as { navigator?: { locks?: LockManager } }).navigator?.locks;
  return locks ? (locks.request(AUTOSAVE_LOCK, { mode }, fn) as Promise<T>) : fn(); // request resolves to the callback's result
}
const encoder = new TextEncoder();

function bytesOf(x: Uint8Array | string): Uint8Array {
  return typeof x === 'string' ? encoder.encode(x) : x;
}

/** Files saved as text come back as text (JSON, JSONL, Markdown); the rest as bytes. */
function isTextFile(name: string): boolean {
  return /\.(json|jsonl|md|txt)$/.test(name);
}

export function memoryRunStorage(): RunStorage {
  let saved: { files: RunFiles; meta: SavedRunMeta } | null = null;
  return {
    async save(files, partial) {
      const meta: SavedRunMeta = {
        ...partial,
        files: Object.entries(files).map(([name, f]) => ({ name, size: bytesOf(f).byteLength })),
      };
      saved = { files: { ...files }, meta: structuredClone(meta) };
      return meta;
    },
    meta: async () => (saved ? structuredClone(saved.meta) : null),
    async files() {
      if (!saved) throw new Error('no autosaved run');
      return { ...saved.files };
    },
    clear: async () => void (saved = null),
  };
}

export function opfsRunStorage(dirName = 'spyrl-autosave'): RunStorage {
  const root = async () => (await navigator.storage.getDirectory()).getDirectoryHandle(dirName, { create: true });
  const write = async (dir: FileSystemDirectoryHandle, name: string, data: Uint8Array) => {
    const w = await (await dir.getFileHandle(name, { create: true })).createWritable();
    await w.write(data as Uint8Array<ArrayBuffer>);
    await w.close();
  };
  const readMeta = async (): Promise<SavedRunMeta | null> => {
    try {
      const file = await (await (await root()).getFileHandle(META)).getFile();
      return JSON.parse(await file.text()) as SavedRunMeta;
    } catch {
      return null;
    }
  };
  return {
    save: (files, partial) => withAutosaveLock('exclusive', () => save(files, partial)),
    meta: () => withAutosaveLock('shared', readMeta),
    files: () => withAutosaveLock('shared', readFiles),
    clear: () => withAutosaveLock('exclusive', clear),
  };

  async function save(files: RunFiles, partial: Omit<SavedRunMeta, 'files'>): Promise<SavedRunMeta> {
    const dir = await root();
    // Drop the old index first: a crash mid-save then leaves no save rather than a mixed one.
    await dir.removeEntry(META).catch(() => undefined);
    const listed: SavedRunMeta['files'] = [];
    for (const [name, f] of Object.entries(files)) {
      const bytes = bytesOf(f);
      await write(dir, name, bytes);
      listed.push({ name, size: bytes.byteLength });
    }
    const meta: SavedRunMeta = { ...partial, files: listed };
    await write(dir, META, encoder.encode(JSON.stringify(meta)));
    return meta;
  }

  async function readFiles(): Promise<RunFiles> {
    const meta = await readMeta();
    if (!meta) throw new Error('no autosaved run');
    const dir = await root();
    const out: RunFiles = {};
    for (const { name, size } of meta.files) {
      const file = await (await dir.getFileHandle(name)).getFile();
      if (file.size !== size)
        throw new Error(`autosave: ${name} has ${file.size} bytes, expected ${size} (the save is damaged)`);
      out[name] = isTextFile(name) ? await file.text() : new Uint8Array(await file.arrayBuffer());
    }
    return out;
  }

  async function clear(): Promise<void> {
    const storage = await navigator.storage.getDirectory();
    await storage.removeEntry(dirName, { recursive: true }).catch(() => undefined);
  }
}

/** OPFS where the browser has it, else memory (Node tests). */
export function defaultRunStorage(): RunStorage {
  const g = globalThis as { navigator?: Navigator };
  return typeof g.navigator?.storage?.getDirectory === 'function' ? opfsRunStorage() : memoryRunStorage();
}
