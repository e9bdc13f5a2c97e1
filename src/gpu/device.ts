// The Gpu object: device creation (browser or Node), buffers, upload/readback, the pending
// command encoder, error capture, and the two launch verbs kernel() and dispatch().

import { shaderSource } from '#shaders';
import { BufferPool, MemoryCounter, objectId, roundSize } from './pool.ts';
import { GpuDeviceLostError, GpuError, GpuOutOfMemoryError, GpuUnavailableError, fromGpuError } from './errors.ts';
import {
  PipelineCache,
  UniformArena,
  UploadArena,
  splitGrid,
  type Constants,
  type Defines,
  type Kernel,
  type Param,
  type Workgroups,
} from './launch.ts';

export interface GpuFeatures {
  f16: boolean;
  subgroups: boolean;
  timestampQuery: boolean;
}

export interface GpuInfo {
  vendor: string;
  architecture: string;
  description: string;
  /** The adapter's smallest subgroup size (with the subgroups feature); 0 where it does not say. */
  subgroupMinSize: number;
}

/** GPU memory the Gpu holds: every buffer it created and has not destroyed. */
export interface GpuMemory {
  /** All of it: storage buffers in use and held free in the pool, readback staging, uniform params. */
  liveBytes: number;
  /** The most liveBytes has been since the Gpu was created or resetPeak() was called. */
  peakBytes: number;
  /** Storage buffers handed out by createBuffer and not yet released. */
  inUseBytes: number;
  /** Released storage buffers the pool holds for reuse. */
  freeBytes: number;
  /** MAP_READ staging buffers of read() (in use or pooled). */
  stagingBytes: number;
  /** The uniform arena's 64 KiB chunks (kernel params) and the upload arena's 256 KiB chunk (staged small writes). */
  uniformBytes: number;
  /** Storage buffers in use / held free (counts). */
  live: number;
  free: number;
  resetPeak(): void;
}

/** One kernel's GPU time over a profile (Gpu.startProfile / stopProfile). */
export interface KernelTime {
  /** The pipeline's label: shader.entry[defines;constants]. */
  label: string;
  calls: number;
  /** Sum of the dispatches' GPU times (end - beginning of each one's pass), seconds. */
  seconds: number;
}

/** Timestamp queries per profiled submit: 2 a dispatch (Dawn's largest query set holds 4096). */
const PROFILE_QUERIES = 4096;

interface Profiler {
  set: GPUQuerySet;
  /** Labels of the dispatches encoded since the last submit, in order. */
  labels: string[];
  reads: Promise<void>[];
  totals: Map<string, { calls: number; ns: number }>;
}

export interface CreateGpuOptions {
  powerPreference?: GPUPowerPreference;
  /** Leave these optional features off even when offered (to test fallback paths). */
  disableFeatures?: OptionalFeature[];
  /** Override where shader text comes from (tests, bundles). */
  shaderSource?: (name: string) => string;
  /**
   * Request at most these values of the limits we raise (to test a smaller device's paths on this
   * one, e.g. Chrome's 10 storage buffers a stage); each still at most the adapter's.
   */
  limitsAtMost?: Partial<Record<RaisedLimit, number>>;
}

/** Limits we raise to the adapter's maximum: big weights, big bindings, big workgroups. */
const RAISED_LIMITS = [
  'maxBufferSize',
  'maxStorageBufferBindingSize',
  'maxStorageBuffersPerShaderStage',
  'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup',
  'maxComputeWorkgroupSizeX',
  'maxComputeWorkgroupSizeY',
  'maxComputeWorkgroupSizeZ',
  'maxComputeWorkgroupsPerDimension',
] as const;
type RaisedLimit = (typeof RAISED_LIMITS)[number];

/**
 * Dispatches with params encoded per submit: each takes a 256-byte slot of the uniform arena, so
 * the arena stays within 2048 slots (512 KiB) however long a pass is, and a longer batch is
 * submitted in pieces. 2048 holds one decode step of a 36-layer model with LoRA on every
 * projection (about 1,000 dispatches) in one command buffer. src/train/memory.ts plans
 * UNIFORM_ARENA_BYTES from this.
 */
export const MAX_PARAM_DISPATCHES_PER_SUBMIT = 2048;

/** Bind groups kept for reuse (Gpu.bindGroup): a few decode steps' worth of dispatches. */
const BIND_GROUP_CACHE = 16384;

/** One cached bind group and what it binds (Gpu.bindGroup). */
interface CachedBindGroup {
  readonly pipeline: GPUComputePipeline;
  readonly buffers: readonly GPUBuffer[];
  readonly slotBuffer: GPUBuffer | null;
  readonly offset: number;
  readonly group: GPUBindGroup;
}

/** FNV-1a's step over a 32-bit word. */
const mix = (h: number, word: number) => Math.imul(h ^ word, 16777619);

const STORAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

const OPTIONAL_FEATURES = ['shader-f16', 'subgroups', 'timestamp-query'] as const;
type OptionalFeature = (typeof OPTIONAL_FEATURES)[number];

/**
 * SPYRL_GPU_FEATURES_OFF (Node): optional features to leave off, comma-separated, as
 * CreateGpuOptions.disableFeatures does for one call (the two add up). npm test runs the kernel
 * tests on lavapipe with `shader-f16` off, the fallbacks SwiftShader takes, at lavapipe's speed;
 * a user can run any command without a feature the same way.
 */
function featuresOffFromEnv(): OptionalFeature[] {
  const raw = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env
    ?.SPYRL_GPU_FEATURES_OFF;
  if (!raw) return [];
  const names = raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  const bad = names.filter((n) => !(OPTIONAL_FEATURES as readonly string[]).includes(n));
  if (bad.length)
    throw new Error(
      `SPYRL_GPU_FEATURES_OFF: unknown feature ${bad.map((b) => `'${b}'`).join(', ')} (known: ${OPTIONAL_FEATURES.join(', ')})`,
    );
  return names as OptionalFeature[];
}

export async function createGpu(opts: CreateGpuOptions = {}): Promise<Gpu> {
  const gpuApi = await getNavigatorGpu();
  const adapter = await gpuApi.requestAdapter({ powerPreference: opts.powerPreference ?? 'high-performance' });
  if (!adapter) throw new GpuUnavailableError('WebGPU is present but no adapter was found');

  const off = new Set([...featuresOffFromEnv(), ...(opts.disableFeatures ?? [])]);
  const wanted: GPUFeatureName[] = [];
  for (const f of OPTIONAL_FEATURES) {
    if (adapter.features.has(f) && !off.has(f)) wanted.push(f as GPUFeatureName);
  }
  const requiredLimits: Record<string, number> = {};
  for (const name of RAISED_LIMITS)
    requiredLimits[name] = Math.min(adapter.limits[name], opts.limitsAtMost?.[name] ?? Infinity);

  let device: GPUDevice;
  try {
    device = await adapter.requestDevice({ requiredFeatures: wanted, requiredLimits, label: 'spyrl' });
  } catch (e) {
    throw new GpuUnavailableError(`requestDevice failed: ${(e as Error).message}`);
  }
  const info = adapter.info as GPUAdapterInfo | undefined;
  return new Gpu(
    device,
    {
      vendor: info?.vendor ?? '',
      architecture: info?.architecture ?? '',
      description: info?.description ?? '',
      subgroupMinSize: info?.subgroupMinSize ?? 0,
    },
    opts.shaderSource ?? shaderSource,
  );
}

let nodeGpuInstance: GPU | undefined;

async function getNavigatorGpu(): Promise<GPU> {
  if (typeof navigator !== 'undefined' && navigator.gpu) return navigator.gpu;
  if (typeof process === 'undefined' || !process.versions?.node) {
    throw new GpuUnavailableError('This browser has no WebGPU (navigator.gpu is missing)');
  }
  // A variable specifier keeps bundlers from pulling the Node-only package into the browser build.
  const mod = 'webgpu';
  let lib: { create: (opts: string[]) => GPU; globals: object };
  try {
    lib = await import(/* @vite-ignore */ mod);
  } catch (e) {
    throw new GpuUnavailableError(`the 'webgpu' package could not be loaded: ${(e as Error).message}`);
  }
  Object.assign(globalThis, lib.globals);
  // Dawn's instance must outlive every device made from it: a collected instance stalls or crashes mapAsync.
  // Full-resolution timestamps (Gpu.startProfile): Dawn rounds them to 64 us by default, a browser's
  // fingerprinting guard that a Node process has no use for. shader-f16 on NVIDIA GPUs over Vulkan:
  // Dawn leaves it out there unless vulkan_enable_f16_on_nvidia is on (a guard for f16 conformance
  // failures, crbug.com/42251215; llama.cpp's WebGPU backend turns it on outside a browser too).
  // Our f16 is the forward GEMM's tiles (tuning.gemmF16), which bench/gpu-check.ts checks against
  // the f64 reference on each device run; --kernels gemmF16=off leaves it unused, and
  // SPYRL_NVIDIA_F16=0 leaves the feature off as Dawn would.
  const nvidiaF16 = process.env.SPYRL_NVIDIA_F16;
  nodeGpuInstance ??= lib.create([
    'disable-dawn-features=timestamp_quantization',
    ...(nvidiaF16 === '0' ? [] : ['enable-dawn-features=vulkan_enable_f16_on_nvidia']),
  ]);
  return nodeGpuInstance;
}

export class Gpu {
  readonly features: GpuFeatures;
  readonly limits: GPUSupportedLimits;
  private readonly pool: BufferPool;
  private readonly readPool: BufferPool;
  private readonly pipelines: PipelineCache;
  private readonly params: UniformArena;
  private readonly uploads: UploadArena;
  private encoder: GPUCommandEncoder | null = null;
  private pass: GPUComputePassEncoder | null = null;
  private errors: GpuError[] = [];
  private scopes = new Set<Promise<void>>();
  private lost: GpuDeviceLostError | null = null;
  private destroyed = false;
  /** Dispatches encoded since creation (for benchmarks and tests). */
  dispatchCount = 0;
  /** Command buffers submitted since creation (for benchmarks and tests). */
  submitCount = 0;
  /** Bind groups created since creation; a repeated dispatch (same kernel, buffers and params slot) reuses its own. */
  bindGroupCount = 0;
  /** Bind groups by a hash of what they bind (Gpu.bindGroup), each bucket checked in full. */
  private bindGroups = new Map<number, CachedBindGroup[]>();
  private cachedBindGroups = 0;
  private profiler: Profiler | null = null;
  /**
   * Bytes of released buffers kept for reuse; older ones are destroyed after each submit. Besides
   * this cap, a createBuffer that finds no free buffer of its size destroys every free buffer
   * (see createBuffer), so pooled memory never outlives the shapes that used it.
   */
  poolFreeBytes = 512 * 2 ** 20;
  /** Every buffer this Gpu creates, counted once (storage pool, staging pool, uniform arena). */
  private readonly counter = new MemoryCounter();
  private uniformBytes = 0;
  /** Dispatches with params encoded since the last submit (their arena slots). */
  private paramDispatches = 0;

  constructor(
    readonly device: GPUDevice,
    readonly info: GpuInfo,
    source: (name: string) => string,
  ) {
    this.features = {
      f16: device.features.has('shader-f16'),
      subgroups: device.features.has('subgroups'),
      timestampQuery: device.features.has('timestamp-query'),
    };
    // A plain copy: each read of a GPUSupportedLimits attribute is a call into the native binding
    // in Node (about 0.1 us), and the encode path reads limits on every dispatch.
    const limits: Record<string, number> = {};
    for (const name in device.limits) {
      const v = (device.limits as unknown as Record<string, unknown>)[name];
      if (typeof v === 'number') limits[name] = v;
    }
    // (An implementation whose attributes do not enumerate keeps the native object.)
    this.limits =
      'maxComputeWorkgroupsPerDimension' in limits ? (limits as unknown as GPUSupportedLimits) : device.limits;
    this.pool = new BufferPool(device, this.counter);
    this.readPool = new BufferPool(device, this.counter);
    // The arena creates its own 64 KiB chunks as dispatches need them: count them through a device view.
    const countedDevice = {
      createBuffer: (desc: GPUBufferDescriptor) => {
        const buf = device.createBuffer(desc);
        this.counter.add(buf.size);
        this.uniformBytes += buf.size;
        return buf;
      },
    } as GPUDevice;
    this.params = new UniformArena(countedDevice, Math.max(256, device.limits.minUniformBufferOffsetAlignment));
    this.uploads = new UploadArena(countedDevice);
    this.pipelines = new PipelineCache(device, source, (scope, ctx) => this.track(scope, ctx));
    device.addEventListener('uncapturederror', (ev) => {
      this.errors.push(fromGpuError((ev as GPUUncapturedErrorEvent).error, 'uncaptured'));
    });
    void device.lost.then((lostInfo) => {
      if (this.destroyed) return;
      this.lost = new GpuDeviceLostError(`GPU device lost: ${lostInfo.message}`, lostInfo.reason);
    });
  }

  // ---- 1. buffers -------------------------------------------------------------------------

  /**
   * A STORAGE | COPY_SRC | COPY_DST buffer of `bytes` (rounded up to 4), from the pool when one
   * of that size is free. When none is, the work has moved to new shapes (the next phase of a
   * round, a sequence of another length): the pending work is submitted and every free buffer
   * destroyed before the new one is made, so the memory held is what is in use, and the peak is
   * that of the largest set of buffers alive together, which is what src/train/memory.ts plans.
   */
  createBuffer(bytes: number, label: string): GPUBuffer {
    this.throwIfLost();
    if (bytes > this.limits.maxBufferSize) {
      throw new GpuOutOfMemoryError(`${label}: ${bytes} bytes exceeds maxBufferSize ${this.limits.maxBufferSize}`);
    }
    const reused = this.pool.reuse(bytes, STORAGE(), label);
    if (reused) return reused;
    this.makeRoom(roundSize(bytes));
    this.device.pushErrorScope('out-of-memory');
    const buf = this.pool.create(bytes, STORAGE(), label);
    this.track(this.device.popErrorScope(), `allocating ${label} (${bytes} bytes)`);
    return buf;
  }

  /**
   * Before a new buffer of `bytes` is made: destroys the pool's free buffers, oldest first, until
   * what the Gpu holds plus the new buffer fits under the peak so far (or none is left). The peak
   * then only grows to a set of buffers in use together plus the staging and uniform chunks,
   * never by buffers held free (src/train/memory.ts plans exactly that), while free buffers that
   * fit under it stay for reuse: a decode step that misses once (a size it has not freed yet)
   * keeps the others, so its next step gets the same buffers again, and with them its cached bind
   * groups and a single submit. Destroying all of them on every miss made each step miss again.
   * Buffers released before the pending batch go first, with no submit (no pending command can
   * use them); a submit only when those are not enough (pending commands may use the others).
   */
  private makeRoom(bytes: number): void {
    const excess = () => this.counter.bytes + bytes - this.counter.peakBytes;
    const trim = (releasedBefore?: number) =>
      this.pool.trimTo(Math.max(0, this.pool.freeByteCount - Math.max(0, excess())), releasedBefore);
    if (this.pool.freeCount === 0 || excess() <= 0) return;
    if (this.encoder) {
      trim(this.pool.batch);
      if (this.pool.freeCount === 0 || excess() <= 0) return;
      this.submit(); // its trimTo(poolFreeBytes) may already free enough
    }
    trim();
  }

  /** Returns a buffer from createBuffer to the pool; pending work that uses it stays valid. */
  releaseBuffer(buf: GPUBuffer): void {
    this.pool.release(buf);
  }

  /**
   * Uploads data; ordered after all work encoded so far and before all work encoded later. Small
   * writes (<= UploadArena.MAX_WRITE) are staged and copied in the command stream, with no
   * submit; larger ones submit the pending work first and use queue.writeBuffer.
   */
  write(buf: GPUBuffer, data: ArrayBufferView | ArrayBuffer, byteOffset = 0): void {
    this.throwIfLost();
    let bytes =
      data instanceof ArrayBuffer
        ? new Uint8Array(data)
        : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    if (bytes.byteLength % 4 !== 0) {
      const padded = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
      padded.set(bytes);
      bytes = padded;
    }
    if (bytes.byteLength === 0) return;
    if (bytes.byteLength <= UploadArena.MAX_WRITE) {
      if (this.uploads.pending + bytes.byteLength > UploadArena.CHUNK && this.encoder) this.submit();
      const staged = this.uploads.put(bytes);
      this.endPass();
      this.getEncoder().copyBufferToBuffer(staged.buffer, staged.offset, buf, byteOffset, bytes.byteLength);
      return;
    }
    if (this.encoder) this.submit();
    this.device.queue.writeBuffer(buf, byteOffset, bytes as Uint8Array<ArrayBuffer>);
  }

  /** Reads `bytes` (default: whole buffer) back; submits pending work first; throws recorded errors. */
  async read(buf: GPUBuffer, bytes?: number, byteOffset = 0): Promise<ArrayBuffer> {
    this.throwIfLost();
    bytes ??= buf.size - byteOffset;
    const size = Math.ceil(bytes / 4) * 4;
    const usage = GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST;
    // Free staging buffers are unmapped and idle (every read waits for its map), so a miss may drop them.
    let staging = this.readPool.reuse(size, usage, `read:${buf.label}`);
    if (!staging) {
      this.readPool.trim();
      staging = this.readPool.create(size, usage, `read:${buf.label}`);
    }
    this.endPass();
    this.getEncoder().copyBufferToBuffer(buf, byteOffset, staging, 0, size);
    this.submit();
    try {
      await staging.mapAsync(GPUMapMode.READ, 0, size);
    } catch (e) {
      await this.settle();
      this.throwIfLost();
      this.throwRecorded();
      throw new GpuError(`mapAsync failed reading ${buf.label}: ${(e as Error).message}`);
    }
    const out = staging.getMappedRange(0, size).slice(0, bytes);
    staging.unmap();
    this.readPool.release(staging);
    await this.settle();
    this.throwIfLost();
    this.throwRecorded();
    return out;
  }

  async readF32(buf: GPUBuffer, count?: number): Promise<Float32Array> {
    return new Float32Array(await this.read(buf, count === undefined ? undefined : count * 4));
  }

  async readU32(buf: GPUBuffer, count?: number): Promise<Uint32Array> {
    return new Uint32Array(await this.read(buf, count === undefined ? undefined : count * 4));
  }

  /** Encodes a buffer-to-buffer copy (in order with dispatches); argument order as copyBufferToBuffer. */
  copy(src: GPUBuffer, srcOffset: number, dst: GPUBuffer, dstOffset: number, bytes: number): void {
    this.endPass();
    this.getEncoder().copyBufferToBuffer(src, srcOffset, dst, dstOffset, bytes);
  }

  /** Encodes zero-filling a buffer range (in order with dispatches). */
  clear(buf: GPUBuffer, byteOffset = 0, bytes?: number): void {
    this.endPass();
    this.getEncoder().clearBuffer(buf, byteOffset, bytes);
  }

  // ---- 2. launch ----------------------------------------------------------------------------

  /** Compute pipelines compiled on this device so far (one per kernel variant first used). */
  get pipelineCount(): number {
    return this.pipelines.size;
  }

  /**
   * The compute pipeline for `entry` in shaders/<shader>.wgsl, preprocessed with `defines`
   * (src/gpu/preprocess.ts) and with `constants` for its `override`s; cached per variant.
   */
  kernel(shader: string, entry: string, defines?: Defines, constants?: Constants): Kernel {
    this.throwIfLost();
    return this.pipelines.get(shader, entry, defines, constants);
  }

  /**
   * Encodes one dispatch into the pending encoder. `buffers` bind to @binding(1..n) in order;
   * `params` (u32 numbers, f32() for floats) bind to @binding(0) as a uniform when given.
   * A 1-D workgroup count is split into an (x, y) grid when above the per-dimension limit.
   */
  dispatch(kernel: Kernel, buffers: readonly GPUBuffer[], workgroups: Workgroups, params?: readonly Param[]): void {
    this.throwIfLost();
    const maxDim = this.limits.maxComputeWorkgroupsPerDimension;
    const [x, y, z] =
      typeof workgroups === 'number'
        ? splitGrid(workgroups, maxDim)
        : [workgroups[0], workgroups[1] ?? 1, workgroups[2] ?? 1];
    if (x === 0 || y === 0 || z === 0) return;
    let slot: GPUBufferBinding | null = null;
    if (params) {
      // Bounds the uniform arena: a submitted batch's slots are reused by the next one.
      if (this.paramDispatches >= MAX_PARAM_DISPATCHES_PER_SUBMIT && this.encoder) this.submit();
      this.paramDispatches++;
      slot = this.params.slot(params, kernel.label);
    }
    const bindGroup = this.bindGroup(kernel, buffers, slot);
    const prof = this.profiler;
    if (prof) {
      // Each dispatch in its own pass between two timestamps.
      this.endPass();
      const i = prof.labels.length;
      const pass = this.getEncoder().beginComputePass({
        timestampWrites: { querySet: prof.set, beginningOfPassWriteIndex: 2 * i, endOfPassWriteIndex: 2 * i + 1 },
      });
      pass.setPipeline(kernel.pipeline);
      pass.setBindGroup(0, bindGroup);
      pass.dispatchWorkgroups(x, y, z);
      pass.end();
      prof.labels.push(kernel.label);
      this.dispatchCount++;
      if (prof.labels.length * 2 >= PROFILE_QUERIES) this.submit();
      return;
    }
    const pass = this.getPass();
    pass.setPipeline(kernel.pipeline);
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(x, y, z);
    this.dispatchCount++;
  }

  /**
   * Starts timing every dispatch on the GPU (the timestamp-query feature): from here each
   * dispatch runs in a compute pass of its own with a timestamp at each end, which adds
   * overhead between dispatches but leaves each one's own time. stopProfile() sums them per
   * kernel. Browsers round timestamps (Chrome: to 100 us unless its WebGPU developer features
   * are on), so there only kernels that run long enough read true; Node gets full resolution.
   * The query set (32 KiB) and the per-submit readback buffers are not counted in `memory`.
   */
  startProfile(): void {
    this.throwIfLost();
    if (!this.features.timestampQuery) {
      throw new GpuError('profiling needs the timestamp-query feature, which this GPU does not offer');
    }
    if (this.profiler) throw new GpuError('startProfile: a profile is already running');
    this.flush();
    const set = this.device.createQuerySet({ type: 'timestamp', count: PROFILE_QUERIES, label: 'spyrl-profile' });
    this.profiler = { set, labels: [], reads: [], totals: new Map() };
  }

  /** Ends the profile started by startProfile(): GPU time per kernel label, most first. */
  async stopProfile(): Promise<KernelTime[]> {
    const prof = this.profiler;
    if (!prof) throw new GpuError('stopProfile: no profile is running');
    try {
      await this.sync();
      await Promise.all(prof.reads);
    } finally {
      this.profiler = null;
      prof.set.destroy();
    }
    return [...prof.totals]
      .map(([label, t]) => ({ label, calls: t.calls, seconds: t.ns / 1e9 }))
      .sort((a, b) => b.seconds - a.seconds);
  }

  /** Before a profiled batch is finished: resolve its timestamps into a buffer read after the submit. */
  private resolveProfile(encoder: GPUCommandEncoder): (() => void) | null {
    const prof = this.profiler;
    if (!prof || prof.labels.length === 0) return null;
    const labels = prof.labels;
    prof.labels = [];
    const bytes = labels.length * 2 * 8;
    const resolved = this.device.createBuffer({
      size: bytes,
      usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC,
      label: 'spyrl-profile-resolve',
    });
    const staging = this.device.createBuffer({
      size: bytes,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      label: 'spyrl-profile-read',
    });
    encoder.resolveQuerySet(prof.set, 0, labels.length * 2, resolved, 0);
    encoder.copyBufferToBuffer(resolved, 0, staging, 0, bytes);
    return () => {
      const read = staging.mapAsync(GPUMapMode.READ).then(() => {
        const t = new BigInt64Array(staging.getMappedRange());
        labels.forEach((label, i) => {
          const ns = Math.max(0, Number(t[2 * i + 1]! - t[2 * i]!));
          const acc = prof.totals.get(label) ?? { calls: 0, ns: 0 };
          acc.calls++;
          acc.ns += ns;
          prof.totals.set(label, acc);
        });
        staging.unmap();
        staging.destroy();
        resolved.destroy();
      });
      prof.reads.push(read);
    };
  }

  /** Submits the pending command encoder; throws errors recorded so far (typed). */
  flush(): void {
    this.throwIfLost();
    if (this.encoder) this.submit();
    this.throwRecorded();
  }

  /** flush() and wait until the GPU is idle and all error scopes have answered. */
  async sync(): Promise<void> {
    this.throwIfLost();
    if (this.encoder) this.submit();
    await this.device.queue.onSubmittedWorkDone();
    await this.settle();
    this.throwIfLost();
    this.throwRecorded();
  }

  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    this.pass?.end();
    this.pass = null;
    this.encoder = null;
    this.pool.destroyAll();
    this.readPool.destroyAll();
    this.params.destroy();
    this.uploads.destroy();
    this.counter.sub(this.counter.bytes);
    this.uniformBytes = 0;
    this.device.destroy();
  }

  /** A snapshot of the GPU memory held (bytes of buffer sizes as created), with its peak. */
  get memory(): GpuMemory {
    const s = this.pool.stats,
      r = this.readPool.stats;
    return {
      liveBytes: this.counter.bytes,
      peakBytes: this.counter.peakBytes,
      inUseBytes: s.liveBytes,
      freeBytes: s.freeBytes,
      stagingBytes: r.liveBytes + r.freeBytes,
      uniformBytes: this.uniformBytes,
      live: s.live,
      free: s.free,
      resetPeak: () => this.counter.resetPeak(),
    };
  }

  // ---- 3. internals -------------------------------------------------------------------------

  /**
   * The bind group of (kernel, buffers, params slot), made once: the uniform arena hands out the
   * same slots in the same order every batch, so the dispatches of a repeated step (a decode
   * step, a layer of the same shapes) find theirs. Looked up by a hash of the objects' own
   * numbers (objectId: the pipeline, each buffer, the slot's chunk) and the slot's offset, then
   * compared in full: one Map read a dispatch. (A trie with a Map per bound object, which this
   * replaced, held a fifth of a decode step's encoding samples in its reads; a key string built
   * per dispatch before that, as much.) A buffer is never reused once destroyed, so a stale entry
   * can never match; the cache is dropped when it passes BIND_GROUP_CACHE bind groups.
   */
  private bindGroup(kernel: Kernel, buffers: readonly GPUBuffer[], slot: GPUBufferBinding | null): GPUBindGroup {
    const { pipeline } = kernel;
    const slotBuffer = slot ? slot.buffer : null;
    const offset = slot ? (slot.offset ?? 0) : -1;
    let h = mix(0x811c9dc5, objectId(pipeline));
    for (let i = 0; i < buffers.length; i++) h = mix(h, objectId(buffers[i]!));
    h = mix(mix(h, slotBuffer ? objectId(slotBuffer) : 0), offset);
    let bucket = this.bindGroups.get(h);
    if (bucket) {
      for (let j = 0; j < bucket.length; j++) {
        const e = bucket[j]!;
        if (e.pipeline !== pipeline || e.slotBuffer !== slotBuffer || e.offset !== offset) continue;
        const bound = e.buffers;
        if (bound.length !== buffers.length) continue;
        let same = true;
        for (let i = 0; i < bound.length && same; i++) same = bound[i] === buffers[i];
        if (same) return e.group;
      }
    }
    if (this.cachedBindGroups >= BIND_GROUP_CACHE) {
      this.bindGroups = new Map();
      this.cachedBindGroups = 0;
      bucket = undefined;
    }
    const entries: GPUBindGroupEntry[] = buffers.map((buffer, i) => ({ binding: i + 1, resource: { buffer } }));
    if (slot) entries.push({ binding: 0, resource: slot });
    const group = this.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries,
      label: kernel.label,
    });
    this.bindGroupCount++;
    const entry: CachedBindGroup = { pipeline, buffers: buffers.slice(), slotBuffer, offset, group };
    if (bucket) bucket.push(entry);
    else this.bindGroups.set(h, [entry]);
    this.cachedBindGroups++;
    return group;
  }

  private getEncoder(): GPUCommandEncoder {
    if (!this.encoder) {
      // One validation scope per submitted batch: errors in bind groups, dispatches and the submit
      // itself come back with a deterministic promise instead of only as an uncaptured event.
      this.device.pushErrorScope('validation');
      this.encoder = this.device.createCommandEncoder({ label: 'spyrl-batch' });
    }
    return this.encoder;
  }

  private getPass(): GPUComputePassEncoder {
    if (!this.pass) this.pass = this.getEncoder().beginComputePass();
    return this.pass;
  }

  private endPass(): void {
    if (this.pass) {
      this.pass.end();
      this.pass = null;
    }
  }

  private submit(): void {
    if (!this.encoder) return;
    this.endPass();
    const readProfile = this.resolveProfile(this.encoder);
    const cmd = this.encoder.finish();
    this.encoder = null;
    this.params.upload(this.device.queue);
    this.uploads.upload(this.device.queue);
    this.paramDispatches = 0;
    this.submitCount++;
    this.pool.batch++;
    this.device.queue.submit([cmd]);
    readProfile?.();
    this.track(this.device.popErrorScope(), 'command batch');
    this.pool.trimTo(this.poolFreeBytes); // safe now: no unsubmitted command refers to a free buffer
  }

  private track(scope: Promise<GPUError | null>, context: string): void {
    const p: Promise<void> = scope
      .then(
        (err) => {
          if (err) this.errors.push(fromGpuError(err, context));
        },
        (e: unknown) => {
          this.errors.push(new GpuError(`${context}: popErrorScope failed: ${(e as Error).message}`));
        },
      )
      .finally(() => this.scopes.delete(p));
    this.scopes.add(p);
  }

  private async settle(): Promise<void> {
    while (this.scopes.size) await Promise.all([...this.scopes]);
  }

  private throwIfLost(): void {
    if (this.lost) throw this.lost;
    if (this.destroyed) throw new GpuDeviceLostError('Gpu was destroyed', 'destroyed');
  }

  /** Throws (and clears) the first recorded error so a caller can recover from a bad call. */
  private throwRecorded(): void {
    if (this.errors.length === 0) return;
    const [first, ...rest] = this.errors;
    this.errors = [];
    if (rest.length) first.message += ` (+${rest.length} more: ${rest.map((e) => e.message).join(' | ')})`;
    throw first;
  }
}
