// Buffer pool: released buffers are kept per (usage, size) and handed out again, so per-step
// activations and staging buffers are not re-allocated on every call.
// Reuse is safe without waiting for the GPU because every later use of a recycled buffer is
// encoded or queued after the work that used it before (see Gpu.write, which flushes first).
// Every buffer the pool creates or destroys is counted in a MemoryCounter, so the device's
// allocated bytes (in use + held free) and their peak are known exactly.

// A GPUBuffer's size and usage never change, and in Node (npm `webgpu`) each read of them is a
// call through the native binding (about 70 ns, against about 5 ns for a property of the object
// itself). The encode path reads them for every bound buffer, so they are read once per buffer and
// kept on the object under symbols (a WeakMap read costs a hash lookup; on a decode step's
// encoding bufferSize held 7% of the samples that way). An object that cannot take a property
// (not extensible) keeps them in WeakMaps instead.
const SIZE = Symbol('spyrl.size');
const USAGE = Symbol('spyrl.usage');
const ID = Symbol('spyrl.id');
type Tagged = { [SIZE]?: number; [USAGE]?: number; [ID]?: number };
const sizes = new WeakMap<object, number>();
const usages = new WeakMap<object, number>();
const ids = new WeakMap<object, number>();
let nextId = 1;

/** o[key] = value, or in `fallback` where o takes no property; returns value. */
function tag(
  o: object,
  key: typeof SIZE | typeof USAGE | typeof ID,
  value: number,
  fallback: WeakMap<object, number>,
): number {
  if (Object.isExtensible(o)) (o as Tagged)[key] = value;
  else fallback.set(o, value);
  return value;
}

/** buf.size, read once per buffer. */
export function bufferSize(buf: GPUBuffer): number {
  return (buf as Tagged)[SIZE] ?? sizes.get(buf) ?? tag(buf, SIZE, buf.size, sizes);
}

/** buf.usage, read once per buffer. */
export function bufferUsage(buf: GPUBuffer): number {
  return (buf as Tagged)[USAGE] ?? usages.get(buf) ?? tag(buf, USAGE, buf.usage, usages);
}

/** A number of this object's own, never given to another (buffers and pipelines: the bind-group cache's hash). */
export function objectId(o: object): number {
  return (o as Tagged)[ID] ?? ids.get(o) ?? tag(o, ID, nextId++, ids);
}

/** Bytes of GPU buffers created and not yet destroyed, and the peak of that since resetPeak(). */
export class MemoryCounter {
  bytes = 0;
  peakBytes = 0;

  add(n: number): void {
    this.bytes += n;
    if (this.bytes > this.peakBytes) this.peakBytes = this.bytes;
  }

  sub(n: number): void {
    this.bytes -= n;
  }

  /** Starts a new peak from what is allocated now. */
  resetPeak(): void {
    this.peakBytes = this.bytes;
  }
}

export class BufferPool {
  private free = new Map<string, GPUBuffer[]>();
  private live = new Set<GPUBuffer>();
  /** Free buffers in release order, for trimming the oldest first. */
  private freeOrder = new Set<GPUBuffer>();
  private freeBytes = 0;
  /** The command batch being encoded (the Gpu's submits so far), and the one each free buffer was released in. */
  batch = 0;
  private releasedIn = new WeakMap<GPUBuffer, number>();
  /** Each buffer's label as last handed out (read without a call into the GPU binding). */
  private labels = new WeakMap<GPUBuffer, string>();

  constructor(
    private readonly device: GPUDevice,
    private readonly counter: MemoryCounter = new MemoryCounter(),
  ) {}

  /** A buffer of exactly `bytes` (rounded up to 4) with `usage`, recycled when one is free. */
  acquire(bytes: number, usage: GPUBufferUsageFlags, label: string): GPUBuffer {
    return this.reuse(bytes, usage, label) ?? this.create(bytes, usage, label);
  }

  /** A free buffer of exactly this size and usage, now live; null when none is free (a miss). */
  reuse(bytes: number, usage: GPUBufferUsageFlags, label: string): GPUBuffer | null {
    const list = this.free.get(key(usage, roundSize(bytes)));
    if (!list?.length) return null;
    // The latest released buffer that last had this label, else the latest released: a repeated
    // step (a decode step: x, h, q, ... of one size) gets each role's buffer back whatever order
    // it released them in, so its bind groups, cached per buffer set (Gpu.bindGroup), match.
    let i = list.length - 1;
    while (i >= 0 && this.labels.get(list[i]) !== label) i--;
    const reused = i >= 0 ? list.splice(i, 1)[0] : list.pop()!;
    this.freeOrder.delete(reused);
    this.freeBytes -= bufferSize(reused);
    if (this.labels.get(reused) !== label) {
      reused.label = label;
      this.labels.set(reused, label);
    }
    this.live.add(reused);
    return reused;
  }

  /** A new live buffer (counted). */
  create(bytes: number, usage: GPUBufferUsageFlags, label: string): GPUBuffer {
    const buf = this.device.createBuffer({ size: roundSize(bytes), usage, label });
    this.labels.set(buf, label);
    this.counter.add(bufferSize(buf));
    this.live.add(buf);
    return buf;
  }

  release(buf: GPUBuffer): void {
    if (!this.live.delete(buf)) return; // not ours or released twice
    const k = key(bufferUsage(buf), bufferSize(buf));
    const list = this.free.get(k);
    if (list) list.push(buf);
    else this.free.set(k, [buf]);
    this.freeOrder.add(buf);
    this.freeBytes += bufferSize(buf);
    this.releasedIn.set(buf, this.batch);
  }

  /**
   * Destroys the oldest free buffers until at most `maxFreeBytes` stay pooled, so sequences of
   * ever-new lengths do not pile up GPU memory. Call it only when no pending (unsubmitted)
   * command uses a free buffer, i.e. right after a submit; or with `releasedBefore`, the batch
   * now pending: then only buffers released before it are destroyed, which no pending command
   * can use (a buffer is used only while live, and these were free all through that batch).
   */
  trimTo(maxFreeBytes: number, releasedBefore = Infinity): void {
    for (const buf of this.freeOrder) {
      if (this.freeBytes <= maxFreeBytes || this.releasedIn.get(buf)! >= releasedBefore) break;
      const list = this.free.get(key(bufferUsage(buf), bufferSize(buf)))!;
      list.splice(list.indexOf(buf), 1);
      this.freeOrder.delete(buf);
      this.freeBytes -= bufferSize(buf);
      this.destroyBuffer(buf);
    }
  }

  /** Destroys the free buffers (keeps live ones). Same precondition as trimTo. */
  trim(): void {
    for (const list of this.free.values()) for (const b of list) this.destroyBuffer(b);
    this.free.clear();
    this.freeOrder.clear();
    this.freeBytes = 0;
  }

  destroyAll(): void {
    this.trim();
    for (const b of this.live) this.destroyBuffer(b);
    this.live.clear();
  }

  /** Free buffers held (count) and their bytes, without walking the live set as stats does. */
  get freeCount(): number {
    return this.freeOrder.size;
  }

  get freeByteCount(): number {
    return this.freeBytes;
  }

  get stats(): { live: number; free: number; liveBytes: number; freeBytes: number } {
    let liveBytes = 0;
    for (const b of this.live) liveBytes += bufferSize(b);
    return { live: this.live.size, free: this.freeOrder.size, liveBytes, freeBytes: this.freeBytes };
  }

  private destroyBuffer(buf: GPUBuffer): void {
    this.counter.sub(bufferSize(buf));
    buf.destroy();
  }
}

/** A buffer's size as the pool makes it: a multiple of 4, at least 4. */
export function roundSize(bytes: number): number {
  return Math.max(4, Math.ceil(bytes / 4) * 4);
}

function key(usage: number, size: number): string {
  return `${usage}:${size}`;
}
