// Training pass over one sequence: forward keeping only each layer's input (activation
// checkpointing), per-token log-probabilities of given targets, then the backward from d(loss)/d(logp)
// that recomputes each layer's internals on the way back and adds into the LoRA gradients.
// Positions are 0..T-1 and attention is causal over the sequence itself (no KV cache), or, with
// opts.layout, several sequences packed as a prefix tree (src/train/packing.ts): each token at its
// own sequence's position, seeing only its ancestors.
//
// Memory (every buffer is listed in trainingPassBytes.ts): the (L+1) checkpoints, f32 or f16/bf16
// packed two per u32; one layer's workspace, attention over all T tokens and the MLP over chunks
// of `mlpChunk` tokens (its (T, I) activations never exist whole); the LM head over chunks of at
// most HEAD_ROWS target rows (the final norm is applied per chunk).
//
// The LM head's gradient is formed in the forward, where its logits are: d log p(y_m) / d x_L of
// target row m is E_m = RMSNorm'((onehot(y_m) - p_m) W) (the final norm's backward of the softmax
// gradient through the head), the same for any loss, and the backward only scales row m by
// d(loss)/d(log p(y_m)) (both are linear in it). So a pass runs the head's big products twice
// (the logits, then (onehot - p) W), not three times (a backward that recomputed the logits), and
// holds E, (M, C) f32, from construction to release. Restricted (vote) passes, logpOnly passes and
// passes built with the adapter off keep the recompute.
//
// Kept layers (opts.keepLayers = k): the forward keeps the intermediates of the last k layers, the
// ones the backward reaches first, instead of dropping them; the backward uses them as they are
// and recomputes only layers 0 .. L-k-1. Each kept layer holds the products of its attention over
// all T tokens (q, k, v, the attention output and its log-sum-exp, xMid) and of its MLP for all T
// tokens too (gate, up, and the LoRA x A^T), from its forward until its own backward. What an
// element-wise kernel makes from those (the normed h1 and h2, q and k after their norms and RoPE,
// silu(gate) * up) it does not keep: one shared workspace holds them while a kept layer runs, and
// the backward forms them again from the kept products, about 38% of a layer's intermediates at
// Qwen3-4B's shapes for a few element-wise dispatches. The MLP runs in mlpChunk chunks as a
// recomputed layer's does: the forward copies each chunk's gate, up and x A^T rows into the kept
// buffers, the backward copies them back instead of recomputing them, so silu(gate) * up and the
// MLP gradients have chunk rows, not T. k = L makes a pass two passes of layer products (forward,
// backward), as an eager framework's, instead of three. The kernels and the chunks are the same,
// so a kept layer's intermediates are the recomputed ones bit for bit.
//
// Reduced-precision checkpoints: the forward continues from the ROUNDED layer input, exactly what
// the backward unpacks, so forward() and backward() are of one function; rounding counts as the
// identity in the backward (straight-through), which is that function's gradient up to rounding.
import type { Gpu } from '../gpu/index.ts';
import * as K from '../ops/index.ts';
import { loraBackwardWeights, type LoraAdapter, type LoraTarget } from '../model/lora.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import {
  CHECKPOINT_DTYPES,
  DEFAULT_MLP_CHUNK,
  HEAD_ROWS,
  checkpointBytes,
  headRows,
  isMlpTarget,
  mlpChunkRows,
  trainingPassBytes,
  type CheckpointDtype,
  type TrainingPassBytes,
} from './trainingPassBytes.ts';

export {
  trainingPassBytes,
  trainingPassLayout,
  type CheckpointDtype,
  type TrainingPassBytes,
  type TrainingPassShape,
} from './trainingPassBytes.ts';

export interface TrainingPassOptions {
  /** Storage of the layer-input checkpoints (default 'f32': bit-for-bit the f32 pass). */
  checkpoints?: CheckpointDtype;
  /** Tokens per MLP chunk (default 256): bounds the (chunk, I) buffers. */
  mlpChunk?: number;
  /**
   * Sampling temperature of the distribution the targets were drawn from (default 1): log p is
   * taken of softmax(logits / temperature), and the backward is that function's gradient.
   */
  temperature?: number;
  /**
   * A packed prefix tree (src/train/packing.ts packSequences): each token's RoPE position and
   * keyEnd (token j is seen by queries j <= t < keyEnd[j]). Needs K.treeAttentionSupported.
   */
  layout?: { positions: readonly number[]; keyEnd: readonly number[] };
  /**
   * Log-probs only (an evaluation): the forward does not form the LM head's gradient for a
   * backward (which then recomputes the head's logits, as a restricted pass's always does).
   */
  logpOnly?: boolean;
  /**
   * Layers whose intermediates the forward keeps for the backward, the last ones (default 0:
   * every layer recomputed). 0 .. numLayers; more memory (trainingPassBytes' `kept`), less work.
   * Ignored where no backward can follow (logpOnly, no enabled adapter, no target).
   */
  keepLayers?: number;
}

/** Candidates of restricted log-probs: one list for every target row, or one list per row. */
export type RestrictTo = readonly number[] | readonly (readonly number[])[];

/**
 * One layer's intermediates: attention over T tokens, MLP over `rows` = Tc = min(T, mlpChunk)
 * tokens at a time (a kept layer's view: its own buffers and the kept layers' workspace).
 */
interface LayerBuffers {
  rows: number;
  h1: GPUBuffer; // (T, C) input_layernorm(x)
  q: GPUBuffer; // (T, NH, HD) before q_norm
  k: GPUBuffer; // (T, NKV, HD) before k_norm
  v: GPUBuffer; // (T, NKV, HD)
  qr: GPUBuffer; // (T, NH, HD) after q_norm and RoPE
  kr: GPUBuffer; // (T, NKV, HD) after k_norm and RoPE
  att: GPUBuffer; // (T, NH, HD) attention output
  lse: GPUBuffer; // (T, NH) log-sum-exp of each attention row
  xMid: GPUBuffer; // (T, C) x + o_proj(att); the forward adds the MLP into it in place (x_{l+1})
  h2: GPUBuffer; // (T, C) post_attention_layernorm(xMid)
  gate: GPUBuffer; // (rows, I)
  up: GPUBuffer; // (rows, I)
  act: GPUBuffer; // (rows, I) silu(gate) * up
  h2c: GPUBuffer | null; // (rows, C) rows of h2 of the current chunk (only when T > rows)
  yc: GPUBuffer | null; // (rows, C) rows of the chunk's output or incoming gradient (only when T > rows)
  u: Map<LoraTarget, GPUBuffer>; // (T, r) x A^T of each adapted attention projection, (rows, r) MLP
}

/** What a kept layer holds from its forward to its backward: the products, at T rows. */
type KeptBuffers = Pick<LayerBuffers, 'q' | 'k' | 'v' | 'att' | 'lse' | 'xMid' | 'gate' | 'up' | 'u'>;
/** What element-wise kernels form from a layer's products (act over the MLP chunk's rows). */
type DerivedBuffers = Pick<LayerBuffers, 'h1' | 'qr' | 'kr' | 'h2' | 'act'>;
/**
 * The kept layers' workspace, one while a kept layer runs: the derived buffers and, when the MLP
 * runs in chunks, the chunk's gate, up and MLP x A^T rows (copied to and from the kept buffers)
 * and its row staging. Unchunked, the kept buffers serve directly (gate, up null; u empty).
 */
type KeptWork = DerivedBuffers &
  Pick<LayerBuffers, 'rows' | 'h2c' | 'yc' | 'u'> & { gate: GPUBuffer | null; up: GPUBuffer | null };

/** Gradients of one layer, reused layer after layer. */
interface LayerGrads {
  dh: GPUBuffer; // (T, C) d h2, then d h1
  dAtt: GPUBuffer; // (T, NH, HD)
  dqr: GPUBuffer; // (T, NH, HD)
  dkr: GPUBuffer; // (T, NKV, HD)
  dv: GPUBuffer; // (T, NKV, HD)
  du: GPUBuffer; // (T, r) LoRA scratch
  dAct: GPUBuffer; // (Tc, I): the MLP chunk's rows
  dGate: GPUBuffer; // the same
  dUp: GPUBuffer; // the same
}

export class TrainingPass {
  private readonly gpu: Gpu;
  private readonly T: number;
  private readonly dtype: CheckpointDtype;
  private readonly Tc: number; // MLP chunk rows, min(T, mlpChunk)
  private readonly mlpChunk: number;
  /** Layers L-keep .. L-1 keep their intermediates from the forward to the backward. */
  private readonly keep: number;
  /** The kept layers' intermediates, by layer, from their forward until their backward. */
  private kept: (KeptBuffers | undefined)[] = [];
  private readonly xs: GPUBuffer[] = []; // L+1 of (T, C) f32 or packed f16/bf16: input of each layer, then the final residual
  private readonly pos: GPUBuffer; // (T) u32 positions: 0..T-1, or the layout's
  private readonly keyEnd: GPUBuffer | null; // (T) u32 the layout's keyEnd (tree attention)
  /** Restricted mode: the candidates of each target row (M lists). */
  private readonly rowCands: (readonly number[])[] | null;
  private readonly buffers: GPUBuffer[] = [];
  private readonly runs: { start: number; length: number; offset: number }[] = []; // target rows as contiguous runs
  private readonly targets: GPUBuffer; // (M) u32 target ids of the rows with a target
  private readonly lse: GPUBuffer; // (M) f32 log-sum-exp of the LM-head rows
  /** (M, C) f32 d log p(target) / d x_L of each target row, formed by the forward (the header); null: recomputed. */
  private readonly headGrad: GPUBuffer | null;
  /** (M) u32 the position of each target row: where headGrad's rows go in d x_L. */
  private readonly targetRows: GPUBuffer | null;
  private readonly logpOnly: boolean;
  /** Whether the last forward filled headGrad. */
  private headGradReady = false;
  private readonly M: number;
  private readonly targetList: number[];
  private readonly temperature: number;
  private released = false;
  /** Restricted mode: softmax over the candidates of each target row (M x nc), kept for the backward. */
  private candidateProbs: Float64Array | null = null;

  /**
   * @param ids (T) token ids
   * @param targets (T) the token each position predicts, or -1 where none (e.g. the prompt)
   */
  constructor(
    readonly model: Qwen3Model,
    readonly lora: LoraAdapter | null,
    readonly ids: readonly number[],
    targets: readonly number[],
    /**
     * When set, log p(target) is taken over these token ids only (renormalised), as a vote
     * restricted to the other players' labels is; every target must be one of them. One list for
     * every row, or a list per target row (packed votes of different voters).
     */
    readonly restrictTo: RestrictTo | null = null,
    opts: TrainingPassOptions = {},
  ) {
    this.gpu = model.gpu;
    const { cfg } = model;
    const T = (this.T = ids.length);
    if (T === 0) throw new RangeError('training sequence is empty');
    if (targets.length !== T) throw new RangeError(`targets has ${targets.length} entries for ${T} tokens`);
    for (const [i, id] of [...ids, ...targets.filter((t) => t >= 0)].entries()) {
      if (!Number.isInteger(id) || id < 0 || id >= cfg.vocabSize)
        throw new RangeError(`token id ${id} (index ${i}) is out of range for vocab size ${cfg.vocabSize}`);
    }
    this.dtype = opts.checkpoints ?? 'f32';
    if (!CHECKPOINT_DTYPES.includes(this.dtype))
      throw new RangeError(
        `TrainingPass option checkpoints must be one of ${CHECKPOINT_DTYPES.join(', ')} (got ${String(opts.checkpoints)})`,
      );
    this.mlpChunk = opts.mlpChunk ?? DEFAULT_MLP_CHUNK;
    if (!Number.isSafeInteger(this.mlpChunk) || this.mlpChunk < 1)
      throw new RangeError(`TrainingPass option mlpChunk must be a positive integer (got ${opts.mlpChunk})`);
    this.Tc = mlpChunkRows(T, this.mlpChunk);
    const keep = opts.keepLayers ?? 0;
    if (!Number.isInteger(keep) || keep < 0 || keep > cfg.numLayers)
      throw new RangeError(
        `TrainingPass option keepLayers must be an integer in 0..${cfg.numLayers} (got ${opts.keepLayers})`,
      );
    this.temperature = opts.temperature ?? 1;
    if (!(Number.isFinite(this.temperature) && this.temperature > 0))
      throw new RangeError(`TrainingPass option temperature must be a positive number (got ${opts.temperature})`);
    const tgt: number[] = [];
    for (let t = 0; t < T; t++) {
      if (targets[t] < 0) continue;
      const last = this.runs[this.runs.length - 1];
      if (last && last.start + last.length === t) last.length++;
      else this.runs.push({ start: t, length: 1, offset: tgt.length });
      tgt.push(targets[t]);
    }
    this.M = tgt.length;
    this.targetList = tgt;
    this.rowCands = null;
    if (restrictTo) {
      const perRow = restrictTo.length > 0 && typeof restrictTo[0] !== 'number';
      const lists = perRow
        ? (restrictTo as readonly (readonly number[])[])
        : tgt.map(() => restrictTo as readonly number[]);
      if (restrictTo.length === 0) throw new RangeError('restrictTo is empty');
      if (lists.length !== tgt.length)
        throw new RangeError(`restrictTo has ${lists.length} candidate lists for ${tgt.length} target rows`);
      for (const [m, t] of tgt.entries()) {
        if (lists[m]!.length === 0) throw new RangeError(`restrictTo: target row ${m} has no candidates`);
        if (!lists[m]!.includes(t)) throw new RangeError(`target ${t} is not among the restricted candidates`);
      }
      this.rowCands = [...lists];
    }
    const layout = opts.layout;
    if (layout) {
      if (layout.positions.length !== T || layout.keyEnd.length !== T)
        throw new RangeError(
          `layout has ${layout.positions.length} positions and ${layout.keyEnd.length} keyEnd entries for ${T} tokens`,
        );
      for (let j = 0; j < T; j++) {
        const e = layout.keyEnd[j]!;
        if (!Number.isInteger(e) || e <= j || e > T)
          throw new RangeError(`layout keyEnd[${j}] = ${e} is not in ${j + 1}..${T}`);
        const p = layout.positions[j]!;
        if (!Number.isInteger(p) || p < 0 || p > j)
          throw new RangeError(`layout position ${j} = ${p} is not in 0..${j}`);
      }
      if (!K.treeAttentionSupported(this.gpu, cfg.headDim))
        throw new RangeError(
          `a packed training pass needs tree attention, which this GPU lacks (head_dim ${cfg.headDim}, ${this.gpu.limits.maxStorageBuffersPerShaderStage} storage buffers per stage)`,
        );
    }
    const C = cfg.hiddenSize;
    for (let l = 0; l <= cfg.numLayers; l++) this.xs.push(this.alloc(checkpointBytes(T * C, this.dtype), `x.${l}`));
    this.pos = this.alloc(T * 4, 'positions');
    this.gpu.write(this.pos, Uint32Array.from(layout ? layout.positions : Array.from({ length: T }, (_, i) => i)));
    this.keyEnd = layout ? this.alloc(T * 4, 'keyEnd') : null;
    if (this.keyEnd) this.gpu.write(this.keyEnd, Uint32Array.from(layout!.keyEnd));
    this.targets = this.alloc(Math.max(1, this.M) * 4, 'targets');
    if (this.M) this.gpu.write(this.targets, Uint32Array.from(tgt));
    this.lse = this.alloc(Math.max(1, this.M) * 4, 'lseHead');
    this.logpOnly = opts.logpOnly ?? false;
    this.keep = this.M > 0 && this.lora?.enabled && !this.logpOnly ? keep : 0;
    // The LM head's gradient formed in the forward: full-vocabulary passes that can run a backward.
    if (this.M > 0 && this.lora?.enabled && !this.rowCands && !this.logpOnly) {
      this.headGrad = this.alloc(this.M * C * 4, 'headGrad');
      this.targetRows = this.alloc(this.M * 4, 'targetRows');
      this.gpu.write(
        this.targetRows,
        Uint32Array.from(this.runs.flatMap((r) => Array.from({ length: r.length }, (_, i) => r.start + i))),
      );
    } else {
      this.headGrad = null;
      this.targetRows = null;
    }
  }

  /** Number of positions with a target (the length of logp / dlogp). */
  get numTargets(): number {
    return this.M;
  }

  /** What this pass allocates (trainingPassBytes of its shape). */
  get bytes(): TrainingPassBytes {
    const lora = this.lora?.enabled
      ? { r: this.lora.settings.r, targetModules: this.lora.settings.targetModules }
      : null;
    return trainingPassBytes(this.model.cfg, {
      seqLen: this.T,
      numTargets: this.M,
      lora,
      checkpoints: this.dtype,
      mlpChunk: this.mlpChunk,
      keepLayers: this.keep,
      candidates: this.rowCands ? Math.max(...this.rowCands.map((c) => c.length)) : undefined,
      packed: this.keyEnd !== null,
      splitK: K.splitKAuto(this.gpu),
      q4Dequant: K.weightFormat(this.model.weights.layers[0]!.gateProj) === 'q4' && K.q4DequantOn(),
      gemmTileRows: K.gemmTileRows(this.gpu),
      logpOnly: this.logpOnly,
    });
  }

  private alloc(bytes: number, label: string): GPUBuffer {
    const b = this.gpu.createBuffer(bytes, label);
    this.buffers.push(b);
    return b;
  }

  private get reduced(): boolean {
    return this.dtype !== 'f32';
  }

  // ---- 1. checkpoints ------------------------------------------------------------------------

  /** (T, C) f32 scratch for the unpacked layer input; null with f32 checkpoints (read in place). */
  private createScratch(): GPUBuffer | null {
    return this.reduced ? this.gpu.createBuffer(this.T * this.model.cfg.hiddenSize * 4, 'xF32') : null;
  }

  /** Stores x (T, C) f32 as checkpoint l. Reduced precision: xF32 receives the rounded value, which the forward continues from. */
  private storeCheckpoint(l: number, x: GPUBuffer, xF32: GPUBuffer | null): void {
    const n = this.T * this.model.cfg.hiddenSize;
    if (!xF32) {
      if (x !== this.xs[l]) this.gpu.copy(x, 0, this.xs[l], 0, n * 4);
      return;
    }
    K.packHalf(this.gpu, this.xs[l], x, n, this.dtype as K.HalfFormat);
    K.unpackHalf(this.gpu, xF32, this.xs[l], n, this.dtype as K.HalfFormat);
  }

  /** Checkpoint l as an f32 (T, C) buffer. */
  private loadCheckpoint(l: number, xF32: GPUBuffer | null): GPUBuffer {
    if (!xF32) return this.xs[l];
    K.unpackHalf(this.gpu, xF32, this.xs[l], this.T * this.model.cfg.hiddenSize, this.dtype as K.HalfFormat);
    return xF32;
  }

  /** Checkpoint l (0: the embedding, L: the final residual) as the backward sees it, unpacked to f32 (T, C). */
  async readCheckpoint(l: number): Promise<Float32Array> {
    const L = this.model.cfg.numLayers;
    if (!Number.isInteger(l) || l < 0 || l > L) throw new RangeError(`checkpoint ${l} is out of range 0..${L}`);
    const xF32 = this.createScratch();
    try {
      return await this.gpu.readF32(this.loadCheckpoint(l, xF32), this.T * this.model.cfg.hiddenSize);
    } finally {
      if (xF32) this.gpu.releaseBuffer(xF32);
    }
  }

  // ---- 2. one layer --------------------------------------------------------------------------

  /** A recomputed layer's intermediates, the MLP's over Tc rows at a time. */
  private layerBuffers(Tc: number): LayerBuffers {
    const C = this.model.cfg.hiddenSize;
    const f = (n: number, label: string) => this.gpu.createBuffer(n * 4, label);
    const chunked = Tc < this.T;
    return {
      rows: Tc,
      ...this.derivedBuffers(Tc),
      ...this.keptBuffers(Tc),
      h2c: chunked ? f(Tc * C, 'h2Chunk') : null,
      yc: chunked ? f(Tc * C, 'yChunk') : null,
    };
  }

  /** The products of a layer (what a kept layer keeps), the MLP's over `rows` rows. */
  private keptBuffers(rows: number): KeptBuffers {
    const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I } = this.model.cfg;
    const { T } = this;
    const f = (n: number, label: string) => this.gpu.createBuffer(n * 4, label);
    const u = new Map<LoraTarget, GPUBuffer>();
    if (this.lora?.enabled)
      for (const t of this.lora.settings.targetModules)
        u.set(t, f((isMlpTarget(t) ? rows : T) * this.lora.settings.r, `u.${t}`));
    return {
      q: f(T * NH * HD, 'q'),
      k: f(T * NKV * HD, 'k'),
      v: f(T * NKV * HD, 'v'),
      att: f(T * NH * HD, 'att'),
      lse: f(T * NH, 'lse'),
      xMid: f(T * C, 'xMid'),
      gate: f(rows * I, 'gate'),
      up: f(rows * I, 'up'),
      u,
    };
  }

  /** What element-wise kernels form from a layer's products, the MLP's over `rows` rows. */
  private derivedBuffers(rows: number): DerivedBuffers {
    const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I } = this.model.cfg;
    const { T } = this;
    const f = (n: number, label: string) => this.gpu.createBuffer(n * 4, label);
    return {
      h1: f(T * C, 'h1'),
      qr: f(T * NH * HD, 'qr'),
      kr: f(T * NKV * HD, 'kr'),
      h2: f(T * C, 'h2'),
      act: f(rows * I, 'act'),
    };
  }

  /** The kept layers' workspace (KeptWork), the MLP's over Tc rows at a time. */
  private keptWork(): KeptWork {
    const { hiddenSize: C, intermediateSize: I } = this.model.cfg;
    const { T, Tc } = this;
    const f = (n: number, label: string) => this.gpu.createBuffer(n * 4, label);
    const chunked = Tc < T;
    const u = new Map<LoraTarget, GPUBuffer>();
    if (chunked && this.lora?.enabled)
      for (const t of this.lora.settings.targetModules)
        if (isMlpTarget(t)) u.set(t, f(Tc * this.lora.settings.r, `u.${t}`));
    return {
      rows: Tc,
      ...this.derivedBuffers(Tc),
      gate: chunked ? f(Tc * I, 'gate') : null,
      up: chunked ? f(Tc * I, 'up') : null,
      u,
      h2c: chunked ? f(Tc * C, 'h2Chunk') : null,
      yc: chunked ? f(Tc * C, 'yChunk') : null,
    };
  }

  /** A kept layer's buffers: its products, and the shared workspace for the rest. */
  private keptView(k: KeptBuffers, w: KeptWork): LayerBuffers {
    const u = new Map(k.u);
    for (const [t, b] of w.u) u.set(t, b); // the MLP chunk's rows, when chunked
    return { ...k, ...w, gate: w.gate ?? k.gate, up: w.up ?? k.up, u };
  }

  /**
   * Copies rows t0 .. t0+R-1 of the MLP chunk's gate, up and LoRA x A^T between a kept layer's
   * buffers (T rows) and the chunk's (b, R rows): into the kept ones in the forward (`save`),
   * back in the backward. Nothing to copy when the MLP runs in one chunk (the same buffers).
   */
  private chunkRowsKept(b: LayerBuffers, k: KeptBuffers, t0: number, R: number, save: boolean): void {
    if (b.gate === k.gate) return;
    const I = this.model.cfg.intermediateSize;
    const copy = (chunk: GPUBuffer, kept: GPUBuffer, n: number) =>
      save
        ? this.gpu.copy(chunk, 0, kept, t0 * n * 4, R * n * 4)
        : this.gpu.copy(kept, t0 * n * 4, chunk, 0, R * n * 4);
    copy(b.gate, k.gate, I);
    copy(b.up, k.up, I);
    for (const [t, kept] of k.u) if (isMlpTarget(t)) copy(b.u.get(t)!, kept, this.lora!.settings.r);
  }

  /**
   * Forms again, from a kept layer's products and its input x, what the forward's element-wise
   * kernels formed from them over all T tokens: h1, q and k after their norms and RoPE, h2
   * (silu(gate) * up follows chunk by chunk in mlpBackward). The same kernels on the same inputs:
   * the forward's values bit for bit.
   */
  private rederive(l: number, x: GPUBuffer, b: LayerBuffers): void {
    const { gpu, T } = this;
    const lw = this.model.weights.layers[l];
    const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD } = this.model.cfg;
    const { rmsNormEps: eps, ropeTheta: theta } = this.model.cfg;
    K.rmsNorm(gpu, b.h1, x, lw.inputNorm, T, C, eps);
    K.rmsNorm(gpu, b.qr, b.q, lw.qNorm, T * NH, HD, eps);
    K.rmsNorm(gpu, b.kr, b.k, lw.kNorm, T * NKV, HD, eps);
    K.rope(gpu, b.qr, this.pos, T, NH, HD, theta);
    K.rope(gpu, b.kr, this.pos, T, NKV, HD, theta);
    K.rmsNorm(gpu, b.h2, b.xMid, lw.postNorm, T, C, eps);
  }

  private releaseAll(bufs: Record<string, number | GPUBuffer | null | Map<LoraTarget, GPUBuffer>>): void {
    for (const b of Object.values(bufs)) {
      if (typeof b === 'number') continue;
      if (b instanceof Map) for (const x of b.values()) this.gpu.releaseBuffer(x);
      else if (b) this.gpu.releaseBuffer(b);
    }
  }

  /** y (rows, N) (+)= x (rows, Kd) W^T, plus the LoRA branch of target t (x A^T kept in u). */
  private proj(
    l: number,
    b: LayerBuffers,
    y: GPUBuffer,
    x: GPUBuffer,
    w: K.Weight,
    t: LoraTarget,
    rows: number,
    N: number,
    Kd: number,
    accumulate = false,
  ): void {
    const p = this.lora?.enabled ? this.lora.get(l, t) : undefined;
    if (!p) {
      K.matmul(this.gpu, y, x, w, rows, N, Kd, accumulate);
      return;
    }
    // u = x A^T first, then the product with s u B^T added in its store where gemm_tiled can
    // (K.matmul's `lora`; else as the separate product loraForward runs).
    const { r } = this.lora!.settings;
    const u = b.u.get(t)!;
    K.matmulF32(this.gpu, u, x, p.A, rows, r, Kd);
    K.matmul(this.gpu, y, x, w, rows, N, Kd, accumulate, { u, B: p.B, r, scale: this.lora!.scale });
  }

  /** Attention half of layer l from its input x (T, C): h1 .. xMid and h2, all kept in b. */
  private attentionForward(l: number, x: GPUBuffer, b: LayerBuffers): void {
    const { gpu, T } = this;
    const { cfg, weights } = this.model;
    const lw = weights.layers[l];
    const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, rmsNormEps: eps, ropeTheta: theta } = cfg;
    K.rmsNorm(gpu, b.h1, x, lw.inputNorm, T, C, eps);
    this.proj(l, b, b.q, b.h1, lw.qProj, 'q_proj', T, NH * HD, C);
    this.proj(l, b, b.k, b.h1, lw.kProj, 'k_proj', T, NKV * HD, C);
    this.proj(l, b, b.v, b.h1, lw.vProj, 'v_proj', T, NKV * HD, C);
    K.rmsNorm(gpu, b.qr, b.q, lw.qNorm, T * NH, HD, eps);
    K.rmsNorm(gpu, b.kr, b.k, lw.kNorm, T * NKV, HD, eps);
    K.rope(gpu, b.qr, this.pos, T, NH, HD, theta);
    K.rope(gpu, b.kr, this.pos, T, NKV, HD, theta);
    K.attentionForwardLse(gpu, b.att, b.lse, b.qr, b.kr, b.v, T, NH, NKV, HD, this.keyEnd);
    gpu.copy(x, 0, b.xMid, 0, T * C * 4);
    this.proj(l, b, b.xMid, b.att, lw.oProj, 'o_proj', T, C, NH * HD, true);
    K.rmsNorm(gpu, b.h2, b.xMid, lw.postNorm, T, C, eps);
  }

  /** Calls fn(t0, R) for each MLP chunk of b's rows t0 .. t0+R-1. */
  private forEachChunk(b: LayerBuffers, fn: (t0: number, R: number) => void): void {
    for (let t0 = 0; t0 < this.T; t0 += b.rows) fn(t0, Math.min(b.rows, this.T - t0));
  }

  /** Rows t0 .. t0+R-1 of src (T, C): src itself when the MLP runs in one chunk, else copied into stage. */
  private chunkRows(src: GPUBuffer, stage: GPUBuffer | null, t0: number, R: number): GPUBuffer {
    if (!stage) return src;
    const C = this.model.cfg.hiddenSize;
    this.gpu.copy(src, t0 * C * 4, stage, 0, R * C * 4);
    return stage;
  }

  /** gate, up, act of one chunk from its h2 rows (R, C). */
  private mlpUp(l: number, b: LayerBuffers, h2: GPUBuffer, R: number): void {
    const lw = this.model.weights.layers[l];
    const { hiddenSize: C, intermediateSize: I } = this.model.cfg;
    this.proj(l, b, b.gate, h2, lw.gateProj, 'gate_proj', R, I, C);
    this.proj(l, b, b.up, h2, lw.upProj, 'up_proj', R, I, C);
    K.siluMul(this.gpu, b.act, b.gate, b.up, R * I);
  }

  /**
   * MLP of layer l, chunk by chunk: out (T, C) += down(silu(gate(h2)) * up(h2)). With out = xMid
   * (a recomputed layer) xMid ends as x_{l+1}; a kept layer keeps xMid and adds into a copy, and
   * each chunk's gate, up and LoRA x A^T rows into `kept`.
   */
  private mlpForward(l: number, b: LayerBuffers, out: GPUBuffer, kept: KeptBuffers | null = null): void {
    const lw = this.model.weights.layers[l];
    const { hiddenSize: C, intermediateSize: I } = this.model.cfg;
    this.forEachChunk(b, (t0, R) => {
      this.mlpUp(l, b, this.chunkRows(b.h2, b.h2c, t0, R), R);
      const y = this.chunkRows(out, b.yc, t0, R);
      this.proj(l, b, y, b.act, lw.downProj, 'down_proj', R, C, I, true);
      if (b.yc) this.gpu.copy(b.yc, 0, out, t0 * C * 4, R * C * 4);
      if (kept) this.chunkRowsKept(b, kept, t0, R, true);
    });
  }

  /** dx_in (rows, Kd) (+)= dy W, plus the LoRA branch's input gradient, and its dA/dB. */
  private projBack(
    l: number,
    b: LayerBuffers,
    g: LayerGrads,
    dxIn: GPUBuffer,
    dy: GPUBuffer,
    xIn: GPUBuffer,
    w: K.Weight,
    t: LoraTarget,
    rows: number,
    N: number,
    Kd: number,
    accumulate: boolean,
  ): void {
    const lora = this.lora!;
    const p = lora.get(l, t);
    if (!p) {
      K.matmulBackwardInput(this.gpu, dxIn, dy, w, rows, N, Kd, accumulate);
      return;
    }
    // dB, du and dA first (they read dy, u and x only), then dx with du A added in the input
    // gradient's store where gemm_tiled can (K.matmulBackwardInput's `lora`; else after it).
    const { r } = lora.settings;
    loraBackwardWeights(this.gpu, g.du, dy, xIn, b.u.get(t)!, p, rows, r, lora.scale);
    K.matmulBackwardInput(this.gpu, dxIn, dy, w, rows, N, Kd, accumulate, { u: g.du, B: p.A, r, scale: 1 });
  }

  /**
   * MLP backward of layer l, chunk by chunk (gate, up and the LoRA x A^T recomputed from h2's
   * rows, or copied back from a kept layer's `kept`; act formed from them): given dx (T, C) =
   * d x_{l+1}, writes g.dh (T, C) = d h2 and adds into the MLP's LoRA gradients.
   */
  private mlpBackward(l: number, b: LayerBuffers, g: LayerGrads, dx: GPUBuffer, kept: KeptBuffers | null): void {
    const { gpu } = this;
    const lw = this.model.weights.layers[l];
    const { hiddenSize: C, intermediateSize: I } = this.model.cfg;
    const down = this.lora!.get(l, 'down_proj');
    this.forEachChunk(b, (t0, R) => {
      const h2 = this.chunkRows(b.h2, b.h2c, t0, R);
      if (kept) {
        this.chunkRowsKept(b, kept, t0, R, false);
        K.siluMul(gpu, b.act, b.gate, b.up, R * I);
      } else {
        this.mlpUp(l, b, h2, R);
        // down_proj's LoRA backward needs u = act A^T; its output itself is not needed.
        if (down) K.matmulF32(gpu, b.u.get('down_proj')!, b.act, down.A, R, this.lora!.settings.r, I);
      }
      const dy = this.chunkRows(dx, b.yc, t0, R);
      this.projBack(l, b, g, g.dAct, dy, b.act, lw.downProj, 'down_proj', R, C, I, false);
      gpu.clear(g.dGate);
      gpu.clear(g.dUp);
      K.siluMulBackward(gpu, g.dGate, g.dUp, g.dAct, b.gate, b.up, R * I);
      const dh2 = b.yc ?? g.dh; // dy is spent: its staging rows receive d h2
      this.projBack(l, b, g, dh2, g.dGate, h2, lw.gateProj, 'gate_proj', R, I, C, false);
      this.projBack(l, b, g, dh2, g.dUp, h2, lw.upProj, 'up_proj', R, I, C, true);
      if (b.yc) gpu.copy(b.yc, 0, g.dh, t0 * C * 4, R * C * 4);
    });
  }

  // ---- 3. forward ----------------------------------------------------------------------------

  /** Runs the forward and returns log p(target) of each row that has a target, in order. */
  async forward(): Promise<Float32Array> {
    const { gpu, T } = this;
    const { cfg, weights } = this.model;
    const C = cfg.hiddenSize;
    const xF32 = this.createScratch();
    const idsBuf = gpu.createBuffer(T * 4, 'ids'); // (T) u32
    gpu.write(idsBuf, Uint32Array.from(this.ids));
    const x0 = xF32 ?? this.xs[0];
    K.embed(gpu, x0, idsBuf, weights.embed, T, C, cfg.vocabSize);
    gpu.releaseBuffer(idsBuf);
    this.storeCheckpoint(0, x0, xF32);
    this.releaseKept(); // a second forward replaces the first's
    const firstKept = cfg.numLayers - this.keep;
    let b = firstKept > 0 ? this.layerBuffers(this.Tc) : null; // the recomputed layers' workspace
    let work: KeptWork | null = null; // the kept layers' workspace
    for (let l = 0; l < cfg.numLayers; l++) {
      const x = xF32 ?? this.xs[l];
      if (l < firstKept) {
        this.attentionForward(l, x, b!);
        this.mlpForward(l, b!, b!.xMid);
        this.storeCheckpoint(l + 1, b!.xMid, xF32);
        continue;
      }
      if (b) this.releaseAll({ ...b });
      b = null;
      work ??= this.keptWork();
      const kept = (this.kept[l] = this.keptBuffers(T));
      const k = this.keptView(kept, work);
      this.attentionForward(l, x, k);
      // x_{l+1} = xMid + MLP, formed where the checkpoint is stored from; x itself is spent.
      const y = xF32 ?? this.xs[l + 1];
      gpu.copy(k.xMid, 0, y, 0, T * C * 4);
      this.mlpForward(l, k, y, kept);
      this.storeCheckpoint(l + 1, y, xF32);
    }
    if (b) this.releaseAll({ ...b });
    if (work) this.releaseAll({ ...work });
    const xL = xF32 ?? this.xs[cfg.numLayers]; // (T, C) f32 final residual (rounded like the checkpoint)
    try {
      if (this.M === 0) return new Float32Array(0);
      const logp = this.rowCands ? await this.restrictedLogp(xL) : await this.fullLogp(xL);
      if (this.dtype === 'f16' && !logp.every(Number.isFinite)) {
        throw new RangeError(
          "non-finite log-probabilities with f16 checkpoints: the residual stream likely exceeded f16's 65504; use checkpoints 'bf16' or 'f32'",
        );
      }
      return logp;
    } finally {
      if (xF32) gpu.releaseBuffer(xF32);
    }
  }

  /**
   * log p(target) over the whole vocabulary; keeps each row's log-sum-exp for the backward, and
   * with headGrad each row's E_m = RMSNorm'((onehot - p) W) (the header).
   */
  private async fullLogp(xL: GPUBuffer): Promise<Float32Array> {
    const { gpu } = this;
    const { cfg, weights } = this.model;
    const V = cfg.vocabSize,
      C = cfg.hiddenSize;
    const Hr = headRows(this.M);
    const logp = gpu.createBuffer(this.M * 4, 'logp'); // (M)
    const tg = gpu.createBuffer(Hr * 4, 'tgtChunk'); // (Hr) u32
    const lp = gpu.createBuffer(Hr * 4, 'logpChunk'); // (Hr)
    const ls = gpu.createBuffer(Hr * 4, 'lseChunk'); // (Hr)
    const grad = this.headGrad
      ? {
          ones: gpu.createBuffer(Hr * 4, 'onesChunk'), // (Hr) 1.0: dlogits = onehot - p
          dlogits: gpu.createBuffer(Hr * V * 4, 'dlogitsRows'), // (Hr, V)
          dh: gpu.createBuffer(Hr * C * 4, 'dhRows'), // (Hr, C) (onehot - p) W
          dxr: gpu.createBuffer(Hr * C * 4, 'dxRows'), // (Hr, C) that through the final norm
        }
      : null;
    if (grad) gpu.write(grad.ones, new Float32Array(Hr).fill(1));
    this.headChunks(xL, (m0, R, logits, xr) => {
      gpu.copy(this.targets, m0 * 4, tg, 0, R * 4);
      K.logSoftmaxGather(gpu, lp, ls, logits, tg, R, V);
      gpu.copy(lp, 0, logp, m0 * 4, R * 4);
      gpu.copy(ls, 0, this.lse, m0 * 4, R * 4);
      if (grad) {
        K.logSoftmaxBackward(gpu, grad.dlogits, grad.ones, logits, ls, tg, R, V);
        K.matmulBackwardInput(gpu, grad.dh, grad.dlogits, weights.lmHead, R, V, C, false);
        gpu.clear(grad.dxr);
        K.rmsNormBackward(gpu, grad.dxr, grad.dh, xr, weights.norm, R, C, cfg.rmsNormEps);
        gpu.copy(grad.dxr, 0, this.headGrad!, m0 * C * 4, R * C * 4);
      }
    });
    for (const x of [tg, lp, ls, ...(grad ? Object.values(grad) : [])]) gpu.releaseBuffer(x);
    this.headGradReady = grad !== null;
    const out = await gpu.readF32(logp, this.M);
    gpu.releaseBuffer(logp);
    return out;
  }

  /** Row m's first entry in the (sum of candidates) layout of candidate logits and probabilities. */
  private candOffsets(): number[] {
    const off = [0];
    for (const c of this.rowCands!) off.push(off[off.length - 1]! + c.length);
    return off;
  }

  /** log p(target) renormalised over each row's candidates: only the candidates' logits come back. */
  private async restrictedLogp(xL: GPUBuffer): Promise<Float32Array> {
    const { gpu } = this;
    const V = this.model.cfg.vocabSize;
    const cands = this.rowCands!;
    const off = this.candOffsets();
    const total = off[this.M]!;
    const picked = gpu.createBuffer(total * 4, 'candidateLogits'); // (sum of candidates)
    this.headChunks(xL, (m0, R, logits) => {
      for (let i = 0; i < R; i++)
        for (const [j, c] of cands[m0 + i]!.entries())
          gpu.copy(logits, (i * V + c) * 4, picked, (off[m0 + i]! + j) * 4, 4);
    });
    const z = await gpu.readF32(picked, total);
    gpu.releaseBuffer(picked);
    const targets = this.targetList;
    const probs = new Float64Array(total);
    const out = new Float32Array(this.M);
    for (let m = 0; m < this.M; m++) {
      const o = off[m]!,
        nc = cands[m]!.length;
      let mx = -Infinity;
      for (let j = 0; j < nc; j++) mx = Math.max(mx, z[o + j]);
      let sum = 0;
      for (let j = 0; j < nc; j++) sum += Math.exp(z[o + j] - mx);
      for (let j = 0; j < nc; j++) probs[o + j] = Math.exp(z[o + j] - mx) / sum;
      out[m] = Math.log(probs[o + cands[m]!.indexOf(targets[m])]);
    }
    this.candidateProbs = probs;
    return out;
  }

  // ---- 4. LM head ----------------------------------------------------------------------------

  /** The contiguous pieces (t0 position, m target index, n rows) of target rows m0 .. m0+R-1. */
  private segments(m0: number, R: number): { t0: number; m: number; n: number }[] {
    const out: { t0: number; m: number; n: number }[] = [];
    for (const run of this.runs) {
      const a = Math.max(m0, run.offset),
        z = Math.min(m0 + R, run.offset + run.length);
      if (a < z) out.push({ t0: run.start + (a - run.offset), m: a, n: z - a });
    }
    return out;
  }

  /**
   * Calls `fn` for each chunk of at most HEAD_ROWS target rows m0 .. m0+R-1 with their residual
   * rows xr (R, C), normed rows hr (R, C) and logits (R, V): logits never exist for all rows.
   */
  private headChunks(
    xL: GPUBuffer,
    fn: (m0: number, R: number, logits: GPUBuffer, xr: GPUBuffer, hr: GPUBuffer) => void,
  ): void {
    const { gpu } = this;
    const { cfg, weights } = this.model;
    const C = cfg.hiddenSize,
      V = cfg.vocabSize;
    const Hr = headRows(this.M);
    const xr = gpu.createBuffer(Hr * C * 4, 'xRows'); // (Hr, C) final residual rows
    const hr = gpu.createBuffer(Hr * C * 4, 'hRows'); // (Hr, C) after the final norm
    const logits = gpu.createBuffer(Hr * V * 4, 'logitsRows'); // (Hr, V)
    for (let m0 = 0; m0 < this.M; m0 += HEAD_ROWS) {
      const R = Math.min(HEAD_ROWS, this.M - m0);
      for (const s of this.segments(m0, R)) gpu.copy(xL, s.t0 * C * 4, xr, (s.m - m0) * C * 4, s.n * C * 4);
      K.rmsNorm(gpu, hr, xr, weights.norm, R, C, cfg.rmsNormEps);
      if (this.temperature === 1) K.matmul(gpu, logits, hr, weights.lmHead, R, V, C);
      else
        K.gemm(
          gpu,
          'lmHeadTemperature',
          logits,
          hr,
          K.weightBuffer(weights.lmHead),
          K.weightFormat(weights.lmHead),
          R,
          V,
          C,
          [C, 1, C, 1],
          false,
          1 / this.temperature,
        ); // logits / temperature
      fn(m0, R, logits, xr, hr);
    }
    for (const x of [xr, hr, logits]) gpu.releaseBuffer(x);
  }

  // ---- 5. backward ---------------------------------------------------------------------------

  /**
   * Backward from dlogp (M) = d(loss)/d(log p(target)), adding into the adapter's dA/dB.
   * forward() must have run.
   */
  backward(dlogpIn: ArrayLike<number>): void {
    if (dlogpIn.length !== this.M) throw new RangeError(`dlogp has ${dlogpIn.length} entries for ${this.M} targets`);
    // The head's logits are z / temperature, so d z = d(z / temperature) / temperature: scaling
    // dlogp scales every logit gradient (both are linear in it).
    const dlogp = this.temperature === 1 ? dlogpIn : Float64Array.from(dlogpIn, (x) => x / this.temperature);
    const { gpu, T } = this;
    const { cfg, weights } = this.model;
    const {
      hiddenSize: C,
      numHeads: NH,
      numKvHeads: NKV,
      headDim: HD,
      intermediateSize: I,
      rmsNormEps: eps,
      ropeTheta: theta,
    } = cfg;
    const lora = this.lora?.enabled ? this.lora : null;
    if (!lora) throw new Error('backward needs an enabled LoRA adapter: only LoRA parameters are trained');
    if (this.M === 0) return; // no target: every gradient is zero
    const r = lora.settings.r;
    const xF32 = this.createScratch();

    const dx = gpu.createBuffer(T * C * 4, 'dx'); // (T, C) gradient of the residual stream
    gpu.clear(dx);
    const dlogpBuf = gpu.createBuffer(this.M * 4, 'dlogp'); // (M)
    gpu.write(dlogpBuf, Float32Array.from(dlogp));
    // d x_L: the forward's E_m (the header), row m scaled by its dlogp, at its target's position;
    // else from the LM head and the final norm with the logits recomputed.
    if (this.headGradReady) K.scatterRowsScaled(gpu, dx, this.headGrad!, this.targetRows!, dlogpBuf, this.M, C, T);
    else this.headBackwardRecomputed(dx, dlogpBuf, dlogp, xF32);
    gpu.releaseBuffer(dlogpBuf);

    // Layer by layer, from the kept intermediates, else recomputing the layer's forward from its
    // checkpoint. dx holds d x_{l+1}.
    const f = (n: number, label: string) => gpu.createBuffer(n * 4, label);
    const g: LayerGrads = {
      dh: f(T * C, 'dh'),
      dAtt: f(T * NH * HD, 'dAtt'),
      dqr: f(T * NH * HD, 'dqr'),
      dkr: f(T * NKV * HD, 'dkr'),
      dv: f(T * NKV * HD, 'dv'),
      du: f(T * r, 'du'),
      dAct: f(this.Tc * I, 'dAct'),
      dGate: f(this.Tc * I, 'dGate'),
      dUp: f(this.Tc * I, 'dUp'),
    };
    let work: KeptWork | null = null; // the kept layers' workspace
    let shared: LayerBuffers | null = null; // the recomputed layers' workspace, made after the kept are spent
    for (let l = cfg.numLayers - 1; l >= 0; l--) {
      const lw = weights.layers[l];
      const x = this.loadCheckpoint(l, xF32);
      const kept = this.kept[l];
      this.kept[l] = undefined;
      if (!kept && work) {
        this.releaseAll({ ...work });
        work = null;
      }
      const b = kept ? this.keptView(kept, (work ??= this.keptWork())) : (shared ??= this.layerBuffers(this.Tc));
      if (kept) this.rederive(l, x, b);
      else this.attentionForward(l, x, b);
      // MLP: x_out = x_mid + down(silu(gate(h2)) * up(h2)), h2 = norm(x_mid).
      this.mlpBackward(l, b, g, dx, kept ?? null);
      K.rmsNormBackward(gpu, dx, g.dh, b.xMid, lw.postNorm, T, C, eps); // dx now holds d x_mid
      // Attention: x_mid = x + o(attn(rope(qnorm(q)), rope(knorm(k)), v)), q/k/v from h1 = norm(x).
      this.projBack(l, b, g, g.dAtt, dx, b.att, lw.oProj, 'o_proj', T, C, NH * HD, false);
      for (const d of [g.dqr, g.dkr, g.dv]) gpu.clear(d);
      K.attentionBackward(gpu, g.dqr, g.dkr, g.dv, g.dAtt, b.att, b.lse, b.qr, b.kr, b.v, T, NH, NKV, HD, this.keyEnd);
      K.ropeBackward(gpu, g.dqr, this.pos, T, NH, HD, theta);
      K.ropeBackward(gpu, g.dkr, this.pos, T, NKV, HD, theta);
      // qr and kr are spent: they receive d q and d k (before q_norm / k_norm).
      const dq = b.qr,
        dk = b.kr;
      gpu.clear(dq);
      gpu.clear(dk);
      K.rmsNormBackward(gpu, dq, g.dqr, b.q, lw.qNorm, T * NH, HD, eps);
      K.rmsNormBackward(gpu, dk, g.dkr, b.k, lw.kNorm, T * NKV, HD, eps);
      this.projBack(l, b, g, g.dh, dq, b.h1, lw.qProj, 'q_proj', T, NH * HD, C, false);
      this.projBack(l, b, g, g.dh, dk, b.h1, lw.kProj, 'k_proj', T, NKV * HD, C, true);
      this.projBack(l, b, g, g.dh, g.dv, b.h1, lw.vProj, 'v_proj', T, NKV * HD, C, true);
      K.rmsNormBackward(gpu, dx, g.dh, x, lw.inputNorm, T, C, eps); // dx now holds d x_l
      if (kept) this.releaseAll({ ...kept });
    }
    if (shared) this.releaseAll({ ...(shared as LayerBuffers) });
    if (work) this.releaseAll({ ...(work as KeptWork) });
    this.releaseAll({ ...g, dx, xF32 });
  }

  /**
   * d x_L into dx from the LM head and the final norm, chunk by chunk, the logits recomputed (never
   * stored for all rows): for passes whose forward did not form headGrad (restricted, logpOnly).
   */
  private headBackwardRecomputed(
    dx: GPUBuffer,
    dlogpBuf: GPUBuffer,
    dlogp: ArrayLike<number>,
    xF32: GPUBuffer | null,
  ): void {
    const { gpu } = this;
    const { cfg, weights } = this.model;
    const { hiddenSize: C, vocabSize: V, rmsNormEps: eps } = cfg;
    const Hr = headRows(this.M);
    const dlogits = gpu.createBuffer(Hr * V * 4, 'dlogitsRows'); // (Hr, V)
    const dhr = gpu.createBuffer(Hr * C * 4, 'dhRows'); // (Hr, C) d(normed rows)
    const dxr = gpu.createBuffer(Hr * C * 4, 'dxRows'); // (Hr, C) d(residual rows)
    const tg = gpu.createBuffer(Hr * 4, 'tgtChunk'); // (Hr) u32
    const ls = gpu.createBuffer(Hr * 4, 'lseChunk'); // (Hr)
    const dl = gpu.createBuffer(Hr * 4, 'dlogpChunk'); // (Hr)
    this.headChunks(this.loadCheckpoint(cfg.numLayers, xF32), (m0, R, logits, xr) => {
      if (this.candidateProbs) this.restrictedDlogits(dlogits, dlogp, m0, R);
      else {
        gpu.copy(this.targets, m0 * 4, tg, 0, R * 4);
        gpu.copy(this.lse, m0 * 4, ls, 0, R * 4);
        gpu.copy(dlogpBuf, m0 * 4, dl, 0, R * 4);
        K.logSoftmaxBackward(gpu, dlogits, dl, logits, ls, tg, R, V);
      }
      K.matmulBackwardInput(gpu, dhr, dlogits, weights.lmHead, R, V, C, false);
      gpu.clear(dxr);
      K.rmsNormBackward(gpu, dxr, dhr, xr, weights.norm, R, C, eps);
      for (const s of this.segments(m0, R)) gpu.copy(dxr, (s.m - m0) * C * 4, dx, s.t0 * C * 4, s.n * C * 4);
    });
    for (const x of [dlogits, dhr, dxr, tg, ls, dl]) gpu.releaseBuffer(x);
  }

  /** dlogits rows: dlogp * (onehot - p) on the candidates, zero elsewhere. */
  private restrictedDlogits(dlogits: GPUBuffer, dlogp: ArrayLike<number>, m0: number, R: number): void {
    const { gpu } = this;
    const V = this.model.cfg.vocabSize;
    const probs = this.candidateProbs!,
      off = this.candOffsets(),
      targets = this.targetList;
    gpu.clear(dlogits, 0, R * V * 4);
    for (let i = 0; i < R; i++) {
      const m = m0 + i;
      for (const [j, c] of this.rowCands![m]!.entries()) {
        const g = dlogp[m] * ((c === targets[m] ? 1 : 0) - probs[off[m]! + j]);
        gpu.write(dlogits, new Float32Array([g]), (i * V + c) * 4);
      }
    }
  }

  /** Releases the kept layers' intermediates a backward has not used. */
  private releaseKept(): void {
    for (const k of this.kept) if (k) this.releaseAll({ ...k });
    this.kept = [];
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    this.releaseKept();
    for (const b of this.buffers) this.gpu.releaseBuffer(b);
  }
}
