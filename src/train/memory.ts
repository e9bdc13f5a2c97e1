// GPU memory of a SpyRL round (and of an SFT step), planned buffer by buffer from the shapes the
// engine allocates, and the check that refuses a run that cannot fit, saying what to change.
// Pure arithmetic, no GPU work: `spyrl train`, `spyrl sft`, `spyrl memory`, the worker and the
// model panel all plan through here, so the CLI and the app cannot disagree on whether a run fits.
// The KV and training-pass bytes come from their owners' byte functions (kvCacheBytes,
// trainingPassBytes), so a change there changes the plan.
//
// A round runs in phases; each holds its own buffers on top of what the whole run holds (base
// weights; LoRA A/B, their stacked copies, gradients and AdamW moments; the uniform arena and a
// readback buffer):
//   load       (q4) the weights and the quantizer's bf16 staging, before the adapter exists
//   summaries  N summary prompts' KV pages (shared prefixes once) + prefill/decode activations
//   reasons    (voteReason) the same for the free-text reasons before the votes
//   votes      N vote prompts' KV pages (report + every summary) + prefill activations
//   eval       (evalDocs > 0) greedy summaries of the held-out reports
//   update     one TrainingPass over the longest sample, or the civilians' samples packed as a
//              prefix tree (src/train/packing.ts), whichever is larger (trainingPassBytes)
//   total = weights + lora + max over phases (kv + activations + workspace)
// Free buffers never raise the peak: before Gpu.createBuffer makes a new buffer it destroys the
// pool's free buffers, oldest first, until the new one fits under the peak so far
// (src/gpu/device.ts makeRoom), so the measured peak (gpu.memory.peakBytes) is the largest set
// of buffers alive together, which is what is planned.
import { weightNames, type Qwen3Config } from '../model/config.ts';
import { KV_PAGE_SIZE, kvCacheBytes, kvPages, type KvDtype } from '../model/kvLayout.ts';
import { targetDims, type LoraTarget } from '../model/loraTargets.ts';
import { q4Words } from '../model/q4.ts';
import { nextAParts } from '../ops/colsSplit.ts';
import { GEMV_MAX_T } from '../ops/common.ts';
import type { SpyRLConfig } from '../game/config.ts';
import { DEFAULT_PROMPTS, type PromptConfig } from '../game/prompts.ts';
import { DEFAULT_MLP_CHUNK, ROUND_CHECKPOINTS, trainingPassBytes, type CheckpointDtype } from './trainingPassBytes.ts';

export type WeightsFormat = 'bf16' | 'q4';
export type { KvDtype, CheckpointDtype };

// ---------------------------------------------------------------------------------------------
// 1. Sequence lengths of a round: one place for the CLI and the app.

/**
 * Tokens of a summary prompt besides the report: chat template + summaryInstruction + "Report:".
 * 31 with DEFAULT_PROMPTS and the Qwen3 tokenizer (test/train/memoryPlan.test.ts re-measures it).
 */
export const SUMMARY_PROMPT_TOKENS = 32;
/**
 * Tokens of a vote prompt besides the report and the summaries: template, voteInstruction,
 * "Summaries:", voteQuestion and the prefilled "Player ". 99 measured.
 */
export const VOTE_PROMPT_TOKENS = 100;
/** Per listed summary: "Player k: " and the blank line (4), or "(no summary)" when empty (8). */
export const VOTE_TOKENS_PER_SUMMARY = 8;
/** Tokens after the point where one civilian's vote prompt leaves another's (its own question): 29. */
export const VOTE_TAIL_TOKENS = 32;
/** reasonQuestion is 12 tokens longer than voteQuestion; "\nVote: " after a reason adds 4. */
export const REASON_QUESTION_EXTRA_TOKENS = 12;
export const REASON_SEPARATOR_TOKENS = 4;
/**
 * Tokens before the report, which the spy's prompt always shares with the civilians': 5 in every
 * prompt of a round (the template and "Report:", src/game/prompts.ts reportHead; the instructions
 * follow the report).
 */
export const SUMMARY_HEAD_TOKENS = 4;
export const VOTE_HEAD_TOKENS = 4;
/** Tokens the spy's report may hold beyond the report minus its removed span: re-tokenization at the cut. */
const SPY_CUT_TOKENS = 4;
/** Tokens per character for instruction text longer than the default's (English is ~0.25). */
const EXTRA_TOKENS_PER_CHAR = 1 / 3;

export interface RoundShape {
  players: number; // N
  docTokens: number; // the report budget
  summaryTokens: number; // G, summaryMaxTokens
  /** Tokens of the free-text reason before each vote (voteReason); 0: votes are read directly. */
  reasonTokens?: number;
  /** Edited instructions make every prompt longer by their extra characters. */
  prompts?: PromptConfig;
  /** The spy's copy of the report lacks this share of it (maskRatio; 0: plan the spy's prompt at full length). */
  maskRatio?: number;
  /** 'placeholder' mode puts this text where the span was. */
  maskPlaceholder?: string | null;
}

export interface RoundSequences {
  /** Tokens of the spy's report at most: the budget minus the smallest span maskSpan removes. */
  spyReport: number;
  summaryPrompt: number; // S: report + SUMMARY_PROMPT_TOKENS
  /** Positions a summary slot holds: the prompt and all but the last sampled token. */
  summaryPositions: number;
  reasonPrompt: number; // 0 without reasons
  reasonPositions: number;
  votePrompt: number; // report + N (G + per-summary) + VOTE_PROMPT_TOKENS (+ the reason)
  /** Tokens of a vote prompt not shared with the first civilian's. */
  voteTail: number;
  /** Training samples: a summary (prompt + completion, G targets) and a vote (prompt + label, 1 target). */
  summarySample: number;
  voteSample: number;
}

function extraInstructionTokens(p: PromptConfig | undefined, keys: (keyof PromptConfig)[]): number {
  if (!p) return 0;
  let chars = 0;
  for (const k of keys) chars += Math.max(0, String(p[k]).length - String(DEFAULT_PROMPTS[k]).length);
  return Math.ceil(chars * EXTRA_TOKENS_PER_CHAR);
}

/**
 * maskSpan removes a span of target +- 25% tokens, target = round(maskRatio x report tokens), so
 * the spy's report holds at most D - (target - tolerance) tokens (the most when the report fills
 * its budget D), plus the placeholder in 'placeholder' mode.
 */
function spyReportTokens(D: number, ratio: number, placeholder: string | null | undefined): number {
  if (!(ratio > 0)) return D;
  const target = Math.max(1, Math.round(ratio * D));
  const removed = target - Math.max(1, Math.round(0.25 * target));
  return Math.min(
    D,
    D - removed + SPY_CUT_TOKENS + (placeholder ? Math.ceil(placeholder.length * EXTRA_TOKENS_PER_CHAR) : 0),
  );
}

export function roundSequences(s: RoundShape): RoundSequences {
  const N = s.players,
    D = s.docTokens,
    G = s.summaryTokens,
    reason = s.reasonTokens ?? 0;
  const spyReport = spyReportTokens(D, s.maskRatio ?? 0, s.maskPlaceholder);
  const summaryPrompt = D + SUMMARY_PROMPT_TOKENS + extraInstructionTokens(s.prompts, ['summaryInstruction']);
  const voteBase =
    D +
    N * (G + VOTE_TOKENS_PER_SUMMARY) +
    VOTE_PROMPT_TOKENS +
    extraInstructionTokens(s.prompts, ['voteInstruction', reason ? 'reasonQuestion' : 'voteQuestion']);
  const reasonPrompt = reason ? voteBase + REASON_QUESTION_EXTRA_TOKENS : 0;
  const reasonTail = reason ? REASON_QUESTION_EXTRA_TOKENS + reason + REASON_SEPARATOR_TOKENS : 0;
  const votePrompt = voteBase + reasonTail;
  return {
    spyReport,
    summaryPrompt,
    summaryPositions: summaryPrompt + G - 1,
    reasonPrompt,
    reasonPositions: reason ? reasonPrompt + reason - 1 : 0,
    votePrompt,
    voteTail: VOTE_TAIL_TOKENS + reasonTail,
    summarySample: summaryPrompt + G,
    voteSample: votePrompt + 1,
  };
}

// ---------------------------------------------------------------------------------------------
// 2. Buffers that live through the whole run.

/** Bytes of a pooled buffer (src/gpu/pool.ts: rounded up to 4, at least 4). */
const pooled = (bytes: number) => Math.max(4, Math.ceil(bytes / 4) * 4);
const f32 = (n: number) => pooled(n * 4);

/** Kernel params: MAX_PARAM_DISPATCHES_PER_SUBMIT (2048) x 256-byte slots (src/gpu/device.ts). */
export const UNIFORM_ARENA_BYTES = 2048 * 256;
/** Small uploads staged in the command stream: one UploadArena.CHUNK (src/gpu/launch.ts). */
export const UPLOAD_ARENA_BYTES = 256 * 1024;
/** Tokens per forward chunk (Qwen3Model's DEFAULT_CHUNK, checked in test/train/memoryPlan.test.ts). */
export const FORWARD_CHUNK = 256;
/**
 * The chunks forwardChunk 'auto' tries past FORWARD_CHUNK, largest first. A chunk of T tokens makes the prefill's
 * products T rows tall: at 256 rows Qwen3-4B's k/v, o and down projections have fewer output tiles
 * than a large GPU has multiprocessors (split over R, with a reduce dispatch each), and every
 * chunk is another pass over all the layers' dispatches and weights.
 */
export const FORWARD_CHUNKS_AUTO = [2048, 1024, 512] as const;
/**
 * The MLP chunks of the update's training passes mlpChunk 'auto' tries past DEFAULT_MLP_CHUNK, largest
 * first (TrainingPassOptions.mlpChunk: the rows of each layer's gate, up and down products, forward
 * and backward). At 256 rows Qwen3-4B's down projection and the input gradients of gate and up
 * have 80 output tiles of 64 x 128, fewer than a large GPU has multiprocessors: split over R with a
 * reduce dispatch each, and every chunk is another round of a layer's MLP dispatches.
 */
export const MLP_CHUNKS_AUTO = [2048, 1024, 512] as const;
/**
 * Checkpoints of SpyRLTrainer's passes (its default) and of sftStep's (TrainingPass's default); the
 * MLP chunk TrainingPass takes by default, where mlpChunk 'auto' starts.
 */
export { DEFAULT_MLP_CHUNK, ROUND_CHECKPOINTS };
export const SFT_CHECKPOINTS: CheckpointDtype = 'f32';
/** load.ts Q4_STAGING_BYTES: the bf16 rows a q4 load quantizes at once (checked in the test). */
export const Q4_STAGING_BYTES = 4 << 20;

/** Base weights on the GPU: bf16 packed two per u32; q4 (docs/ENGINE.md) for every 2-D weight, norms bf16. */
export function weightBytes(
  cfg: Qwen3Config,
  format: WeightsFormat,
): { total: number; largest: { bytes: number; what: string } } {
  let total = 0;
  let largest = { bytes: 0, what: '' };
  for (const w of weightNames(cfg)) {
    const n = w.shape.reduce((a, b) => a * b, 1);
    const bytes = format === 'q4' && w.shape.length === 2 ? q4Words(w.shape[0]!, w.shape[1]!) * 4 : pooled(n * 2);
    total += bytes;
    if (bytes > largest.bytes) largest = { bytes, what: `the ${format} weight ${w.name} (${w.shape.join(', ')})` };
  }
  return { total, largest };
}

export interface LoraShape {
  r: number;
  targets: readonly LoraTarget[];
}

/** A (r, K) and B (N, r) of every adapted projection, f32; `copies` of them (params, grads, m, v). */
export function loraBytes(cfg: Qwen3Config, lora: LoraShape, copies: number): number {
  let one = 0;
  for (const t of lora.targets) {
    const d = targetDims(cfg, t);
    one += f32(lora.r * d.in) + f32(d.out * lora.r);
  }
  return copies * cfg.numLayers * one;
}

/**
 * The stacked copies of a group's A and B matrices (LoraAdapter.packed), made where a group the
 * adapter targets whole binds its LoRA branches packed in decode (K.groupLoraPacks: a device with
 * fewer storage buffers a stage than one u and B per projection need, but 2 more than the group's
 * own: q/k/v with its norm at 10 to 13, Chrome's 10; gate/up at 8 or 9), q/k/v's wherever its
 * A product is begun in down_proj's GEMV (tuning.loraAFold: from 10 on, on GPUs), and gate/up's
 * wherever its GEMV begins down_proj's A product (K.groupPairs, from 10 on, with down_proj
 * adapted too). Both groups' bytes, planned on every device.
 */
export function loraPackBytes(cfg: Qwen3Config, lora: LoraShape): number {
  let bytes = 0;
  for (const group of LORA_GROUPS) {
    if (!group.every((t) => lora.targets.includes(t))) continue;
    for (const t of group) {
      const d = targetDims(cfg, t);
      bytes += f32(lora.r * d.in) + f32(d.out * lora.r);
    }
  }
  return cfg.numLayers * bytes;
}
const LORA_GROUPS: readonly (readonly LoraTarget[])[] = [
  ['q_proj', 'k_proj', 'v_proj'],
  ['gate_proj', 'up_proj'],
];

// ---------------------------------------------------------------------------------------------
// 3. Phases.

export type RoundPhase = 'load' | 'summaries' | 'reasons' | 'votes' | 'eval' | 'update';

export interface PlannedBuffer {
  name: string;
  shape: string;
  /** Of all `count` buffers together. */
  bytes: number;
  /** Identical buffers this entry stands for (the largest single buffer is bytes / count). */
  count: number;
}

export interface PhasePlan {
  phase: RoundPhase;
  kv: number;
  activations: number;
  workspace: number;
  /** weights + lora + kv + activations + workspace (load: weights + its staging; no adapter yet) */
  total: number;
  /** What the phase holds besides the weights and the LoRA state, largest first. */
  buffers: PlannedBuffer[];
  /** Its largest single buffer. */
  largest: { bytes: number; what: string };
}

const buf = (name: string, shape: string, bytes: number, count = 1): PlannedBuffer => ({ name, shape, bytes, count });
const sum = (b: readonly PlannedBuffer[]) => b.reduce((n, x) => n + x.bytes, 0);

/**
 * The live buffers of one Qwen3Model.forward over `tokens` tokens with `rows` logit rows: the
 * (R, V) logits and one chunk's intermediates (equal chunks reuse each other's buffers; a shorter
 * last chunk's are made after the full chunk's are dropped), with the gathered rows and, in any
 * chunk after the first, their (R', V) logits before the copy into place.
 */
function forwardBuffers(
  cfg: Qwen3Config,
  tokens: number,
  rows: number,
  r: number,
  chunk: number,
  tag: string,
): PlannedBuffer[] {
  const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, vocabSize: V } = cfg;
  const chunkSet = (T: number, later: boolean): PlannedBuffer[] => {
    const out = [
      buf(`${tag} ids, slots, positions`, `3 x (${T}) u32`, 3 * f32(T), 3),
      buf(`${tag} x, h`, `2 x (${T}, C) f32`, 2 * f32(T * C), 2),
      buf(`${tag} q, qNormed, attn`, `3 x (${T}, NH*HD) f32`, 3 * f32(T * NH * HD), 3),
      buf(`${tag} k, kNormed, v`, `3 x (${T}, NKV*HD) f32`, 3 * f32(T * NKV * HD), 3),
      buf(`${tag} gate, up, act`, `3 x (${T}, I) f32`, 3 * f32(T * I), 3),
    ];
    if (r > 0) out.push(buf(`${tag} loraU`, `3 x (${T}, r) f32`, 3 * f32(T * r), 3));
    // Decode on GPUs: q/k/v's LoRA A product as down_proj's partial sums (K.NextAProduct)
    if (r > 0 && T <= GEMV_MAX_T)
      out.push(
        buf(`${tag} loraAParts`, `(${nextAParts(C)}, ${T}, 3 r) f32`, f32(nextAParts(C) * T * 3 * r)),
        // o_proj's as attention_combine's (K.AttentionAProduct), down_proj's as the gate/up GEMV's (K.PairAProduct)
        buf(`${tag} loraOParts`, `(NH, ${T}, r) f32`, f32(NH * T * r)),
        buf(`${tag} loraDParts`, `(${nextAParts(I)}, ${T}, r) f32`, f32(nextAParts(I) * T * r)),
      );
    if (rows > 0)
      out.push(buf(`${tag} logitRows`, '(R) u32', f32(rows)), buf(`${tag} hLast`, '(R, C) f32', f32(rows * C)));
    if (later && rows > 1) out.push(buf(`${tag} logitsChunk`, "(R', V) f32", f32((rows - 1) * V)));
    return out;
  };
  const full = Math.min(tokens, chunk),
    last = tokens > chunk ? tokens - Math.floor((tokens - 1) / chunk) * chunk : 0;
  const candidates = [chunkSet(full, tokens >= 2 * chunk)];
  if (last > 0) candidates.push(chunkSet(last, true));
  return [
    buf(`${tag} logits`, '(R, V) f32', f32(Math.max(rows, 1) * V)),
    ...candidates.reduce((a, b) => (sum(b) > sum(a) ? b : a)),
  ];
}

interface BatchShape {
  slots: number;
  /** Prompt tokens of a civilian (the first one is the KV source). */
  prompt: number;
  /** Tokens of another civilian's prompt after the part it shares with the source. */
  civilianTail: number;
  /** The spy's prompt, and the tokens before its report it surely shares with the source. */
  spyPrompt: number;
  spyHead: number;
  /** Positions written past the prompt (generated tokens fed back). */
  extra: number;
  /**
   * Prompt tokens the source civilian and the spy take from the previous batch's kept cache instead
   * of prefilling them (GpuPolicy's prefillSources: their report, whole pages); 0 without one.
   */
  adopt?: number;
  spyAdopt?: number;
  /** Whether prompts share KV prefixes (the game's prompts; eval prompts do not). */
  shared: boolean;
}

/**
 * How GpuPolicy lays out a batch (sharedPositions, planPages): the source civilian holds its
 * prompt and answer; every other prompt maps the source's whole pages of their common prefix and
 * holds (and re-prefills) the rest. The spy's copy differs from the removed span on, planned at
 * the report's first token: it shares only the head.
 */
function batchLayout(b: BatchShape, P: number) {
  const own = (tokens: number) => kvPages(tokens + b.extra, P);
  if (!b.shared)
    return { pages: b.slots * own(b.prompt), pass0: { tokens: b.slots * b.prompt, rows: b.slots }, pass1: null };
  const civilianShared = Math.floor(Math.max(0, b.prompt - Math.max(1, b.civilianTail)) / P) * P;
  const spyShared = Math.floor(Math.min(b.spyHead, b.spyPrompt - 1) / P) * P;
  // Adopted pages are the prompt's own (the same pages); only its prefill starts later. One page
  // less than the shapes give: the real prompt's report ends inside a page somewhere else.
  const adopted = (tokens: number, prompt: number) => Math.max(0, Math.floor(Math.min(tokens, prompt - 1) / P) * P - P);
  const source = b.prompt - adopted(b.adopt ?? 0, b.prompt);
  const spy = b.spyPrompt - Math.max(spyShared, adopted(b.spyAdopt ?? 0, b.spyPrompt));
  const pages = own(b.prompt) + (b.slots - 2) * (own(b.prompt) - civilianShared / P) + own(b.spyPrompt) - spyShared / P;
  // Pass 0: prompts that share nothing (the source, and the spy when its head is under a page); pass 1: the borrowers.
  const civilians = { tokens: (b.slots - 2) * (b.prompt - civilianShared), rows: b.slots - 2 };
  return spyShared > 0
    ? {
        pages,
        pass0: { tokens: source, rows: 1 },
        pass1: { tokens: civilians.tokens + spy, rows: civilians.rows + 1 },
      }
    : { pages, pass0: { tokens: source + spy, rows: 2 }, pass1: civilians.rows > 0 ? civilians : null };
}

export interface RoundPlanOptions extends RoundShape {
  weights: WeightsFormat;
  kv: KvDtype;
  lora: LoraShape;
  /** false: inference only (no gradients, no AdamW moments, no update phase). Default true. */
  training?: boolean;
  /** TrainingPass options (default: ROUND_CHECKPOINTS). */
  checkpoints?: CheckpointDtype;
  /**
   * Rows of the update's MLP chunks (TrainingPassOptions.mlpChunk). 'auto' (default): the largest
   * of MLP_CHUNKS_AUTO whose plan neither raises the round's peak nor its largest buffer above
   * those of DEFAULT_MLP_CHUNK rows; withKeptLayers grows it further into a budget the kept layers
   * leave. The chunk the plan then holds is MemoryPlan.mlpChunk.
   */
  mlpChunk?: number | 'auto';
  /**
   * Layers of the update's training passes that keep their activations for the backward instead
   * of recomputing them (TrainingPassOptions.keepLayers; default 0). withKeptLayers picks it:
   * planMemory, and so every run, keeps as many as fit the round's own peak or the user's budget.
   */
  keepLayers?: number;
  /**
   * Whether the summaries' (and reasons') KV cache is kept for the next stage, whose prompts open
   * with the same report (GpuPolicy's keepPromptKv): one cache for the play stages, sized for the
   * largest of them, the later ones reading the report where the summaries left it. 'auto'
   * (default): where that does not raise the round's peak.
   */
  keepPromptKv?: boolean | 'auto';
  /** Held-out reports at an evaluation (0: none); src/train/evaluate.ts summarises them one at a time. */
  evalDocs?: number;
  /** Report and summary budgets of the evaluation (evalDocTokenBudget, evalSummaryMaxTokens; default: the game's). */
  evalDocTokens?: number;
  evalSummaryTokens?: number;
  /**
   * Tokens per prefill chunk (Qwen3Model.chunk). 'auto' (default): the largest of
   * FORWARD_CHUNKS_AUTO whose plan neither raises the round's peak nor its largest buffer above
   * those of FORWARD_CHUNK tokens, the chunk the plan then holds (MemoryPlan.forwardChunk).
   */
  forwardChunk?: number | 'auto';
}

export interface MemoryPlan {
  kind: 'round' | 'sft';
  weights: number;
  kv: number; // of the peak phase
  lora: number;
  activations: number; // of the peak phase
  workspace: number; // of the peak phase
  total: number;
  peakPhase: RoundPhase;
  phases: PhasePlan[];
  /** The largest single buffer: it must fit maxStorageBufferBindingSize. */
  largestBuffer: { bytes: number; what: string };
  sequences: RoundSequences | null;
  /** Longest sequence of the update (the training pass). */
  trainSeqLen: number;
  /** Layers whose activations the update's passes keep (options.keepLayers; 0 without training). */
  keepLayers: number;
  /**
   * Whether the round keeps the summaries' (and reasons') KV cache for the next stage's prompts
   * (GenerateOptions.keepPromptKv, GpuPolicy.keepPromptKv): options.keepPromptKv, or with 'auto',
   * where that does not raise the round's peak. false for SFT.
   */
  keepPromptKv: boolean;
  /**
   * Tokens per prefill chunk the plan holds and a run sets (Qwen3Model.chunk): options.forwardChunk,
   * or with 'auto' the largest that leaves the peak and the largest buffer where FORWARD_CHUNK does.
   */
  forwardChunk: number;
  /**
   * Rows of the update's MLP chunks the plan holds and a run's training passes take
   * (TrainingPassOptions.mlpChunk): options.mlpChunk, or with 'auto' the largest that leaves the
   * peak and the largest buffer where DEFAULT_MLP_CHUNK does (withKeptLayers: or a budget allows).
   */
  mlpChunk: number;
  cfg: Qwen3Config;
  options: Required<Omit<RoundPlanOptions, 'prompts'>> & { prompts?: PromptConfig };
}

function resolve(o: RoundPlanOptions): MemoryPlan['options'] {
  return {
    ...o,
    maskRatio: o.maskRatio ?? 0,
    maskPlaceholder: o.maskPlaceholder ?? null,
    reasonTokens: o.reasonTokens ?? 0,
    training: o.training ?? true,
    checkpoints: o.checkpoints ?? ROUND_CHECKPOINTS,
    mlpChunk: o.mlpChunk ?? 'auto',
    keepLayers: o.keepLayers ?? 0,
    keepPromptKv: o.keepPromptKv ?? 'auto',
    evalDocs: o.evalDocs ?? 0,
    evalDocTokens: o.evalDocTokens ?? o.docTokens,
    evalSummaryTokens: o.evalSummaryTokens ?? o.summaryTokens,
    forwardChunk: o.forwardChunk ?? 'auto',
  };
}

function persistent(cfg: Qwen3Config, o: MemoryPlan['options']) {
  const weights = weightBytes(cfg, o.weights);
  // A, B always (and their stacked copies for a packed group fold); with training dA, dB and
  // AdamW's m and v of both, and the grad-norm word.
  const lora = loraBytes(cfg, o.lora, o.training ? 4 : 1) + loraPackBytes(cfg, o.lora) + (o.training ? 4 : 0);
  return { weights, lora };
}

/** The largest readback of a run: sampled ids, vote candidates, log-probs, a LoRA tensor at a checkpoint. */
function stagingBytes(cfg: Qwen3Config, o: MemoryPlan['options']): number {
  const N = o.players,
    G = o.summaryTokens;
  const loraTensor = Math.max(
    0,
    ...o.lora.targets.map((t) => {
      const d = targetDims(cfg, t);
      return o.lora.r * Math.max(d.in, d.out);
    }),
  );
  return f32(Math.max(2 * N, N * N, G * Math.max(1, N - 1), loraTensor, 1));
}

function phasePlan(
  phase: RoundPhase,
  base: number,
  kv: PlannedBuffer[],
  activations: PlannedBuffer[],
  workspace: PlannedBuffer[],
): PhasePlan {
  const k = sum(kv),
    a = sum(activations),
    w = sum(workspace);
  const buffers = [...kv, ...activations, ...workspace].sort((x, y) => y.bytes - x.bytes);
  const one = buffers.reduce(
    (m, b) =>
      b.bytes / b.count > m.bytes ? { bytes: b.bytes / b.count, what: `the ${phase} buffer ${b.name} ${b.shape}` } : m,
    { bytes: 0, what: '' },
  );
  return { phase, kv: k, activations: a, workspace: w, total: base + k + a + w, buffers, largest: one };
}

/** One generate (GpuPolicy.generate) or voteLogprobs call over a batch, as a phase. */
function batchPhase(
  cfg: Qwen3Config,
  o: MemoryPlan['options'] & { forwardChunk: number },
  phase: RoundPhase,
  b: BatchShape,
  decode: boolean,
  base: number,
  workspace: PlannedBuffer[],
  hold: { pages: number; maxT: number } | null = null,
): PhasePlan {
  const V = cfg.vocabSize,
    N = b.slots,
    P = KV_PAGE_SIZE,
    r = o.lora.r;
  const layout = batchLayout(b, P);
  // With keepPromptKv, the round's one cache, sized for every stage that runs in it (hold).
  const pages = hold?.pages ?? layout.pages;
  const maxT = hold?.maxT ?? b.prompt + b.extra;
  // L layers' K and V pools (one buffer each) and the page table.
  const pool = kvCacheBytes({ ...cfg, numLayers: 1 }, { dtype: o.kv, pageSize: P, pages }) / 2;
  const table = kvCacheBytes(cfg, { dtype: o.kv, pageSize: P, pages, slots: N, maxT }) - 2 * cfg.numLayers * pool;
  const kv = [
    buf(
      `${phase} KV cache`,
      `2L x (${pages} pages, ${P}, NKV, HD) ${o.kv}`,
      2 * cfg.numLayers * pool,
      2 * cfg.numLayers,
    ),
    buf(`${phase} KV page table`, `(${N}, ${kvPages(maxT, P)}) u32`, table),
  ];
  // Prefill: pass 0 the prompts that own their prefix, pass 1 the borrowers (each re-prefills its tail).
  const passes = [layout.pass0, ...(layout.pass1 ? [layout.pass1] : [])].map((x) =>
    forwardBuffers(cfg, x.tokens, x.rows, r, o.forwardChunk, 'prefill'),
  );
  const prefill = [
    buf(`${phase} promptLogits`, '(N, V) f32', f32(N * V)),
    ...passes.reduce((a, x) => (sum(x) > sum(a) ? x : a)),
  ];
  let act = prefill;
  if (decode) {
    // Ahead decoding (src/model/generate.ts decodeSteps): ids and log-probs of two steps, the RNG
    // rows, and the next step's readback in flight beside the planned staging.
    const sampling = [
      buf('sampled ids and log-probs', '2 x (2N) u32', 2 * f32(2 * N), 2),
      buf('sampling RNG rows', '(N, 3) u32', f32(3 * N)),
      buf('readback in flight', 'MAP_READ (2N) u32', f32(2 * N)),
    ];
    const step = forwardBuffers(cfg, N, N, r, o.forwardChunk, 'decode');
    act = [...sampling, ...(sum(prefill) >= sum(step) ? prefill : step)];
  }
  return phasePlan(phase, base, kv, act, workspace);
}

/**
 * The memory of one SpyRL round: every phase's buffers, and the total at the largest phase.
 * Lengths are the budgets (a report of docTokens, summaries of summaryTokens): an upper bound.
 */
export function planRound(cfg: Qwen3Config, options: RoundPlanOptions): MemoryPlan {
  const o = resolve(options);
  const fixedF = fixedChunk('forwardChunk', o.forwardChunk, 'tokens');
  const fixedM = fixedChunk('mlpChunk', o.mlpChunk, 'rows');
  // The plan at the fixed chunks, FORWARD_CHUNK tokens and DEFAULT_MLP_CHUNK rows for those left
  // 'auto', decides the cache keeping; then each 'auto' chunk takes the largest candidate that
  // holds no more at the peak and in any one buffer. The prefill's chunk grows only the play phases'
  // activations and the MLP's only the update's, so where the update is the peak the first may
  // grow and the second not, and where a phase of play is, the reverse (without training, no
  // update: the MLP chunk stays DEFAULT_MLP_CHUNK, which nothing runs).
  const base = planRoundAt(cfg, { ...o, forwardChunk: fixedF ?? FORWARD_CHUNK, mlpChunk: fixedM ?? DEFAULT_MLP_CHUNK });
  const at = (forwardChunk: number, mlpChunk: number) =>
    planRoundAt(cfg, { ...o, keepPromptKv: base.keepPromptKv, forwardChunk, mlpChunk });
  let best = base;
  if (fixedF === null) best = grownChunk(base, FORWARD_CHUNKS_AUTO, (c) => at(c, best.mlpChunk)) ?? best;
  if (fixedM === null && o.training) best = grownChunk(base, MLP_CHUNKS_AUTO, (c) => at(best.forwardChunk, c)) ?? best;
  // The options keep 'auto' for replanning.
  return { ...best, options: o };
}

/**
 * The plan at the first of `chunks` (largest first) that holds no more than `limit` at the peak and
 * in any one buffer, or null.
 */
function grownChunk(
  limit: MemoryPlan,
  chunks: readonly number[],
  at: (chunk: number) => MemoryPlan,
): MemoryPlan | null {
  for (const chunk of chunks) {
    const p = at(chunk);
    if (p.total <= limit.total && p.largestBuffer.bytes <= limit.largestBuffer.bytes) return p;
  }
  return null;
}

/** A chunk option's number, null for 'auto'; anything else is refused by name. */
function fixedChunk(name: string, v: number | 'auto', unit: string): number | null {
  if (v === 'auto') return null;
  if (!Number.isSafeInteger(v) || v < 1)
    throw new RangeError(`${name} must be a positive integer of ${unit} or 'auto' (got ${String(v)})`);
  return v;
}

function planRoundAt(
  cfg: Qwen3Config,
  o: MemoryPlan['options'] & { forwardChunk: number; mlpChunk: number },
): MemoryPlan {
  if (!Number.isInteger(o.players) || o.players < 3)
    throw new RangeError(`players must be an integer >= 3 (got ${o.players})`);
  const seq = roundSequences(o);
  const spyCut = o.docTokens - seq.spyReport;
  const { weights, lora } = persistent(cfg, o);
  const base = weights.total + lora;
  const workspace = [
    buf('uniform arena', '(2048 dispatches x 256 B) kernel params', UNIFORM_ARENA_BYTES),
    buf('upload arena', 'staged small uploads', UPLOAD_ARENA_BYTES),
    buf('readback staging', 'MAP_READ', stagingBytes(cfg, o)),
  ];
  const N = o.players;
  const summaryShape: BatchShape = {
    slots: N,
    prompt: seq.summaryPrompt,
    civilianTail: 1,
    spyPrompt: seq.summaryPrompt - spyCut,
    spyHead: SUMMARY_HEAD_TOKENS,
    extra: o.summaryTokens - 1,
    shared: true,
  };
  const reasonShape: BatchShape | null =
    o.reasonTokens > 0
      ? {
          slots: N,
          prompt: seq.reasonPrompt,
          civilianTail: VOTE_TAIL_TOKENS + REASON_QUESTION_EXTRA_TOKENS,
          spyPrompt: seq.reasonPrompt - spyCut,
          spyHead: VOTE_HEAD_TOKENS,
          extra: o.reasonTokens - 1,
          shared: true,
        }
      : null;
  const voteShape: BatchShape = {
    slots: N,
    prompt: seq.votePrompt,
    civilianTail: seq.voteTail,
    spyPrompt: seq.votePrompt - spyCut,
    spyHead: VOTE_HEAD_TOKENS,
    extra: 0,
    shared: true,
  };
  // The summaries, reasons and votes, each in a cache of its own, or (keepPromptKv) all in the
  // summaries' cache, sized for each stage at its budgets plus a page a prompt (GpuPolicy's
  // createCache with GenerateOptions.nextCalls), the later stages reading the report (after
  // reasons, the votes their whole reason prompt) where the earlier one left it.
  const playStages = (keep: boolean): PhasePlan[] => {
    const P = KV_PAGE_SIZE;
    const later = [reasonShape, voteShape].filter((x): x is BatchShape => x !== null);
    const hold = keep
      ? {
          pages: Math.max(
            batchLayout(summaryShape, P).pages,
            ...later.map((x) => batchLayout({ ...x, extra: x.extra + P }, P).pages),
          ),
          maxT: Math.max(summaryShape.prompt + summaryShape.extra, ...later.map((x) => x.prompt + x.extra + P)),
        }
      : null;
    const report = { adopt: VOTE_HEAD_TOKENS + o.docTokens, spyAdopt: VOTE_HEAD_TOKENS + seq.spyReport };
    const out = [batchPhase(cfg, o, 'summaries', summaryShape, true, base, workspace, hold)];
    if (reasonShape)
      out.push(batchPhase(cfg, o, 'reasons', { ...reasonShape, ...(keep && report) }, true, base, workspace, hold));
    const voteAdopt = reasonShape ? { adopt: seq.reasonPrompt, spyAdopt: seq.reasonPrompt - spyCut } : report;
    out.push(batchPhase(cfg, o, 'votes', { ...voteShape, ...(keep && voteAdopt) }, false, base, workspace, hold));
    return out;
  };
  const withKept = playStages(true),
    withoutKept = playStages(false);
  const phases: PhasePlan[] = [...loadPhase(cfg, o.weights, weights.total)];
  if (o.evalDocs > 0) {
    phases.push(
      batchPhase(
        cfg,
        o,
        'eval',
        {
          slots: 1,
          prompt: seq.summaryPrompt - o.docTokens + o.evalDocTokens,
          civilianTail: 0,
          spyPrompt: 0,
          spyHead: 0,
          extra: o.evalSummaryTokens - 1,
          shared: false,
        },
        true,
        base,
        workspace,
      ),
    );
  }
  let trainSeqLen = 0;
  let keepLayers = 0;
  if (o.training) {
    const L = cfg.numLayers;
    if (!(Number.isInteger(o.keepLayers) && o.keepLayers >= 0 && o.keepLayers <= L))
      throw new RangeError(`keepLayers must be an integer in 0..${L} (got ${String(o.keepLayers)})`);
    const shape = {
      lora: o.lora.targets.length ? { r: o.lora.r, targetModules: o.lora.targets } : null,
      checkpoints: o.checkpoints,
      mlpChunk: o.mlpChunk,
    };
    // One sequence alone, or the N - 1 civilians' packed together (src/train/packing.ts): their
    // prompts are shared up to the last token (summaries) or the voter's own tail (votes), and
    // the update packs them when the pass fits this plan.
    const civ = Math.max(1, N - 1);
    const shapes = [
      { seqLen: seq.voteSample, numTargets: 1, candidates: N - 1 },
      { seqLen: seq.summarySample, numTargets: o.summaryTokens },
      {
        seqLen: seq.votePrompt - seq.voteTail + civ * (seq.voteTail + 1),
        numTargets: civ,
        candidates: N - 1,
        packed: true,
      },
      { seqLen: seq.summaryPrompt - 1 + civ * (o.summaryTokens + 1), numTargets: civ * o.summaryTokens, packed: true },
    ];
    keepLayers = o.keepLayers;
    const passes = shapes.map((x) => ({
      seqLen: x.seqLen,
      bytes: trainingPassBytes(cfg, { ...shape, ...x, keepLayers }),
    }));
    const pass = passes.reduce((a, b) => (b.bytes.peak > a.bytes.peak ? b : a));
    trainSeqLen = pass.seqLen;
    phases.push(updatePhase(pass.bytes, trainSeqLen, base, workspace, keepLayers, L));
  }
  // 'auto': keep the caches where that does not raise the round's peak (the update's kept layers,
  // or a budget's, often leave room for it; a round planned at its least memory does without).
  const peakOf = (xs: PhasePlan[]) => Math.max(0, ...xs.map((x) => x.total));
  const keepPromptKv =
    o.keepPromptKv === 'auto' ? peakOf(withKept) <= Math.max(peakOf(phases), peakOf(withoutKept)) : o.keepPromptKv;
  phases.splice(loadPhase(cfg, o.weights, weights.total).length, 0, ...(keepPromptKv ? withKept : withoutKept));
  return finish('round', cfg, o, weights, lora, phases, seq, trainSeqLen, {
    keepLayers,
    keepPromptKv,
    forwardChunk: o.forwardChunk,
    mlpChunk: o.mlpChunk,
  });
}

/**
 * Loading q4 weights from a bf16 checkpoint (load.ts): every weight lands packed, through one
 * bf16 staging buffer of whole rows and a status word per quantized tensor; no adapter yet.
 */
function loadPhase(cfg: Qwen3Config, format: WeightsFormat, weights: number): PhasePlan[] {
  if (format !== 'q4') return [];
  const q4 = weightNames(cfg).filter((w) => w.shape.length === 2);
  const maxRow = Math.max(...q4.map((w) => w.shape[1]! * 2));
  const maxTensor = Math.max(...q4.map((w) => w.shape[0]! * w.shape[1]! * 2));
  const staging = pooled(Math.min(Math.max(Q4_STAGING_BYTES, maxRow), maxTensor));
  return [
    phasePlan(
      'load',
      weights,
      [],
      [buf('q4 staging', '(rows, K) bf16', staging), buf('q4 status', '(tensors) u32', f32(q4.length))],
      [],
    ),
  ];
}

function updatePhase(
  pass: ReturnType<typeof trainingPassBytes>,
  T: number,
  base: number,
  workspace: PlannedBuffer[],
  keepLayers = 0,
  L = 0,
): PhasePlan {
  const act = [
    buf(
      `training pass (T=${T})`,
      keepLayers === 0
        ? 'checkpoints + one layer or the LM head, forward or backward (trainingPassBytes)'
        : `checkpoints + the activations of ${keepLayers === L ? 'all' : `the last ${keepLayers} of`} ${L} layers kept + one layer or the LM head, forward or backward (trainingPassBytes)`,
      pass.peak,
    ),
  ];
  const p = phasePlan('update', base, [], act, workspace);
  p.largest = { bytes: pass.largestBuffer.bytes, what: `the training buffer ${pass.largestBuffer.name} at T=${T}` };
  return p;
}

function finish(
  kind: MemoryPlan['kind'],
  cfg: Qwen3Config,
  o: MemoryPlan['options'],
  weights: ReturnType<typeof weightBytes>,
  lora: number,
  phases: PhasePlan[],
  seq: RoundSequences | null,
  trainSeqLen: number,
  chosen: Pick<MemoryPlan, 'keepLayers' | 'keepPromptKv' | 'forwardChunk' | 'mlpChunk'>,
): MemoryPlan {
  const peak = phases.reduce((a, p) => (p.total > a.total ? p : a));
  const largestBuffer = [weights.largest, ...phases.map((p) => p.largest)].reduce((a, b) =>
    b.bytes > a.bytes ? b : a,
  );
  return {
    kind,
    weights: weights.total,
    kv: peak.kv,
    lora,
    activations: peak.activations,
    workspace: peak.workspace,
    total: peak.total,
    peakPhase: peak.phase,
    phases,
    largestBuffer,
    sequences: seq,
    trainSeqLen,
    ...chosen,
    cfg,
    options: o,
  };
}

export interface SftPlanOptions {
  weights: WeightsFormat;
  lora: LoraShape;
  seqLen: number;
  checkpoints?: CheckpointDtype;
  /** Rows of the passes' MLP chunks, as RoundPlanOptions.mlpChunk (default 'auto'). */
  mlpChunk?: number | 'auto';
  /** Layers whose activations each pass keeps (TrainingPassOptions.keepLayers; default 0). */
  keepLayers?: number;
}

/** The memory of `spyrl sft`: weights, LoRA state and one training pass of seqLen tokens (T - 1 targets). */
export function planSft(cfg: Qwen3Config, s: SftPlanOptions): MemoryPlan {
  const o = resolve({
    ...s,
    checkpoints: s.checkpoints ?? SFT_CHECKPOINTS,
    kv: 'f32',
    players: 3,
    docTokens: 0,
    summaryTokens: 1,
  });
  const fixed = fixedChunk('mlpChunk', o.mlpChunk, 'rows');
  const at = (mlpChunk: number) => planSftAt(cfg, s.seqLen, { ...o, mlpChunk });
  // 'auto' as planRound's: the largest chunk that holds no more at the peak and in any one buffer
  // (the pass is the peak unless loading q4 weights takes more, so it mostly stays).
  const base = at(fixed ?? DEFAULT_MLP_CHUNK);
  const grown = fixed === null ? grownChunk(base, MLP_CHUNKS_AUTO, at) : null;
  return { ...(grown ?? base), options: o };
}

function planSftAt(cfg: Qwen3Config, seqLen: number, o: MemoryPlan['options'] & { mlpChunk: number }): MemoryPlan {
  const { weights, lora } = persistent(cfg, o);
  const base = weights.total + lora;
  const workspace = [
    buf('uniform arena', '(2048 dispatches x 256 B) kernel params', UNIFORM_ARENA_BYTES),
    buf('upload arena', 'staged small uploads', UPLOAD_ARENA_BYTES),
    buf(
      'readback staging',
      'MAP_READ',
      f32(Math.max(seqLen, o.lora.r * Math.max(cfg.intermediateSize, cfg.hiddenSize))),
    ),
  ];
  const pass = trainingPassBytes(cfg, {
    seqLen,
    numTargets: seqLen - 1,
    lora: { r: o.lora.r, targetModules: o.lora.targets },
    checkpoints: o.checkpoints,
    mlpChunk: o.mlpChunk,
    keepLayers: o.keepLayers,
  });
  return finish(
    'sft',
    cfg,
    o,
    weights,
    lora,
    [
      ...loadPhase(cfg, o.weights, weights.total),
      updatePhase(pass, seqLen, base, workspace, o.keepLayers, cfg.numLayers),
    ],
    null,
    seqLen,
    { keepLayers: o.keepLayers, keepPromptKv: false, forwardChunk: FORWARD_CHUNK, mlpChunk: o.mlpChunk },
  );
}

// ---------------------------------------------------------------------------------------------
// 4. The check: hard limits, then the user's budget, with what to change.

const gib = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;

export function formatBytes(n: number): string {
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(2)} GiB`;
  if (n >= 2 ** 20) return `${(n / 2 ** 20).toFixed(1)} MiB`;
  if (n >= 2 ** 10) return `${(n / 2 ** 10).toFixed(0)} KiB`;
  return `${n} B`;
}

export interface AdapterLimits {
  maxStorageBufferBindingSize: number;
  maxBufferSize: number;
}

/** The plan with one option changed (`seqLen` for SFT). */
function replan(p: MemoryPlan, change: Partial<RoundPlanOptions> & { seqLen?: number }): MemoryPlan {
  const o = { ...p.options, ...change };
  return p.kind === 'sft'
    ? planSft(p.cfg, {
        weights: o.weights,
        lora: o.lora,
        seqLen: change.seqLen ?? p.trainSeqLen,
        checkpoints: o.checkpoints,
        mlpChunk: o.mlpChunk,
        keepLayers: o.keepLayers,
      })
    : planRound(p.cfg, o);
}

/** The largest value of an integer knob in [lo, hi] whose plan passes `ok`, or null. */
function largestFitting(lo: number, hi: number, ok: (v: number) => boolean): number | null {
  if (hi < lo || !ok(lo)) return null;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (ok(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** The first single change that makes `fits` true, in the order a user would try them. */
function whatToChange(p: MemoryPlan, fits: (q: MemoryPlan) => boolean): string {
  const o = p.options;
  if (o.weights === 'bf16' && fits(replan(p, { weights: 'q4' })))
    return 'load the weights as q4 (--weights q4, or Weights: q4 in the app)';
  if (p.kind === 'round' && o.kv === 'f32' && fits(replan(p, { kv: 'f16' }))) return 'use an f16 KV cache (--kv f16)';
  if (p.kind === 'sft') {
    const T = largestFitting(2, p.trainSeqLen - 1, (v) => fits(replan(p, { seqLen: v })));
    return T !== null
      ? `reduce the sequence length to at most ${T} tokens (--seq-len)`
      : 'use a smaller model or a lower LoRA rank';
  }
  const doc = largestFitting(16, o.docTokens - 1, (v) => fits(replan(p, { docTokens: v })));
  if (doc !== null) return `set docTokenBudget to at most ${doc} tokens`;
  const sumTok = largestFitting(8, o.summaryTokens - 1, (v) => fits(replan(p, { summaryTokens: v })));
  if (sumTok !== null) return `set summaryMaxTokens to at most ${sumTok} tokens`;
  const players = largestFitting(3, o.players - 1, (v) => fits(replan(p, { players: v })));
  if (players !== null) return `set groupSize to ${players} players`;
  return 'use a smaller model or a lower LoRA rank';
}

/**
 * Throws a RangeError saying what to change when the plan cannot run: a buffer above the adapter's
 * binding limit, or a total above `budgetBytes` (the GPU memory the user allows; WebGPU does not
 * report it).
 */
export function checkPlanFits(p: MemoryPlan, limits: AdapterLimits, budgetBytes?: number): void {
  // A missing limit (e.g. a spread copy of a GPUSupportedLimits, whose fields are getters) would
  // make every comparison false and let any plan through: refuse it by name instead.
  for (const name of ['maxStorageBufferBindingSize', 'maxBufferSize'] as const) {
    const v: unknown = limits[name];
    if (typeof v !== 'number' || !(v > 0))
      throw new TypeError(`GPU limit ${name} is ${String(v)}: the memory check needs the adapter's limits as numbers`);
  }
  const limit = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
  if (p.largestBuffer.bytes > limit) {
    const hint = whatToChange(p, (q) => q.largestBuffer.bytes <= limit);
    throw new RangeError(
      `${p.largestBuffer.what} needs ${gib(p.largestBuffer.bytes)}, above this GPU's ${gib(limit)} buffer limit: ${hint === 'use a smaller model or a lower LoRA rank' ? 'use a GPU/browser that allows larger storage buffers, or a smaller model' : hint}`,
    );
  }
  if (budgetBytes !== undefined && p.total > budgetBytes) {
    const what = p.kind === 'sft' ? 'training' : 'a round';
    throw new RangeError(
      `${what} needs about ${gib(p.total)} of GPU memory at its peak (${p.peakPhase}: weights ${gib(p.weights)}, LoRA state ${gib(p.lora)}, KV cache ${gib(p.kv)}, ` +
        `activations ${gib(p.activations)}, workspace ${gib(p.workspace)}), above the ${gib(budgetBytes)} available: ${whatToChange(p, (q) => q.total <= budgetBytes)}`,
    );
  }
}

// ---------------------------------------------------------------------------------------------
// 5. From a run's config (the CLI and the app).

export type RunShape = Pick<SpyRLConfig, 'groupSize' | 'docTokenBudget' | 'summaryMaxTokens' | 'lora'> &
  Partial<
    Pick<
      SpyRLConfig,
      | 'voteReason'
      | 'voteReasonMaxTokens'
      | 'prompts'
      | 'maskRatio'
      | 'maskMode'
      | 'maskPlaceholder'
      | 'evalDocTokenBudget'
      | 'evalSummaryMaxTokens'
    >
  >;

export interface EngineFormat {
  weights: WeightsFormat;
  kv: KvDtype;
}

/** Plan options of a SpyRL config on an engine format. */
export function roundPlanOptions(
  run: RunShape,
  format: EngineFormat,
  extra: Partial<RoundPlanOptions> = {},
): RoundPlanOptions {
  return {
    weights: format.weights,
    kv: format.kv,
    players: run.groupSize,
    docTokens: run.docTokenBudget,
    summaryTokens: run.summaryMaxTokens,
    reasonTokens: run.voteReason ? (run.voteReasonMaxTokens ?? 0) : 0,
    prompts: run.prompts,
    maskRatio: run.maskRatio ?? 0,
    maskPlaceholder: run.maskMode === 'placeholder' ? (run.maskPlaceholder ?? null) : null,
    lora: { r: run.lora.r, targets: run.lora.targetModules },
    ...(run.evalDocTokenBudget !== undefined ? { evalDocTokens: run.evalDocTokenBudget } : {}),
    ...(run.evalSummaryMaxTokens !== undefined ? { evalSummaryTokens: run.evalSummaryMaxTokens } : {}),
    ...extra,
  };
}

export interface MemoryCheck {
  plan: MemoryPlan;
  /** Null when it fits; else what is wrong and what to change. */
  problem: string | null;
  /** True when the problem is a hard adapter limit (loading would fail), not only the budget. */
  blocking: boolean;
}

/**
 * The app's check of a model choice: the round's plan against the adapter's limits and the user's
 * budget. `format` is the weights / KV choice the load will use; `extra` e.g. { evalDocs }.
 */
export function planMemory(
  cfg: Qwen3Config,
  run: RunShape,
  limits: AdapterLimits,
  budgetBytes?: number,
  format: EngineFormat = { weights: 'bf16', kv: 'f32' },
  extra: Partial<RoundPlanOptions> = {},
): MemoryCheck {
  const plan = planRound(cfg, roundPlanOptions(run, format, extra));
  try {
    checkPlanFits(plan, limits);
  } catch (e) {
    return { plan, problem: (e as Error).message, blocking: true };
  }
  const keep = extra.keepLayers === undefined;
  try {
    checkPlanFits(plan, limits, budgetBytes);
  } catch (e) {
    // Above the budget (a warning, the run may go ahead): keeping only within the round's own peak.
    return { plan: keep ? withKeptLayers(plan, limits) : plan, problem: (e as Error).message, blocking: false };
  }
  return {
    plan: keep ? withKeptLayers(plan, limits, budgetBytes) : plan,
    problem: null,
    blocking: false,
  };
}

/** Kept layers fill at most this share of the user's budget: the rest stays free for the browser and the display. */
export const KEPT_BUDGET_SHARE = 0.9;

/**
 * The round's (or an SFT step's) plan with as many kept layers (RoundPlanOptions.keepLayers) as memory allows: the
 * most k whose plan stays within the larger of the plan's own peak (memory the summaries or the
 * votes hold anyway) and KEPT_BUDGET_SHARE of `budgetBytes` (the GPU memory the user allows),
 * and, given `limits`, whose buffers fit them. Each kept layer saves recomputing it in every training pass's
 * backward: all L make a pass two layer passes (forward, backward) instead of three. Then, with
 * mlpChunk 'auto', the largest of MLP_CHUNKS_AUTO whose plan stays within the same bounds
 * (MemoryPlan.mlpChunk: taller MLP products in every pass). A plan without training comes back as
 * it is; k starts at the plan's own keepLayers (planMemory does not call this where the caller set
 * keepLayers).
 */
export function withKeptLayers(p: MemoryPlan, limits?: AdapterLimits, budgetBytes?: number): MemoryPlan {
  if (!p.options.training) return p;
  const ceiling = Math.max(p.total, KEPT_BUDGET_SHARE * (budgetBytes ?? 0));
  const fits = (q: MemoryPlan) => {
    if (q.total > ceiling) return false;
    if (!limits) return true;
    try {
      checkPlanFits(q, limits);
      return true;
    } catch {
      return false;
    }
  };
  // Bytes grow with k, so the fitting k are 0 .. some k*.
  const k = largestFitting(p.keepLayers, p.cfg.numLayers, (v) => fits(replan(p, { keepLayers: v })));
  const kept = k === null || k === p.keepLayers ? p : replan(p, { keepLayers: k });
  if (p.options.mlpChunk !== 'auto') return kept;
  // Then the update's MLP chunk ('auto'), into what the kept layers leave of the same ceiling: a
  // kept layer saves a third of its layer's work in every pass, its recompute, which is measured
  // (bench/keep-ab.ts); what taller MLP products save is not yet, so the layers come first.
  for (const chunk of MLP_CHUNKS_AUTO) {
    if (chunk <= kept.mlpChunk) break;
    const q = replan(kept, { mlpChunk: chunk });
    if (fits(q)) return q;
  }
  return kept;
}
