// The SpyRL run: rounds of the game on the GPU policy, GRPO/PPO updates of the LoRA adapter every
// roundsPerUpdate rounds, ROUGE-L evaluation every evalEvery rounds, a JSONL run log, and
// checkpoints (adapter, optimizer, spy baseline, pending rounds, round index) that resume exactly.
import { documentForRound, fitToBudget, type SpyDocument } from '../game/documents.ts';
import { INITIAL_SPY_BASELINE, type SpyBaselineState } from '../game/advantages.ts';
import { checkTrainable, type SpyRLConfig } from '../game/config.ts';
import { playRound, roundRng, runLogLine, type PolicySample, type RoundRecord } from '../game/round.ts';
import { ppoUpdate, type UpdateContext, type UpdateResult } from './update.ts';
import type { CheckpointDtype } from './trainingPass.ts';
import { DEFAULT_MLP_CHUNK, ROUND_CHECKPOINTS } from './trainingPassBytes.ts';
import { LoraAdapter } from '../model/lora.ts';
import {
  initLora,
  loraConfig,
  readAdapter,
  readOptimizerState,
  writeAdapter,
  writeOptimizerState,
  type LoraConfig,
} from '../model/peft.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import { memorySource } from '../model/sources.ts';
import type { Qwen3Tokenizer } from '../model/tokenizer.ts';
import type { TrainListener } from './events.ts';
import { LoraAdamW, DEFAULT_ADAMW } from './optimizer.ts';
import { GpuPolicy } from './policy.ts';
import {
  configDiff,
  configValues,
  describeDiff,
  parsePending,
  parseRunLog,
  parseSavedConfig,
  parseTrainerExtra,
  runStamp,
  type RunStamp,
} from './checkpoint.ts';
import type { EvalProgress, EvalReport, EvalSystem } from './evaluate.ts';
import { evaluatePolicy } from './runEval.ts';

/** What SpyRLTrainer.evaluate returns: mean ROUGE-L F1 of base and adapter (the chart's points) and the full report. */
export interface TrainerEvaluation {
  base: number;
  adapter: number;
  perDocument: { id: string; base: number; adapter: number }[];
  report: EvalReport;
}

export type CheckpointFiles = Record<string, Uint8Array | string>;

export const RUN_LOG_FILE = 'run.jsonl';
export const CONFIG_FILE = 'spyrl_config.json';
const PENDING_FILE = 'pending_samples.json';

export interface TrainerOptions {
  model: Qwen3Model;
  tokenizer: Qwen3Tokenizer;
  config: SpyRLConfig;
  train: SpyDocument[];
  evalDocs: SpyDocument[];
  /** A checkpoint to continue (from checkpointFiles()), or a PEFT adapter alone to start from. */
  resume?: CheckpointFiles;
  onEvent?: TrainListener;
  /** A millisecond clock for timings; leave it out for byte-identical run logs. */
  now?: () => number;
  /** Base model name for adapter_config.json. */
  baseModel?: string;
  /**
   * Storage of the training pass's layer-input checkpoints (default 'bf16': half the memory of
   * f32 and, unlike f16, no overflow on the large residual values Qwen models can reach).
   */
  checkpoints?: CheckpointDtype;
  /** The run's id (src/train/checkpoint.ts): kept from the checkpoint when resuming, else new. */
  runId?: string;
  /**
   * The most bytes one training pass of an update may take: the memory plan's update pass
   * (src/train/run.ts sets it). Packed prefix-sharing passes stay within it (src/train/update.ts).
   */
  packBytes?: number;
  /** Share prompt prefixes between the update's sequences (default true). */
  packPrefixes?: boolean;
  /**
   * Layers of each training pass that keep their activations for the backward instead of
   * recomputing them (TrainingPassOptions.keepLayers; default 0). src/train/run.ts sets the memory
   * plan's: as many as fit under the round's other phases.
   */
  keepLayers?: number;
  /**
   * Rows of each training pass's MLP chunks (TrainingPassOptions.mlpChunk; default
   * DEFAULT_MLP_CHUNK). src/train/run.ts sets the memory plan's (MemoryPlan.mlpChunk).
   */
  mlpChunk?: number;
  /**
   * Whether the policy keeps the summaries' (and reasons') KV cache for the votes, whose prompts
   * open with the same report (GpuPolicy.keepPromptKv; default true). src/train/run.ts sets the
   * memory plan's: where one cache sized for the summaries and the votes does not raise the round's peak.
   */
  keepPromptKv?: boolean;
}

interface TrainerState {
  round: number;
  spyBaseline: SpyBaselineState;
  pending: { round: number; samples: PolicySample[] }[];
}

export class SpyRLTrainer {
  private state: TrainerState = { round: 0, spyBaseline: INITIAL_SPY_BASELINE, pending: [] };
  private readonly log: RoundRecord[] = [];
  private listener: TrainListener | undefined;
  private checkpoints: CheckpointDtype = ROUND_CHECKPOINTS;
  private packing: Pick<UpdateContext, 'packBytes' | 'packPrefixes' | 'keepLayers' | 'mlpChunk'> = {};
  private stamp: RunStamp = runStamp();

  private constructor(
    readonly model: Qwen3Model,
    readonly tokenizer: Qwen3Tokenizer,
    readonly config: SpyRLConfig,
    readonly lora: LoraConfig,
    readonly adapter: LoraAdapter,
    readonly optimizer: LoraAdamW,
    readonly policy: GpuPolicy,
    private readonly train: SpyDocument[],
    private readonly evalDocs: SpyDocument[],
    private readonly now: (() => number) | undefined,
  ) {}

  static async create(o: TrainerOptions): Promise<SpyRLTrainer> {
    const { model, config: c } = o;
    if (o.train.length === 0) throw new RangeError('no training documents');
    checkTrainable(c);
    const cfg = model.cfg;
    let lora = loraConfig({
      r: c.lora.r,
      alpha: c.lora.alpha,
      targetModules: c.lora.targetModules,
      baseModel: o.baseModel ?? null,
    });
    let weights = initLora(cfg, lora, c.seed);
    const src = o.resume ? memorySource('checkpoint', new Map(Object.entries(o.resume))) : null;
    if (src) ({ lora, tensors: weights } = await readAdapter(src, cfg));
    const adapter = new LoraAdapter(model.gpu, cfg, lora);
    adapter.setWeights(weights);
    model.lora = adapter;
    const optimizer = new LoraAdamW(model.gpu, adapter, {
      ...DEFAULT_ADAMW,
      lr: c.optimizer.lr,
      weightDecay: c.optimizer.weightDecay,
      maxGradNorm: c.optimizer.maxGradNorm,
      schedule: { kind: 'constant', warmup: c.optimizer.warmupSteps },
    });
    const t = new SpyRLTrainer(
      model,
      o.tokenizer,
      c,
      lora,
      adapter,
      optimizer,
      new GpuPolicy(model, o.tokenizer),
      o.train,
      o.evalDocs,
      o.now,
    );
    t.listener = o.onEvent;
    t.checkpoints = o.checkpoints ?? ROUND_CHECKPOINTS;
    t.packing = {
      packBytes: o.packBytes,
      packPrefixes: o.packPrefixes,
      keepLayers: o.keepLayers,
      mlpChunk: o.mlpChunk,
    };
    if (o.now) t.policy.clock = o.now;
    if (o.keepPromptKv !== undefined) t.policy.keepPromptKv = o.keepPromptKv;
    t.policy.hooks.onDelta = (seat, text) => t.listener?.({ type: 'summary-delta', round: t.state.round, seat, text });
    if (o.runId) t.stamp = runStamp(o.runId);
    if (src && (await src.exists('trainer_state.json'))) {
      // Every part is checked (src/train/checkpoint.ts) before any of it is used; a refusal frees the adapter.
      await t.resumeFrom(src, weights, o.runId).catch((e: unknown) => {
        t.destroy();
        throw e;
      });
    }
    return t;
  }

  /** Continues a checkpoint: every file is checked (src/train/checkpoint.ts) before any of it is used. */
  private async resumeFrom(
    src: ReturnType<typeof memorySource>,
    weights: Map<string, Float32Array>,
    runId: string | undefined,
  ): Promise<void> {
    const st = await readOptimizerState(src, weights);
    const { stamp, state } = parseTrainerExtra(st.extra);
    if (runId && runId !== stamp.runId)
      throw new Error(`checkpoint: trainer_state.json belongs to run ${stamp.runId}, not to run ${runId}`);
    if (await src.exists(CONFIG_FILE)) {
      const saved = parseSavedConfig(await src.readText(CONFIG_FILE), CONFIG_FILE);
      const diff = configDiff(saved, this.config);
      if (diff.length)
        throw new Error(
          `checkpoint: the config given differs from the run's ${CONFIG_FILE} in ${describeDiff(configValues(saved), configValues(this.config), diff)}`,
        );
    }
    if (await src.exists(PENDING_FILE))
      state.pending = parsePending(await src.readText(PENDING_FILE), this.model.cfg.vocabSize, PENDING_FILE);
    const log = (await src.exists(RUN_LOG_FILE)) ? parseRunLog(await src.readText(RUN_LOG_FILE), RUN_LOG_FILE) : [];
    this.optimizer.setState(st);
    this.stamp = stamp;
    this.state = state;
    this.log.push(...(log as unknown as RoundRecord[]));
  }

  /** The run's id, kept across resumes. */
  get runId(): string {
    return this.stamp.runId;
  }

  /** Rows of the MLP chunks of the update's training passes (TrainerOptions.mlpChunk). */
  get mlpChunk(): number {
    return this.packing.mlpChunk ?? DEFAULT_MLP_CHUNK;
  }

  /** Rounds completed. */
  get round(): number {
    return this.state.round;
  }

  get records(): readonly RoundRecord[] {
    return this.log;
  }

  set onEvent(l: TrainListener | undefined) {
    this.listener = l;
  }

  private emit: TrainListener = (e) => this.listener?.(e);

  /** Plays one round; updates the adapter when roundsPerUpdate rounds are pending; evaluates when due. */
  async runRound(): Promise<RoundRecord> {
    const c = this.config;
    const round = this.state.round;
    const doc = documentForRound(this.train, round, c.seed);
    const rng = roundRng(c.seed, round);
    const started = this.now?.() ?? performance.now();
    const tokens0 = this.policy.generatedTokens + this.policy.prefilledTokens;
    const pipelines0 = this.model.gpu.pipelineCount;

    // Announce the round before generation, with exactly what playRound will build (it is deterministic).
    const { maskSpan } = await import('../game/masking.ts');
    const { assignRoles } = await import('../game/roles.ts');
    const budget = fitToBudget(doc.report, this.tokenizer, c.docTokenBudget);
    const preview = maskSpan(budget.text, this.tokenizer, {
      maskRatio: c.maskRatio,
      mode: c.maskMode,
      rng: rng.fork('mask'),
      placeholder: c.maskPlaceholder,
    });
    const roles = assignRoles(c.groupSize, rng.fork('roles'));
    this.emit({
      type: 'round-start',
      round,
      documentId: doc.id,
      fullText: preview.full,
      spyText: preview.spyText,
      span: { charStart: preview.span.charStart, charEnd: preview.span.charEnd },
      spyMarkAt: preview.span.charStart,
      cut: budget.cut ? { keptTokens: budget.cut.tokensKept, totalTokens: budget.cut.tokensTotal } : null,
      groupSize: c.groupSize,
      labels: roles.labels,
      spySeat: roles.spySeat,
    });

    const res = await playRound(
      {
        config: c,
        tokenizer: this.tokenizer,
        document: doc,
        round,
        rng: roundRng(c.seed, round),
        spyBaseline: this.state.spyBaseline,
        now: this.now,
      },
      this.policy,
    );
    const rec = res.record;
    this.emit({
      type: 'summaries-done',
      round,
      summaries: rec.summaries.map((s) => ({ seat: s.seat, text: s.text, truncated: s.truncated })),
    });
    for (const v of rec.votes) {
      const candidateSeats = v.candidates.map((label) => rec.labels.indexOf(label));
      this.emit({ type: 'vote', round, voterSeat: v.seat, candidateSeats, probs: v.probs, chosenSeat: v.chosenSeat });
    }
    const totals = rec.labels.map((_, s) => rec.rewards.summary[s] + (rec.rewards.vote[s] ?? 0));
    this.emit({ type: 'reveal', round, spySeat: rec.spySeat, caught: rec.metrics.spyCaught, rewards: totals });

    this.state.spyBaseline = res.spyBaseline;
    this.state.pending.push({ round, samples: res.samples });
    this.state.round = round + 1;
    if (this.state.pending.length >= c.roundsPerUpdate) {
      const u0 = this.now?.() ?? performance.now();
      const upd = await this.update();
      rec.train = {
        loss: upd.loss,
        kl: upd.kl,
        gradNorm: upd.gradNorm,
        lr: upd.lr,
        stages: upd.stages,
        packing: upd.packing,
      };
      if (this.now) rec.timings.updateMs = this.now() - u0;
      this.emit({
        type: 'update',
        round,
        step: upd.step,
        loss: upd.loss,
        kl: upd.kl,
        gradNorm: upd.gradNorm,
        lr: upd.lr,
        skipped: upd.skipped,
        reason: upd.reason,
        stages: upd.stages,
        packing: upd.packing,
      });
    }
    if (c.evalEvery > 0 && this.state.round % c.evalEvery === 0 && this.evalDocs.length > 0) {
      const ev = await this.evaluate();
      this.emit({ type: 'eval', round, ...ev });
    }
    this.log.push(rec);
    const seconds = ((this.now?.() ?? performance.now()) - started) / 1000;
    const tokens = this.policy.generatedTokens + this.policy.prefilledTokens - tokens0;
    this.emit({
      type: 'round-done',
      round,
      record: rec,
      tokensPerSecond: seconds > 0 ? tokens / seconds : 0,
      seconds,
      compiledKernels: this.model.gpu.pipelineCount - pipelines0,
    });
    return rec;
  }

  /**
   * One PPO/GRPO update over the pending rounds (src/train/update.ts): per-stage loss, the
   * sampler's log-probs as the old ones, one forward + backward per sequence and epoch.
   */
  private async update(): Promise<UpdateResult> {
    const samples = this.state.pending.flatMap((p) => p.samples.map((sample) => ({ round: p.round, sample })));
    this.state.pending = [];
    return ppoUpdate(
      {
        model: this.model,
        adapter: this.adapter,
        optimizer: this.optimizer,
        ppo: this.config.ppo,
        checkpoints: this.checkpoints,
        temperature: this.config.sampling.temperature,
        ...this.packing,
        onLogprobs: this.onLogprobs,
      },
      samples,
    );
  }

  /** Test hook: each trained sample's current and reference log-probs, per epoch. */
  onLogprobs: UpdateContext['onLogprobs'];

  /**
   * The held-out evaluation (src/train/evaluate.ts): greedy summaries with the adapter off
   * (base) and on, and optionally of another checkpoint; base/adapter are mean ROUGE-L F1.
   */
  async evaluate(o: { compare?: EvalSystem; onProgress?: (p: EvalProgress) => void } = {}): Promise<TrainerEvaluation> {
    // The one evaluation (src/train/runEval.ts), shared with `spyrl eval`; this.adapter is model.lora.
    const report = await evaluatePolicy({
      policy: this.policy,
      tokenizer: this.tokenizer,
      config: this.config,
      docs: this.evalDocs,
      labels: { base: 'base model', adapter: `adapter (round ${this.state.round})` },
      compare: o.compare,
      onProgress: o.onProgress,
    });
    const scored = report.documents.filter((d) => d.results['adapter']);
    const perDocument = scored.map((d) => ({
      id: d.id,
      base: d.results['base']!.scores.rougeL,
      adapter: d.results['adapter']!.scores.rougeL,
    }));
    return { base: report.means['base']!.rougeL, adapter: report.means['adapter']!.rougeL, perDocument, report };
  }

  /** The PEFT adapter alone. */
  async adapterFiles(): Promise<CheckpointFiles> {
    return { ...writeAdapter(this.lora, await this.adapter.getTensors('weights'), this.model.cfg) };
  }

  /** Everything needed to continue exactly: adapter, optimizer, trainer state, pending rounds, run log, config. */
  async checkpointFiles(): Promise<CheckpointFiles> {
    const opt = await this.optimizer.getState();
    const { pending, ...trainer } = this.state;
    return {
      ...(await this.adapterFiles()),
      ...writeOptimizerState({
        step: opt.step,
        m: opt.m,
        v: opt.v,
        extra: { run: { ...this.stamp }, trainer: { ...trainer, pending: [] } },
      }),
      [PENDING_FILE]: JSON.stringify(pending),
      [RUN_LOG_FILE]: this.runLogJsonl(),
      [CONFIG_FILE]: JSON.stringify(this.config, null, 2) + '\n',
    };
  }

  runLogJsonl(): string {
    return this.log.map((r) => runLogLine(r) + '\n').join('');
  }

  destroy(): void {
    this.optimizer.destroy();
    this.adapter.destroy();
    if (this.model.lora === this.adapter) this.model.lora = null;
  }
}
