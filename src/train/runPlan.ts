// The one memory plan of a SpyRL run, for every front end: `spyrl train` (through Run.create),
// the worker engine (Run.create again, at run start) and the app's check before loading
// (src/store/modelSlice.ts). Pure: no GPU, so the store and the UI may import it.
import type { Qwen3Config } from '../model/config.ts';
import type { SpyRLConfig } from '../game/config.ts';
import type { SpyDocument } from '../game/documents.ts';
import { planMemory, type AdapterLimits, type EngineFormat, type MemoryCheck, type RunShape } from './memory.ts';

export type { AdapterLimits, EngineFormat, MemoryCheck };

/** The config fields the plan reads: the round's shape and when and what it evaluates. */
export type RunPlanConfig = RunShape & Pick<SpyRLConfig, 'evalEvery' | 'evalHeldOut'>;

/**
 * Held-out reports an evaluation of the run summarises: those with a reference, and none when
 * the run never evaluates (evalEvery 0). Without the documents (the app before loading), the
 * split the run will make: evalHeldOut reports of the bundled sample.
 */
export function evalDocCount(config: RunPlanConfig, evalDocs?: readonly SpyDocument[]): number {
  if (config.evalEvery <= 0) return 0;
  return evalDocs ? evalDocs.filter((d) => d.summary).length : config.evalHeldOut;
}

/**
 * The round's plan (src/train/memory.ts planRound) of `config` on `cfg` in `format`, checked
 * against the adapter's limits (blocking: loading or the run would fail) and then against the
 * user's GPU memory `budgetBytes` (WebGPU does not report it). `evalDocs` is evalDocCount's;
 * `forwardChunk` the prefill's tokens per chunk and `mlpChunk` the update's MLP rows per chunk
 * (RoundPlanOptions.forwardChunk and mlpChunk, 'auto' by default).
 */
export function planRunMemory(
  cfg: Qwen3Config,
  config: RunPlanConfig,
  limits: AdapterLimits,
  budgetBytes: number | undefined,
  format: EngineFormat,
  evalDocs: number = evalDocCount(config),
  forwardChunk: number | 'auto' = 'auto',
  mlpChunk: number | 'auto' = 'auto',
): MemoryCheck {
  return planMemory(cfg, config, limits, budgetBytes, format, { evalDocs, forwardChunk, mlpChunk });
}
