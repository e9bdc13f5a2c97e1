// One round of Who Is the Spy?: budget and mask the report, seat the players, generate the
// summaries (one batch), read the votes, score and compute advantages. The model sits behind
// the Policy interface (the GPU engine implements it; tests use a scripted one), so this file
// is the whole game and knows nothing about GPUs.
import { computeRewards, summaryFormat, type FormatFlags, type RoundRewards } from './rewards.ts';
import { roundAdvantages, type SpyBaselineState } from './advantages.ts';
import type { SpyRLConfig } from './config.ts';
import { fitToBudget, type BudgetedText, type DocumentCut, type SpyDocument } from './documents.ts';
import { maskSpan, type MaskedSpan, type MaskMode } from './masking.ts';
import { cleanReason, labelTokenIds, reasonPrompts, summaryPrompts, votePrompts, type ChatPrompt } from './prompts.ts';
import { Rng, type RngState } from './rng.ts';
import { assignRoles, seatsByLabel } from './roles.ts';
import { normalizeText, type GameTokenizer } from './text.ts';
import { castVotes } from './votes.ts';

// ---------------------------------------------------------------------------------------------
// 1. The policy the game plays against.

export interface GenerateOptions {
  maxTokens: number;
  temperature: number;
  topP: number;
  /** 0 = off. */
  topK: number;
  /** One seed per prompt: a completion must be a pure function of (prompt, seed, weights), for exact resume. */
  seeds: number[];
  /**
   * The policy's next call has prompts that open as these do (a player's vote or reason prompt
   * begins with the report its summary prompt began with; src/game/prompts.ts reportHead): a
   * policy may keep this call's KV cache for it, which then reads that common prefix from it
   * instead of prefilling it again, and releases it (or releaseKv does). The same weights, the
   * same positions: the results equal a fresh prefill's up to f32 rounding.
   */
  keepPromptKv?: boolean;
  /**
   * With keepPromptKv, the calls that follow, their prompts at their budgets (placeholder
   * summaries and reasons of the most tokens): a policy sizes the kept cache so that they run in
   * it in place, reading the common prefix where it already is.
   */
  nextCalls?: readonly NextCall[];
}

/** A call after this one (GenerateOptions.nextCalls): its prompts and the tokens it samples (0: none). */
export interface NextCall {
  prompts: readonly ChatPrompt[];
  maxTokens: number;
}

export interface Generation {
  /** The completion decoded, without the stop token. */
  text: string;
  /** Sampled ids, ending with the stop token when generation stopped (so the policy learns to stop). */
  tokenIds: number[];
  /**
   * Log-prob of each sampled id under the distribution it was actually drawn from (logits /
   * temperature, then top-k, then top-p, renormalised): the PPO behaviour log-prob.
   */
  logprobs: number[];
  /** maxTokens reached before a stop token. */
  truncated: boolean;
}

export interface Policy {
  /** Batched sampling; prompts[i].kvShare says which prompts share a prefix (civilians share all of it). */
  generate(prompts: ChatPrompt[], opts: GenerateOptions): Promise<Generation[]>;
  /** out[i][j] = log softmax(next-token logits after prompts[i])[candidateTokenIds[i][j]], temperature 1. */
  voteLogprobs(prompts: ChatPrompt[], candidateTokenIds: number[][]): Promise<number[][]>;
  /**
   * Milliseconds `generate` has spent prefilling prompts so far (their GPU work finished), when
   * the policy measures it; the round reads it around its summaries (timings.summaryPrefillMs).
   */
  readonly prefillMs?: number;
  /** Releases what a generate call kept for the next (keepPromptKv) when no call took it; playRound calls it at its end. */
  releaseKv?(): void;
}

// ---------------------------------------------------------------------------------------------
// 2. What a round produces.

export interface SummaryRecord {
  seat: number;
  label: number;
  role: 'civilian' | 'spy';
  text: string;
  tokens: number;
  truncated: boolean;
  sumLogprob: number;
  format: FormatFlags;
}

export interface VoteRecord {
  seat: number;
  label: number;
  /** Labels the voter could name, ascending. */
  candidates: number[];
  /** Vote distribution over `candidates`. */
  probs: number[];
  chosenLabel: number;
  chosenSeat: number;
  /** Renormalised log-prob of the chosen label (the vote's policy-gradient term). */
  logprob: number;
  /** The free-text reason before the vote (voteReason mode), else null. */
  reason: string | null;
}

export interface RoundRecord {
  round: number;
  documentId: string;
  /** The round's rng state before any draw (reproduces the round with the same model). */
  rngState: RngState;
  groupSize: number;
  spySeat: number;
  spyLabel: number;
  /** labels[seat] = k of "Player k". */
  labels: number[];
  /** The per-agent token budget's cut of the report; null when it fit. */
  cut: DocumentCut | null;
  mask: { mode: MaskMode; totalTokens: number; targetTokens: number; ratio: number; span: MaskedSpan };
  prompts: {
    civilianSummaryTokens: number;
    spySummaryTokens: number;
    /** Tokens the spy's summary prompt shares with the civilians' (KV cache shared up to the removed span). */
    sharedPrefixTokens: number;
    voteTokens: number[];
    /** The full prompt texts; omitted from run-log lines unless asked (they repeat the report N+2 times). */
    texts?: { civilianSummary: string; spySummary: string; votes: string[] };
  };
  summaries: SummaryRecord[];
  votes: VoteRecord[];
  rewards: RoundRewards;
  advantages: { summary: number[]; vote: (number | null)[]; spyBaseline: number; spyBaselineCount: number };
  metrics: {
    /** The spy got strictly more votes than any other player. */
    spyCaught: boolean;
    /** Share of civilian votes naming the spy. */
    voteAccuracy: number;
    meanCivilianSuspicion: number;
    spySuspicion: number;
    meanSummaryTokens: number;
  };
  /**
   * Filled by the trainer after the update that used this round. kl is null when it was not
   * computed (klBeta 0): never a 0 that was not measured.
   */
  train: {
    loss: number | null;
    kl: number | null;
    gradNorm: number | null;
    lr: number | null;
    stages?: StageStats;
    packing?: PackingStats;
  };
  /** Milliseconds; null without a clock (RoundContext.now) or until the trainer fills them. */
  timings: {
    summarizeMs: number | null;
    /** The part of summarizeMs spent prefilling the summary prompts; null unless the policy measures it. */
    summaryPrefillMs: number | null;
    voteMs: number | null;
    updateMs: number | null;
    totalMs: number | null;
  };
}

/**
 * Prefix sharing in an update (src/train/update.ts): the sequences trained, the training passes
 * they ran in, and the tokens run against the tokens they would have run one sequence a pass,
 * each summed over the update's epochs; the KL term's reference forwards are not among them.
 */
export interface PackingStats {
  sequences: number;
  passes: number;
  tokens: number;
  unpackedTokens: number;
  /**
   * Layers whose activations the training passes kept for their backward, and their layers, each
   * summed over those passes (absent in older saves).
   */
  keptLayers?: number;
  layers?: number;
}

/** Each stage's part of an update: its loss and its share of the squared gradient norm. */
export interface StageStats {
  summary: StageStat;
  vote: StageStat;
}

export interface StageStat {
  /** The stage's loss before its weight (token-mean over summaries; mean over votes). */
  loss: number;
  /** Norm of the gradient of weight * loss, alone. */
  gradNorm: number;
  /** |g_stage|^2 / (|g_summary|^2 + |g_vote|^2); 0 for both when neither has a gradient. */
  gradShare: number;
  /** Sequences and tokens of the stage in the update (votes: one per cast vote, reason included). */
  sequences: number;
  tokens: number;
}

/** One trainable sequence. */
export interface PolicySample {
  stage: 'summary' | 'vote';
  seat: number;
  promptTokenIds: number[];
  completionTokenIds: number[];
  /** Behaviour-policy log-prob of each completion token (for the PPO ratio). */
  oldLogprobs: number[];
  advantage: number;
  /**
   * A vote's label: the label tokens the vote distribution is renormalised over (at temperature
   * 1). The vote's log-prob is log softmax over these candidates' logits, not over the whole
   * vocabulary. null for sampled text (summaries; with voteReason, a vote's reason, a second
   * 'vote' sample of the same seat): drawn at sampling.temperature.
   */
  candidateTokenIds: number[] | null;
}

export interface RoundResult {
  record: RoundRecord;
  samples: PolicySample[];
  /** Spy baseline after this round: pass it to the next round and store it in checkpoints. */
  spyBaseline: SpyBaselineState;
}

export interface RoundContext {
  config: SpyRLConfig;
  tokenizer: GameTokenizer;
  document: SpyDocument;
  round: number;
  /** This round's own stream, e.g. roundRng(config.seed, round); playRound only forks it. */
  rng: Rng;
  spyBaseline: SpyBaselineState;
  /** A millisecond clock for timings; leave it out for byte-identical records. */
  now?: () => number;
}

/** The rng of round `round`: a function of (seed, round) alone, so a resumed run replays it. */
export function roundRng(seed: number | string, round: number): Rng {
  return Rng.fromSeed(seed).fork(`round/${round}`);
}

// ---------------------------------------------------------------------------------------------
// 3. Playing it.

/** fitToBudget caches per (tokenizer, budget, report), so replaying a document does not re-tokenize it. */
function budgeted(doc: SpyDocument, tokenizer: GameTokenizer, budget: number): BudgetedText {
  return fitToBudget(normalizeText(doc.report), tokenizer, budget); // parseDocuments output is already NFC, so this is the same string
}

function seeds(rng: Rng, n: number): number[] {
  return Array.from({ length: n }, () => rng.nextUint32());
}

function checkGenerations(gens: Generation[], n: number, what: string): void {
  if (gens.length !== n) throw new RangeError(`policy.generate returned ${gens.length} ${what} for ${n} prompts`);
  gens.forEach((g, i) => {
    if (g.tokenIds.length !== g.logprobs.length)
      throw new RangeError(`${what}[${i}]: ${g.tokenIds.length} tokens but ${g.logprobs.length} log-probs`);
  });
}

const mean = (xs: readonly number[]) => (xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length);

export async function playRound(ctx: RoundContext, policy: Policy): Promise<RoundResult> {
  try {
    return await playRoundStages(ctx, policy);
  } finally {
    policy.releaseKv?.(); // a kept cache the votes did not take (a failed stage)
  }
}

async function playRoundStages(ctx: RoundContext, policy: Policy): Promise<RoundResult> {
  const { config: cfg, tokenizer, rng } = ctx;
  const clock = ctx.now;
  const t0 = clock?.();
  const prefill0 = clock ? policy.prefillMs : undefined;
  const N = cfg.groupSize;

  const doc = budgeted(ctx.document, tokenizer, cfg.docTokenBudget);
  const masked = maskSpan(doc.text, tokenizer, {
    maskRatio: cfg.maskRatio,
    mode: cfg.maskMode,
    rng: rng.fork('mask'),
    placeholder: cfg.maskPlaceholder,
  });
  const roles = assignRoles(N, rng.fork('roles'));
  const { spySeat, labels } = roles;

  // Performing stage. The summaries' KV cache is kept for the reasons or votes, whose prompts open
  // with the same report, and sized for them: their prompts at their budgets (placeholder
  // summaries and reasons of the most tokens each) tell the policy how large (keepPromptKv).
  const sp = summaryPrompts(tokenizer, roles, masked.full, masked.spyText, cfg.prompts);
  const words = (n: number) => roles.labels.map(() => Array.from({ length: n }, () => 'word').join(' '));
  const atBudget = {
    roles,
    civilianText: masked.full,
    spyText: masked.spyText,
    summaries: words(cfg.summaryMaxTokens),
  };
  const voteCall: NextCall = {
    prompts: votePrompts(
      tokenizer,
      { ...atBudget, reasons: cfg.voteReason ? words(cfg.voteReasonMaxTokens) : null },
      cfg.prompts,
    ),
    maxTokens: 0,
  };
  const nextCalls: NextCall[] = cfg.voteReason
    ? [{ prompts: reasonPrompts(tokenizer, atBudget, cfg.prompts), maxTokens: cfg.voteReasonMaxTokens }, voteCall]
    : [voteCall];
  const sampling = { temperature: cfg.sampling.temperature, topP: cfg.sampling.topP, topK: cfg.sampling.topK };
  const gens = await policy.generate(sp.prompts, {
    maxTokens: cfg.summaryMaxTokens,
    ...sampling,
    seeds: seeds(rng.fork('summary-seeds'), N),
    keepPromptKv: true, // the reason or vote prompts open with the same report
    nextCalls,
  });
  checkGenerations(gens, N, 'summaries');
  const t1 = clock?.();
  const prefill1 = prefill0 === undefined ? undefined : policy.prefillMs;
  const texts = gens.map((g) => g.text);
  const formats = gens.map((g) => summaryFormat(g.text, g.truncated));

  // Voting stage.
  const voteInput = { roles, civilianText: masked.full, spyText: masked.spyText, summaries: texts };
  let reasons: string[] | null = null;
  let reasonGens: { prompts: ChatPrompt[]; gens: Generation[] } | null = null;
  if (cfg.voteReason) {
    const rp = reasonPrompts(tokenizer, voteInput, cfg.prompts);
    const rg = await policy.generate(rp, {
      maxTokens: cfg.voteReasonMaxTokens,
      ...sampling,
      seeds: seeds(rng.fork('reason-seeds'), N),
      keepPromptKv: true, // each vote prompt continues its reason prompt
      nextCalls: [voteCall],
    });
    checkGenerations(rg, N, 'reasons');
    reasons = rg.map((g) => cleanReason(g.text));
    reasonGens = { prompts: rp, gens: rg };
  }
  const vp = votePrompts(tokenizer, { ...voteInput, reasons }, cfg.prompts);
  const labelTokens = labelTokenIds(tokenizer, N);
  const listed = seatsByLabel(roles);
  const eligible = listed.map((_, v) => listed.filter((s) => s !== v));
  const candidateTokenIds = eligible.map((seats) => seats.map((s) => labelTokens[labels[s]! - 1]!));
  const lps = await policy.voteLogprobs(vp, candidateTokenIds);
  if (lps.length !== N || lps.some((row, v) => row.length !== candidateTokenIds[v]!.length)) {
    throw new RangeError('policy.voteLogprobs must return one log-prob per candidate per prompt');
  }
  const votes = castVotes(lps, eligible, { choice: cfg.voteChoice, rng: rng.fork('votes') });
  const t2 = clock?.();

  // Scoring.
  const rewards = computeRewards(votes, spySeat, formats, cfg.rewards);
  const adv = roundAdvantages(rewards.summary, rewards.vote, spySeat, cfg.advantages, ctx.spyBaseline);
  const voteCounts = labels.map((_, s) => votes.filter((v) => v.chosen === s).length);
  const civilianVotes = votes.filter((v) => v.voter !== spySeat);
  const civilianSeats = labels.map((_, s) => s).filter((s) => s !== spySeat);

  const record: RoundRecord = {
    round: ctx.round,
    documentId: ctx.document.id,
    rngState: rng.state(),
    groupSize: N,
    spySeat,
    spyLabel: labels[spySeat]!,
    labels: [...labels],
    cut: doc.cut,
    mask: {
      mode: masked.mode,
      totalTokens: masked.totalTokens,
      targetTokens: masked.targetTokens,
      ratio: masked.ratio,
      span: masked.span,
    },
    prompts: {
      civilianSummaryTokens: sp.prompts[spySeat === 0 ? 1 : 0]!.tokenIds.length,
      spySummaryTokens: sp.prompts[spySeat]!.tokenIds.length,
      sharedPrefixTokens: sp.sharedPrefixTokens,
      voteTokens: vp.map((p) => p.tokenIds.length),
      texts: {
        civilianSummary: sp.prompts[spySeat === 0 ? 1 : 0]!.text,
        spySummary: sp.prompts[spySeat]!.text,
        votes: vp.map((p) => p.text),
      },
    },
    summaries: gens.map((g, seat) => ({
      seat,
      label: labels[seat]!,
      role: seat === spySeat ? 'spy' : 'civilian',
      text: g.text,
      tokens: g.tokenIds.length,
      truncated: g.truncated,
      sumLogprob: g.logprobs.reduce((a, b) => a + b, 0),
      format: formats[seat]!,
    })),
    votes: votes.map((v) => ({
      seat: v.voter,
      label: labels[v.voter]!,
      candidates: v.candidates.map((s) => labels[s]!),
      probs: v.probs,
      chosenLabel: labels[v.chosen]!,
      chosenSeat: v.chosen,
      logprob: v.logprob,
      reason: reasons ? reasons[v.voter]! : null,
    })),
    rewards,
    advantages: {
      summary: adv.summary,
      vote: adv.vote,
      spyBaseline: adv.spyBaseline,
      spyBaselineCount: ctx.spyBaseline.count,
    },
    metrics: {
      spyCaught: voteCounts.every((c, s) => s === spySeat || c < voteCounts[spySeat]!),
      voteAccuracy: mean(civilianVotes.map((v) => (v.chosen === spySeat ? 1 : 0))),
      meanCivilianSuspicion: mean(civilianSeats.map((s) => rewards.suspicion[s]!)),
      spySuspicion: rewards.suspicion[spySeat]!,
      meanSummaryTokens: mean(gens.map((g) => g.tokenIds.length)),
    },
    train: { loss: null, kl: null, gradNorm: null, lr: null },
    timings: {
      summarizeMs: t0 === undefined || t1 === undefined ? null : t1 - t0,
      summaryPrefillMs: prefill0 === undefined || prefill1 === undefined ? null : prefill1 - prefill0,
      voteMs: t1 === undefined || t2 === undefined ? null : t2 - t1,
      updateMs: null,
      totalMs: t0 === undefined || t2 === undefined ? null : t2 - t0,
    },
  };

  const samples: PolicySample[] = [];
  gens.forEach((g, seat) =>
    samples.push({
      stage: 'summary',
      seat,
      promptTokenIds: sp.prompts[seat]!.tokenIds,
      completionTokenIds: g.tokenIds,
      oldLogprobs: g.logprobs,
      advantage: adv.summary[seat]!,
      candidateTokenIds: null,
    }),
  );
  votes.forEach((v) => {
    const a = adv.vote[v.voter];
    if (a === null || a === undefined) return; // an untrained vote (the spy's, by default)
    const idx = v.candidates.indexOf(v.chosen);
    // With voteReason the vote's action is (reason, label): the reason's tokens, drawn by the
    // policy, are trained with the vote's advantage as part of the same vote.
    const reason = reasonGens?.gens[v.voter];
    if (reasonGens && reason && reason.tokenIds.length > 0) {
      samples.push({
        stage: 'vote',
        seat: v.voter,
        promptTokenIds: reasonGens.prompts[v.voter]!.tokenIds,
        completionTokenIds: reason.tokenIds,
        oldLogprobs: reason.logprobs,
        advantage: a,
        candidateTokenIds: null,
      });
    }
    samples.push({
      stage: 'vote',
      seat: v.voter,
      promptTokenIds: vp[v.voter]!.tokenIds,
      completionTokenIds: [candidateTokenIds[v.voter]![idx]!],
      oldLogprobs: [v.logprob],
      advantage: a,
      candidateTokenIds: candidateTokenIds[v.voter]!,
    });
  });
  return { record, samples, spyBaseline: adv.nextSpyBaseline };
}

/** One JSONL line of the run log (no trailing newline); prompt texts only when asked. */
export function runLogLine(record: RoundRecord, opts: { includePromptTexts?: boolean } = {}): string {
  if (opts.includePromptTexts) return JSON.stringify(record);
  const { texts: _omitted, ...prompts } = record.prompts;
  return JSON.stringify({ ...record, prompts });
}
