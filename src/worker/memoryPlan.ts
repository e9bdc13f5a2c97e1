// The GPU memory a model choice needs for a SpyRL run, against what the adapter allows.
// WebGPU does not report a GPU's total memory, so the budget is the user's own figure; the
// adapter's buffer limits are hard limits.
import { gpuMemoryBytes, type MemoryEstimate, type Qwen3Config } from '../model/config.ts';
import { loraConfig } from '../model/peft.ts';
import { checkTrainingFits, trainingMemoryBytes, type TrainingMemory } from '../train/memory.ts';
import type { SpyRLConfig } from '../game/config.ts';

/** Chat-template and instruction tokens around the report in the longest prompt (the vote). */
const PROMPT_OVERHEAD_TOKENS = 256;

export interface MemoryPlan {
  /** Longest sequence a round trains on: the vote prompt (report + every summary). */
  seqLen: number;
  inference: MemoryEstimate;
  training: TrainingMemory;
  /** Null when it fits; else what is wrong and what to change. */
  problem: string | null;
  /** True when the problem is a hard adapter limit (loading would fail), not only the budget. */
  blocking: boolean;
}

export function planMemory(
  cfg: Qwen3Config,
  run: Pick<SpyRLConfig, 'groupSize' | 'docTokenBudget' | 'summaryMaxTokens' | 'lora'>,
  limits: { maxBufferSize: number; maxStorageBufferBindingSize: number },
  budgetBytes?: number,
): MemoryPlan {
  const seqLen = run.docTokenBudget + run.groupSize * run.summaryMaxTokens + PROMPT_OVERHEAD_TOKENS;
  const kvMaxT = run.docTokenBudget + run.summaryMaxTokens + PROMPT_OVERHEAD_TOKENS;
  const lora = loraConfig({ r: run.lora.r, alpha: run.lora.alpha, targetModules: run.lora.targetModules });
  const inference = gpuMemoryBytes(cfg, { maxT: kvMaxT, slots: run.groupSize });
  const training = trainingMemoryBytes(cfg, lora, { seqLen, kvSlots: run.groupSize, kvMaxT });
  try {
    checkTrainingFits(training, limits, seqLen);
  } catch (e) {
    return { seqLen, inference, training, problem: (e as Error).message, blocking: true };
  }
  try {
    checkTrainingFits(training, limits, seqLen, budgetBytes);
  } catch (e) {
    return { seqLen, inference, training, problem: (e as Error).message, blocking: false };
  }
  return { seqLen, inference, training, problem: null, blocking: false };
}

export function formatBytes(n: number): string {
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(2)} GiB`;
  if (n >= 2 ** 20) return `${(n / 2 ** 20).toFixed(1)} MiB`;
  if (n >= 2 ** 10) return `${(n / 2 ** 10).toFixed(0)} KiB`;
  return `${n} B`;
}
