// SpyRLConfig: every setting of a run, one typed object of defaults, each with the reason for
// its value (CONFIG_FIELDS, also rendered for the README by describeConfig). validateConfig
// merges a partial config over the defaults and rejects unknown keys and out-of-range values.
import { LORA_TARGETS, type LoraTarget } from '../model/loraTargets.ts';
import type { AdvantageConfig } from './advantages.ts';
import type { MaskMode } from './masking.ts';
import { DEFAULT_PROMPTS, type PromptConfig } from './prompts.ts';
import type { RewardConfig } from './rewards.ts';
import { MAX_GROUP_SIZE, MIN_GROUP_SIZE } from './roles.ts';
import type { VoteChoice } from './votes.ts';

export interface SamplingConfig {
  temperature: number;
  topP: number;
  /** 0 = off. */
  topK: number;
}

export interface PpoConfig {
  clipEps: number;
  /** Weight of the k3 KL estimate to the base model (adapter off); 0 = no KL term. */
  klBeta: number;
  /** Optimisation passes over each batch of rounds. */
  epochs: number;
  /** How the summary stage's per-token terms are averaged (votes: a mean over votes). */
  aggregation: 'token-mean' | 'sequence-mean';
  /** loss = summaryWeight * L_summaries + voteWeight * L_votes, each stage averaged on its own. */
  summaryWeight: number;
  voteWeight: number;
}

export interface OptimizerConfig {
  lr: number;
  warmupSteps: number;
  weightDecay: number;
  /** Global grad-norm clip; 0 = off. */
  maxGradNorm: number;
}

export interface LoraSettings {
  r: number;
  alpha: number;
  targetModules: LoraTarget[];
}

export interface SpyRLConfig {
  seed: number;
  groupSize: number;
  maskRatio: number;
  maskMode: MaskMode;
  maskPlaceholder: string;
  docTokenBudget: number;
  summaryMaxTokens: number;
  voteChoice: VoteChoice;
  voteReason: boolean;
  voteReasonMaxTokens: number;
  prompts: PromptConfig;
  sampling: SamplingConfig;
  rewards: RewardConfig;
  advantages: AdvantageConfig;
  ppo: PpoConfig;
  optimizer: OptimizerConfig;
  roundsPerUpdate: number;
  evalEvery: number;
  /** Reports held out of play for evaluation (stratified over sources; see splitGovReport). */
  evalHeldOut: number;
  /** Evaluation reads each held-out report whole up to this many tokens. */
  evalDocTokenBudget: number;
  /** A report longer than evalDocTokenBudget: 'mark' cuts it and flags the row, 'skip' leaves it out. */
  evalOverflow: 'mark' | 'skip';
  evalSummaryMaxTokens: number;
  /** ROUGE with Porter stemming (rouge_score's use_stemmer=True). */
  evalStemmer: boolean;
  checkpointEvery: number;
  lora: LoraSettings;
}

export type DeepPartial<T> = {
  [K in keyof T]?: T[K] extends readonly unknown[] ? T[K] : T[K] extends object ? DeepPartial<T[K]> : T[K];
};
export type SpyRLConfigInput = DeepPartial<SpyRLConfig>;

export const DEFAULT_CONFIG: SpyRLConfig = {
  seed: 0,
  groupSize: 4,
  maskRatio: 0.2,
  maskMode: 'remove',
  maskPlaceholder: '[...]',
  docTokenBudget: 2048,
  summaryMaxTokens: 256,
  voteChoice: 'sample',
  voteReason: false,
  voteReasonMaxTokens: 64,
  prompts: { ...DEFAULT_PROMPTS },
  sampling: { temperature: 1, topP: 1, topK: 0 },
  rewards: {
    catchSpy: 1,
    evadeSuspicion: 1,
    spyVote: 0,
    useExpectedVotes: false,
    emptyPenalty: 1,
    multiParagraphPenalty: 0.5,
    truncatedPenalty: 0.5,
  },
  advantages: { stdNormalize: false, spyBaseline: 'running-mean', spyBaselineWindow: 20 },
  ppo: { clipEps: 0.2, klBeta: 0, epochs: 1, aggregation: 'token-mean', summaryWeight: 1, voteWeight: 1 },
  optimizer: { lr: 5e-5, warmupSteps: 0, weightDecay: 0, maxGradNorm: 1 },
  roundsPerUpdate: 2,
  evalEvery: 20,
  evalHeldOut: 6,
  evalDocTokenBudget: 8192,
  evalOverflow: 'mark',
  evalSummaryMaxTokens: 768,
  evalStemmer: true,
  checkpointEvery: 20,
  lora: { r: 16, alpha: 32, targetModules: [...LORA_TARGETS] },
};

export class ConfigError extends Error {
  override name = 'ConfigError';
  constructor(
    readonly field: string,
    detail: string,
  ) {
    super(`config.${field}: ${detail}`);
  }
}

type Check = (v: unknown) => string | null; // null = valid, else what is wrong

const int =
  (lo: number, hi: number): Check =>
  (v) =>
    typeof v === 'number' && Number.isSafeInteger(v) && v >= lo && v <= hi
      ? null
      : `must be an integer in ${lo}..${hi}, got ${JSON.stringify(v)}`;
const num =
  (lo: number, hi: number, { loOpen = false, hiOpen = false } = {}): Check =>
  (v) =>
    typeof v === 'number' && Number.isFinite(v) && (loOpen ? v > lo : v >= lo) && (hiOpen ? v < hi : v <= hi)
      ? null
      : `must be a number in ${loOpen ? '(' : '['}${lo}, ${hi}${hiOpen ? ')' : ']'}, got ${JSON.stringify(v)}`;
const oneOf =
  (...values: string[]): Check =>
  (v) =>
    typeof v === 'string' && values.includes(v)
      ? null
      : `must be one of ${values.map((x) => `"${x}"`).join(', ')}, got ${JSON.stringify(v)}`;
const bool: Check = (v) => (typeof v === 'boolean' ? null : `must be true or false, got ${JSON.stringify(v)}`);
const text =
  (mustContain?: string): Check =>
  (v) => {
    if (typeof v !== 'string' || v.trim() === '') return `must be a non-empty string, got ${JSON.stringify(v)}`;
    return mustContain && !v.includes(mustContain) ? `must contain ${mustContain}` : null;
  };
const targets: Check = (v) => {
  if (!Array.isArray(v) || v.length === 0) return `must be a non-empty list of ${LORA_TARGETS.join(', ')}`;
  for (const t of v)
    if (!(LORA_TARGETS as readonly unknown[]).includes(t))
      return `unknown LoRA target ${JSON.stringify(t)} (supported: ${LORA_TARGETS.join(', ')})`;
  return new Set(v).size === v.length ? null : 'lists a target twice';
};

const NO_MAX = Number.MAX_SAFE_INTEGER;

/** Every leaf of SpyRLConfig: its check and why its default is what it is. */
export const CONFIG_FIELDS: Record<string, { check: Check; why: string }> = {
  seed: { check: int(0, NO_MAX), why: 'fixed by default so a run is reproducible; change it to play different rounds' },
  groupSize: {
    check: int(MIN_GROUP_SIZE, MAX_GROUP_SIZE),
    why: 'SpyRL default: 3 civilians give a real majority and a 3-sample group baseline, at 4 generations a round',
  },
  maskRatio: {
    check: num(0, 0.9, { loOpen: true }),
    why: 'SpyRL default: 20% missing is detectable from a good summary yet leaves the spy most of the report',
  },
  maskMode: {
    check: oneOf('remove', 'placeholder'),
    why: "'remove': the spy is not told, so it cannot simply announce the gap",
  },
  maskPlaceholder: { check: text(), why: "what 'placeholder' mode puts where the span was" },
  docTokenBudget: {
    check: int(16, 131072),
    why: 'keeps N vote prompts (report + N summaries) within a few thousand tokens of KV cache each on a consumer GPU',
  },
  summaryMaxTokens: {
    check: int(8, 8192),
    why: 'a one-paragraph summary is 100-200 words; longer is cut and penalised as truncated',
  },
  voteChoice: {
    check: oneOf('sample', 'argmax'),
    why: "'sample': the vote is drawn from the restricted label distribution with the round's seed, so its log-prob is exact and the vote stage is a true policy gradient. 'argmax' is greedy and biased: the cast vote is not drawn from the policy, yet it is still trained as if sampled (its log-prob times its advantage), a heuristic, not the gradient of the expected reward",
  },
  voteReason: {
    check: bool,
    why: "off: the vote is read directly from one next-token distribution, cheapest and exact. On: the reason tokens are part of the vote's sample and are trained with the vote's advantage",
  },
  voteReasonMaxTokens: { check: int(1, 1024), why: 'a one-sentence reason; the vote follows it' },
  'prompts.summaryInstruction': {
    check: text(),
    why: 'the task the game trains: a one-paragraph summary of the whole report',
  },
  'prompts.voteInstruction': {
    check: text(),
    why: 'states the rules so voters look for omissions, the only signal that separates the spy',
  },
  'prompts.voteQuestion': { check: text('{self}'), why: 'tells the voter its own label, which it may not vote for' },
  'prompts.reasonQuestion': { check: text('{self}'), why: 'as voteQuestion, asking for a reason before the vote' },
  'prompts.enableThinking': {
    check: bool,
    why: "off: Qwen3's thinking would spend the summary's token budget before the summary",
  },
  'sampling.temperature': {
    check: num(0, 10, { loOpen: true }),
    why: "1: the policy itself. Any other value is trained exactly: the trained policy is softmax(logits / temperature), in the sampler's stored log-probs and in the update alike",
  },
  'sampling.topP': {
    check: num(0, 1, { loOpen: true }),
    why: '1 (off). Training refuses other values: the update cannot recompute a truncated distribution, so the PPO ratio would be wrong',
  },
  'sampling.topK': { check: int(0, NO_MAX), why: '0 (off); training refuses other values, as topP' },
  'rewards.catchSpy': { check: num(0, 100), why: 'SpyRL: 1 for a civilian naming the spy' },
  'rewards.evadeSuspicion': {
    check: num(0, 100),
    why: 'SpyRL: a summary earns 1 - the share of other voters naming its author',
  },
  'rewards.spyVote': { check: num(0, 100), why: "0: the spy's vote has no right answer in the game" },
  'rewards.useExpectedVotes': {
    check: bool,
    why: 'off: rewards follow the votes actually cast (the game outcome); on lowers variance',
  },
  'rewards.emptyPenalty': {
    check: num(0, 100),
    why: 'an empty summary is never suspected for its content, so it must cost the full reward',
  },
  'rewards.multiParagraphPenalty': {
    check: num(0, 100),
    why: 'the task asks for one paragraph; half a reward keeps format secondary to content',
  },
  'rewards.truncatedPenalty': {
    check: num(0, 100),
    why: 'a summary cut mid-sentence is incomplete; half a reward, as above',
  },
  'advantages.stdNormalize': {
    check: bool,
    why: 'off (Dr. GRPO): with 3 civilians the std is noisy and dividing by it over-weights near-unanimous groups',
  },
  'advantages.spyBaseline': {
    check: oneOf('running-mean', 'group'),
    why: "the spy's prompt differs from the civilians', so their mean is not its baseline",
  },
  'advantages.spyBaselineWindow': {
    check: int(1, NO_MAX),
    why: 'about 20 rounds: long enough to be stable, short enough to follow the improving spy',
  },
  'ppo.clipEps': { check: num(0, 1, { loOpen: true, hiOpen: true }), why: 'PPO/GRPO standard 0.2' },
  'ppo.klBeta': {
    check: num(0, 10),
    why: '0: skips a base-model pass; the clip and a small LoRA keep the policy near the base in short runs',
  },
  'ppo.epochs': {
    check: int(1, 16),
    why: '1: each batch is used once, on-policy; more reuses rounds at the cost of staleness',
  },
  'ppo.aggregation': {
    check: oneOf('token-mean', 'sequence-mean'),
    why: "summary stage: 'token-mean' (DAPO, Dr. GRPO), no per-sequence length bias. Votes are always a mean over votes (a vote's reason tokens and label averaged within it)",
  },
  'ppo.summaryWeight': {
    check: num(0, 100),
    why: "1: L_summaries is a token mean over the update's summaries, on its own scale",
  },
  'ppo.voteWeight': {
    check: num(0, 100),
    why: "1: L_votes is a mean over votes, so at weight 1 the ~6 votes of an update weigh as much as its ~1,500 summary tokens (pooled, they were ~0.4% of the loss); the run log's grad-norm shares show what each stage contributes",
  },
  'optimizer.lr': {
    check: num(0, 1, { loOpen: true, hiOpen: true }),
    why: 'LoRA takes about 10x the learning rate of full fine-tuning; 5e-5 is a conservative RL value',
  },
  'optimizer.warmupSteps': {
    check: int(0, NO_MAX),
    why: '0: the LoRA B matrix starts at zero, so early steps are already small',
  },
  'optimizer.weightDecay': { check: num(0, 1), why: '0: short runs; decay mostly pulls the adapter back to zero' },
  'optimizer.maxGradNorm': { check: num(0, 1e6), why: '1: guards against a rare huge policy-gradient step' },
  roundsPerUpdate: {
    check: int(1, 1024),
    why: '2 rounds (14 sequences at N=4: 8 summaries, 6 votes) per optimizer step: less noisy than 1, still frequent updates',
  },
  evalEvery: {
    check: int(0, NO_MAX),
    why: 'the held-out evaluation (ROUGE-1/2/L, base vs adapter) every 20 rounds (0 = never): a trend without slowing training much',
  },
  evalHeldOut: {
    check: int(0, 1000),
    why: '6: 3 GAO and 3 CRS reports of the bundled sample, never played (the shortest with a reference of each source, so they are read whole); 0 = no evaluation',
  },
  evalDocTokenBudget: {
    check: int(16, 262144),
    why: '8192: each held-out report is read whole (the bundled ones fit), since a reference summarises the whole report, not a prefix',
  },
  evalOverflow: {
    check: oneOf('mark', 'skip'),
    why: "'mark': a longer report is cut to the budget and its row says the reference covers more than the input; 'skip' leaves it out of the means",
  },
  evalSummaryMaxTokens: {
    check: int(8, 8192),
    why: '768: GovReport references average about 440 words (600 tokens); a lower cap would limit ROUGE recall by length alone',
  },
  evalStemmer: {
    check: bool,
    why: "on: ROUGE-1/2/L with rouge_score's Porter stemming (use_stemmer=True), as summarisation papers report it",
  },
  checkpointEvery: { check: int(0, NO_MAX), why: 'every 20 rounds (0 = never): at most 20 rounds lost on a crash' },
  'lora.r': { check: int(1, 256), why: '16: enough capacity for RL, whose updates carry few bits per sample' },
  'lora.alpha': { check: num(0, 1e4, { loOpen: true }), why: '2r, the usual scale' },
  'lora.targetModules': {
    check: targets,
    why: 'all linear layers: LoRA matches full fine-tuning best when it adapts the MLPs too',
  },
};

function isPlainObject(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

function merge(defaults: Record<string, unknown>, input: unknown, path: string): Record<string, unknown> {
  if (!isPlainObject(input)) throw new ConfigError(path || '(root)', `must be an object, got ${JSON.stringify(input)}`);
  const at = (k: string) => (path ? `${path}.${k}` : k);
  const out: Record<string, unknown> = {};
  for (const [k, d] of Object.entries(defaults))
    out[k] = isPlainObject(d) ? merge(d, {}, at(k)) : Array.isArray(d) ? [...d] : d;
  for (const [k, v] of Object.entries(input)) {
    const field = at(k);
    if (!Object.hasOwn(defaults, k))
      throw new ConfigError(field, `unknown key (known here: ${Object.keys(defaults).join(', ')})`);
    const d = defaults[k];
    if (isPlainObject(d)) {
      out[k] = merge(d, v, field);
      continue;
    }
    const rule = CONFIG_FIELDS[field];
    if (!rule) throw new ConfigError(field, 'has no validation rule'); // a field added to DEFAULT_CONFIG without one
    const problem = rule.check(v);
    if (problem) throw new ConfigError(field, problem);
    out[k] = Array.isArray(v) ? [...v] : v;
  }
  return out;
}

/** The defaults with `input` applied; throws ConfigError naming the field on an unknown key or a bad value. */
export function validateConfig(input: unknown = {}): SpyRLConfig {
  const cfg = merge(DEFAULT_CONFIG as unknown as Record<string, unknown>, input, '') as unknown as SpyRLConfig;
  cfg.lora.targetModules = LORA_TARGETS.filter((t) => cfg.lora.targetModules.includes(t)); // module order, as PEFT writes it
  return cfg;
}

/**
 * Settings a training run refuses (validateConfig accepts them for playing): top-k and top-p cut
 * the distribution the tokens are drawn from, and the update recomputes log-probs of the whole
 * (temperature-scaled) softmax, so the PPO ratio would be wrong. Throws ConfigError.
 */
export function checkTrainable(cfg: SpyRLConfig): void {
  if (cfg.sampling.topP !== 1)
    throw new ConfigError(
      'sampling.topP',
      `must be 1 for training (got ${cfg.sampling.topP}): the update cannot recompute a top-p-truncated distribution, so its PPO ratio would be wrong`,
    );
  if (cfg.sampling.topK !== 0)
    throw new ConfigError(
      'sampling.topK',
      `must be 0 for training (got ${cfg.sampling.topK}): the update cannot recompute a top-k-truncated distribution, so its PPO ratio would be wrong`,
    );
}

/** Leaf paths of DEFAULT_CONFIG with their values. */
export function configLeaves(cfg: SpyRLConfig = DEFAULT_CONFIG): [string, unknown][] {
  const out: [string, unknown][] = [];
  const walk = (o: Record<string, unknown>, prefix: string) => {
    for (const [k, v] of Object.entries(o)) {
      if (isPlainObject(v)) walk(v, `${prefix}${k}.`);
      else out.push([`${prefix}${k}`, v]);
    }
  };
  walk(cfg as unknown as Record<string, unknown>, '');
  return out;
}

/** A Markdown table of every setting, its default and why (prompt texts abbreviated). */
export function describeConfig(): string {
  const rows = configLeaves().map(([path, v]) => {
    let shown = JSON.stringify(v);
    if (shown.length > 48) shown = `${shown.slice(0, 45)}..."`;
    return `| \`${path}\` | \`${shown.replaceAll('|', '\\|')}\` | ${CONFIG_FIELDS[path]?.why ?? ''} |`;
  });
  return ['| setting | default | why |', '|---|---|---|', ...rows].join('\n');
}
