// The SpyRL run: rounds of the game on the GPU policy, GRPO/PPO updates of the LoRA adapter every
// roundsPerUpdate rounds, ROUGE-L evaluation every evalEvery rounds, a JSONL run log, and
// checkpoints (adapter, optimizer, spy baseline, pending rounds, round index) that resume exactly.
import { documentForRound, fitToBudget, type SpyDocument } from '../game/documents.ts';
import { INITIAL_SPY_BASELINE, type SpyBaselineState } from '../game/advantages.ts';
import type { SpyRLConfig } from '../game/config.ts';
import { renderPrompt, summaryMessages } from '../game/prompts.ts';
import { playRound, roundRng, runLogLine, type PolicySample, type RoundRecord } from '../game/round.ts';
import { rougeL } from '../game/rouge.ts';
import { TrainingPass, type CheckpointDtype } from './trainingPass.ts';
import { ROUND_CHECKPOINTS } from './trainingPassBytes.ts';
import { LoraAdapter } from '../model/lora.ts';
import { initLora, loraConfig, readAdapter, readOptimizerState, writeAdapter, writeOptimizerState, type LoraConfig } from '../model/peft.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import { memorySource } from '../model/sources.ts';
import type { Qwen3Tokenizer } from '../model/tokenizer.ts';
import type { TrainListener } from './events.ts';
import { LoraAdamW, DEFAULT_ADAMW } from './optimizer.ts';
import { ppoLoss } from './pgLoss.ts';
import { GpuPolicy } from './policy.ts';

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
    const cfg = model.cfg;
    let lora = loraConfig({ r: c.lora.r, alpha: c.lora.alpha, targetModules: c.lora.targetModules, baseModel: o.baseModel ?? null });
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
    const t = new SpyRLTrainer(model, o.tokenizer, c, lora, adapter, optimizer, new GpuPolicy(model, o.tokenizer), o.train, o.evalDocs, o.now);
    t.listener = o.onEvent;
    t.checkpoints = o.checkpoints ?? ROUND_CHECKPOINTS;
    t.policy.hooks.onDelta = (seat, text) => t.listener?.({ type: 'summary-delta', round: t.state.round, seat, text });
    if (src && (await src.exists('trainer_state.json'))) {
      const st = await readOptimizerState(src, weights);
      optimizer.setState(st);
      const extra = st.extra as { trainer?: TrainerState };
      if (!extra.trainer) throw new Error('checkpoint: trainer_state.json has no trainer state');
      t.state = extra.trainer;
      if (await src.exists(PENDING_FILE)) t.state.pending = JSON.parse(await src.readText(PENDING_FILE));
      if (await src.exists(RUN_LOG_FILE)) {
        for (const line of (await src.readText(RUN_LOG_FILE)).split('\n')) if (line.trim()) t.log.push(JSON.parse(line));
      }
    }
    return t;
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

    // Announce the round before generation, with exactly what playRound will build (it is deterministic).
    const { maskSpan } = await import('../game/masking.ts');
    const { assignRoles } = await import('../game/roles.ts');
    const budget = fitToBudget(doc.report, this.tokenizer, c.docTokenBudget);
    const preview = maskSpan(budget.text, this.tokenizer, { maskRatio: c.maskRatio, mode: c.maskMode, rng: rng.fork('mask'), placeholder: c.maskPlaceholder });
    const roles = assignRoles(c.groupSize, rng.fork('roles'));
    this.emit({
      type: 'round-start', round, documentId: doc.id, fullText: preview.full, spyText: preview.spyText,
      span: { charStart: preview.span.charStart, charEnd: preview.span.charEnd },
      spyMarkAt: preview.span.charStart,
      cut: budget.cut ? { keptTokens: budget.cut.tokensKept, totalTokens: budget.cut.tokensTotal } : null,
      groupSize: c.groupSize, labels: roles.labels, spySeat: roles.spySeat,
    });

    const res = await playRound({ config: c, tokenizer: this.tokenizer, document: doc, round, rng: roundRng(c.seed, round), spyBaseline: this.state.spyBaseline, now: this.now }, this.policy);
    const rec = res.record;
    this.emit({ type: 'summaries-done', round, summaries: rec.summaries.map((s) => ({ seat: s.seat, text: s.text, truncated: s.truncated })) });
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
      rec.train = { loss: upd.loss, kl: upd.kl, gradNorm: upd.gradNorm, lr: upd.lr };
      if (this.now) rec.timings.updateMs = this.now() - u0;
      this.emit({ type: 'update', round, step: upd.step, loss: upd.loss, kl: upd.kl, gradNorm: upd.gradNorm, lr: upd.lr, skipped: upd.skipped, reason: upd.reason });
    }
    if (c.evalEvery > 0 && this.state.round % c.evalEvery === 0 && this.evalDocs.length > 0) {
      const ev = await this.evaluate();
      this.emit({ type: 'eval', round, ...ev });
    }
    this.log.push(rec);
    const seconds = ((this.now?.() ?? performance.now()) - started) / 1000;
    const tokens = this.policy.generatedTokens + this.policy.prefilledTokens - tokens0;
    this.emit({ type: 'round-done', round, record: rec, tokensPerSecond: seconds > 0 ? tokens / seconds : 0 });
    return rec;
  }

  /**
   * One PPO/GRPO update over the pending rounds: log-probs of every sample (and of the base
   * model for the KL term), the clipped loss on the CPU, then per sample a recomputed
   * forward + backward with its d(loss)/d(logp); AdamW once per epoch.
   */
  private async update(): Promise<{ loss: number; kl: number; gradNorm: number; lr: number; step: number; skipped: boolean; reason?: string }> {
    const c = this.config;
    const samples = this.state.pending.flatMap((p) => p.samples).filter((s) => s.completionTokenIds.length > 0);
    this.state.pending = [];
    const seqOf = (s: PolicySample) => {
      const ids = [...s.promptTokenIds, ...s.completionTokenIds];
      const targets = ids.map((_, t) => (t >= s.promptTokenIds.length - 1 && t < ids.length - 1 ? ids[t + 1] : -1));
      return { ids, targets };
    };
    const logpOf = async (s: PolicySample) => {
      const { ids, targets } = seqOf(s);
      const pass = new TrainingPass(this.model, this.adapter, ids, targets, s.candidateTokenIds, { checkpoints: this.checkpoints });
      try { return await pass.forward(); } finally { pass.release(); }
    };
    let refLogp: Float32Array[] | null = null;
    if (c.ppo.klBeta > 0) {
      this.adapter.enabled = false;
      try { refLogp = []; for (const s of samples) refLogp.push(await logpOf(s)); } finally { this.adapter.enabled = true; }
    }
    let last = { loss: 0, kl: 0, gradNorm: 0, lr: 0, step: this.optimizer.step, skipped: true, reason: 'no samples' as string | undefined };
    if (samples.length === 0) return last;
    for (let epoch = 0; epoch < c.ppo.epochs; epoch++) {
      const logps: Float32Array[] = [];
      for (const s of samples) logps.push(await logpOf(s));
      const seqLens = logps.map((l) => l.length);
      const cat = (arrs: ArrayLike<number>[]) => Float64Array.from(arrs.flatMap((a) => Array.from(a)));
      const pg = ppoLoss(
        {
          logp: cat(logps),
          oldLogp: cat(samples.map((s) => s.oldLogprobs)),
          advantages: cat(samples.map((s) => s.completionTokenIds.map(() => s.advantage))),
          refLogp: refLogp ? cat(refLogp) : undefined,
          seqLens,
        },
        { clipEps: c.ppo.clipEps, klBeta: c.ppo.klBeta, aggregation: c.ppo.aggregation },
      );
      let off = 0;
      for (const s of samples) {
        const n = s.completionTokenIds.length;
        const d = pg.dlogp.subarray(off, off + n);
        off += n;
        if (d.every((x) => x === 0)) continue; // zero advantage and no KL: nothing to backpropagate
        const { ids, targets } = seqOf(s);
        const pass = new TrainingPass(this.model, this.adapter, ids, targets, s.candidateTokenIds, { checkpoints: this.checkpoints });
        try {
          await pass.forward();
          pass.backward(d);
        } finally {
          pass.release();
        }
      }
      // The loss is already an average (token- or sequence-mean): no further division.
      const rep = await this.optimizer.update(1);
      last = { loss: pg.loss, kl: pg.stats.kl, gradNorm: rep.gradNorm, lr: rep.lr, step: rep.step, skipped: rep.skipped, reason: rep.reason };
    }
    return last;
  }

  /** ROUGE-L F1 of greedy summaries of the held-out reports, with the adapter off and on. */
  async evaluate(): Promise<{ base: number; adapter: number; perDocument: { id: string; base: number; adapter: number }[] }> {
    const c = this.config;
    const docs = this.evalDocs.filter((d) => d.summary);
    const prompts = docs.map((d) => renderPrompt(this.tokenizer, summaryMessages(fitToBudget(d.report, this.tokenizer, c.docTokenBudget).text, c.prompts), '', c.prompts));
    const greedy = { maxTokens: c.summaryMaxTokens, temperature: 0, topP: 1, topK: 0, seeds: docs.map(() => 0) };
    const hooks = this.policy.hooks.onDelta;
    this.policy.hooks.onDelta = undefined;
    try {
      this.adapter.enabled = false;
      const base = await this.policy.generate(prompts, greedy);
      this.adapter.enabled = true;
      const tuned = await this.policy.generate(prompts, greedy);
      const perDocument = docs.map((d, i) => ({ id: d.id, base: rougeL(d.summary!, base[i].text).fmeasure, adapter: rougeL(d.summary!, tuned[i].text).fmeasure }));
      const mean = (k: 'base' | 'adapter') => perDocument.reduce((s, x) => s + x[k], 0) / Math.max(1, perDocument.length);
      return { base: mean('base'), adapter: mean('adapter'), perDocument };
    } finally {
      this.adapter.enabled = true;
      this.policy.hooks.onDelta = hooks;
    }
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
      ...writeOptimizerState({ step: opt.step, m: opt.m, v: opt.v, extra: { trainer: { ...trainer, pending: [] } } }),
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
