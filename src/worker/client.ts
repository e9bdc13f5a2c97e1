// The UI's handle on the engine worker: a typed comlink proxy. Callbacks passed to it must be
// wrapped with `callback()` so they run on this side.
import * as Comlink from 'comlink';
import type { PlaygroundEngine } from './engine.ts';
import { registerErrorTransfer } from './errors.ts';
import { watchWorker } from './tokenizerWatch.ts';

// Errors thrown in the worker arrive typed (EngineError with `kind`, e.g. 'device-lost').
registerErrorTransfer();

export type EngineApi = Comlink.Remote<PlaygroundEngine>;

const stopListeners = new Set<(message: string) => void>();
let stoppedMessage: string | null = null;

/** Called once if the tokenizer watchdog stops the engine worker (immediately when it already has). */
export function onEngineStopped(listener: (message: string) => void): () => void {
  if (stoppedMessage !== null) listener(stoppedMessage);
  stopListeners.add(listener);
  return () => stopListeners.delete(listener);
}

export function startEngineWorker(): { api: EngineApi; terminate: () => void } {
  const worker = new Worker(new URL('./engine.worker.ts', import.meta.url), { type: 'module', name: 'spyrl-engine' });
  watchWorker(worker, (message) => {
    stoppedMessage = message;
    for (const l of stopListeners) l(message);
  });
  return { api: Comlink.wrap<PlaygroundEngine>(worker), terminate: () => worker.terminate() };
}

export const callback = Comlink.proxy;
