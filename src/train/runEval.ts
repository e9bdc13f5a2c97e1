// The one held-out evaluation of a policy, for every front end: SpyRLTrainer.evaluate (the
// periodic eval, Run.evaluate and so the app's compare view) and `spyrl eval`. Columns: the base
// model (the policy's adapter switched off), the adapter, and optionally another system (a
// checkpoint of the same architecture); scoring is src/train/evaluate.ts's evaluateHeldOut.
import type { SpyDocument } from '../game/documents.ts';
import type { Qwen3Tokenizer } from '../model/tokenizer.ts';
import { evaluateHeldOut, type EvalConfig, type EvalProgress, type EvalReport, type EvalSystem } from './evaluate.ts';
import type { GpuPolicy } from './policy.ts';

export interface PolicyEvalOptions {
  /** Generates the summaries; its model's adapter (model.lora) is the adapter column. */
  policy: GpuPolicy;
  tokenizer: Qwen3Tokenizer;
  config: EvalConfig;
  docs: readonly SpyDocument[];
  /** Column labels; `adapter` undefined: no adapter column (e.g. `spyrl eval` without --adapter). */
  labels: { base: string; adapter?: string };
  /** A third column, e.g. another checkpoint on its own device. */
  compare?: EvalSystem;
  onProgress?: (p: EvalProgress) => void;
}

/** Greedy summaries of the held-out reports from the base model, the adapter and `compare`, scored. */
export async function evaluatePolicy(o: PolicyEvalOptions): Promise<EvalReport> {
  const { policy } = o;
  const model = policy.model;
  if (o.labels.adapter !== undefined && !model.lora) throw new Error('an adapter column needs a model with an adapter');
  const generate: EvalSystem['generate'] = (p, g) => policy.generate(p, g);
  const base: EvalSystem = {
    key: 'base',
    label: o.labels.base,
    generate,
    around: async (job) => {
      const lora = model.lora;
      if (lora) lora.enabled = false;
      try {
        return await job();
      } finally {
        if (lora) lora.enabled = true;
      }
    },
  };
  const systems = [base];
  if (o.labels.adapter !== undefined) systems.push({ key: 'adapter', label: o.labels.adapter, generate });
  if (o.compare) systems.push(o.compare);
  // Evaluation summaries are not the game's: keep them off the live summary stream.
  const onDelta = policy.hooks.onDelta;
  policy.hooks.onDelta = undefined;
  try {
    return await evaluateHeldOut({
      docs: o.docs,
      tokenizer: o.tokenizer,
      config: o.config,
      systems,
      onProgress: o.onProgress,
    });
  } finally {
    policy.hooks.onDelta = onDelta;
  }
}
