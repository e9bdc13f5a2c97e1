// Training pass over one sequence: forward keeping only each layer's input (activation
// checkpointing), per-token log-probabilities of given targets, then the backward from d(loss)/d(logp)
// that recomputes each layer's internals on the way back and adds into the LoRA gradients.
// Positions are 0..T-1 and attention is causal over the sequence itself (no KV cache).
import type { Gpu } from '../gpu/index.ts';
import * as K from '../ops/index.ts';
import { loraBackward, loraForward, type LoraAdapter, type LoraTarget } from '../model/lora.ts';
import type { Qwen3Model } from '../model/qwen3.ts';

/** Rows of the LM head processed at once: bounds the (R, V) logits buffer. */
const HEAD_ROWS = 64;

/** Per-layer intermediates of one recomputed layer forward (T tokens). */
interface LayerBuffers {
  h1: GPUBuffer; // (T, C) input_layernorm(x)
  q: GPUBuffer; // (T, NH, HD) before q_norm
  k: GPUBuffer; // (T, NKV, HD) before k_norm
  v: GPUBuffer; // (T, NKV, HD)
  qr: GPUBuffer; // (T, NH, HD) after q_norm and RoPE
  kr: GPUBuffer; // (T, NKV, HD) after k_norm and RoPE
  att: GPUBuffer; // (T, NH, HD) attention output
  lse: GPUBuffer; // (T, NH) log-sum-exp of each attention row
  xMid: GPUBuffer; // (T, C) x + o_proj(att)
  h2: GPUBuffer; // (T, C) post_attention_layernorm(xMid)
  gate: GPUBuffer; // (T, I)
  up: GPUBuffer; // (T, I)
  act: GPUBuffer; // (T, I) silu(gate) * up
  u: Map<LoraTarget, GPUBuffer>; // (T, r) x A^T of each adapted projection
}

export class TrainingPass {
  private readonly gpu: Gpu;
  private readonly T: number;
  private readonly xs: GPUBuffer[] = []; // L+1 of (T, C): input of each layer, then the final residual
  private readonly hN: GPUBuffer; // (T, C) final norm output
  private readonly pos: GPUBuffer; // (T) u32 positions 0..T-1
  private readonly buffers: GPUBuffer[] = [];
  private readonly runs: { start: number; length: number; offset: number }[] = []; // target rows as contiguous runs
  private readonly targets: GPUBuffer; // (M) u32 target ids of the rows with a target
  private readonly lse: GPUBuffer; // (M) f32 log-sum-exp of the LM-head rows
  private readonly M: number;
  private readonly targetList: number[];
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
     * restricted to the other players' labels is; every target must be one of them.
     */
    readonly restrictTo: readonly number[] | null = null,
  ) {
    this.gpu = model.gpu;
    const { cfg } = model;
    const T = (this.T = ids.length);
    if (T === 0) throw new RangeError('training sequence is empty');
    if (targets.length !== T) throw new RangeError(`targets has ${targets.length} entries for ${T} tokens`);
    for (const [i, id] of [...ids, ...targets.filter((t) => t >= 0)].entries()) {
      if (!Number.isInteger(id) || id < 0 || id >= cfg.vocabSize) throw new RangeError(`token id ${id} (index ${i}) is out of range for vocab size ${cfg.vocabSize}`);
    }
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
    if (restrictTo) {
      if (restrictTo.length === 0) throw new RangeError('restrictTo is empty');
      for (const t of tgt) if (!restrictTo.includes(t)) throw new RangeError(`target ${t} is not among the restricted candidates`);
    }
    const C = cfg.hiddenSize;
    for (let l = 0; l <= cfg.numLayers; l++) this.xs.push(this.alloc(T * C * 4, `x.${l}`));
    this.hN = this.alloc(T * C * 4, 'hN');
    this.pos = this.alloc(T * 4, 'positions');
    this.gpu.write(this.pos, Uint32Array.from({ length: T }, (_, i) => i));
    this.targets = this.alloc(Math.max(1, this.M) * 4, 'targets');
    if (this.M) this.gpu.write(this.targets, Uint32Array.from(tgt));
    this.lse = this.alloc(Math.max(1, this.M) * 4, 'lseHead');
  }

  /** Number of positions with a target (the length of logp / dlogp). */
  get numTargets(): number {
    return this.M;
  }

  private alloc(bytes: number, label: string): GPUBuffer {
    const b = this.gpu.createBuffer(bytes, label);
    this.buffers.push(b);
    return b;
  }

  private layerBuffers(): LayerBuffers {
    const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I } = this.model.cfg;
    const T = this.T;
    const f = (n: number, label: string) => this.gpu.createBuffer(n * 4, label);
    const u = new Map<LoraTarget, GPUBuffer>();
    if (this.lora?.enabled) for (const t of this.lora.settings.targetModules) u.set(t, f(T * this.lora.settings.r, `u.${t}`));
    return {
      h1: f(T * C, 'h1'), q: f(T * NH * HD, 'q'), k: f(T * NKV * HD, 'k'), v: f(T * NKV * HD, 'v'),
      qr: f(T * NH * HD, 'qr'), kr: f(T * NKV * HD, 'kr'), att: f(T * NH * HD, 'att'), lse: f(T * NH, 'lse'),
      xMid: f(T * C, 'xMid'), h2: f(T * C, 'h2'), gate: f(T * I, 'gate'), up: f(T * I, 'up'), act: f(T * I, 'act'), u,
    };
  }

  private releaseLayerBuffers(b: LayerBuffers): void {
    const { u, ...rest } = b;
    for (const buf of [...Object.values(rest), ...u.values()]) this.gpu.releaseBuffer(buf);
  }

  /** x_{l+1} = layer_l(x_l), leaving every intermediate in `b` for the backward. */
  private layerForward(l: number, x: GPUBuffer, xOut: GPUBuffer, b: LayerBuffers): void {
    const { gpu, T } = this;
    const { cfg, weights } = this.model;
    const lw = weights.layers[l];
    const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, rmsNormEps: eps, ropeTheta: theta } = cfg;
    const lora = this.lora?.enabled ? this.lora : null;
    const proj = (y: GPUBuffer, xIn: GPUBuffer, w: GPUBuffer, t: LoraTarget, N: number, Kd: number, accumulate = false) => {
      K.matmul(gpu, y, xIn, w, T, N, Kd, accumulate);
      const p = lora?.get(l, t);
      if (p) loraForward(gpu, y, b.u.get(t)!, xIn, p, T, lora!.settings.r, lora!.scale);
    };
    K.rmsNorm(gpu, b.h1, x, lw.inputNorm, T, C, eps);
    proj(b.q, b.h1, lw.qProj, 'q_proj', NH * HD, C);
    proj(b.k, b.h1, lw.kProj, 'k_proj', NKV * HD, C);
    proj(b.v, b.h1, lw.vProj, 'v_proj', NKV * HD, C);
    K.rmsNorm(gpu, b.qr, b.q, lw.qNorm, T * NH, HD, eps);
    K.rmsNorm(gpu, b.kr, b.k, lw.kNorm, T * NKV, HD, eps);
    K.rope(gpu, b.qr, this.pos, T, NH, HD, theta);
    K.rope(gpu, b.kr, this.pos, T, NKV, HD, theta);
    K.attentionForwardLse(gpu, b.att, b.lse, b.qr, b.kr, b.v, T, NH, NKV, HD);
    gpu.copy(x, 0, b.xMid, 0, T * C * 4);
    proj(b.xMid, b.att, lw.oProj, 'o_proj', C, NH * HD, true);
    K.rmsNorm(gpu, b.h2, b.xMid, lw.postNorm, T, C, eps);
    proj(b.gate, b.h2, lw.gateProj, 'gate_proj', I, C);
    proj(b.up, b.h2, lw.upProj, 'up_proj', I, C);
    K.siluMul(gpu, b.act, b.gate, b.up, T * I);
    gpu.copy(b.xMid, 0, xOut, 0, T * C * 4);
    proj(xOut, b.act, lw.downProj, 'down_proj', C, I, true);
  }

  /** Runs the forward and returns log p(target) of each row that has a target, in order. */
  async forward(): Promise<Float32Array> {
    const { gpu, T } = this;
    const { cfg, weights } = this.model;
    const C = cfg.hiddenSize;
    const idsBuf = gpu.createBuffer(T * 4, 'ids');
    gpu.write(idsBuf, Uint32Array.from(this.ids));
    K.embed(gpu, this.xs[0], idsBuf, weights.embed, T, C, cfg.vocabSize);
    const b = this.layerBuffers();
    for (let l = 0; l < cfg.numLayers; l++) this.layerForward(l, this.xs[l], this.xs[l + 1], b);
    this.releaseLayerBuffers(b);
    gpu.releaseBuffer(idsBuf);
    K.rmsNorm(gpu, this.hN, this.xs[cfg.numLayers], weights.norm, T, C, cfg.rmsNormEps);
    if (this.M === 0) return new Float32Array(0);
    if (this.restrictTo) return this.restrictedLogp();
    const logp = gpu.createBuffer(this.M * 4, 'logp'); // (M)
    this.headChunks((r0, R, off, hr, logits) => {
      const tg = gpu.createBuffer(R * 4, 'tgtChunk');
      const lp = gpu.createBuffer(R * 4, 'logpChunk');
      const ls = gpu.createBuffer(R * 4, 'lseChunk');
      gpu.copy(this.targets, off * 4, tg, 0, R * 4);
      K.logSoftmaxGather(gpu, lp, ls, logits, tg, R, cfg.vocabSize);
      gpu.copy(lp, 0, logp, off * 4, R * 4);
      gpu.copy(ls, 0, this.lse, off * 4, R * 4);
      for (const x of [tg, lp, ls]) gpu.releaseBuffer(x);
      void r0; void hr;
    });
    const out = await gpu.readF32(logp, this.M);
    gpu.releaseBuffer(logp);
    return out;
  }

  /** log p(target) renormalised over `restrictTo`: only the candidates' logits come back. */
  private async restrictedLogp(): Promise<Float32Array> {
    const { gpu } = this;
    const V = this.model.cfg.vocabSize;
    const cands = this.restrictTo!;
    const nc = cands.length;
    const picked = gpu.createBuffer(this.M * nc * 4, 'candidateLogits'); // (M, nc)
    this.headChunks((_r0, R, off, _hr, logits) => {
      for (let i = 0; i < R; i++) for (let j = 0; j < nc; j++) gpu.copy(logits, (i * V + cands[j]) * 4, picked, ((off + i) * nc + j) * 4, 4);
    });
    const z = await gpu.readF32(picked, this.M * nc);
    gpu.releaseBuffer(picked);
    const targets = this.targetList;
    const probs = new Float64Array(this.M * nc);
    const out = new Float32Array(this.M);
    for (let m = 0; m < this.M; m++) {
      let mx = -Infinity;
      for (let j = 0; j < nc; j++) mx = Math.max(mx, z[m * nc + j]);
      let sum = 0;
      for (let j = 0; j < nc; j++) sum += Math.exp(z[m * nc + j] - mx);
      for (let j = 0; j < nc; j++) probs[m * nc + j] = Math.exp(z[m * nc + j] - mx) / sum;
      out[m] = Math.log(probs[m * nc + cands.indexOf(targets[m])]);
    }
    this.candidateProbs = probs;
    return out;
  }

  /** Calls `fn` for each chunk of target rows with their hidden rows and logits (R, V). */
  private headChunks(fn: (r0: number, R: number, offset: number, hr: GPUBuffer, logits: GPUBuffer) => void): void {
    const { gpu } = this;
    const { cfg, weights } = this.model;
    const C = cfg.hiddenSize, V = cfg.vocabSize;
    const hr = gpu.createBuffer(HEAD_ROWS * C * 4, 'hRows');
    const logits = gpu.createBuffer(HEAD_ROWS * V * 4, 'logitsRows');
    for (const run of this.runs) {
      for (let i = 0; i < run.length; i += HEAD_ROWS) {
        const R = Math.min(HEAD_ROWS, run.length - i), r0 = run.start + i;
        gpu.copy(this.hN, r0 * C * 4, hr, 0, R * C * 4);
        K.matmul(gpu, logits, hr, weights.lmHead, R, V, C);
        fn(r0, R, run.offset + i, hr, logits);
      }
    }
    gpu.releaseBuffer(hr);
    gpu.releaseBuffer(logits);
  }

  /**
   * Backward from dlogp (M) = d(loss)/d(log p(target)), adding into the adapter's dA/dB.
   * forward() must have run.
   */
  backward(dlogp: ArrayLike<number>): void {
    if (dlogp.length !== this.M) throw new RangeError(`dlogp has ${dlogp.length} entries for ${this.M} targets`);
    const { gpu, T } = this;
    const { cfg, weights } = this.model;
    const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, vocabSize: V, rmsNormEps: eps, ropeTheta: theta } = cfg;
    const lora = this.lora?.enabled ? this.lora : null;
    if (!lora) throw new Error('backward needs an enabled LoRA adapter: only LoRA parameters are trained');
    const r = lora.settings.r;

    // d hN: LM head rows, chunk by chunk (logits recomputed, never stored for all rows).
    const dhN = gpu.createBuffer(T * C * 4, 'dhN'); // (T, C)
    gpu.clear(dhN);
    const dlogpBuf = gpu.createBuffer(Math.max(1, this.M) * 4, 'dlogp'); // (M)
    gpu.write(dlogpBuf, Float32Array.from(dlogp));
    const dlogits = gpu.createBuffer(HEAD_ROWS * V * 4, 'dlogits'); // (R, V)
    const dhr = gpu.createBuffer(HEAD_ROWS * C * 4, 'dhRows'); // (R, C)
    this.headChunks((r0, R, off, _hr, logits) => {
      const tg = gpu.createBuffer(R * 4, 'tgtChunk');
      const ls = gpu.createBuffer(R * 4, 'lseChunk');
      const dl = gpu.createBuffer(R * 4, 'dlogpChunk');
      gpu.copy(this.targets, off * 4, tg, 0, R * 4);
      gpu.copy(this.lse, off * 4, ls, 0, R * 4);
      gpu.copy(dlogpBuf, off * 4, dl, 0, R * 4);
      if (this.candidateProbs) this.restrictedDlogits(dlogits, dlogp, off, R);
      else K.logSoftmaxBackward(gpu, dlogits, dl, logits, ls, tg, R, V);
      K.matmulBackwardInput(gpu, dhr, dlogits, weights.lmHead, R, V, C, false);
      gpu.copy(dhr, 0, dhN, r0 * C * 4, R * C * 4);
      for (const x of [tg, ls, dl]) gpu.releaseBuffer(x);
    });
    for (const x of [dlogpBuf, dlogits, dhr]) gpu.releaseBuffer(x);

    // d x_L from the final norm; then layer by layer, recomputing each layer's forward.
    const dx = gpu.createBuffer(T * C * 4, 'dx'); // (T, C) gradient of the residual stream
    gpu.clear(dx);
    K.rmsNormBackward(gpu, dx, dhN, this.xs[cfg.numLayers], weights.norm, T, C, eps);
    gpu.releaseBuffer(dhN);

    const b = this.layerBuffers();
    const f = (n: number, label: string) => gpu.createBuffer(n * 4, label);
    const dAct = f(T * I, 'dAct'), dGate = f(T * I, 'dGate'), dUp = f(T * I, 'dUp');
    const dh = f(T * C, 'dh'), dAtt = f(T * NH * HD, 'dAtt');
    const dqr = f(T * NH * HD, 'dqr'), dkr = f(T * NKV * HD, 'dkr'), dv = f(T * NKV * HD, 'dv');
    const dq = f(T * NH * HD, 'dq'), dk = f(T * NKV * HD, 'dk');
    const du = f(T * r, 'du');
    const xOut = f(T * C, 'xOutRecompute');
    // dx_in (+)= dy W (+ the LoRA branch's input gradient, and its dA/dB).
    const projBack = (l: number, dxIn: GPUBuffer, dy: GPUBuffer, xIn: GPUBuffer, w: GPUBuffer, t: LoraTarget, N: number, Kd: number, accumulate: boolean) => {
      K.matmulBackwardInput(gpu, dxIn, dy, w, T, N, Kd, accumulate);
      const p = lora.get(l, t);
      if (p) loraBackward(gpu, dxIn, du, dy, xIn, b.u.get(t)!, p, T, r, lora.scale);
    };
    for (let l = cfg.numLayers - 1; l >= 0; l--) {
      const lw = weights.layers[l];
      this.layerForward(l, this.xs[l], xOut, b);
      // MLP: x_out = x_mid + down(silu(gate(h2)) * up(h2)), h2 = norm(x_mid). dx holds d x_out.
      projBack(l, dAct, dx, b.act, lw.downProj, 'down_proj', C, I, false);
      gpu.clear(dGate);
      gpu.clear(dUp);
      K.siluMulBackward(gpu, dGate, dUp, dAct, b.gate, b.up, T * I);
      projBack(l, dh, dGate, b.h2, lw.gateProj, 'gate_proj', I, C, false);
      projBack(l, dh, dUp, b.h2, lw.upProj, 'up_proj', I, C, true);
      K.rmsNormBackward(gpu, dx, dh, b.xMid, lw.postNorm, T, C, eps); // dx now holds d x_mid
      // Attention: x_mid = x + o(attn(rope(qnorm(q)), rope(knorm(k)), v)), q/k/v from h1 = norm(x).
      projBack(l, dAtt, dx, b.att, lw.oProj, 'o_proj', C, NH * HD, false);
      for (const g of [dqr, dkr, dv, dq, dk]) gpu.clear(g);
      K.attentionBackward(gpu, dqr, dkr, dv, dAtt, b.att, b.lse, b.qr, b.kr, b.v, T, NH, NKV, HD);
      K.ropeBackward(gpu, dqr, this.pos, T, NH, HD, theta);
      K.ropeBackward(gpu, dkr, this.pos, T, NKV, HD, theta);
      K.rmsNormBackward(gpu, dq, dqr, b.q, lw.qNorm, T * NH, HD, eps);
      K.rmsNormBackward(gpu, dk, dkr, b.k, lw.kNorm, T * NKV, HD, eps);
      projBack(l, dh, dq, b.h1, lw.qProj, 'q_proj', NH * HD, C, false);
      projBack(l, dh, dk, b.h1, lw.kProj, 'k_proj', NKV * HD, C, true);
      projBack(l, dh, dv, b.h1, lw.vProj, 'v_proj', NKV * HD, C, true);
      K.rmsNormBackward(gpu, dx, dh, this.xs[l], lw.inputNorm, T, C, eps); // dx now holds d x_l
    }
    this.releaseLayerBuffers(b);
    for (const x of [dAct, dGate, dUp, dh, dAtt, dqr, dkr, dv, dq, dk, du, xOut, dx]) gpu.releaseBuffer(x);
  }

  /** dlogits rows: dlogp * (onehot - p) on the candidates, zero elsewhere. */
  private restrictedDlogits(dlogits: GPUBuffer, dlogp: ArrayLike<number>, off: number, R: number): void {
    const { gpu } = this;
    const V = this.model.cfg.vocabSize;
    const cands = this.restrictTo!, nc = cands.length, probs = this.candidateProbs!, targets = this.targetList;
    gpu.clear(dlogits, 0, R * V * 4);
    for (let i = 0; i < R; i++) {
      const m = off + i;
      for (let j = 0; j < nc; j++) {
        const g = dlogp[m] * ((cands[j] === targets[m] ? 1 : 0) - probs[m * nc + j]);
        gpu.write(dlogits, new Float32Array([g]), (i * V + cands[j]) * 4);
      }
    }
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    for (const b of this.buffers) this.gpu.releaseBuffer(b);
  }
}
