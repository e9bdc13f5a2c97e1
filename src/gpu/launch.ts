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

const keyOf = (o: Readonly<Record<string, unknown>>) => Object.keys(o).sort().map((k) => `${k}=${o[k]}`).join(',');

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

/**
 * Pipelines cached by (shader, entry, defines, constants); shader modules cached by their
 * preprocessed text, so variants that expand to the same WGSL share one module.
 */
export class PipelineCache {
  private pipelines = new Map<string, Kernel>();
  private modules = new Map<string, GPUShaderModule>();

  constructor(
    private readonly device: GPUDevice,
    private readonly source: (shader: string) => string,
    /** Receives the validation scope of every pipeline creation (compile errors surface there). */
    private readonly track: (scope: Promise<GPUError | null>, context: string) => void,
  ) {}

  get(shader: string, entry: string, defines: Defines = {}, constants: Constants = {}): Kernel {
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
 * Uniform params for one flush: fixed 64 KiB uniform buffers cut into 256-byte slots, filled
 * on the CPU while dispatches are encoded and uploaded once with queue.writeBuffer right before
 * submit. Queue ordering makes it safe to reuse the same buffers for the next flush.
 */
export class UniformArena {
  static readonly CHUNK = 64 * 1024;
  private chunks: { buffer: GPUBuffer; cpu: ArrayBuffer }[] = [];
  private used = 0; // bytes used in the current flush, across chunks

  constructor(
    private readonly device: GPUDevice,
    private readonly slotBytes = 256,
  ) {}

  /** Writes params into the next slot; returns the binding for it. */
  slot(params: readonly Param[], label: string): GPUBufferBinding {
    if (params.length * 4 > this.slotBytes) throw new Error(`${label}: ${params.length} params exceed a ${this.slotBytes}-byte slot`);
    const chunkIdx = Math.floor(this.used / UniformArena.CHUNK);
    const offset = this.used % UniformArena.CHUNK;
    if (chunkIdx === this.chunks.length) {
      const buffer = this.device.createBuffer({ size: UniformArena.CHUNK, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST, label: `params#${chunkIdx}` });
      this.chunks.push({ buffer, cpu: new ArrayBuffer(UniformArena.CHUNK) });
    }
    const chunk = this.chunks[chunkIdx];
    const u = new Uint32Array(chunk.cpu, offset, params.length);
    const f = new Float32Array(chunk.cpu, offset, params.length);
    for (let i = 0; i < params.length; i++) {
      const v = params[i];
      if (v instanceof F32) f[i] = v.value;
      else {
        if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new Error(`${label}: param ${i} = ${v} is not a u32 (wrap floats with f32())`);
        u[i] = v;
      }
    }
    this.used += this.slotBytes;
    return { buffer: chunk.buffer, offset, size: this.slotBytes };
  }

  /** Uploads this flush's params; call right before queue.submit. */
  upload(queue: GPUQueue): void {
    let left = this.used;
    for (let i = 0; left > 0; i++, left -= UniformArena.CHUNK) {
      queue.writeBuffer(this.chunks[i].buffer, 0, this.chunks[i].cpu, 0, Math.min(left, UniformArena.CHUNK));
    }
    this.used = 0;
  }

  destroy(): void {
    for (const c of this.chunks) c.buffer.destroy();
    this.chunks = [];
  }
}
