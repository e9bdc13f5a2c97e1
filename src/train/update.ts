// One PPO/GRPO update of the LoRA adapter over the samples of a few rounds, stage by stage:
//   loss = summaryWeight * L_summaries + voteWeight * L_votes
//   L_summaries = token-mean of the PPO term over every summary token of the update
//                 (ppo.aggregation 'sequence-mean': the mean over summaries of their token means)
//   L_votes     = mean over votes of each vote's token-mean (its label; with voteReason, its
//                 reason tokens and its label)
// Each stage is averaged on its own, so the ~6 one-token votes of an update are not drowned by
// its ~1,500 summary tokens.
//
// Cost: the old log-probs are the sampler's (PolicySample.oldLogprobs, exact under the
// distribution each token was drawn from), so every sequence costs one forward (its current
// log-probs, from which its dlogp follows token by token) and one backward per epoch; klBeta > 0
// adds one forward per sequence with the adapter off. Sequences whose terms are all zero
// (advantage 0 and no KL) cost nothing.
//
// Prefix sharing (src/train/packing.ts): sequences of one round and stage that share most of
// their prompt (the civilians' summary prompts are identical; vote prompts differ only in the
// voter's last line) run as one packed pass, so the shared report goes through the forward and
// the backward once. A pack grows only while its pass fits the memory of the largest single
// pass the run was planned for (UpdateContext.packBytes), so packing never raises the peak.
//
// Kept layers (TrainingPassOptions.keepLayers): each pass keeps the activations of at least
// UpdateContext.keepLayers layers (the memory plan's, for its longest pass), and more where its
// own peak stays within the same bytes: a shorter pass keeps more, so it recomputes fewer. Kept or
// recomputed, a layer's log-probs and gradients are the same bit for bit.
//
// Per-stage gradient norms are exact: the vote stage is backpropagated first and its gradient
// g_v measured and set aside (read back to the CPU, so no second gradient set on the GPU during
// the summary passes), then the summary stage's g_s is measured and g_v added back. The
// grad-norm share of a stage is |g_stage|^2 / (|g_summary|^2 + |g_vote|^2).
import type { Gpu } from '../gpu/index.ts';
import type { PpoConfig } from '../game/config.ts';
import type { PackingStats, PolicySample, StageStat, StageStats } from '../game/round.ts';
import type { LoraAdapter } from '../model/lora.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import * as K from '../ops/index.ts';
import type { LoraAdamW } from './optimizer.ts';
import { packSequences, type PackedLayout } from './packing.ts';
import { ppoTokenTerm } from './pgLoss.ts';
import { TrainingPass, trainingPassBytes, type CheckpointDtype, type TrainingPassOptions } from './trainingPass.ts';

/** A sample with the round it came from (a vote is identified by round and voter seat). */
export interface RoundSample {
  round: number;
  sample: PolicySample;
}

export interface UpdateContext {
  model: Qwen3Model;
  adapter: LoraAdapter;
  optimizer: LoraAdamW;
  ppo: PpoConfig;
  /** Storage of the training passes' layer checkpoints. */
  checkpoints: CheckpointDtype;
  /** Layers whose activations each pass keeps for its backward (TrainingPassOptions.keepLayers; default 0). */
  keepLayers?: number;
  /** Rows of each pass's MLP chunks (TrainingPassOptions.mlpChunk; default DEFAULT_MLP_CHUNK): the plan's. */
  mlpChunk?: number;
  /** sampling.temperature: sampled text (candidateTokenIds null) is recomputed at it, vote labels at 1. */
  temperature: number;
  /**
   * Pack sequences that share a prompt prefix into one pass (default true; needs
   * K.treeAttentionSupported, else every sequence runs alone).
   */
  packPrefixes?: boolean;
  /**
   * The most bytes one training pass may take (trainingPassBytes' peak): the memory plan's
   * update pass. Default: the largest single-sequence pass of this update.
   */
  packBytes?: number;
  /** Called with each sample's log-prob sets of each epoch (tests check the KL against them). */
  onLogprobs?: (epoch: number, sample: PolicySample, logp: Float32Array, refLogp: Float32Array | null) => void;
}

export interface EpochStats {
  loss: number;
  /** Token-mean k3 estimate of KL(policy || base) over every token; null when klBeta is 0 (not computed). */
  kl: number | null;
  /** Token means over the sequences that were run (a sequence with nothing to learn is skipped). */
  meanRatio: number;
  clipFraction: number;
  gradNorm: number;
  stages: StageStats;
}

export interface UpdateResult {
  /** The first epoch's (on-policy) loss, KL, grad norm and stage stats; every epoch's in `epochs`. */
  loss: number;
  kl: number | null;
  gradNorm: number;
  lr: number;
  step: number;
  skipped: boolean;
  reason?: string;
  stages: StageStats;
  epochs: EpochStats[];
  /** Training-pass forwards and backwards run (one of each per pass and epoch, plus the KL reference forwards). */
  passes: { forward: number; backward: number };
  /** Prefix sharing over every forward: sequences run, tokens run, and the tokens they would take unpacked. */
  packing: PackingStats;
}

const emptyStage = (): StageStat => ({ loss: 0, gradNorm: 0, gradShare: 0, sequences: 0, tokens: 0 });

/**
 * How a pass stores and chunks its work: its checkpoints' dtype and its MLP chunk's rows
 * (TrainingPassOptions; mlpChunk left out: DEFAULT_MLP_CHUNK). Its peak bytes depend on both.
 */
export type PassFormat = { checkpoints: CheckpointDtype } & Pick<TrainingPassOptions, 'mlpChunk'>;

/** ids = prompt + completion; targets: each completion token at the position before it. */
export function sampleSequence(s: PolicySample): { ids: number[]; targets: number[] } {
  const ids = [...s.promptTokenIds, ...s.completionTokenIds];
  const p = s.promptTokenIds.length;
  const targets = ids.map((_, t) => (t >= p - 1 && t < ids.length - 1 ? ids[t + 1]! : -1));
  return { ids, targets };
}

/**
 * The training pass that recomputes a sample's log-probs as they were sampled: same tokens, and
 * either the vote's candidate restriction (temperature 1) or sampled text at `temperature`.
 */
export function samplePass(
  model: Qwen3Model,
  adapter: LoraAdapter,
  s: PolicySample,
  format: PassFormat,
  temperature: number,
  keepLayers = 0,
): TrainingPass {
  const { ids, targets } = sampleSequence(s);
  return new TrainingPass(model, adapter, ids, targets, s.candidateTokenIds, {
    ...format,
    temperature: s.candidateTokenIds ? 1 : temperature,
    keepLayers,
  });
}

/** Samples run together in one pass: a single sample, or a packed prefix tree of several. */
export interface SamplePack {
  /** Indices into the update's samples. */
  members: number[];
  /** The packed layout (null for a single sample). */
  layout: PackedLayout | null;
}

/** trainingPassBytes' peak of a pass over `layout` (or one sample) with the adapter's shape. */
function packPeak(
  model: Qwen3Model,
  adapter: LoraAdapter,
  format: PassFormat,
  shape: PassShape,
  keepLayers: number,
): number {
  return trainingPassBytes(model.cfg, {
    seqLen: shape.T,
    numTargets: shape.M,
    lora: { r: adapter.settings.r, targetModules: adapter.settings.targetModules },
    ...format,
    candidates: shape.candidates,
    packed: shape.packed,
    keepLayers,
  }).peak;
}

/** A pass's shape: tokens, target rows, candidates (restricted votes), packed or not. */
interface PassShape {
  T: number;
  M: number;
  candidates: number | undefined;
  packed: boolean;
}

/** The shape of a pack's pass. */
function packShape(samples: readonly RoundSample[], pack: SamplePack): PassShape {
  const cands = (m: number) => samples[m]!.sample.candidateTokenIds?.length;
  const candidates =
    cands(pack.members[0]!) === undefined ? undefined : Math.max(...pack.members.map((m) => cands(m)!));
  if (pack.layout)
    return {
      T: pack.layout.ids.length,
      M: pack.layout.rows.reduce((n, r) => n + r.length, 0),
      candidates,
      packed: true,
    };
  const { ids, targets } = sampleSequence(samples[pack.members[0]!]!.sample);
  return { T: ids.length, M: targets.filter((t) => t >= 0).length, candidates, packed: false };
}

/**
 * The most layers (at least `keep`) a pack's pass keeps with its peak (trainingPassBytes) within
 * `budget` bytes; `keep` where even that is over.
 */
export function packKeepLayers(
  model: Qwen3Model,
  adapter: LoraAdapter,
  samples: readonly RoundSample[],
  pack: SamplePack,
  format: PassFormat,
  budget: number,
  keep: number,
): number {
  const shape = packShape(samples, pack);
  const fits = (k: number) => packPeak(model, adapter, format, shape, k) <= budget;
  let lo = keep,
    hi = model.cfg.numLayers; // the peak grows with k: the largest k that fits, by bisection
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * Groups samples (indices into `samples`) into packs: the same round, stage and kind (restricted
 * vote label, or text), sorted by prompt so that shared prefixes are neighbours; a sample joins
 * the open pack when it shares at least half of its tokens with it and the packed pass's peak
 * stays within `budget` bytes.
 */
export function planPacks(
  model: Qwen3Model,
  adapter: LoraAdapter,
  samples: readonly RoundSample[],
  which: readonly number[],
  format: PassFormat,
  budget: number,
  keepLayers = 0,
): SamplePack[] {
  const kind = (i: number) => {
    const x = samples[i]!;
    return `${x.round}/${x.sample.stage}/${x.sample.candidateTokenIds ? 'label' : 'text'}`;
  };
  const cmp = (a: readonly number[], b: readonly number[]) => {
    for (let t = 0; t < Math.min(a.length, b.length); t++) if (a[t] !== b[t]) return a[t]! - b[t]!;
    return a.length - b.length;
  };
  const order = [...which].sort(
    (a, b) =>
      kind(a).localeCompare(kind(b)) ||
      cmp(samples[a]!.sample.promptTokenIds, samples[b]!.sample.promptTokenIds) ||
      a - b,
  );
  const packs: SamplePack[] = [];
  let open: { members: number[]; layout: PackedLayout | null; tokens: number } | null = null;
  const close = () => {
    if (open) packs.push({ members: open.members, layout: open.members.length > 1 ? open.layout : null });
    open = null;
  };
  for (const i of order) {
    const seq = sampleSequence(samples[i]!.sample);
    if (open && kind(open.members[0]!) === kind(i)) {
      const members: number[] = [...open.members, i];
      const layout = packSequences(members.map((m) => sampleSequence(samples[m]!.sample)));
      const saved = open.tokens + seq.ids.length - layout.ids.length;
      const peak = packPeak(model, adapter, format, packShape(samples, { members, layout }), keepLayers);
      const before = open.layout ? open.tokens - open.layout.ids.length : 0;
      if (saved - before >= seq.ids.length / 2 && peak <= budget) {
        open = { members, layout, tokens: open.tokens + seq.ids.length };
        continue;
      }
    }
    close();
    open = { members: [i], layout: packSequences([seq]), tokens: seq.ids.length };
  }
  close();
  return packs;
}

/** The training pass of a pack (samplePass for one sample). */
function packPass(
  model: Qwen3Model,
  adapter: LoraAdapter,
  samples: readonly RoundSample[],
  pack: SamplePack,
  format: PassFormat,
  temperature: number,
  keepLayers: number,
): TrainingPass {
  if (!pack.layout)
    return samplePass(model, adapter, samples[pack.members[0]!]!.sample, format, temperature, keepLayers);
  const first = samples[pack.members[0]!]!.sample;
  const L = pack.layout;
  let restrict: number[][] | null = null; // each target row's candidates: its voter's
  if (first.candidateTokenIds) {
    restrict = [];
    for (const [k, m] of pack.members.entries())
      for (const row of L.rows[k]!) restrict[row] = [...samples[m]!.sample.candidateTokenIds!];
  }
  return new TrainingPass(model, adapter, L.ids, L.targets, restrict, {
    ...format,
    temperature: first.candidateTokenIds ? 1 : temperature,
    layout: { positions: L.positions, keyEnd: L.keyEnd },
    keepLayers,
  });
}

/** Each member's log-probs out of its pack's (in the pack's target order). */
function splitLogp(pack: SamplePack, logp: Float32Array): Float32Array[] {
  if (!pack.layout) return [logp];
  return pack.layout.rows.map((rows) => Float32Array.from(rows, (m) => logp[m]!));
}

/**
 * Per-token weights u (within the stage: the stage loss is sum_t u_t loss_t) of every sample,
 * and each stage's sequence and token counts.
 */
export function stageWeights(
  samples: readonly RoundSample[],
  aggregation: PpoConfig['aggregation'],
): { u: number[]; counts: Record<'summary' | 'vote', { sequences: number; tokens: number }> } {
  const summaries = samples.filter((x) => x.sample.stage === 'summary');
  const summaryTokens = summaries.reduce((n, x) => n + x.sample.completionTokenIds.length, 0);
  const voteTokens = new Map<string, number>(); // vote key -> its tokens (reason + label)
  const voteKey = (x: RoundSample) => `${x.round}/${x.sample.seat}`;
  for (const x of samples) {
    if (x.sample.stage === 'vote')
      voteTokens.set(voteKey(x), (voteTokens.get(voteKey(x)) ?? 0) + x.sample.completionTokenIds.length);
  }
  const u = samples.map((x) => {
    const n = x.sample.completionTokenIds.length;
    if (x.sample.stage === 'vote') return 1 / (voteTokens.size * voteTokens.get(voteKey(x))!);
    return aggregation === 'token-mean' ? 1 / summaryTokens : 1 / (summaries.length * n);
  });
  const voteTokenTotal = [...voteTokens.values()].reduce((a, b) => a + b, 0);
  return {
    u,
    counts: {
      summary: { sequences: summaries.length, tokens: summaryTokens },
      vote: { sequences: voteTokens.size, tokens: voteTokenTotal },
    },
  };
}

async function gradSumSquares(gpu: Gpu, adapter: LoraAdapter, out: GPUBuffer): Promise<number> {
  const r = adapter.settings.r;
  gpu.clear(out);
  for (const p of adapter.pairs) {
    K.sumSquares(gpu, out, p.dA, r * p.K, 0);
    K.sumSquares(gpu, out, p.dB, p.N * r, 0);
  }
  return (await gpu.readF32(out, 1))[0]!;
}

/** Reads every LoRA gradient back and zeroes it on the GPU. */
async function takeGrads(gpu: Gpu, adapter: LoraAdapter): Promise<Float32Array[]> {
  const r = adapter.settings.r;
  const out: Float32Array[] = [];
  for (const p of adapter.pairs) {
    out.push(await gpu.readF32(p.dA, r * p.K));
    out.push(await gpu.readF32(p.dB, p.N * r));
  }
  adapter.zeroGrad();
  return out;
}

/** Adds gradients taken by takeGrads back into the adapter's (one tensor-sized staging buffer at a time). */
function addGrads(gpu: Gpu, adapter: LoraAdapter, grads: Float32Array[]): void {
  let i = 0;
  for (const p of adapter.pairs) {
    for (const dst of [p.dA, p.dB]) {
      const g = grads[i++]!;
      const tmp = gpu.createBuffer(g.byteLength, 'stashedGrad');
      gpu.write(tmp, g);
      K.add(gpu, dst, tmp, g.length);
      gpu.releaseBuffer(tmp);
    }
  }
}

/** One PPO update (ppo.epochs AdamW steps) over `samples`; the adapter's gradients must be zero. */
export async function ppoUpdate(ctx: UpdateContext, all: readonly RoundSample[]): Promise<UpdateResult> {
  const { model, adapter, optimizer, ppo } = ctx;
  const gpu = model.gpu;
  const samples = all.filter((x) => x.sample.completionTokenIds.length > 0);
  const passes = { forward: 0, backward: 0 };
  const packing: PackingStats = { sequences: 0, passes: 0, tokens: 0, unpackedTokens: 0, keptLayers: 0, layers: 0 };
  const none: UpdateResult = {
    loss: 0,
    kl: null,
    gradNorm: 0,
    lr: 0,
    step: optimizer.step,
    skipped: true,
    reason: 'no samples',
    stages: { summary: emptyStage(), vote: emptyStage() },
    epochs: [],
    passes,
    packing,
  };
  if (samples.length === 0) return none;
  for (const x of samples) {
    if (x.sample.oldLogprobs.length !== x.sample.completionTokenIds.length) {
      throw new RangeError(
        `update: a ${x.sample.stage} sample of round ${x.round} has ${x.sample.completionTokenIds.length} tokens but ${x.sample.oldLogprobs.length} old log-probs`,
      );
    }
  }
  const { u, counts } = stageWeights(samples, ppo.aggregation);
  const weightOf = { summary: ppo.summaryWeight, vote: ppo.voteWeight };
  const lo = 1 - ppo.clipEps,
    hi = 1 + ppo.clipEps;

  // Which samples run together (the same packs in every epoch).
  const share = ctx.packPrefixes !== false && K.treeAttentionSupported(gpu, model.cfg.headDim);
  const keep = ctx.keepLayers ?? 0;
  const format: PassFormat = { checkpoints: ctx.checkpoints, mlpChunk: ctx.mlpChunk };
  const budget =
    ctx.packBytes ??
    Math.max(
      ...samples.map((_, i) =>
        packPeak(model, adapter, format, packShape(samples, { members: [i], layout: null }), keep),
      ),
    );
  const packsOf = (which: number[]): SamplePack[] =>
    share
      ? planPacks(model, adapter, samples, which, format, budget, keep)
      : which.map((i) => ({ members: [i], layout: null }));
  const indices = (keep: (x: RoundSample) => boolean) => [...samples.keys()].filter((i) => keep(samples[i]!));
  /** A pack's pass, forward run: the pass (to run its backward, then release) and each member's log-probs. */
  const forward = async (p: SamplePack) => {
    const k = adapter.enabled ? packKeepLayers(model, adapter, samples, p, format, budget, keep) : 0;
    const pass = packPass(model, adapter, samples, p, format, ctx.temperature, k);
    try {
      const logp = await pass.forward();
      passes.forward++;
      // The training passes only: the KL term's reference forwards (adapter off) are not counted.
      if (adapter.enabled) {
        packing.passes++;
        packing.sequences += p.members.length;
        packing.keptLayers! += k;
        packing.layers! += model.cfg.numLayers;
        packing.tokens += p.layout ? p.layout.ids.length : sampleSequence(samples[p.members[0]!]!.sample).ids.length;
        for (const i of p.members) packing.unpackedTokens += sampleSequence(samples[i]!.sample).ids.length;
      }
      return { pass, logp, parts: splitLogp(p, logp) };
    } catch (e) {
      pass.release();
      throw e;
    }
  };

  // The base model's log-probs for the KL term: one forward per pass, adapter off.
  let refLogp: Float32Array[] | null = null;
  if (ppo.klBeta > 0) {
    const ref: Float32Array[] = new Array<Float32Array>(samples.length);
    adapter.enabled = false;
    try {
      for (const p of packsOf(indices(() => true))) {
        const { pass, parts } = await forward(p);
        pass.release();
        for (const [k, i] of p.members.entries()) ref[i] = parts[k]!;
      }
    } finally {
      adapter.enabled = true;
    }
    refLogp = ref;
  }
  // Advantage 0 and no KL: every term and its gradient is 0, whatever the log-probs.
  const stagePacks = {
    vote: packsOf(indices((x) => x.sample.stage === 'vote' && (x.sample.advantage !== 0 || refLogp !== null))),
    summary: packsOf(indices((x) => x.sample.stage === 'summary' && (x.sample.advantage !== 0 || refLogp !== null))),
  };

  const norms = gpu.createBuffer(4, 'stageGradSumSquares');
  const epochs: EpochStats[] = [];
  let last = { lr: 0, step: optimizer.step, skipped: true, reason: undefined as string | undefined };
  try {
    for (let epoch = 0; epoch < ppo.epochs; epoch++) {
      const stageLoss = { summary: 0, vote: 0 };
      const normSq = { summary: 0, vote: 0 };
      let klSum = 0,
        klTokens = 0,
        ratioSum = 0,
        ratioTokens = 0,
        clipped = 0;
      let stash: Float32Array[] | null = null;
      for (const stage of ['vote', 'summary'] as const) {
        let backwards = 0;
        for (const p of stagePacks[stage]) {
          const { pass, logp, parts } = await forward(p);
          try {
            const dlogp = new Float64Array(logp.length);
            for (const [k, i] of p.members.entries()) {
              const s = samples[i]!.sample;
              const lp = parts[k]!;
              const rows = p.layout?.rows[k];
              const ref = refLogp?.[i];
              ctx.onLogprobs?.(epoch, s, lp, ref ?? null);
              const w = weightOf[stage] * u[i]!;
              for (let t = 0; t < lp.length; t++) {
                const term = ppoTokenTerm(lp[t]!, s.oldLogprobs[t]!, s.advantage, ref?.[t], lo, hi, ppo.klBeta);
                stageLoss[stage] += u[i]! * term.loss;
                dlogp[rows ? rows[t]! : t] = w * term.dlogp;
                klSum += term.kl;
                ratioSum += term.ratio;
                if (term.clipped) clipped++;
              }
              klTokens += ref ? lp.length : 0;
              ratioTokens += lp.length;
            }
            if (dlogp.some((d) => d !== 0)) {
              pass.backward(dlogp);
              passes.backward++;
              backwards++;
            }
          } finally {
            pass.release();
          }
        }
        if (backwards > 0) normSq[stage] = await gradSumSquares(gpu, adapter, norms);
        // Set the vote gradient aside so the summary stage's can be measured alone.
        if (stage === 'vote' && backwards > 0 && samples.some((x) => x.sample.stage === 'summary'))
          stash = await takeGrads(gpu, adapter);
      }
      if (stash) addGrads(gpu, adapter, stash);
      const rep = await optimizer.update(1); // the loss is already a mean: no further division
      const total = normSq.summary + normSq.vote;
      const stat = (st: 'summary' | 'vote'): StageStat => ({
        loss: stageLoss[st],
        gradNorm: Math.sqrt(normSq[st]),
        gradShare: total > 0 ? normSq[st] / total : 0,
        ...counts[st],
      });
      epochs.push({
        loss: weightOf.summary * stageLoss.summary + weightOf.vote * stageLoss.vote,
        kl: refLogp ? klSum / Math.max(1, klTokens) : null,
        meanRatio: ratioTokens > 0 ? ratioSum / ratioTokens : 1,
        clipFraction: ratioTokens > 0 ? clipped / ratioTokens : 0,
        gradNorm: rep.gradNorm,
        stages: { summary: stat('summary'), vote: stat('vote') },
      });
      last = { lr: rep.lr, step: rep.step, skipped: rep.skipped, reason: rep.reason };
    }
  } finally {
    gpu.releaseBuffer(norms);
  }
  const first = epochs[0]!;
  return {
    loss: first.loss,
    kl: first.kl,
    gradNorm: first.gradNorm,
    lr: last.lr,
    step: last.step,
    skipped: last.skipped,
    reason: last.reason,
    stages: first.stages,
    epochs,
    passes,
    packing,
  };
}
