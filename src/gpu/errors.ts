// Typed GPU errors. The engine records uncaptured errors and device loss and throws them from the
// next flush()/read(), so a failure is never silent and callers can branch on the class.

export class GpuError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** No WebGPU (no navigator.gpu, no `webgpu` package) or no adapter/device could be obtained. */
export class GpuUnavailableError extends GpuError {}

/** A WebGPU validation error: wrong binding, bad shader, out-of-range dispatch... (a bug in our code). */
export class GpuValidationError extends GpuError {}

/** An allocation failed or would exceed the device limits (model too large for this GPU). */
export class GpuOutOfMemoryError extends GpuError {}

/** The device was lost (driver reset, tab backgrounded too long, GPU removed). */
export class GpuDeviceLostError extends GpuError {
  constructor(
    message: string,
    readonly reason: string = 'unknown',
  ) {
    super(message);
  }
}

/** Maps a WebGPU GPUError to our typed error. */
export function fromGpuError(err: GPUError, context: string): GpuError {
  const kind = err.constructor?.name ?? '';
  const msg = `${context}: ${err.message}`;
  if (
    (typeof GPUValidationError !== 'undefined' && err instanceof GPUValidationError) ||
    kind === 'GPUValidationError'
  ) {
    return new GpuValidationError(msg);
  }
  if (
    (typeof GPUOutOfMemoryError !== 'undefined' && err instanceof GPUOutOfMemoryError) ||
    kind === 'GPUOutOfMemoryError'
  ) {
    return new GpuOutOfMemoryError(msg);
  }
  return new GpuError(msg);
}
