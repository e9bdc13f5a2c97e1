// The UI's handle on the engine worker: a typed comlink proxy. Callbacks passed to it must be
// wrapped with `callback()` so they run on this side.
import * as Comlink from 'comlink';
import type { PlaygroundEngine } from './engine.ts';

export type EngineApi = Comlink.Remote<PlaygroundEngine>;

export function startEngineWorker(): { api: EngineApi; terminate: () => void } {
  const worker = new Worker(new URL('./engine.worker.ts', import.meta.url), { type: 'module', name: 'spyrl-engine' });
  return { api: Comlink.wrap<PlaygroundEngine>(worker), terminate: () => worker.terminate() };
}

export const callback = Comlink.proxy;
