// Launch API pieces: WGSL templating, the pipeline cache, uniform params and grid splitting.
//
// Shader convention (every shaders/*.wgsl entry point):
//   @group(0) @binding(0) var<uniform> p: SomeParams;   // bound only when dispatch gets params
//   @group(0) @binding(1..n) storage buffers, in the order the TS op passes them (outputs first).
// Storage bindings always start at 1, so a kernel without params simply has no binding 0.
// Several entry points share a file; each declares its own bindings (WGSL allows the same
// binding numbers on variables used by different entry points).

/** A kernel parameter: a plain number is a u32; wrap floats with f32(). */
export type Param = number | F32;

export class F32 {
  constructor(readonly value: number) {}
}
export const f32 = (value: number): F32 => new F32(value);

/** `{{NAME}}` placeholders in the WGSL text, filled per pipeline variant. */
export type Defines = Readonly<Record<string, string | number | boolean>>;

/** Workgroup counts: a 1-D count (split over x/y when above the per-dimension limit) or [x, y, z]. */
export type Workgroups = number | readonly [number, number?, number?];

export interface Kernel {
  readonly pipeline: GPUComputePipeline;
  readonly label: string;
}

export function expandDefines(source: string, defines: Defines, label: string): string {
  const text = source.replace(/\{\{(\w+)\}\}/g, (_, name: string) => {
    const v = defines[name];
    if (v === undefined) throw new Error(`${label}: missing define {{${name}}}`);
    return typeof v === 'boolean' ? (v ? 'true' : 'false') : String(v);
  });
  return text;
}

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

/** Pipelines cached by (shader, entry, defines); shader modules cached by expanded text. */
export class PipelineCache {
  private pipelines = new Map<string, Kernel>();
  private modules = new Map<string, GPUShaderModule>();

  constructor(
    private readonly device: GPUDevice,
    private readonly source: (shader: string) => string,
    /** Receives the validation scope of every pipeline creation (compile errors surface there). */
    private readonly track: (scope: Promise<GPUError | null>, context: string) => void,
  ) {}

  get(shader: string, entry: string, defines: Defines = {}): Kernel {
    const defKey = Object.keys(defines).sort().map((k) => `${k}=${defines[k]}`).join(',');
    const key = `${shader}:${entry}:${defKey}`;
    const hit = this.pipelines.get(key);
    if (hit) return hit;

    const label = defKey ? `${shader}.${entry}[${defKey}]` : `${shader}.${entry}`;
    const code = expandDefines(this.source(shader), defines, label);
    let module = this.modules.get(code);
    this.device.pushErrorScope('validation');
    if (!module) {
      module = this.device.createShaderModule({ code, label: `${shader}[${defKey}]` });
      this.modules.set(code, module);
    }
    const pipeline = this.device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: entry }, label });
    this.track(this.device.popErrorScope(), `creating pipeline ${label}`);
    const kernel: Kernel = { pipeline, label };
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
