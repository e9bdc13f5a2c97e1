// Qwen3 forward pass on our WGSL kernels: the same math as Hugging Face modeling_qwen3.py.
// One `forward` serves prefill (many tokens of one sequence), several prompts at once and
// batched decode (one token of each of B sequences): every token carries its KV-cache slot
// and position, and attention reads the cache, so no T x T buffer ever exists.
import type { Gpu } from '../gpu/index.ts';
import * as K from '../ops/index.ts';
import type { Qwen3Config } from './config.ts';
import { KVCache, type KvCacheOptions } from './kvCache.ts';
import { loraForward, type LoraAdapter, type LoraTarget } from './lora.ts';

export { KVCache } from './kvCache.ts';

export interface LayerWeights {
  inputNorm: GPUBuffer; // (C) bf16
  qProj: K.Weight; // (NH*HD, C) bf16 or q4
  kProj: K.Weight; // (NKV*HD, C) bf16 or q4
  vProj: K.Weight; // (NKV*HD, C) bf16 or q4
  qNorm: GPUBuffer; // (HD) bf16
  kNorm: GPUBuffer; // (HD) bf16
  oProj: K.Weight; // (C, NH*HD) bf16 or q4
  postNorm: GPUBuffer; // (C) bf16
  gateProj: K.Weight; // (I, C) bf16 or q4
  upProj: K.Weight; // (I, C) bf16 or q4
  downProj: K.Weight; // (C, I) bf16 or q4
}

export interface Qwen3Weights {
  embed: K.Weight; // (V, C) bf16 or q4
  layers: LayerWeights[]; // L
  norm: GPUBuffer; // (C) bf16
  lmHead: K.Weight; // (V, C) bf16 or q4; the embedding itself (same object) when tied
}

/** Tokens per forward chunk: bounds activation memory whatever the prompt length. */
export const DEFAULT_CHUNK = 256;

/**
 * Token ids already on the GPU (the previous decode step's samples, K.sampleRows): token t is
 * buffer[rows[t]], so a decode step starts without reading them back. The ids are not checked on
 * the CPU; the sampler only writes ids < V.
 */
export interface GpuTokenIds {
  buffer: GPUBuffer; // (n) u32 token ids, n >= max(rows) + 1
  rows: ArrayLike<number>; // (T) index into buffer of each token
}

export interface ForwardInput {
  ids: ArrayLike<number> | GpuTokenIds; // (T) token ids, or where on the GPU they are
  slots: ArrayLike<number>; // (T) KV-cache slot of each token
  positions: ArrayLike<number>; // (T) position of each token in its sequence
  /** Token indices whose logits are wanted, in output-row order. */
  logitRows: ArrayLike<number>;
}

export class Qwen3Model {
  private chunkTokens: number;
  /** KV-cache element type of createCache. */
  readonly kv: 'f32' | 'f16';
  /** Applied in every forward while set and enabled (the policy); null or disabled = the base model. */
  lora: LoraAdapter | null = null;
  constructor(
    readonly gpu: Gpu,
    readonly cfg: Qwen3Config,
    readonly weights: Qwen3Weights,
    opts: { chunk?: number; kv?: 'f32' | 'f16' } = {},
  ) {
    this.chunkTokens = checkedChunk(opts.chunk ?? DEFAULT_CHUNK);
    this.kv = opts.kv ?? 'f32';
  }

  /**
   * Tokens per forward chunk: a prompt runs through the layers this many tokens at a time, so its
   * activations are bounded whatever its length. A run sets its memory plan's (MemoryPlan.forwardChunk:
   * larger chunks where the round's peak allows, fewer dispatches and taller products).
   */
  get chunk(): number {
    return this.chunkTokens;
  }

  set chunk(tokens: number) {
    this.chunkTokens = checkedChunk(tokens);
  }

  /** A paged cache of `slots` sequences of up to maxT tokens, in this.kv (opts.pages: its memory). */
  createCache(slots: number, maxT: number, opts: Omit<KvCacheOptions, 'dtype'> = {}): KVCache {
    return new KVCache(this.gpu, this.cfg, slots, maxT, { ...opts, dtype: this.kv });
  }

  /**
   * Runs the model over the given tokens, writing their K/V into `cache`, and returns a
   * buffer with the logits of `logitRows` (R, V) f32. Tokens of one slot must come in
   * position order; tokens of a later chunk may attend to those of an earlier one.
   * The caller releases the returned buffer with gpu.releaseBuffer.
   */
  forward(input: ForwardInput, cache: KVCache): GPUBuffer {
    const { gpu, cfg } = this;
    const onGpu = tokenIdsOnGpu(input.ids);
    const T = onGpu ? onGpu.rows.length : (input.ids as ArrayLike<number>).length;
    if (input.slots.length !== T || input.positions.length !== T)
      throw new Error('forward: ids, slots and positions differ in length');
    const V = cfg.vocabSize;
    const idCount = onGpu ? onGpu.buffer.size / 4 : V; // a GPU row index must fall inside its buffer
    for (let t = 0; t < T; t++) {
      const id = onGpu ? onGpu.rows[t] : (input.ids as ArrayLike<number>)[t],
        s = input.slots[t],
        p = input.positions[t];
      if (!Number.isInteger(id) || id < 0 || id >= idCount)
        throw new RangeError(
          onGpu
            ? `token row ${id} at index ${t} is out of range for the ${idCount}-id buffer '${onGpu.buffer.label}'`
            : `token id ${id} at index ${t} is out of range for vocab size ${V}`,
        );
      if (s < 0 || s >= cache.slots)
        throw new RangeError(`slot ${s} at index ${t} is out of range (cache has ${cache.slots} slots)`);
      if (p < 0 || p >= cache.maxT)
        throw new RangeError(`position ${p} at index ${t} exceeds the KV cache capacity of ${cache.maxT} tokens`);
    }
    cache.prepareWrite(input.slots, input.positions); // maps pages under new positions, uploads the page table
    const R = input.logitRows.length;
    const logits = gpu.createBuffer(Math.max(R, 1) * V * 4, 'logits'); // (R, V) f32
    let row = 0;
    for (let t0 = 0; t0 < T; t0 += this.chunk) {
      const t1 = Math.min(T, t0 + this.chunk);
      const rows: number[] = [];
      for (; row < R && input.logitRows[row] < t1; row++) {
        const r = input.logitRows[row];
        if (r < t0) throw new Error('forward: logitRows must be increasing');
        rows.push(r - t0);
      }
      const outOffset = (row - rows.length) * V * 4;
      this.forwardChunk(input, t0, t1, rows, cache, logits, outOffset);
    }
    if (row !== R) throw new Error('forward: logitRows out of range');
    return logits;
  }

  private forwardChunk(
    input: ForwardInput,
    t0: number,
    t1: number,
    rows: number[],
    cache: KVCache,
    logits: GPUBuffer,
    logitsOffset: number,
  ): void {
    const { gpu, cfg, weights: w } = this;
    const T = t1 - t0;
    const {
      hiddenSize: C,
      numHeads: NH,
      numKvHeads: NKV,
      headDim: HD,
      intermediateSize: I,
      vocabSize: V,
      rmsNormEps: eps,
      ropeTheta: theta,
    } = cfg;
    const kv = cache.paging;

    const onGpu = tokenIdsOnGpu(input.ids);
    const idList = onGpu ? onGpu.rows : (input.ids as ArrayLike<number>);
    const ids = this.u32(
      Array.from({ length: T }, (_, i) => idList[t0 + i]),
      onGpu ? 'idRows' : 'ids',
    ); // (T) u32: token ids, or their rows in onGpu.buffer
    const slot = this.u32(
      Array.from({ length: T }, (_, i) => input.slots[t0 + i]),
      'slots',
    ); // (T) u32
    const pos = this.u32(
      Array.from({ length: T }, (_, i) => input.positions[t0 + i]),
      'positions',
    ); // (T) u32

    const x = gpu.createBuffer(T * C * 4, 'x'); // (T, C) residual stream
    const h = gpu.createBuffer(T * C * 4, 'h'); // (T, C) normed
    const q = gpu.createBuffer(T * NH * HD * 4, 'q'); // (T, NH, HD)
    const qn = gpu.createBuffer(T * NH * HD * 4, 'qNormed'); // (T, NH, HD)
    const k = gpu.createBuffer(T * NKV * HD * 4, 'k'); // (T, NKV, HD)
    const v = gpu.createBuffer(T * NKV * HD * 4, 'v'); // (T, NKV, HD)
    const att = gpu.createBuffer(T * NH * HD * 4, 'attn'); // (T, NH, HD)
    const gate = gpu.createBuffer(T * I * 4, 'gate'); // (T, I)
    const up = gpu.createBuffer(T * I * 4, 'up'); // (T, I)
    const act = gpu.createBuffer(T * I * 4, 'act'); // (T, I)

    const lora = this.lora?.enabled ? this.lora : null;
    // (T, r) x A^T scratch: one per projection of a group (q/k/v) whose A products run as one dispatch
    const us = lora ? [0, 1, 2].map((i) => gpu.createBuffer(T * lora.settings.r * 4, `loraU${i}`)) : [];
    const u = us[0] ?? null;
    // (T, G r): a group's u over its stacked A matrices, where its branches bind packed (made on first use)
    let uPacked: GPUBuffer | null = null;
    // The next group's LoRA A product as the partial sums the GEMV before it wrote (K.NextAProduct,
    // tuning.loraAFold): q/k/v's from the previous layer's down_proj, gate/up's from o_proj. Their
    // count a row, 0 where that GEMV did not write them.
    let aParts: GPUBuffer | null = null;
    let pendingParts = 0;
    // o_proj's LoRA A product as attention_combine's partial sums (K.AttentionAProduct), and
    // down_proj's as the paired gate/up GEMV's (K.PairAProduct, pendingDown a row), made on first use
    let oParts: GPUBuffer | null = null;
    let dParts: GPUBuffer | null = null;
    let pendingDown = 0;
    const siluFold = K.foldsSilu(gpu, T);
    let l = 0;
    // y (+)= x W^T, plus the LoRA branch s (x A^T) B^T when the adapter targets this projection:
    // K.matmul runs its A product first, then the B product inside the projection's GEMV where
    // that takes it (K.matmul's `lora`: decode), so a LoRA projection is two dispatches, not three
    // (and where the A product splits over K, the GEMV adds up its slices: tuning.loraAFold).
    // With `up`, xIn is the MLP's gate and the products take silu(gate) * up (K.foldsSilu).
    const proj = (
      y: GPUBuffer,
      xIn: GPUBuffer,
      wt: K.Weight,
      target: LoraTarget,
      N: number,
      Kd: number,
      accumulate = false,
      up?: GPUBuffer,
      next?: K.NextAProduct,
      uParts?: { buffer: GPUBuffer; parts: number },
    ): number => {
      const p = lora?.get(l, target);
      if (!p) return K.matmul(gpu, y, xIn, wt, T, N, Kd, accumulate, undefined, up, next);
      const r = lora!.settings.r;
      const branch = uParts
        ? { u: uParts.buffer, parts: uParts.parts, B: p.B, r, scale: lora!.scale }
        : { u: u!, A: p.A, B: p.B, r, scale: lora!.scale };
      return K.matmul(gpu, y, xIn, wt, T, N, Kd, accumulate, branch, up, next);
    };
    const qkvTargets: readonly LoraTarget[] = ['q_proj', 'k_proj', 'v_proj'];
    const qkvNs = [NH * HD, NKV * HD, NKV * HD];
    const gateUpTargets: readonly LoraTarget[] = ['gate_proj', 'up_proj'];
    const gateUpNs = [I, I];
    // Layer l1's q/k/v (qkv) or gate/up LoRA A product for the GEMV writing that group's input x
    // to begin (K.matmul's `next`), where the group takes its u as partial sums (K.groupTakesParts):
    // q/k/v's over its stacked A matrices, its branches packed (the producer, down_proj, has no
    // bindings for three A's on Chrome's 10); gate/up's over its own two, each branch its own B.
    // gate/up packed too where its GEMV pairs its columns to begin down_proj's A product (mlpPairs).
    const nextGroupA = (l1: number, qkv: boolean): K.NextAProduct | undefined => {
      const targets = qkv ? qkvTargets : gateUpTargets;
      if (!lora || l1 >= cfg.numLayers || !targets.every((t) => lora.get(l1, t))) return undefined;
      const lw1 = w.layers[l1];
      const normW = qkv ? lw1.inputNorm : lw1.postNorm;
      const wts = qkv ? [lw1.qProj, lw1.kProj, lw1.vProj] : [lw1.gateProj, lw1.upProj];
      const r = lora.settings.r;
      const packed = qkv || mlpPairs(l1);
      if (!K.groupTakesParts(gpu, x, wts, T, qkv ? qkvNs : gateUpNs, C, r, { w: normW, eps }, packed)) return undefined;
      aParts ??= gpu.createBuffer(K.nextAParts(C) * T * 3 * r * 4, 'loraAParts'); // the larger group's
      const As = packed ? [lora.packed(l1, targets)!.A] : targets.map((t) => lora.get(l1, t)!.A);
      return { As, normW, parts: aParts, R: targets.length * r };
    };
    // Whether layer l1's gate/up GEMV begins down_proj's LoRA A product (K.groupPairs: its columns
    // paired, its branches packed from o_proj's partial sums, 10 bindings) for down_proj's GEMV to
    // add up (K.matmulTakesParts): the adapter on all three, the SwiGLU folded into down_proj.
    const mlpPairs = (l1: number): boolean => {
      if (!lora || !siluFold || ![...gateUpTargets, 'down_proj' as const].every((t) => lora.get(l1, t))) return false;
      const lw1 = w.layers[l1];
      const r = lora.settings.r;
      const norm = { w: lw1.postNorm, eps };
      return (
        K.groupPairs(gpu, x, [lw1.gateProj, lw1.upProj], T, gateUpNs, C, r, norm) &&
        K.matmulTakesParts(gpu, gate, lw1.downProj, T, C, I, r)
      );
    };
    // Projections of h = rmsNorm(x, normW) sharing one read of it (q/k/v, gate/up): one fused GEMV
    // dispatch in decode (K.matmulGroup), then each target's LoRA branch on its own output.
    // When the adapter targets every projection of the group, their LoRA A products (which share h
    // too) run first as one dispatch (K.matmulGroupF32), and the group product takes their B
    // products: in its GEMV's store where that fits (decode; tuning.loraFold), else as one more
    // dispatch (K.matmulEachF32: decode on GPUs; one each elsewhere). Where one u and B per
    // projection do not fit the device's storage buffers a stage but a packed pair does
    // (K.groupLoraPacks: the q/k/v group with its norm under Chrome's 10), the A product runs over
    // the group's stacked A matrices into one u, and the group product binds the stacked B's
    // (LoraAdapter.packed).
    // Where the group products can take it (K.foldsNorm: decode on GPUs), the norm runs inside them
    // and h is never written; a LoRA A product of one projection alone needs h, so not then.
    // Where the GEMV before the group wrote its u as partial sums (nextGroupA: tuning.loraAFold),
    // the group product adds them up in its store and no A product runs.
    const projGroup = (
      normW: GPUBuffer,
      ys: GPUBuffer[],
      wts: K.Weight[],
      targets: readonly LoraTarget[],
      Ns: readonly number[],
    ) => {
      const ps = targets.map((target) => lora?.get(l, target) ?? null);
      const groupA = lora !== null && ps.every((p) => p !== null);
      const fold = K.foldsNorm(gpu, T, wts.length) && (groupA || ps.every((p) => p === null));
      const norm = fold ? { w: normW, eps } : undefined;
      if (!fold) K.rmsNorm(gpu, h, x, normW, T, C, eps);
      const xIn = fold ? x : h;
      if (!groupA) {
        K.matmulGroup(gpu, ys, xIn, wts, T, Ns, C, norm);
        ps.forEach((p, i) => {
          if (p) loraForward(gpu, ys[i], u!, h, p, T, lora!.settings.r, lora!.scale);
        });
        return;
      }
      const r = lora.settings.r;
      if (pendingParts > 0) {
        // u from the partial sums the GEMV before wrote (nextGroupA)
        const parts = pendingParts;
        pendingParts = 0;
        const scale = lora.scale;
        if (wts.length === 3) {
          const B = lora.packed(l, targets)!.B;
          K.matmulGroup(gpu, ys, xIn, wts, T, Ns, C, norm, { u: aParts!, B, r, scale, parts });
        } else if (mlpPairs(l)) {
          // gate/up packed (nextGroupA), beginning down_proj's A product
          const B = lora.packed(l, targets)!.B;
          dParts ??= gpu.createBuffer(K.pairParts(I) * T * r * 4, 'loraDParts');
          const next = { A: lora.get(l, 'down_proj')!.A, parts: dParts, R: r };
          pendingDown = K.matmulGroup(gpu, ys, xIn, wts, T, Ns, C, norm, { u: aParts!, B, r, scale, parts }, next);
        } else {
          const Bs = ps.map((p) => p!.B);
          K.matmulGroup(gpu, ys, xIn, wts, T, Ns, C, norm, { u: aParts!, Bs, r, scale, parts });
        }
        return;
      }
      if (K.groupLoraPacks(gpu, xIn, wts, T, Ns, C, norm)) {
        const pack = lora.packed(l, targets)!;
        uPacked ??= gpu.createBuffer(T * 3 * r * 4, 'loraUPacked'); // the larger group's
        K.matmulF32(gpu, uPacked, xIn, pack.A, T, wts.length * r, C, false, 1, undefined, norm);
        K.matmulGroup(gpu, ys, xIn, wts, T, Ns, C, norm, { u: uPacked, B: pack.B, r, scale: lora.scale });
        return;
      }
      const pairs = ps as NonNullable<(typeof ps)[number]>[];
      const groupUs = us.slice(0, pairs.length);
      K.matmulGroupF32(
        gpu,
        groupUs,
        xIn,
        pairs.map((p) => p.A),
        T,
        pairs.map(() => r),
        C,
        norm,
      );
      K.matmulGroup(gpu, ys, xIn, wts, T, Ns, C, norm, {
        us: groupUs,
        Bs: pairs.map((p) => p.B),
        r,
        scale: lora.scale,
      });
    };

    if (onGpu) K.embedPicked(gpu, x, onGpu.buffer, ids, w.embed, T, C, V, onGpu.buffer.size / 4);
    else K.embed(gpu, x, ids, w.embed, T, C, V);
    for (l = 0; l < cfg.numLayers; l++) {
      const lw = w.layers[l];
      // x = x + o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v))
      projGroup(lw.inputNorm, [q, k, v], [lw.qProj, lw.kProj, lw.vProj], qkvTargets, qkvNs);
      // q/k norms, RoPE, and k, v into the cache: one dispatch
      K.qkNormRopeKv(
        gpu,
        qn,
        cache.k[l],
        cache.v[l],
        q,
        k,
        v,
        lw.qNorm,
        lw.kNorm,
        cache.pageTable,
        slot,
        pos,
        T,
        NH,
        NKV,
        HD,
        eps,
        theta,
        kv,
      );
      // The attention begins o_proj's LoRA A product where its GEMV adds up the partial sums
      // (K.matmulTakesParts) and a split attention's combine writes att.
      const pO = lora?.get(l, 'o_proj');
      let oA: K.AttentionAProduct | undefined;
      if (pO && K.matmulTakesParts(gpu, att, lw.oProj, T, C, NH * HD, lora!.settings.r)) {
        const r = lora!.settings.r;
        oParts ??= gpu.createBuffer(NH * T * r * 4, 'loraOParts');
        oA = { A: pO.A, parts: oParts, r };
      }
      const nParts = K.attention(
        gpu,
        att,
        qn,
        cache.k[l],
        cache.v[l],
        cache.pageTable,
        slot,
        pos,
        T,
        NH,
        NKV,
        HD,
        kv,
        oA,
      );
      // o_proj also begins gate/up's LoRA A product where that folds (nextGroupA).
      const oU = nParts > 0 ? { buffer: oParts!, parts: nParts } : undefined;
      pendingParts = proj(x, att, lw.oProj, 'o_proj', C, NH * HD, true, undefined, nextGroupA(l, false), oU);
      // x = x + down(silu(gate(h)) * up(h))
      projGroup(lw.postNorm, [gate, up], [lw.gateProj, lw.upProj], gateUpTargets, gateUpNs);
      // down_proj over silu(gate) * up: formed inside its GEMVs where they take it (K.foldsSilu),
      // else by its own kernel first.
      // It also begins the next layer's q/k/v LoRA A product where that folds (nextGroupA).
      const next = nextGroupA(l + 1, true);
      if (siluFold) {
        // u from the gate/up GEMV's partial sums where it paired (mlpPairs)
        const dU = pendingDown > 0 ? { buffer: dParts!, parts: pendingDown } : undefined;
        pendingDown = 0;
        pendingParts = proj(x, gate, lw.downProj, 'down_proj', C, I, true, up, next, dU);
      } else {
        K.siluMul(gpu, act, gate, up, T * I);
        pendingParts = proj(x, act, lw.downProj, 'down_proj', C, I, true, undefined, next);
      }
    }
    if (rows.length > 0) {
      // The final norm of the logit rows only, into h's first R rows (free once the layers are
      // done): the rows gathered first where they are not every row in order (a prefill's last
      // tokens), none where they are (a decode step's). The norm is per row, so each row's
      // value is the same bits as norming all T rows and gathering after.
      const R = rows.length;
      const everyRow = R === T && rows.every((r, i) => r === i);
      let rowIdx: GPUBuffer | null = null,
        xr: GPUBuffer | null = null;
      if (!everyRow) {
        rowIdx = this.u32(rows, 'logitRows'); // (R) u32
        xr = gpu.createBuffer(R * C * 4, 'hLast'); // (R, C) the rows of x
        K.gatherRows(gpu, xr, x, rowIdx, R, C);
      }
      K.rmsNorm(gpu, h, xr ?? x, w.norm, R, C, eps);
      if (logitsOffset === 0) {
        K.matmul(gpu, logits, h, w.lmHead, R, V, C);
      } else {
        const part = gpu.createBuffer(R * V * 4, 'logitsChunk'); // (R, V)
        K.matmul(gpu, part, h, w.lmHead, R, V, C);
        gpu.copy(part, 0, logits, logitsOffset, R * V * 4);
        gpu.releaseBuffer(part);
      }
      if (xr) gpu.releaseBuffer(xr);
      if (rowIdx) gpu.releaseBuffer(rowIdx);
    }
    // Released together at the end, after the last buffer this chunk makes: a release before a
    // later make would let that make's miss (src/gpu/device.ts makeRoom) destroy the released
    // buffer, and the next decode step would miss it in turn, with new bind groups every step.
    for (const b of [ids, slot, pos, x, h, q, qn, k, v, att, gate, up, act, ...us]) gpu.releaseBuffer(b);
    if (uPacked) gpu.releaseBuffer(uPacked);
    if (aParts) gpu.releaseBuffer(aParts);
    if (oParts) gpu.releaseBuffer(oParts);
    if (dParts) gpu.releaseBuffer(dParts);
  }

  private u32(values: ArrayLike<number>, label: string): GPUBuffer {
    const buf = this.gpu.createBuffer(Math.max(values.length, 1) * 4, label);
    this.gpu.write(buf, Uint32Array.from(values));
    return buf;
  }
}

function checkedChunk(tokens: number): number {
  if (!Number.isSafeInteger(tokens) || tokens < 1)
    throw new RangeError(`forward chunk must be a positive integer of tokens (got ${tokens})`);
  return tokens;
}

function tokenIdsOnGpu(ids: ForwardInput['ids']): GpuTokenIds | null {
  return 'buffer' in ids && 'rows' in ids ? ids : null;
}
