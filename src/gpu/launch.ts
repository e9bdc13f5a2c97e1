// Launch API pieces: the pipeline cache (over the WGSL preprocessor), uniform params and grid splitting.
//
// Shader convention (every shaders/*.wgsl entry point):
//   @group(0) @binding(0) var<uniform> p: SomeParams;   // bound only when dispatch gets params
//   @group(0) @binding(1..n) storage buffers, in the order the TS op passes them (outputs first).
// Storage bindings always start at 1, so a kernel without params simply has no binding 0.
// Several entry points share a file; each declares its own bindings (WGSL allows the same
// binding numbers on variables used by different entry points).

import { preprocess, type Defines } from './preprocess.ts';

/** A kernel parameter: a plain number is a u32; wrap floats with f32(). */
export type Param = number | F32;

export class F32 {
  constructor(readonly value: number) {}
}
export const f32 = (value: number): F32 => new F32(value);

export type { Defines } from './preprocess.ts';

/** Pipeline-overridable constants (WGSL `override`), e.g. workgroup sizes. */
export type Constants = Readonly<Record<string, number>>;

/** Workgroup counts: a 1-D count (split over x/y when above the per-dimension limit) or [x, y, z]. */
export type Workgroups = number | readonly [number, number?, number?];

/** A compiled entry point and the variant it was built for (defines and override constants). */
export interface Kernel {
  readonly pipeline: GPUComputePipeline;
  readonly label: string;
  readonly shader: string;
  readonly entry: string;
  readonly defines: Defines;
  readonly constants: Constants;
}

const keyOf = (o: Readonly<Record<string, unknown>>) =>
  Object.keys(o)
    .sort()
    .map((k) => `${k}=${o[k]}`)
    .join(',');

/**
 * Splits a 1-D workgroup count into an (x, y) grid within maxPerDim. Shaders recover the linear
 * id as `wid.x + wid.y * nwg.x` and skip ids >= n (the last row of the grid may be partial).
 */
export function splitGrid(n: number, maxPerDim: number): [number, number, number] {
  if (n <= maxPerDim) return [Math.max(1, n), 1, 1];
  const y = Math.ceil(n / maxPerDim);
  if (y > maxPerDim) throw new Error(`dispatch of ${n} workgroups exceeds ${maxPerDim}^2`);
  return [Math.ceil(n / y), y, 1];
}

/** PipelineCache's lookup by call order: a Map per level, the kernel under KERNEL at the end. */
type KeyTrie = Map<unknown, unknown>;
const CONSTANTS = Symbol('constants'); // between the defines and the constants
const KERNEL = Symbol('kernel');

function trieChild(node: KeyTrie, key: unknown): KeyTrie {
  let child = node.get(key) as KeyTrie | undefined;
  if (!child) node.set(key, (child = new Map()));
  return child;
}

/**
 * Pipelines cached by (shader, entry, defines, constants); shader modules cached by their
 * preprocessed text, so variants that expand to the same WGSL share one module.
 */
export class PipelineCache {
  private pipelines = new Map<string, Kernel>();
  private byCallOrder: KeyTrie = new Map();
  /** Frozen defines objects (ops' blockDefines, subgroupDefines): a trie each, over shader, entry, constants. */
  private byFrozenDefines = new WeakMap<Defines, KeyTrie>();
  private modules = new Map<string, GPUShaderModule>();

  /** Pipelines created so far (each a compile: the first use of a kernel variant). */
  get size(): number {
    return this.pipelines.size;
  }

  constructor(
    private readonly device: GPUDevice,
    private readonly source: (shader: string) => string,
    /** Receives the validation scope of every pipeline creation (compile errors surface there). */
    private readonly track: (scope: Promise<GPUError | null>, context: string) => void,
  ) {}

  get(shader: string, entry: string, defines: Defines = {}, constants: Constants = {}): Kernel {
    // Looked up first by the defines in the caller's order (no sort: this runs for every
    // dispatch), in a trie of Maps over shader, entry, then each define's name and value and each
    // constant's (no key string built per call); a miss there finds or makes the kernel under the
    // sorted key, so one variant is one pipeline whatever order its defines come in. A frozen
    // defines object (src/ops/forward.ts blockDefines: one object per content, never changed) is
    // looked up by identity instead of by its names and values: 3 Map reads, not 2 a define.
    let node: KeyTrie;
    if (Object.isFrozen(defines)) {
      let root = this.byFrozenDefines.get(defines);
      if (!root) this.byFrozenDefines.set(defines, (root = new Map()));
      node = trieChild(trieChild(root, shader), entry);
    } else {
      node = trieChild(trieChild(this.byCallOrder, shader), entry);
      for (const k in defines) node = trieChild(trieChild(node, k), defines[k]);
      node = trieChild(node, CONSTANTS);
    }
    for (const k in constants) node = trieChild(trieChild(node, k), constants[k]);
    const seen = node.get(KERNEL) as Kernel | undefined;
    if (seen) return seen;
    const kernel = this.getSorted(shader, entry, defines, constants);
    node.set(KERNEL, kernel);
    return kernel;
  }

  private getSorted(shader: string, entry: string, defines: Defines, constants: Constants): Kernel {
    const defKey = keyOf(defines);
    const constKey = keyOf(constants);
    const key = `${shader}:${entry}:${defKey}:${constKey}`;
    const hit = this.pipelines.get(key);
    if (hit) return hit;

    const variant = [defKey, constKey].filter(Boolean).join(';');
    const label = variant ? `${shader}.${entry}[${variant}]` : `${shader}.${entry}`;
    const code = preprocess(this.source(shader), { defines, include: this.source, label });
    let module = this.modules.get(code);
    this.device.pushErrorScope('validation');
    if (!module) {
      module = this.device.createShaderModule({ code, label: `${shader}[${defKey}]` });
      this.modules.set(code, module);
    }
    const compute: GPUProgrammableStage = { module, entryPoint: entry };
    if (constKey) compute.constants = { ...constants };
    const pipeline = this.device.createComputePipeline({ layout: 'auto', compute, label });
    this.track(this.device.popErrorScope(), `creating pipeline ${label}`);
    const kernel: Kernel = { pipeline, label, shader, entry, defines: { ...defines }, constants: { ...constants } };
    this.pipelines.set(key, kernel);
    return kernel;
  }
}

/**
 * GPU buffers filled on the CPU while work is encoded and uploaded with queue.writeBuffer right
 * before submit: chunks of `chunkBytes`, handed out in order and reused from the start after each
 * upload. Queue ordering makes the reuse safe: the next flush's writeBuffer runs after the work
 * submitted with this one has read the old contents.
 */
class StagedChunks {
  private chunks: { buffer: GPUBuffer; cpu: ArrayBuffer; u32: Uint32Array; f32: Float32Array; used: number }[] = [];
  private current = 0; // the chunk being filled

  constructor(
    private readonly device: GPUDevice,
    private readonly usage: GPUBufferUsageFlags,
    readonly chunkBytes: number,
    private readonly label: string,
  ) {}

  /** `bytes` (<= chunkBytes) at the next free offset of a chunk, for the CPU to fill. */
  alloc(bytes: number): { buffer: GPUBuffer; cpu: ArrayBuffer; u32: Uint32Array; f32: Float32Array; offset: number } {
    if (bytes > this.chunkBytes)
      throw new Error(`${this.label}: ${bytes} bytes exceed a ${this.chunkBytes}-byte chunk`);
    if (this.current < this.chunks.length && this.chunks[this.current].used + bytes > this.chunkBytes) this.current++;
    if (this.current === this.chunks.length) {
      const buffer = this.device.createBuffer({
        size: this.chunkBytes,
        usage: this.usage | GPUBufferUsage.COPY_DST,
        label: `${this.label}#${this.current}`,
      });
      const cpu = new ArrayBuffer(this.chunkBytes);
      this.chunks.push({ buffer, cpu, u32: new Uint32Array(cpu), f32: new Float32Array(cpu), used: 0 });
    }
    const chunk = this.chunks[this.current];
    const offset = chunk.used;
    chunk.used += bytes;
    return { buffer: chunk.buffer, cpu: chunk.cpu, u32: chunk.u32, f32: chunk.f32, offset };
  }

  /** Uploads what this flush filled; call right before queue.submit. */
  upload(queue: GPUQueue): void {
    for (const c of this.chunks) {
      if (c.used > 0) queue.writeBuffer(c.buffer, 0, c.cpu, 0, c.used);
      c.used = 0;
    }
    this.current = 0;
  }

  destroy(): void {
    for (const c of this.chunks) c.buffer.destroy();
    this.chunks = [];
    this.current = 0;
  }
}

/**
 * Uniform params for one flush: 64 KiB uniform buffers cut into 256-byte slots (the offset
 * alignment of uniform bindings), filled while dispatches are encoded (StagedChunks).
 */
export class UniformArena {
  static readonly CHUNK = 64 * 1024;
  private readonly staged: StagedChunks;

  constructor(
    device: GPUDevice,
    private readonly slotBytes = 256,
  ) {
    this.staged = new StagedChunks(device, GPUBufferUsage.UNIFORM, UniformArena.CHUNK, 'params');
  }

  /** Writes params into the next slot; returns the binding for it. */
  slot(params: readonly Param[], label: string): GPUBufferBinding {
    if (params.length * 4 > this.slotBytes)
      throw new Error(`${label}: ${params.length} params exceed a ${this.slotBytes}-byte slot`);
    // Whole-chunk views made once per chunk, indexed from the slot's word (slots are 4-aligned).
    const { buffer, u32, f32, offset } = this.staged.alloc(this.slotBytes);
    const w0 = offset >> 2;
    for (let i = 0; i < params.length; i++) {
      const v = params[i];
      if (v instanceof F32) f32[w0 + i] = v.value;
      else {
        if (!Number.isInteger(v) || v < 0 || v > 0xffffffff)
          throw new Error(`${label}: param ${i} = ${v} is not a u32 (wrap floats with f32())`);
        u32[w0 + i] = v;
      }
    }
    return { buffer, offset, size: this.slotBytes };
  }

  /** Uploads this flush's params; call right before queue.submit. */
  upload(queue: GPUQueue): void {
    this.staged.upload(queue);
  }

  destroy(): void {
    this.staged.destroy();
  }
}

/**
 * Small uploads ordered with the encoded work without a submit: the bytes go to a staged chunk
 * (uploaded right before the batch is submitted) and a copy into the target is encoded where the
 * write was asked for, so a write in the middle of a forward (token ids, page table, logit rows)
 * no longer splits it into two submits.
 */
export class UploadArena {
  static readonly CHUNK = 256 * 1024;
  /** Writes up to this size go through the arena; larger ones flush and use queue.writeBuffer. */
  static readonly MAX_WRITE = 64 * 1024;
  /** Bytes staged since the last upload: the Gpu submits before this would pass CHUNK, so the arena stays one chunk. */
  pending = 0;
  private readonly staged: StagedChunks;

  constructor(device: GPUDevice) {
    this.staged = new StagedChunks(device, GPUBufferUsage.COPY_SRC, UploadArena.CHUNK, 'uploads');
  }

  /** Stages `bytes` (a multiple of 4 long); returns where they will be once uploaded. */
  put(bytes: Uint8Array): { buffer: GPUBuffer; offset: number } {
    const { buffer, cpu, offset } = this.staged.alloc(bytes.byteLength);
    new Uint8Array(cpu, offset, bytes.byteLength).set(bytes);
    this.pending += bytes.byteLength;
    return { buffer, offset };
  }

  upload(queue: GPUQueue): void {
    this.staged.upload(queue);
    this.pending = 0;
  }

  destroy(): void {
    this.staged.destroy();
  }
}
