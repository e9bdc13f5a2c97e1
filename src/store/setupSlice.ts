// Config and documents slices: what a run will be started with.
import type { StateCreator } from 'zustand';
import { DEFAULT_CONFIG, type SpyRLConfig } from '../game/config.ts';
import {
  checkDocumentSize,
  parseDocuments,
  readDocumentFile,
  splitGovReport,
  DEFAULT_HELD_OUT,
  type DocumentSplit,
  type SpyDocument,
} from '../game/documents.ts';
import { configFromDraft, draftFromConfig, PRESETS, type ConfigDraft } from './configForm.ts';
import { errorMessage } from '../worker/protocol.ts';
import type { AppState, StoreDeps } from './store.ts';

export interface ConfigSlice {
  draft: ConfigDraft;
  /** The draft validated (validateConfig): a config, or the field that is wrong and why. */
  configResult: { config: SpyRLConfig | null; error: { field: string; message: string } | null };
  setField(path: string, value: string | string[]): void;
  applyPreset(name: keyof typeof PRESETS): void;
  setConfig(cfg: SpyRLConfig): void;
}

export interface DocumentsSlice {
  bundled: DocumentSplit | null;
  useBundled: boolean;
  custom: SpyDocument[];
  docsError: string | null;
  /** One line per file whose bytes were not all valid UTF-8 (the file was still added). */
  docsWarnings: string[];
  loadBundled(): Promise<void>;
  setUseBundled(on: boolean): void;
  addPasted(title: string, text: string): boolean;
  addFiles(files: File[]): Promise<void>;
  removeCustom(id: string): void;
}

export const createConfigSlice: StateCreator<AppState, [], [], ConfigSlice> = (set, get) => ({
  draft: draftFromConfig(DEFAULT_CONFIG),
  configResult: { config: DEFAULT_CONFIG, error: null },
  setField(path, value) {
    const draft = { ...get().draft, [path]: value };
    set({ draft, configResult: configFromDraft(draft, DEFAULT_CONFIG) });
  },
  applyPreset(name) {
    get().setConfig(PRESETS[name]!.config);
  },
  setConfig(cfg) {
    const draft = draftFromConfig(cfg);
    set({ draft, configResult: configFromDraft(draft, cfg) });
  },
});

/** The bundled sample split with the settings' held-out count (evalHeldOut; splitGovReport). */
function bundledSplit(s: AppState): DocumentSplit | null {
  const b = s.bundled;
  const heldOut = s.configResult.config?.evalHeldOut ?? DEFAULT_HELD_OUT;
  return b?.all && b.eval.length !== heldOut ? splitGovReport(b.all, heldOut) : b;
}

/** Training documents of the next run: the bundled sample's training split and the user's own. */
export function selectTrainDocs(s: AppState): SpyDocument[] {
  return [...(s.useBundled && s.bundled ? bundledSplit(s)!.train : []), ...s.custom];
}

/** Held-out reports with reference summaries (never played): the bundled sample's held-out split. */
export function selectEvalDocs(s: AppState): SpyDocument[] {
  return bundledSplit(s)?.eval ?? [];
}

function uniqueId(taken: Set<string>, id: string): string {
  if (!taken.has(id)) return id;
  let k = 2;
  while (taken.has(`${id} (${k})`)) k++;
  return `${id} (${k})`;
}

export const createDocumentsSlice =
  (deps: StoreDeps): StateCreator<AppState, [], [], DocumentsSlice> =>
  (set, get) => {
    const addDocs = (docs: SpyDocument[]) => {
      const taken = new Set([...get().custom.map((d) => d.id), ...(get().bundled?.train ?? []).map((d) => d.id)]);
      const added = docs.map((d) => {
        const id = uniqueId(taken, d.id);
        taken.add(id);
        return { ...d, id };
      });
      set({ custom: [...get().custom, ...added], docsError: null });
    };
    /** Size cap first (File.size, before reading), then the same decoding and parsing as the CLI's --docs. */
    const readFile = async (f: File): Promise<{ docs: SpyDocument[]; warning: string | null }> => {
      checkDocumentSize(f.size, f.name);
      return readDocumentFile(new Uint8Array(await f.arrayBuffer()), f.name);
    };
    return {
      bundled: null,
      useBundled: true,
      custom: [],
      docsError: null,
      docsWarnings: [],
      async loadBundled() {
        try {
          set({ bundled: await deps.loadBundledDocuments() });
        } catch (e) {
          set({ docsError: errorMessage(e), useBundled: false });
        }
      },
      setUseBundled: (on) => set({ useBundled: on }),
      addPasted(title, text) {
        const name = (title.trim() || `pasted-${get().custom.length + 1}`).replace(/\.(txt|md)$/i, '');
        try {
          addDocs(parseDocuments(text, `${name}.txt`)); // refuses a paste over the 20 MB cap too
          set({ docsWarnings: [] });
          return true;
        } catch (e) {
          set({ docsError: errorMessage(e) });
          return false;
        }
      },
      async addFiles(files) {
        try {
          const docs: SpyDocument[] = [];
          const warnings: string[] = [];
          for (const f of files) {
            const r = await readFile(f);
            docs.push(...r.docs);
            if (r.warning) warnings.push(r.warning);
          }
          addDocs(docs); // all files or none: one bad file adds nothing and removes nothing
          set({ docsWarnings: warnings });
        } catch (e) {
          set({ docsError: errorMessage(e) });
        }
      },
      removeCustom: (id) => set({ custom: get().custom.filter((d) => d.id !== id) }),
    };
  };
