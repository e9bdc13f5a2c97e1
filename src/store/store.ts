// The app's one store, built from slices (model, config + documents, run with rounds and
// metrics). The engine is injected: the worker proxy in the app, a plain object in tests.
import { createStore, type StoreApi } from 'zustand/vanilla';
import type { DocumentSplit } from '../game/documents.ts';
import type { EngineApi } from '../worker/client.ts';
import { createEvalSlice, type EvalSlice } from './evalSlice.ts';
import { createModelSlice, type ModelSlice } from './modelSlice.ts';
import { createRunSlice, type RunSlice } from './runSlice.ts';
import { createConfigSlice, createDocumentsSlice, type ConfigSlice, type DocumentsSlice } from './setupSlice.ts';

export type AppState = ModelSlice & ConfigSlice & DocumentsSlice & RunSlice & EvalSlice;
export type AppStore = StoreApi<AppState>;

export interface StoreDeps {
  engine: EngineApi;
  /** Marks a function passed to the engine as a callback (comlink.proxy across the worker). */
  callback: <F extends (...args: never[]) => unknown>(fn: F) => F;
  hasWebGpu: boolean;
  loadBundledDocuments: () => Promise<DocumentSplit>;
  saveFile: (name: string, blob: Blob) => void;
}

export function createAppStore(deps: StoreDeps): AppStore {
  return createStore<AppState>()((...a) => ({
    ...createModelSlice(deps)(...a),
    ...createConfigSlice(...a),
    ...createDocumentsSlice(deps)(...a),
    ...createRunSlice(deps)(...a),
    ...createEvalSlice(deps)(...a),
  }));
}
