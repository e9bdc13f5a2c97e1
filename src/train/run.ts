// The run core: one SpyRL run on a loaded model, for every front end. `spyrl train` and the worker
// engine (src/worker/engine.ts) are shells over it; `spyrl eval` uses its evaluation without a run.
//
//   Run.create   checks the round's memory plan (planRunMemory, the app's check too) against the
//                device, then starts a trainer (src/train/spyrl.ts), from a PEFT adapter if given
//   Run.resume   the same from a checkpoint (trainer_state.json), continuing exactly
//   step         one round (and the update and evaluation it makes due)
//   evaluate     the held-out evaluation (evaluatePolicy), with an optional third column
//   adapterFiles / checkpointFiles   the exports: PEFT adapter, or everything to continue
import type { RoundRecord } from '../game/round.ts';
import { isQ4 } from '../ops/common.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import { TRAINER_STATE_FILE } from '../model/peft.ts';
import type { EvalProgress, EvalSystem } from './evaluate.ts';
import type { TrainListener } from './events.ts';
import { withKeptLayers, type MemoryPlan } from './memory.ts';
import { evalDocCount, planRunMemory, type EngineFormat } from './runPlan.ts';
import { SpyRLTrainer, type CheckpointFiles, type TrainerEvaluation, type TrainerOptions } from './spyrl.ts';

export { evalDocCount, planRunMemory } from './runPlan.ts';
export { evaluatePolicy, type PolicyEvalOptions } from './runEval.ts';

export interface RunOptions extends TrainerOptions {
  /** The GPU memory the user allows (`--gpu-memory`); left out, only the adapter's hard limits are checked. */
  budgetBytes?: number;
  /**
   * The GPU memory the user gave where it is advice, not a refusal (the app's model panel, which
   * warns above it): kept layers fill at most 90% of it (withKeptLayers), as they do of budgetBytes.
   */
  keepBudgetBytes?: number;
  /**
   * Tokens per prefill chunk (`--prefill-chunk`; RoundPlanOptions.forwardChunk): left out, the
   * plan's 'auto', the largest chunk that holds no more memory at the round's peak.
   */
  forwardChunk?: number;
  /**
   * Rows of the update's MLP chunks (`--mlp-chunk`; RoundPlanOptions.mlpChunk): left out, the plan's
   * 'auto', the largest that holds no more memory at the round's peak or, with a budget, fits what
   * the kept layers leave of it.
   */
  mlpChunk?: number;
}

/** The weights and KV formats the model was loaded with: what the plan must be made for. */
export function modelFormat(model: Qwen3Model): EngineFormat {
  return { weights: isQ4(model.weights.embed) ? 'q4' : 'bf16', kv: model.kv };
}

/**
 * The round's plan of a run on this model and device; throws the plan's RangeError (what to
 * change) when a buffer exceeds the adapter's limits or, with a budget, the total exceeds it.
 */
export function checkRunFits(
  model: Qwen3Model,
  o: Pick<RunOptions, 'config' | 'evalDocs' | 'budgetBytes' | 'forwardChunk' | 'mlpChunk'>,
): MemoryPlan {
  const check = planRunMemory(
    model.cfg,
    o.config,
    model.gpu.limits,
    o.budgetBytes,
    modelFormat(model),
    evalDocCount(o.config, o.evalDocs),
    o.forwardChunk,
    o.mlpChunk,
  );
  if (check.problem) throw new RangeError(check.problem);
  return check.plan;
}

/**
 * The plan a run follows: checkRunFits (refusing what cannot fit), then, where the GPU memory came
 * as advice (keepBudgetBytes, the app's) rather than a budget, as many kept layers as fit in it:
 * the plan the model panel shows for the same memory.
 */
export function planRun(
  model: Qwen3Model,
  o: Pick<RunOptions, 'config' | 'evalDocs' | 'budgetBytes' | 'keepBudgetBytes' | 'forwardChunk' | 'mlpChunk'>,
): MemoryPlan {
  const plan = checkRunFits(model, o);
  return o.keepBudgetBytes !== undefined && o.budgetBytes === undefined
    ? withKeptLayers(plan, model.gpu.limits, o.keepBudgetBytes)
    : plan;
}

export class Run {
  private constructor(
    private readonly trainer: SpyRLTrainer,
    /** The memory plan the run was checked against (`--report-memory` compares the measured peaks). */
    readonly plan: MemoryPlan,
  ) {}

  /** A new run (or one starting from the PEFT adapter in `resume`); refused when it cannot fit. */
  static async create(o: RunOptions): Promise<Run> {
    const plan = planRun(o.model, o);
    // The prefill's chunk the plan holds memory for (larger than the model's default where the
    // round's peak leaves room): every forward of the run, prompts and evaluations, takes it.
    o.model.chunk = plan.forwardChunk;
    // Packed (prefix-sharing) update passes may use what the plan holds for the update's pass.
    const packBytes = plan.phases.find((p) => p.phase === 'update')?.activations;
    // Layers whose activations the passes keep: as many as the plan found room for (memory the round holds anyway).
    return new Run(
      await SpyRLTrainer.create({
        ...o,
        packBytes: o.packBytes ?? packBytes,
        keepLayers: o.keepLayers ?? plan.keepLayers,
        // The rows of the passes' MLP chunks the plan holds memory for.
        mlpChunk: plan.mlpChunk,
        keepPromptKv: plan.keepPromptKv,
      }),
      plan,
    );
  }

  /** Continues a checkpoint (Run.checkpointFiles): every file is checked before any is used. */
  static async resume(o: RunOptions & { resume: CheckpointFiles }): Promise<Run> {
    if (!(TRAINER_STATE_FILE in o.resume))
      throw new Error(`not a checkpoint: ${TRAINER_STATE_FILE} is missing (a PEFT adapter alone starts a new run)`);
    return Run.create(o);
  }

  get round(): number {
    return this.trainer.round;
  }

  /** Rows of the MLP chunks the update's training passes take (the plan's, MemoryPlan.mlpChunk). */
  get mlpChunk(): number {
    return this.trainer.mlpChunk;
  }

  get runId(): string {
    return this.trainer.runId;
  }

  get records(): readonly RoundRecord[] {
    return this.trainer.records;
  }

  set onEvent(l: TrainListener | undefined) {
    this.trainer.onEvent = l;
  }

  step(): Promise<RoundRecord> {
    return this.trainer.runRound();
  }

  /** The held-out evaluation of the run's adapter against the base model (and `compare`). */
  evaluate(o: { compare?: EvalSystem; onProgress?: (p: EvalProgress) => void } = {}): Promise<TrainerEvaluation> {
    return this.trainer.evaluate(o);
  }

  adapterFiles(): Promise<CheckpointFiles> {
    return this.trainer.adapterFiles();
  }

  checkpointFiles(): Promise<CheckpointFiles> {
    return this.trainer.checkpointFiles();
  }

  runLogJsonl(): string {
    return this.trainer.runLogJsonl();
  }

  destroy(): void {
    this.trainer.destroy();
  }
}
