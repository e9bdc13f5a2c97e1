// Shared pieces of the ops layer (docs/ENGINE.md): size checks, the variant switches, and the
// record of which pipeline variant each op last launched (kernelVariant, for tests).
import type { Gpu } from '../gpu/device.ts';
import type { Constants, Defines, Kernel } from '../gpu/launch.ts';
import { bufferSize } from '../gpu/pool.ts';
import { TUNING_DEFAULTS, type Tuning } from './tuning.ts';

export { formatTuning, parseTuning, TUNING_CHOICES, TUNING_DEFAULTS, type Tuning } from './tuning.ts';

export const ELEMS_PER_WG = 256; // elementwise kernels: one thread per element, 256 per workgroup

/** Decode-path cutoff: at most this many tokens go through the GEMV kernel. */
export const GEMV_MAX_T = 8;

/**
 * The kernel variant switches (src/ops/tuning.ts: each one's choices and what 'auto' picks), read
 * by the ops at encode time. Tests, the CLI's --kernels and the app's "Kernel variants" field set
 * them; resetTuning() puts back the defaults.
 */
export const tuning: Tuning = { ...TUNING_DEFAULTS };

/** Every switch back to its default, then `overrides` on top. */
export function resetTuning(overrides: Partial<Tuning> = {}): void {
  Object.assign(tuning, TUNING_DEFAULTS, overrides);
}

/**
 * Why `settings` cannot run on gpu (a forced variant needing a feature the device lacks), naming
 * the switch; null when they can. Checked before a model loads (CLI --kernels, the app).
 */
export function tuningProblem(gpu: Gpu, settings: Partial<Tuning>): string | null {
  if (settings.gemmF16 === 'on' && !gpu.features.f16) {
    return `gemmF16=on needs shader-f16, which this GPU (${gpu.info.description || 'unnamed adapter'}) lacks`;
  }
  if (settings.gemmSubgroups === 'on' && !gpu.features.subgroups) {
    return `gemmSubgroups=on needs subgroups, which this GPU (${gpu.info.description || 'unnamed adapter'}) lacks`;
  }
  return null;
}

const cpuAdapters = new WeakMap<Gpu, boolean>(); // isCpuAdapter's answers: asked on every dispatch's path

/** Whether gpu is a CPU emulation of a GPU (SwiftShader, lavapipe, llvmpipe, WARP), by its adapter info. */
export function isCpuAdapter(gpu: Gpu): boolean {
  let cpu = cpuAdapters.get(gpu);
  if (cpu === undefined) {
    const id = `${gpu.info.architecture} ${gpu.info.description}`.toLowerCase();
    cpuAdapters.set(gpu, (cpu = /swiftshader|llvmpipe|lavapipe|warp/.test(id)));
  }
  return cpu;
}

/**
 * Whether the 'auto' variant choices are a CPU adapter's (tuning.autoFor: the adapter's own, or
 * forced either way). Every op's 'auto' asks this, never isCpuAdapter.
 */
export function autoForCpu(gpu: Gpu): boolean {
  return tuning.autoFor === 'auto' ? isCpuAdapter(gpu) : tuning.autoFor === 'cpu';
}

// ---- variants -----------------------------------------------------------------------------------
// The reduction-heavy kernels (rmsNorm and its backward, the GEMV matmul, sample and
// logSoftmaxGather) reduce with subgroup operations when the device has the `subgroups` feature
// (define SUBGROUPS, shaders/common/reduce.wgsl), else with a shared-memory tree.

/** Whether the subgroup variants run on this Gpu. */
export function useSubgroups(gpu: Gpu): boolean {
  return gpu.features.subgroups;
}

const SUBGROUPS_ON: Defines = Object.freeze({ SUBGROUPS: 1 });
const SUBGROUPS_OFF: Defines = Object.freeze({});

/** The SUBGROUPS define when `on` (frozen: the pipeline cache finds its kernels by identity). */
export function subgroupDefines(on: boolean): Defines {
  return on ? SUBGROUPS_ON : SUBGROUPS_OFF;
}

export interface KernelVariant {
  subgroups: boolean;
  label: string;
  defines: Defines;
  constants: Constants;
}

const launched = new WeakMap<Gpu, Map<string, Kernel>>();

/** gpu.kernel(...), remembering for kernelVariant which pipeline variant `op` last got. */
export function opKernel(
  gpu: Gpu,
  op: string,
  shader: string,
  entry: string,
  defines: Defines = {},
  constants: Constants = {},
): Kernel {
  const kernel = gpu.kernel(shader, entry, defines, constants);
  let perGpu = launched.get(gpu);
  if (!perGpu) launched.set(gpu, (perGpu = new Map()));
  perGpu.set(op, kernel);
  return kernel;
}

/** Forgets the variants kernelVariant remembers for gpu (tests: did this call run `op`?). */
export function forgetKernelVariants(gpu: Gpu): void {
  launched.delete(gpu);
}

/** The pipeline variant the last call of `op` ('rmsNorm', 'matmul', 'sample', ...) encoded on gpu (tests). */
export function kernelVariant(gpu: Gpu, op: string): KernelVariant | undefined {
  const kernel = launched.get(gpu)?.get(op);
  if (!kernel) return undefined;
  const { label, defines, constants } = kernel;
  return { subgroups: 'SUBGROUPS' in defines, label, defines, constants };
}

// ---- weights --------------------------------------------------------------------------------------

/**
 * A frozen weight on the GPU: a bare buffer is bf16 (two per u32, the safetensors bytes); q4 is
 * the 4-bit format of docs/ENGINE.md, "q4 weights" (nibbles, then f16 group scales).
 */
export type Weight = GPUBuffer | Q4Weight;

export interface Q4Weight {
  readonly format: 'q4';
  readonly buf: GPUBuffer;
  /** Rows and last dimension of the quantized tensor (K % 32 == 0). */
  readonly N: number;
  readonly K: number;
}

export type WeightFormat = 'f32' | 'bf16' | 'q4';

export function isQ4(w: Weight): w is Q4Weight {
  return (w as Q4Weight).format === 'q4';
}

export function weightBuffer(w: Weight): GPUBuffer {
  return isQ4(w) ? w.buf : w;
}

export function weightFormat(w: Weight): 'bf16' | 'q4' {
  return isQ4(w) ? 'q4' : 'bf16';
}

/** u32 words of a q4 (N, K) tensor: N*K/8 of nibbles, then the f16 scales two per word. */
export function q4Words(N: number, K: number): number {
  return (N * K) / 8 + Math.ceil((N * K) / 64);
}

/** Checks that w holds an (N, K) weight and returns its buffer. */
export function checkWeight(w: Weight, N: number, K: number, what: string): GPUBuffer {
  if (isQ4(w)) {
    if (w.N * w.K !== N * K)
      throw new RangeError(`${what}: q4 weight '${w.buf.label}' is (${w.N}, ${w.K}), needs ${N} x ${K} elements`);
    checkSize(w.buf, q4Words(w.N, w.K) * 4, what);
    return w.buf;
  }
  checkSize(w, bf16Bytes(N * K), what);
  return w;
}

/** Throws a RangeError with msg unless cond; a function msg is built only on failure (hot paths). */
export function check(cond: boolean, msg: string | (() => string)): void {
  if (!cond) throw new RangeError(typeof msg === 'string' ? msg : msg());
}

// The message only when it fails: this runs for every buffer of every dispatch, and a buffer's
// label is a call into the WebGPU binding (its size is read once, bufferSize).
export function checkSize(buf: GPUBuffer, bytes: number, what: string | (() => string)): void {
  const size = bufferSize(buf);
  if (size < bytes) {
    const name = typeof what === 'string' ? what : what(); // a function: built only on failure
    throw new RangeError(`${name}: buffer '${buf.label}' has ${size} bytes, needs ${bytes}`);
  }
}

export const bf16Bytes = (n: number) => Math.ceil(n / 2) * 4;

/** WGSL never binds one buffer twice in a dispatch. */
export function distinct(op: string, ...bufs: GPUBuffer[]): void {
  // Pairwise, not a Set: a handful of buffers per dispatch, on every dispatch's path.
  for (let i = 1; i < bufs.length; i++)
    for (let j = 0; j < i; j++) if (bufs[i] === bufs[j]) throw new RangeError(`${op}: the same buffer is passed twice`);
}

// ---- KV cache layout -------------------------------------------------------------------------

/**
 * Layout of a paged KV cache (docs/ENGINE.md, "KV cache"): per layer a K and a V pool of `pages`
 * pages of `pageSize` tokens, (pages, pageSize, NKV, HD), f32 or f16 pairs packed in u32; a page
 * table (S, pagesPerSlot) u32 maps (slot, pos) to page table[slot][pos / pageSize].
 */
export interface KvPaging {
  dtype: 'f32' | 'f16';
  /** Tokens per page, a power of two. */
  pageSize: number;
  /** Physical pages in each pool. */
  pages: number;
  /** Page-table row width: ceil(maxT / pageSize). */
  pagesPerSlot: number;
  /** Positions per slot. */
  maxT: number;
}

/** Bytes of one layer's K (or V) pool. */
export function kvPoolBytes(kv: Pick<KvPaging, 'dtype' | 'pageSize' | 'pages'>, NKV: number, HD: number): number {
  return kv.pages * kv.pageSize * NKV * HD * (kv.dtype === 'f16' ? 2 : 4);
}

// ---- named bindings -------------------------------------------------------------------------------

/**
 * The storage bindings (@binding 1..n, in order) of shaders/attention.wgsl's entries, by name:
 * the entries share one module, so their binding numbers interleave; a dispatch names its buffers
 * and `bindings` puts them in this order.
 */
export const ATTENTION_BINDINGS = {
  kv_write: ['kCache', 'vCache', 'k', 'v', 'pageTable', 'slot', 'pos'],
  attention_forward: ['out', 'q', 'kCache', 'vCache', 'pageTable', 'slot', 'pos'],
  attention_split: ['out', 'q', 'kCache', 'vCache', 'pageTable', 'slot', 'pos', 'partLse'],
  attention_combine: ['out', 'splitLse', 'splitOut'],
  attention_forward_lse: ['out', 'q', 'k', 'v', 'lse'],
  attention_backward_dq: ['dq', 'q', 'k', 'v', 'dout', 'lse', 'D', 'out'],
  attention_backward_dkv: ['dk', 'q', 'k', 'v', 'dout', 'lse', 'D', 'dv'],
  // the TILED module of shaders/attention.wgsl: the same names at the same binding numbers
  attention_tiled: ['out', 'q', 'kCache', 'vCache', 'pageTable', 'slot', 'pos'],
  attention_tiled_lse: ['out', 'q', 'k', 'v', 'lse'],
  attention_tiled_dq: ['dq', 'q', 'k', 'v', 'dout', 'lse', 'D', 'out'],
  attention_tiled_dkv: ['dk', 'q', 'k', 'v', 'dout', 'lse', 'D', 'dv'],
  // with TREE (a packed prefix tree): keyEnd after the others
  attention_tiled_lse_tree: ['out', 'q', 'k', 'v', 'lse', 'keyEnd'],
  attention_tiled_dq_tree: ['dq', 'q', 'k', 'v', 'dout', 'lse', 'D', 'out', 'keyEnd'],
  attention_tiled_dkv_tree: ['dk', 'q', 'k', 'v', 'dout', 'lse', 'D', 'dv', 'keyEnd'],
} as const;

/** The buffers of `named` in the binding order of `order`. */
export function bindings<const N extends readonly string[]>(
  order: N,
  named: Record<N[number], GPUBuffer>,
): GPUBuffer[] {
  return order.map((name: N[number]) => named[name]);
}
