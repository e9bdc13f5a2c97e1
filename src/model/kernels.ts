// One TS function per op (docs/ENGINE.md). Each checks its sizes, then encodes one dispatch into
// gpu's pending encoder: no GPU sync, no allocation except cached constant tables.
// Argument order (llm.c): outputs/gradients, saved tensors, inputs/weights, sizes. Each backward
// sits right below its forward and adds into its gradient buffers.

import type { Gpu } from '../gpu/device.ts';
import { f32, splitGrid, type Defines, type Kernel } from '../gpu/launch.ts';

const ELEMS_PER_WG = 256; // elementwise kernels: one thread per element, 256 per workgroup

/** Decode-path cutoff: at most this many tokens go through the GEMV kernel. */
export const GEMV_MAX_T = 8;

/**
 * Kernel variant choice. 'auto': on CPU adapters (SwiftShader) the barrier-free 'rows' matmul,
 * which is ~10x faster there; on GPUs 'gemv' for T <= GEMV_MAX_T, else 'tiled'. Tests force each.
 */
export const tuning: { matmul: 'auto' | 'rows' | 'gemv' | 'tiled' } = { matmul: 'auto' };

export function isCpuAdapter(gpu: Gpu): boolean {
  const id = `${gpu.info.architecture} ${gpu.info.description}`.toLowerCase();
  return /swiftshader|llvmpipe|lavapipe|warp/.test(id);
}

// ---- subgroup variants -----------------------------------------------------------------------
// The reduction-heavy kernels (rmsNorm and its backward, the GEMV matmul, sample, and
// logSoftmaxGather in src/train/kernels.ts) have a variant that reduces with subgroupAdd /
// subgroupMax and one shared-memory step across subgroups, used whenever the device has the
// `subgroups` feature; the barrier/shared-memory tree is the fallback. rmsNorm's variant is its own
// file (shaders/rmsnorm_subgroups.wgsl); the others are sections of one file switched by defines.

/** Whether the subgroup variants run on this Gpu. */
export function useSubgroups(gpu: Gpu): boolean {
  return gpu.features.subgroups;
}

/**
 * Defines that pick a shader's variant: ENABLE is the `enable subgroups;` directive or nothing;
 * IF_SUBGROUPS / ELSE / END become comment delimiters around `{{IF_SUBGROUPS}} subgroup code
 * {{ELSE}} shared-memory code {{END}}` so that exactly one of the two sections compiles.
 */
export function subgroupDefines(on: boolean): Defines {
  return on
    ? { ENABLE: 'enable subgroups;', IF_SUBGROUPS: '', ELSE: '/*', END: '*/' }
    : { ENABLE: '', IF_SUBGROUPS: '/*', ELSE: '*/', END: '' };
}

const launched = new WeakMap<Gpu, Map<string, { subgroups: boolean; label: string }>>();

/** gpu.kernel(...), remembering for kernelVariant which pipeline `op` last got. */
export function opKernel(gpu: Gpu, op: string, shader: string, entry: string, defines: Defines): Kernel {
  const kernel = gpu.kernel(shader, entry, defines);
  let perGpu = launched.get(gpu);
  if (!perGpu) launched.set(gpu, (perGpu = new Map()));
  // Read from the pipeline's label ("shader.entry[defines]"), i.e. from what was compiled.
  const subgroups = /^\w+_subgroups\./.test(kernel.label) || kernel.label.includes('ENABLE=enable subgroups;');
  perGpu.set(op, { subgroups, label: kernel.label });
  return kernel;
}

/** The pipeline the last call of `op` ('rmsNorm', 'matmul', 'sample', ...) encoded on gpu (tests). */
export function kernelVariant(gpu: Gpu, op: string): { subgroups: boolean; label: string } | undefined {
  return launched.get(gpu)?.get(op);
}

const NO_SUBGROUPS = subgroupDefines(false);

function check(cond: boolean, msg: string): void {
  if (!cond) throw new RangeError(msg);
}

function checkSize(buf: GPUBuffer, bytes: number, what: string): void {
  check(buf.size >= bytes, `${what}: buffer '${buf.label}' has ${buf.size} bytes, needs ${bytes}`);
}

const bf16Bytes = (n: number) => Math.ceil(n / 2) * 4;

/** WGSL never binds one buffer twice in a dispatch. */
function distinct(op: string, ...bufs: GPUBuffer[]): void {
  check(new Set(bufs).size === bufs.length, `${op}: the same buffer is passed twice`);
}

/** out (T, C) f32 = table[ids] ; ids (T) u32 ; table (V, C) bf16 */
export function embed(gpu: Gpu, out: GPUBuffer, ids: GPUBuffer, table: GPUBuffer, T: number, C: number): void {
  checkSize(out, T * C * 4, 'embed out');
  checkSize(ids, T * 4, 'embed ids');
  gpu.dispatch(gpu.kernel('embed', 'embed_forward'), [out, ids, table], Math.ceil((T * C) / ELEMS_PER_WG), [T, C]);
}

/** out (R, D) f32 = w * x * rsqrt(mean(x^2) + eps) ; x (R, D) f32 ; w (D) bf16 */
export function rmsNorm(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, w: GPUBuffer, R: number, D: number, eps: number): void {
  checkSize(out, R * D * 4, 'rmsNorm out');
  checkSize(x, R * D * 4, 'rmsNorm x');
  checkSize(w, bf16Bytes(D), 'rmsNorm w');
  check(out !== x, 'rmsNorm: out and x must differ');
  const WG = D <= 512 ? 64 : 256;
  const shader = useSubgroups(gpu) ? 'rmsnorm_subgroups' : 'rmsnorm';
  gpu.dispatch(opKernel(gpu, 'rmsNorm', shader, 'rmsnorm_forward', { WG }), [out, x, w], R, [R, D, f32(eps)]);
}

/** dx (R, D) += d/dx of rmsNorm given dy (R, D) ; x (R, D) f32 ; w (D) bf16 frozen (no dw) */
export function rmsNormBackward(gpu: Gpu, dx: GPUBuffer, dy: GPUBuffer, x: GPUBuffer, w: GPUBuffer, R: number, D: number, eps: number): void {
  checkSize(dx, R * D * 4, 'rmsNormBackward dx');
  checkSize(dy, R * D * 4, 'rmsNormBackward dy');
  checkSize(x, R * D * 4, 'rmsNormBackward x');
  checkSize(w, bf16Bytes(D), 'rmsNormBackward w');
  distinct('rmsNormBackward', dx, dy, x);
  const WG = D <= 512 ? 64 : 256;
  const shader = useSubgroups(gpu) ? 'rmsnorm_subgroups' : 'rmsnorm';
  gpu.dispatch(opKernel(gpu, 'rmsNormBackward', shader, 'rmsnorm_backward', { WG }), [dx, x, w, dy], R, [R, D, f32(eps)]);
}

/** out (T, N) f32 (+)= x (T, K) f32 . w (N, K) bf16 ^T */
export function matmul(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, w: GPUBuffer, T: number, N: number, K: number, accumulate = false): void {
  checkSize(out, T * N * 4, 'matmul out');
  checkSize(x, T * K * 4, 'matmul x');
  checkSize(w, bf16Bytes(N * K), 'matmul w');
  check(out !== x, 'matmul: out and x must differ');
  check(T * Math.max(N, K) < 2 ** 32 && N * K < 2 ** 33, 'matmul: sizes overflow u32 indexing');
  if (T === 0) return;
  const params = [T, N, K, accumulate ? 1 : 0];
  const variant = tuning.matmul === 'auto' ? (isCpuAdapter(gpu) ? 'rows' : T <= GEMV_MAX_T ? 'gemv' : 'tiled') : tuning.matmul;
  if (variant === 'rows') {
    const TMAX = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8;
    const [x0, y0] = splitGrid(Math.ceil(N / 64), gpu.limits.maxComputeWorkgroupsPerDimension);
    gpu.dispatch(opKernel(gpu, 'matmul', 'matmul', 'matmul_rows', { TMAX, LANES: 64, ...NO_SUBGROUPS }), [out, x, w], [x0, y0, Math.ceil(T / TMAX)], params);
  } else if (variant === 'gemv') {
    check(T <= GEMV_MAX_T, `matmul: gemv variant needs T <= ${GEMV_MAX_T}`);
    const TMAX = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8;
    // ~4+ weight words per lane: 64 lanes from K >= 512; tiny K gets more rows per workgroup.
    const LANES = Math.min(64, Math.max(4, 2 ** Math.floor(Math.log2(Math.max(1, K / 8)))));
    gpu.dispatch(opKernel(gpu, 'matmul', 'matmul', 'matmul_gemv', { TMAX, LANES, ...subgroupDefines(useSubgroups(gpu)) }), [out, x, w], Math.ceil(N / (256 / LANES)), params);
  } else {
    gpu.dispatch(opKernel(gpu, 'matmul', 'matmul', 'matmul_tiled', { TMAX: 1, LANES: 64, ...NO_SUBGROUPS }), [out, x, w], [Math.ceil(N / 64), Math.ceil(T / 64)], params);
  }
}

/**
 * out (M, N) (+)= scale * sum_r A(m, r) B(n, r) through strides (shaders/matmul.wgsl, gemm):
 * A(m, r) = a[m * aM + r * aR] f32, B(n, r) = element n * bN + r * bR of b (bf16 or f32).
 */
function gemm(
  gpu: Gpu, op: string, out: GPUBuffer, a: GPUBuffer, b: GPUBuffer, bBf16: boolean,
  M: number, N: number, R: number, strides: readonly [number, number, number, number], accumulate: boolean, scale: number,
): void {
  distinct(op, out, a, b);
  check(M * Math.max(N, R) < 2 ** 32 && N * R < 2 ** 32, `${op}: sizes overflow u32 indexing`);
  if (M === 0 || N === 0) return;
  const params = [M, N, R, accumulate ? 1 : 0, ...strides, bBf16 ? 1 : 0, f32(scale)];
  // No gemv variant here: 'gemv' (forced by tests) runs 'rows', as does a GPU with M <= GEMV_MAX_T.
  const variant = tuning.matmul === 'auto' ? (isCpuAdapter(gpu) || M <= GEMV_MAX_T ? 'rows' : 'tiled') : tuning.matmul;
  if (variant === 'tiled') {
    gpu.dispatch(gpu.kernel('matmul', 'gemm_tiled', { TMAX: 1, LANES: 64, ...NO_SUBGROUPS }), [out, a, b], [Math.ceil(N / 64), Math.ceil(M / 64)], params);
  } else {
    const TMAX = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8;
    gpu.dispatch(gpu.kernel('matmul', 'gemm_rows', { TMAX, LANES: 64, ...NO_SUBGROUPS }), [out, a, b], Math.ceil((N * Math.ceil(M / TMAX)) / 64), params);
  }
}

/** out (T, N) f32 (+)= scale * x (T, K) f32 . w (N, K) f32 ^T  (the LoRA A and B products) */
export function matmulF32(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, w: GPUBuffer, T: number, N: number, K: number, accumulate = false, scale = 1): void {
  checkSize(out, T * N * 4, 'matmulF32 out');
  checkSize(x, T * K * 4, 'matmulF32 x');
  checkSize(w, N * K * 4, 'matmulF32 w');
  gemm(gpu, 'matmulF32', out, x, w, false, T, N, K, [K, 1, K, 1], accumulate, scale);
}

/** dx (T, K) f32 (+)= dy (T, N) f32 . w (N, K) bf16 */
export function matmulBackwardInput(gpu: Gpu, dx: GPUBuffer, dy: GPUBuffer, w: GPUBuffer, T: number, N: number, K: number, accumulate = true): void {
  checkSize(dx, T * K * 4, 'matmulBackwardInput dx');
  checkSize(dy, T * N * 4, 'matmulBackwardInput dy');
  checkSize(w, bf16Bytes(N * K), 'matmulBackwardInput w');
  gemm(gpu, 'matmulBackwardInput', dx, dy, w, true, T, K, N, [N, 1, 1, K], accumulate, 1);
}

/** dx (T, K) f32 (+)= scale * dy (T, N) f32 . w (N, K) f32 */
export function matmulBackwardInputF32(
  gpu: Gpu, dx: GPUBuffer, dy: GPUBuffer, w: GPUBuffer, T: number, N: number, K: number, accumulate = true, scale = 1,
): void {
  checkSize(dx, T * K * 4, 'matmulBackwardInputF32 dx');
  checkSize(dy, T * N * 4, 'matmulBackwardInputF32 dy');
  checkSize(w, N * K * 4, 'matmulBackwardInputF32 w');
  gemm(gpu, 'matmulBackwardInputF32', dx, dy, w, false, T, K, N, [N, 1, 1, K], accumulate, scale);
}

/** dw (N, K) f32 += scale * dy^T (N, T) . x (T, K) ; the reduction runs over T */
export function matmulBackwardWeightF32(gpu: Gpu, dw: GPUBuffer, dy: GPUBuffer, x: GPUBuffer, T: number, N: number, K: number, scale = 1): void {
  checkSize(dw, N * K * 4, 'matmulBackwardWeightF32 dw');
  checkSize(dy, T * N * 4, 'matmulBackwardWeightF32 dy');
  checkSize(x, T * K * 4, 'matmulBackwardWeightF32 x');
  gemm(gpu, 'matmulBackwardWeightF32', dw, dy, x, false, N, K, T, [1, N, 1, K], true, scale);
}

// inv_freq_i = 1 / theta^(2i/HD) rounded to f32, as HF computes it; cached per (Gpu, HD, theta).
const invFreqCache = new WeakMap<Gpu, Map<string, GPUBuffer>>();

export function ropeInvFreq(HD: number, theta: number): Float32Array {
  const inv = new Float32Array(HD / 2);
  for (let i = 0; i < HD / 2; i++) inv[i] = 1 / Math.fround(theta ** Math.fround((2 * i) / HD));
  return inv;
}

function invFreqBuffer(gpu: Gpu, HD: number, theta: number): GPUBuffer {
  let perGpu = invFreqCache.get(gpu);
  if (!perGpu) invFreqCache.set(gpu, (perGpu = new Map()));
  const key = `${HD}:${theta}`;
  let buf = perGpu.get(key);
  if (!buf) {
    buf = gpu.createBuffer((HD / 2) * 4, `ropeInvFreq.${key}`); // (HD/2) f32
    gpu.write(buf, ropeInvFreq(HD, theta));
    perGpu.set(key, buf);
  }
  return buf;
}

/** In place on x (T, H, HD) f32, HF rotate-half; pos (T) u32 */
export function rope(gpu: Gpu, x: GPUBuffer, pos: GPUBuffer, T: number, H: number, HD: number, theta: number): void {
  check(HD % 2 === 0, `rope: HD=${HD} must be even`);
  checkSize(x, T * H * HD * 4, 'rope x');
  checkSize(pos, T * 4, 'rope pos');
  const inv = invFreqBuffer(gpu, HD, theta);
  gpu.dispatch(gpu.kernel('rope', 'rope_forward'), [x, pos, inv], Math.ceil((T * H * HD) / 2 / ELEMS_PER_WG), [T, H, HD]);
}

/** In place on dx (T, H, HD) f32: the transpose of rope, a rotation by -angle ; pos (T) u32 */
export function ropeBackward(gpu: Gpu, dx: GPUBuffer, pos: GPUBuffer, T: number, H: number, HD: number, theta: number): void {
  check(HD % 2 === 0, `ropeBackward: HD=${HD} must be even`);
  checkSize(dx, T * H * HD * 4, 'ropeBackward dx');
  checkSize(pos, T * 4, 'ropeBackward pos');
  const inv = invFreqBuffer(gpu, HD, theta);
  gpu.dispatch(gpu.kernel('rope', 'rope_backward'), [dx, pos, inv], Math.ceil((T * H * HD) / 2 / ELEMS_PER_WG), [T, H, HD]);
}

/** kCache, vCache (S, maxT, NKV, HD) f32 ; k, v (T, NKV, HD) f32 ; row t -> [slot[t], pos[t]] */
export function kvWrite(
  gpu: Gpu, kCache: GPUBuffer, vCache: GPUBuffer, k: GPUBuffer, v: GPUBuffer, slot: GPUBuffer, pos: GPUBuffer,
  T: number, NKV: number, HD: number, maxT: number,
): void {
  checkSize(k, T * NKV * HD * 4, 'kvWrite k');
  checkSize(v, T * NKV * HD * 4, 'kvWrite v');
  checkSize(kCache, maxT * NKV * HD * 4, 'kvWrite kCache');
  check(kCache !== vCache, 'kvWrite: kCache and vCache must differ');
  gpu.dispatch(gpu.kernel('attention', 'kv_write'), [kCache, vCache, k, v, slot, pos], Math.ceil((T * NKV * HD) / ELEMS_PER_WG), [T, NKV, HD, maxT]);
}

/** out, q (T, NH, HD) f32 ; token t attends to slot[t], positions 0..pos[t]; GQA h -> h / (NH/NKV) */
export function attention(
  gpu: Gpu, out: GPUBuffer, q: GPUBuffer, kCache: GPUBuffer, vCache: GPUBuffer, slot: GPUBuffer, pos: GPUBuffer,
  T: number, NH: number, NKV: number, HD: number, maxT: number,
): void {
  check(HD <= 256, `attention: HD=${HD} > 256`);
  check(NH % NKV === 0, `attention: NH=${NH} not a multiple of NKV=${NKV}`);
  checkSize(out, T * NH * HD * 4, 'attention out');
  checkSize(q, T * NH * HD * 4, 'attention q');
  checkSize(kCache, maxT * NKV * HD * 4, 'attention kCache');
  gpu.dispatch(gpu.kernel('attention', 'attention_forward'), [out, q, kCache, vCache, slot, pos], T * NH,
    [T, NH, NKV, HD, maxT, f32(1 / Math.sqrt(HD))]);
}

function checkTrainingAttention(op: string, T: number, NH: number, NKV: number, HD: number): void {
  check(HD <= 256, `${op}: HD=${HD} > 256`);
  check(NH % NKV === 0, `${op}: NH=${NH} not a multiple of NKV=${NKV}`);
  check(T * NH * HD < 2 ** 32, `${op}: sizes overflow u32 indexing`);
}

/**
 * Training path, one causal sequence (positions 0..T-1), no cache: out, q (T, NH, HD) f32 ;
 * k, v (T, NKV, HD) f32 ; lse (T, NH) f32 = log sum_j exp(q.k_j / sqrt(HD)), saved for the backward.
 */
export function attentionForwardLse(
  gpu: Gpu, out: GPUBuffer, lse: GPUBuffer, q: GPUBuffer, k: GPUBuffer, v: GPUBuffer, T: number, NH: number, NKV: number, HD: number,
): void {
  checkTrainingAttention('attentionForwardLse', T, NH, NKV, HD);
  checkSize(out, T * NH * HD * 4, 'attentionForwardLse out');
  checkSize(lse, T * NH * 4, 'attentionForwardLse lse');
  checkSize(q, T * NH * HD * 4, 'attentionForwardLse q');
  checkSize(k, T * NKV * HD * 4, 'attentionForwardLse k');
  checkSize(v, T * NKV * HD * 4, 'attentionForwardLse v');
  distinct('attentionForwardLse', out, lse, q, k, v);
  gpu.dispatch(gpu.kernel('attention', 'attention_forward_lse'), [out, q, k, v, lse], T * NH,
    [T, NH, NKV, HD, T, f32(1 / Math.sqrt(HD))]);
}

/**
 * dq (T, NH, HD), dk, dv (T, NKV, HD) += gradients of attentionForwardLse given dout (T, NH, HD);
 * saved out (T, NH, HD) and lse (T, NH); probabilities are recomputed, never stored (T x T).
 * Encodes two dispatches and uses a pooled (T, NH) scratch buffer for D = rowsum(dout * out).
 */
export function attentionBackward(
  gpu: Gpu, dq: GPUBuffer, dk: GPUBuffer, dv: GPUBuffer, dout: GPUBuffer, out: GPUBuffer, lse: GPUBuffer,
  q: GPUBuffer, k: GPUBuffer, v: GPUBuffer, T: number, NH: number, NKV: number, HD: number,
): void {
  checkTrainingAttention('attentionBackward', T, NH, NKV, HD);
  for (const [buf, n, what] of [[dq, NH, 'dq'], [dk, NKV, 'dk'], [dv, NKV, 'dv'], [dout, NH, 'dout'], [out, NH, 'out'],
    [q, NH, 'q'], [k, NKV, 'k'], [v, NKV, 'v']] as const) checkSize(buf, T * n * HD * 4, `attentionBackward ${what}`);
  checkSize(lse, T * NH * 4, 'attentionBackward lse');
  distinct('attentionBackward', dq, dk, dv, dout, out, lse, q, k, v);
  if (T === 0) return;
  const params = [T, NH, NKV, HD, T, f32(1 / Math.sqrt(HD))];
  const rowDot = gpu.createBuffer(T * NH * 4, 'attentionBackward.D'); // (T, NH) f32
  gpu.dispatch(gpu.kernel('attention', 'attention_backward_dq'), [dq, q, k, v, dout, lse, rowDot, out], T * NH, params);
  gpu.dispatch(gpu.kernel('attention', 'attention_backward_dkv'), [dk, q, k, v, dout, lse, rowDot, dv], T * NKV, params);
  gpu.releaseBuffer(rowDot); // safe: later users of the recycled buffer are encoded after these reads
}

/** out (n) f32 = silu(gate) * up */
export function siluMul(gpu: Gpu, out: GPUBuffer, gate: GPUBuffer, up: GPUBuffer, n: number): void {
  checkSize(out, n * 4, 'siluMul out');
  checkSize(gate, n * 4, 'siluMul gate');
  checkSize(up, n * 4, 'siluMul up');
  gpu.dispatch(gpu.kernel('activation', 'silu_mul_forward'), [out, gate, up], Math.ceil(n / ELEMS_PER_WG), [n]);
}

/** dgate, dup (n) f32 += gradients of out = silu(gate) * up given dout (n) f32 */
export function siluMulBackward(gpu: Gpu, dgate: GPUBuffer, dup: GPUBuffer, dout: GPUBuffer, gate: GPUBuffer, up: GPUBuffer, n: number): void {
  for (const [buf, what] of [[dgate, 'dgate'], [dup, 'dup'], [dout, 'dout'], [gate, 'gate'], [up, 'up']] as const) {
    checkSize(buf, n * 4, `siluMulBackward ${what}`);
  }
  distinct('siluMulBackward', dgate, dup, dout, gate, up);
  gpu.dispatch(gpu.kernel('activation', 'silu_mul_backward'), [dgate, gate, up, dup, dout], Math.ceil(n / ELEMS_PER_WG), [n]);
}

/** out (n) f32 += a (n) f32 */
export function add(gpu: Gpu, out: GPUBuffer, a: GPUBuffer, n: number): void {
  checkSize(out, n * 4, 'add out');
  checkSize(a, n * 4, 'add a');
  distinct('add', out, a);
  gpu.dispatch(gpu.kernel('elementwise', 'add_inplace'), [out, a], Math.ceil(n / ELEMS_PER_WG), [n]);
}

/** out (R, C) f32 = x[rows[r], :] ; rows (R) u32 */
export function gatherRows(gpu: Gpu, out: GPUBuffer, x: GPUBuffer, rows: GPUBuffer, R: number, C: number): void {
  checkSize(out, R * C * 4, 'gatherRows out');
  checkSize(rows, R * 4, 'gatherRows rows');
  gpu.dispatch(gpu.kernel('gather', 'gather_rows_forward'), [out, x, rows], Math.ceil((R * C) / ELEMS_PER_WG), [R, C]);
}

export interface SampleOptions {
  /** 0 = greedy argmax. */
  temperature: number;
  /** Keep the k most likely tokens; 0 = off. */
  topK: number;
  /** Keep the smallest set with this much probability; 1 = off. */
  topP: number;
}

/** outIds (B) u32 ; logits (B, V) f32 ; RNG = hash(seed, step, row) */
export function sample(gpu: Gpu, outIds: GPUBuffer, logits: GPUBuffer, B: number, V: number, opts: SampleOptions, seed: number, step: number): void {
  checkSize(outIds, B * 4, 'sample outIds');
  checkSize(logits, B * V * 4, 'sample logits');
  check(opts.temperature >= 0 && opts.topK >= 0 && opts.topP > 0, `sample: bad options ${JSON.stringify(opts)}`);
  // Barrier count is 32-64 bisection rounds x log2(WG); a small vocabulary needs few threads.
  const WG = V >= 8192 ? 256 : V >= 512 ? 64 : 16;
  gpu.dispatch(opKernel(gpu, 'sample', 'sample', 'sample_forward', { WG, ...subgroupDefines(useSubgroups(gpu)) }), [outIds, logits], B,
    [B, V, Math.floor(opts.topK), seed >>> 0, step >>> 0, f32(opts.temperature), f32(Math.min(opts.topP, 1))]);
}
