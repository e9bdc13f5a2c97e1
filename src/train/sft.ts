// Supervised LoRA fine-tuning on plain text: next-token cross-entropy over windows of the
// tokenized text, gradient accumulation over `batch` windows per optimizer step.
import { TrainingPass, type TrainingPassOptions } from './trainingPass.ts';
import type { LoraAdapter } from '../model/lora.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import type { LoraAdamW, StepReport } from './optimizer.ts';
import { crossEntropyLoss } from './pgLoss.ts';
import { mulberry32 } from '../model/prng.ts';

/** Consecutive windows of `seqLen` tokens (a last, shorter window kept when it has 2+ tokens). */
export function packSequences(ids: readonly number[], seqLen: number): number[][] {
  if (!Number.isInteger(seqLen) || seqLen < 2) throw new RangeError(`sequence length must be >= 2 (got ${seqLen})`);
  const out: number[][] = [];
  for (let i = 0; i < ids.length; i += seqLen) {
    const w = ids.slice(i, i + seqLen);
    if (w.length >= 2) out.push(w);
  }
  return out;
}

/** Seeded order of the windows for one epoch (mulberry32 Fisher-Yates). */
export function epochOrder(n: number, seed: number, epoch: number): number[] {
  const rand = mulberry32(seed * 0x9e3779b1 + epoch * 0x85ebca6b);
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

/** Mean next-token cross-entropy of one window under the current adapter (no gradient). */
export async function sequenceLoss(model: Qwen3Model, lora: LoraAdapter, ids: readonly number[]): Promise<number> {
  const pass = new TrainingPass(model, lora, ids, [...ids.slice(1), -1], null, { logpOnly: true });
  try {
    return crossEntropyLoss(await pass.forward()).loss;
  } finally {
    pass.release();
  }
}

export interface SftStepResult extends StepReport {
  /** Mean loss of the step's windows, measured before the update. */
  loss: number;
  tokens: number;
}

/**
 * One optimizer step over `windows` (gradients accumulated, then averaged); each pass keeps the
 * activations of its last `keepLayers` layers and runs its MLP `mlpChunk` rows at a time
 * (TrainingPassOptions; the plan's, src/train/memory.ts planSft and withKeptLayers).
 */
export async function sftStep(
  model: Qwen3Model,
  lora: LoraAdapter,
  opt: LoraAdamW,
  windows: readonly (readonly number[])[],
  pass: Pick<TrainingPassOptions, 'keepLayers' | 'mlpChunk'> = {},
): Promise<SftStepResult> {
  let loss = 0,
    tokens = 0;
  for (const ids of windows) {
    const p = new TrainingPass(model, lora, ids, [...ids.slice(1), -1], null, pass);
    try {
      const ce = crossEntropyLoss(await p.forward());
      p.backward(ce.dlogp);
      loss += ce.loss;
      tokens += ids.length;
    } finally {
      p.release();
    }
  }
  const report = await opt.update(windows.length);
  return { ...report, loss: loss / windows.length, tokens };
}
