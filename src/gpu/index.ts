export { createGpu, Gpu, type CreateGpuOptions, type GpuFeatures, type GpuInfo, type KernelTime } from './device.ts';
export {
  GpuError,
  GpuUnavailableError,
  GpuValidationError,
  GpuOutOfMemoryError,
  GpuDeviceLostError,
} from './errors.ts';
export {
  f32,
  F32,
  splitGrid,
  type Param,
  type Constants,
  type Defines,
  type Kernel,
  type Workgroups,
} from './launch.ts';
export { BufferPool, bufferSize, bufferUsage, objectId } from './pool.ts';
export { preprocess, ShaderPreprocessError } from './preprocess.ts';
