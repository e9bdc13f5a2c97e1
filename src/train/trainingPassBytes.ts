// GPU memory of one TrainingPass (src/train/trainingPass.ts): every buffer it allocates, by phase,
// as a pure function of the model dimensions and the pass options. No GPU import: the memory plan
// and the UI memory panel use it. It lists the pass's allocations one for one;
// test/train/trainingMemory.test.ts checks its peaks against the live bytes of real passes.
import type { Qwen3Config } from '../model/config.ts';
import type { LoraTarget } from '../model/peft.ts';
import { colsScratchBytes } from '../ops/colsSplit.ts';
import { splitKScratchBytes } from '../ops/splitK.ts';
import { q4DequantScratchBytes } from '../ops/q4Dequant.ts';

/** Storage of the (L+1) layer-input checkpoints: f32, or f16 / bf16 packed two per u32. */
export type CheckpointDtype = 'f32' | 'f16' | 'bf16';
export const CHECKPOINT_DTYPES: readonly CheckpointDtype[] = ['f32', 'f16', 'bf16'];

/** Target rows of the LM head processed at once: bounds the (rows, V) logits buffers. */
export const HEAD_ROWS = 64;
/** Tokens of one MLP chunk: bounds the (chunk, I) buffers whatever T is. */
export const DEFAULT_MLP_CHUNK = 256;
/** Checkpoints of the SpyRL trainer's passes: half of f32, and bf16's range cannot overflow on Qwen's large activations. */
export const ROUND_CHECKPOINTS: CheckpointDtype = 'bf16';

const ATTENTION_TARGETS: readonly LoraTarget[] = ['q_proj', 'k_proj', 'v_proj', 'o_proj'];
/** Whether a LoRA target sits in the MLP, whose buffers have chunk rows instead of T. */
export const isMlpTarget = (t: LoraTarget) => !ATTENTION_TARGETS.includes(t);

export interface TrainingPassShape {
  seqLen: number; // T
  /** Positions with a target, M (next-token training: T - 1). */
  numTargets: number;
  /** The adapter (null or disabled: base-model log-probs; backward needs one). */
  lora: { r: number; targetModules: readonly LoraTarget[] } | null;
  checkpoints?: CheckpointDtype; // default 'f32'
  mlpChunk?: number; // default DEFAULT_MLP_CHUNK
  /**
   * Layers whose intermediates the forward keeps for the backward (TrainingPassOptions.keepLayers,
   * default 0). Counted only where a backward can follow (targets, an adapter, not logpOnly).
   */
  keepLayers?: number;
  /** Restricted (vote) log-probs over this many candidate ids; leave out for the full vocabulary. */
  candidates?: number;
  /** A packed prefix tree (src/train/packing.ts): the pass also holds keyEnd (T) u32. */
  packed?: boolean;
  /** Log-probs only (TrainingPassOptions.logpOnly): no LM head gradient formed in the forward. */
  logpOnly?: boolean;
  /**
   * Count the tiled GEMM's split-K scratch (src/ops/splitK.ts, 'auto' on a GPU). Default true: a
   * plan is for a GPU. A pass on a CPU adapter, which never splits that way, says false.
   */
  splitK?: boolean;
  /**
   * Count the f32 copy of a q4 weight that the tiled GEMM dequantizes first (src/ops/q4Dequant.ts,
   * tuning.gemmQ4Dequant 'on'): true for q4 base weights with it on. Default false ('auto' leaves
   * it off).
   */
  q4Dequant?: boolean;
  /**
   * Rows of the tiled GEMM's output tiles with 16-byte loads that split-K counts with
   * (K.gemmTileRows: 128 where tuning.gemmTile takes the tall tiles, which split more; the LoRA
   * weight gradients keep the r-major tiles' 64). Default 64.
   */
  gemmTileRows?: number;
}

/** What a buffer is for, the classes of the report. */
export type BufferClass = 'checkpoints' | 'pass' | 'scratch' | 'layer' | 'kept' | 'head';

export interface PassBuffer {
  name: string;
  shape: string;
  bytes: number;
  cls: BufferClass;
}

/**
 * The buffers live in each phase, on top of `held` (construction to release). With kept layers
 * (k > 0): forwardLayers and backwardLayers are the recomputed layers' phases (empty when k = L);
 * forwardKept ends with all k layers' intermediates alive, which forwardHead and backwardHead hold
 * too, and backwardKept starts with them all (its first layer).
 */
export interface TrainingPassLayout {
  held: PassBuffer[];
  embed: PassBuffer[];
  forwardLayers: PassBuffer[];
  forwardKept: PassBuffer[];
  forwardHead: PassBuffer[];
  backwardHead: PassBuffer[];
  backwardKept: PassBuffer[];
  backwardLayers: PassBuffer[];
}

export interface TrainingPassBytes {
  checkpoints: number; // (L+1) x (T, C) in the checkpoint dtype, held from construction to release
  pass: number; // positions (T) u32, target ids and head lse (M), with headGrad (M, C) f32 and targetRows (M) u32, held likewise
  scratch: number; // (T, C) f32 unpacked layer input (reduced checkpoints), during forward() and backward()
  layerForward: number; // one recomputed layer's intermediates in the forward (attention over T, MLP over a chunk); 0 when every layer is kept
  layerBackward: number; // the same, recomputed, plus their gradients, d(residual) and op scratch; 0 when every layer is kept
  kept: number; // the kept layers' products (attention and MLP over all T), from their forward to their backward, and the workspace of a kept layer's element-wise intermediates
  headForward: number; // LM head: target rows, logits chunk, log-probs; with headGrad, dlogits and row gradients
  headBackward: number; // d(residual), dlogp; recomputed (no headGrad): the forward's plus dlogits and row gradients
  peakForward: number; // the most live during construction + forward()
  peakBackward: number; // the most live during backward()
  peak: number;
  largestBuffer: { bytes: number; name: string }; // must fit maxStorageBufferBindingSize
  layout: TrainingPassLayout;
}

/** Pool size of a buffer of `bytes` (src/gpu/pool.ts: rounded up to 4, at least 4). */
const pooled = (bytes: number) => Math.max(4, Math.ceil(bytes / 4) * 4);

export function checkpointBytes(n: number, dtype: CheckpointDtype): number {
  return pooled(dtype === 'f32' ? n * 4 : Math.ceil(n / 2) * 4);
}

/** Rows of the MLP chunk: min(T, chunk). */
export const mlpChunkRows = (T: number, chunk: number) => Math.min(T, chunk);

/** Rows of the LM-head chunk buffers: min(HEAD_ROWS, M), at least 1. */
export const headRows = (M: number) => Math.max(1, Math.min(HEAD_ROWS, M));

/** Every buffer a TrainingPass allocates, by phase. */
export function trainingPassLayout(cfg: Qwen3Config, s: TrainingPassShape): TrainingPassLayout {
  const {
    hiddenSize: C,
    numHeads: NH,
    numKvHeads: NKV,
    headDim: HD,
    intermediateSize: I,
    vocabSize: V,
    numLayers: L,
  } = cfg;
  const T = s.seqLen,
    M = s.numTargets;
  const dtype = s.checkpoints ?? 'f32';
  const Tc = mlpChunkRows(T, s.mlpChunk ?? DEFAULT_MLP_CHUNK);
  const Hr = headRows(M);
  const backward = M > 0 && s.lora !== null && !s.logpOnly;
  const keep = backward ? (s.keepLayers ?? 0) : 0;
  if (!Number.isInteger(keep) || keep < 0 || keep > L)
    throw new RangeError(`keepLayers must be an integer in 0..${L} (got ${s.keepLayers})`);
  // The LM head's gradient formed in the forward (src/train/trainingPass.ts, the header).
  const headGrad = backward && !s.candidates;
  const f32 = (name: string, shape: string, n: number, cls: BufferClass): PassBuffer => ({
    name,
    shape,
    bytes: pooled(n * 4),
    cls,
  });

  const held: PassBuffer[] = [];
  for (let l = 0; l <= L; l++)
    held.push({ name: `x.${l}`, shape: `(T, C) ${dtype}`, bytes: checkpointBytes(T * C, dtype), cls: 'checkpoints' });
  held.push(
    f32('positions', '(T) u32', T, 'pass'),
    ...(s.packed ? [f32('keyEnd', '(T) u32', T, 'pass')] : []),
    f32('targets', '(M) u32', Math.max(1, M), 'pass'),
    f32('lseHead', '(M) f32', Math.max(1, M), 'pass'),
    ...(headGrad ? [f32('headGrad', '(M, C) f32', M * C, 'pass'), f32('targetRows', '(M) u32', M, 'pass')] : []),
  );

  const scratch = dtype === 'f32' ? [] : [f32('xF32', '(T, C) f32', T * C, 'scratch')];
  // A layer's products (what a kept layer keeps), the MLP's over R rows (R = Tc recomputed, T kept).
  const productsOf = (R: number, Rn: string, cls: BufferClass, prefix = ''): PassBuffer[] => {
    const out = [
      f32('q', '(T, NH, HD)', T * NH * HD, cls),
      f32('k', '(T, NKV, HD)', T * NKV * HD, cls),
      f32('v', '(T, NKV, HD)', T * NKV * HD, cls),
      f32('att', '(T, NH, HD)', T * NH * HD, cls),
      f32('lse', '(T, NH)', T * NH, cls),
      f32('xMid', '(T, C)', T * C, cls),
      f32('gate', `(${Rn}, I)`, R * I, cls),
      f32('up', `(${Rn}, I)`, R * I, cls),
    ];
    if (s.lora)
      for (const t of s.lora.targetModules) {
        const rows = isMlpTarget(t) ? R : T;
        out.push(f32(`u.${t}`, `(${isMlpTarget(t) ? Rn : 'T'}, r)`, rows * s.lora.r, cls));
      }
    return prefix ? out.map((b) => ({ ...b, name: prefix + b.name })) : out;
  };
  // What element-wise kernels form from those: a recomputed layer's own, the kept layers' shared.
  const derivedOf = (R: number, Rn: string, cls: BufferClass, prefix = ''): PassBuffer[] =>
    [
      f32('h1', '(T, C)', T * C, cls),
      f32('qr', '(T, NH, HD)', T * NH * HD, cls),
      f32('kr', '(T, NKV, HD)', T * NKV * HD, cls),
      f32('h2', '(T, C)', T * C, cls),
      f32('act', `(${Rn}, I)`, R * I, cls),
    ].map((b) => ({ ...b, name: prefix + b.name }));
  const layer = [
    ...derivedOf(Tc, 'Tc', 'layer'),
    ...productsOf(Tc, 'Tc', 'layer'),
    ...(Tc < T ? [f32('h2c', '(Tc, C)', Tc * C, 'layer'), f32('yc', '(Tc, C)', Tc * C, 'layer')] : []),
  ];
  const kept: PassBuffer[] = [];
  for (let l = L - keep; l < L; l++) kept.push(...productsOf(T, 'T', 'kept', `kept.${l}.`));
  // The kept layers' workspace: the derived buffers (act over a chunk) and, with chunks, the
  // chunk's gate, up and MLP x A^T rows (copied to and from the kept buffers) and row staging.
  const keptWork = keep
    ? [
        ...derivedOf(Tc, 'Tc', 'kept', 'keptWork.'),
        ...(Tc < T
          ? [
              f32('keptWork.gate', '(Tc, I)', Tc * I, 'kept'),
              f32('keptWork.up', '(Tc, I)', Tc * I, 'kept'),
              ...(s.lora?.targetModules ?? [])
                .filter(isMlpTarget)
                .map((t) => f32(`keptWork.u.${t}`, '(Tc, r)', Tc * s.lora!.r, 'kept')),
              f32('keptWork.h2c', '(Tc, C)', Tc * C, 'kept'),
              f32('keptWork.yc', '(Tc, C)', Tc * C, 'kept'),
            ]
          : []),
      ]
    : [];
  const layerGrads: PassBuffer[] = [
    f32('dh', '(T, C)', T * C, 'layer'),
    f32('dAtt', '(T, NH, HD)', T * NH * HD, 'layer'),
    f32('dqr', '(T, NH, HD)', T * NH * HD, 'layer'),
    f32('dkr', '(T, NKV, HD)', T * NKV * HD, 'layer'),
    f32('dv', '(T, NKV, HD)', T * NKV * HD, 'layer'),
    f32('du', '(T, r)', T * (s.lora?.r ?? 0), 'layer'),
    f32('dAct', '(Tc, I)', Tc * I, 'layer'),
    f32('dGate', '(Tc, I)', Tc * I, 'layer'),
    f32('dUp', '(Tc, I)', Tc * I, 'layer'),
  ];
  // Inside K.attentionBackward, which runs no product: the larger of it and a product's scratch.
  const rowDot = f32('attentionBackward.D', '(T, NH)', T * NH, 'layer');
  // The scratch of split partial outputs, transient inside one product: gemv_cols' (CPU adapters,
  // src/ops/colsSplit.ts; the input gradients dx = dy . W) or the tiled GEMM's split-K (GPUs,
  // src/ops/splitK.ts; any product whose tiles make few workgroups). The largest of a layer's
  // products, and of the LM head's chunks. out (M, N) over R: both functions take (M, N, R).
  const splitK = s.splitK ?? true;
  // gemv_cols splits only the input gradients (on CPU adapters); split-K any tiled product (on GPUs).
  const gk = (m: number, n: number, r: number) => (splitK ? splitKScratchBytes(m, n, r, s.gemmTileRows) : 0);
  // The LoRA weight gradients read A across r: the r-major tiles, always 64 rows.
  const gkW = (m: number, n: number, r: number) => (splitK ? splitKScratchBytes(m, n, r) : 0);
  const dxSplit = (m: number, n: number, r: number) => Math.max(colsScratchBytes(m, n, r), gk(m, n, r));
  // A base weight's product over q4 may first dequantize the weight into a pooled f32 copy, alive
  // with the product's split partials (src/ops/q4Dequant.ts; the LoRA products are f32 already).
  const gq = (m: number, n: number, r: number) => (s.q4Dequant ? q4DequantScratchBytes(m, n, r) : 0);
  const rowCounts = (n: number, chunk: number) => [...new Set([Math.min(n, chunk), n % chunk || chunk])];
  const projShapes: [LoraTarget, number, number][] = [
    ['q_proj', NH * HD, C],
    ['k_proj', NKV * HD, C],
    ['v_proj', NKV * HD, C],
    ['o_proj', C, NH * HD],
    ['gate_proj', I, C],
    ['up_proj', I, C],
    ['down_proj', C, I],
  ];
  // The forward's own products, x . W^T and u = x . A^T, and the backward's: dx = dy . W, and with
  // LoRA du = dy . B, dx += du . A, dA = du^T . x, dB = dy^T . u. A recomputed layer's backward
  // runs its forward's too. MLP products over Tc (and T mod Tc) rows, or a kept layer's T.
  const partialsOf = (mlpRowCounts: number[], recompute: boolean) => {
    let fwd = 0,
      bwd = 0;
    for (const [t, N, Kin] of projShapes)
      for (const rows of isMlpTarget(t) ? mlpRowCounts : [T]) {
        const r = s.lora?.targetModules.includes(t) ? s.lora.r : 0;
        const forward = Math.max(gk(rows, N, Kin) + gq(rows, N, Kin), r ? gk(rows, r, Kin) : 0);
        fwd = Math.max(fwd, forward);
        bwd = Math.max(bwd, recompute ? forward : 0, dxSplit(rows, Kin, N) + gq(rows, Kin, N));
        if (r) bwd = Math.max(bwd, dxSplit(rows, r, N), dxSplit(rows, Kin, r), gkW(r, Kin, rows), gkW(N, r, rows));
      }
    return { fwd, bwd };
  };
  const recomputed = partialsOf(rowCounts(T, Tc), true);
  const keptPartials = partialsOf(rowCounts(T, Tc), false);
  const forwardPartials = recomputed.fwd;
  const layerPartials = recomputed.bwd;
  const headPartials = Math.max(
    ...rowCounts(M, Hr).map((R) => Math.max(dxSplit(R, C, V) + gq(R, C, V), gk(R, V, C) + gq(R, V, C))),
  );
  const partials = (n: number, shape: string, cls: BufferClass): PassBuffer[] =>
    n > 0 ? [{ name: 'matmul.scratch', shape, bytes: pooled(n), cls }] : [];
  const layerShape = "(splits, M, N) f32 and a q4 weight's f32 copy, the largest of the layer";
  const rowDotOr = (n: number) => (rowDot.bytes >= n ? [rowDot] : partials(n, layerShape, 'layer'));
  const dx = f32('dx', '(T, C)', T * C, 'head');
  const headRowsBufs = [
    f32('xRows', '(Hr, C)', Hr * C, 'head'),
    f32('hRows', '(Hr, C)', Hr * C, 'head'),
    f32('logitsRows', '(Hr, V)', Hr * V, 'head'),
  ];
  const forwardHead =
    M === 0
      ? []
      : s.candidates
        ? [...scratch, f32('candidateLogits', '(M, nc)', M * s.candidates, 'head'), ...headRowsBufs]
        : [
            ...scratch,
            f32('logp', '(M)', M, 'head'),
            f32('tgtChunk', '(Hr) u32', Hr, 'head'),
            f32('logpChunk', '(Hr)', Hr, 'head'),
            f32('lseChunk', '(Hr)', Hr, 'head'),
            ...(headGrad
              ? [
                  f32('onesChunk', '(Hr)', Hr, 'head'),
                  f32('dlogitsRows', '(Hr, V)', Hr * V, 'head'),
                  f32('dhRows', '(Hr, C)', Hr * C, 'head'),
                  f32('dxRows', '(Hr, C)', Hr * C, 'head'),
                  ...partials(headPartials, "(splits, Hr, C) f32 and a q4 weight's f32 copy", 'head'),
                ]
              : []),
            ...headRowsBufs,
          ];
  const recomputes = keep < L; // some layer runs on the shared workspace
  return {
    held,
    embed: [...scratch, f32('ids', '(T) u32', T, 'scratch')],
    forwardLayers: recomputes ? [...scratch, ...layer, ...partials(forwardPartials, layerShape, 'layer')] : [],
    forwardKept: keep ? [...scratch, ...kept, ...keptWork, ...partials(keptPartials.fwd, layerShape, 'layer')] : [],
    forwardHead: [...forwardHead, ...kept],
    backwardHead: !backward
      ? []
      : headGrad
        ? [...scratch, dx, f32('dlogp', '(M)', M, 'head'), ...kept]
        : [
            ...kept,
            ...scratch,
            dx,
            f32('dlogp', '(M)', M, 'head'),
            ...headRowsBufs,
            f32('dlogitsRows', '(Hr, V)', Hr * V, 'head'),
            f32('dhRows', '(Hr, C)', Hr * C, 'head'),
            f32('dxRows', '(Hr, C)', Hr * C, 'head'),
            f32('tgtChunk', '(Hr) u32', Hr, 'head'),
            f32('lseChunk', '(Hr)', Hr, 'head'),
            f32('dlogpChunk', '(Hr)', Hr, 'head'),
            ...partials(headPartials, "(splits, Hr, C) f32 and a q4 weight's f32 copy", 'head'),
          ],
    backwardKept:
      backward && keep
        ? [...scratch, { ...dx, cls: 'layer' }, ...kept, ...keptWork, ...layerGrads, ...rowDotOr(keptPartials.bwd)]
        : [],
    backwardLayers:
      backward && recomputes
        ? [...scratch, { ...dx, cls: 'layer' }, ...layer, ...layerGrads, ...rowDotOr(layerPartials)]
        : [],
  };
}

const sum = (bufs: readonly PassBuffer[], cls?: BufferClass) =>
  bufs.reduce((n, b) => n + (cls === undefined || b.cls === cls ? b.bytes : 0), 0);

/**
 * Bytes of one TrainingPass by buffer class, and its peaks. With w = 4 bytes, Tc = min(T, chunk),
 * Hr = min(64, M), ck = T*C*w (f32) or ceil(T*C/2)*w (f16/bf16), nA / nM adapted attention / MLP
 * projections, [c] = 1 when T > chunk, [g] = 1 when the forward forms the LM head's gradient (M > 0,
 * an adapter, the full vocabulary, not logpOnly; src/train/trainingPass.ts):
 *   checkpoints   = (L+1) ck
 *   pass          = w (T + 2 max(1, M)) + [g] w M (C + 1)
 *   scratch       = T C w when the checkpoints are f16/bf16, else 0
 *   layerForward  = w [T (3C + 3 NH HD + 3 NKV HD + NH) + 3 Tc I + 2 [c] Tc C + r (nA T + nM Tc)] + Pf
 *   layerBackward = layerForward + w [T (2C + 2 NH HD + 2 NKV HD + r) + 3 Tc I] + max(w T NH, Pl)
 *   headForward   = w [M + Hr (2C + V + 3)] + [g] (w Hr (2C + V + 1) + Ph)
 *                                                  (restricted: w [M nc + Hr (2C + V)])
 *   headBackward  = [g] w [T C + M], else w [T C + M + Hr (4C + 2V + 3)] + Ph
 * where Pl and Ph are the split scratch of partial outputs, gemv_cols' (colsScratchBytes,
 * src/ops/colsSplit.ts; CPU adapters) or, with `splitK` (the default), the larger of that and the
 * tiled GEMM's split-K (splitKScratchBytes, src/ops/splitK.ts; GPUs) over every product below:
 * Pl the largest over a layer's input-gradient products dx = dy . W (each projection at T rows, or
 * the MLP's Tc and T mod Tc rows; with LoRA also du = dy . B and dx += du . A), Ph the LM head's
 * (Hr and M mod Hr rows, C outputs, V rows of W); 0 where nothing splits. With split-K, Pl also
 * covers the layer's forward products (recomputed in the backward), u = x . A^T and the LoRA
 * weight gradients, and Pf, the forward pass's own, the largest of x . W^T and u = x . A^T.
 * Split-K counts output tiles of `gemmTileRows` rows (64, or 128 with tuning.gemmTile '128'),
 * except for the LoRA weight gradients, whose r-major tiles keep 64.
 * The attention backward's D (T, NH) lives only inside K.attentionBackward, where no product runs,
 * so the layer's backward counts the larger of it and Pl.
 * With `q4Dequant`, a base weight's product (x . W^T, dx = dy . W; the LM head's) also counts the
 * f32 copy of its weight (q4DequantScratchBytes, src/ops/q4Dequant.ts: N K 4 bytes where the
 * product has at least 128 rows and the copy fits 128 MiB) on top of its split partials.
 *   peakForward   = checkpoints + pass + scratch + max(w T, layerForward, headForward)
 *   peakBackward  = checkpoints + pass + scratch + max(headBackward, layerBackward)
 * With k kept layers (keepLayers, where a backward can follow):
 *   kept          = k w T [C + 2 NH HD + 2 NKV HD + NH + 2 I + r (nA + nM)]
 *   keptWork      = w [T (2C + NH HD + NKV HD) + Tc I] + [c] w Tc (2I + 2C + r nM)
 * (keptWork: h1, h2, q and k normed and rotated, the chunk's silu(gate) up; with chunks its gate,
 * up, MLP x A^T and row staging), layerForward and layerBackward are 0 when k = L, and the forward
 * and the backward each gain a phase, the kept layers': forwardKept (kept + keptWork + the largest
 * forward product's split scratch) and backwardKept (kept + keptWork + the layer gradients +
 * d(residual) + the largest backward product's), the MLP's products over chunks as a recomputed
 * layer's. forwardHead and headBackward are counted with the kept products alive, keptWork
 * released. The report's `kept` is k kept layers' products + keptWork.
 */
export function trainingPassBytes(cfg: Qwen3Config, s: TrainingPassShape): TrainingPassBytes {
  const layout = trainingPassLayout(cfg, s);
  const held = sum(layout.held);
  const phase = (bufs: readonly PassBuffer[]) => held + sum(bufs);
  const peakForward = Math.max(
    phase(layout.embed),
    phase(layout.forwardLayers),
    phase(layout.forwardKept),
    phase(layout.forwardHead),
  );
  const peakBackward = Math.max(
    held,
    phase(layout.backwardHead),
    phase(layout.backwardKept),
    phase(layout.backwardLayers),
  );
  const all = Object.values(layout).flat() as PassBuffer[];
  const largest = all.reduce((a, b) => (b.bytes > a.bytes ? b : a));
  return {
    checkpoints: sum(layout.held, 'checkpoints'),
    pass: sum(layout.held, 'pass'),
    scratch: sum(layout.embed.filter((b) => b.name === 'xF32')),
    layerForward: sum(layout.forwardLayers, 'layer'),
    layerBackward: sum(layout.backwardLayers, 'layer'),
    kept: sum(layout.forwardKept, 'kept'),
    headForward: sum(layout.forwardHead, 'head'),
    headBackward: sum(layout.backwardHead, 'head'),
    peakForward,
    peakBackward,
    peak: Math.max(peakForward, peakBackward),
    largestBuffer: { bytes: largest.bytes, name: `${largest.name} ${largest.shape}` },
    layout,
  };
}
