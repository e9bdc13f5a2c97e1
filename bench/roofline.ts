// The roofline of this adapter, measured rather than looked up: a plain vec4 copy (the bandwidth
// a kernel can reach) and a register FMA chain (the f32 rate), shaders/roofline.wgsl. Every other
// figure of the benchmark is shown as a fraction of these two.
import type { Gpu } from '../src/gpu/index.ts';
import { makeRecord, timeCalls, type BenchRecord, type Roofline } from './measure.ts';

const WG = 256; // threads per workgroup of both probes
const FLOPS_PER_ITER = 8 * 4 * 2; // 8 vec4 FMAs, 2 FLOPs each

export interface RooflineSizes {
  /** Bytes copied per call (read once, written once). */
  copyBytes: number;
  /** Workgroups and loop trips of the FMA probe. */
  fmaGroups: number;
  fmaIters: number;
}

export const ROOFLINE_SIZES: Record<'quick' | 'full', RooflineSizes> = {
  quick: { copyBytes: 32 << 20, fmaGroups: 64, fmaIters: 512 },
  full: { copyBytes: 512 << 20, fmaGroups: 8192, fmaIters: 2048 },
};

/** FLOPs of one FMA-probe call. */
export const fmaFlops = (s: RooflineSizes) => s.fmaGroups * WG * s.fmaIters * FLOPS_PER_ITER;

export async function measureRoofline(
  gpu: Gpu,
  sizes: RooflineSizes,
  minSeconds: number,
): Promise<{ roofline: Roofline; records: BenchRecord[] }> {
  const bytes = Math.min(sizes.copyBytes, Math.floor(gpu.limits.maxStorageBufferBindingSize / 16) * 16);
  const words = bytes / 16;
  const src = gpu.createBuffer(bytes, 'roofline.src');
  const dst = gpu.createBuffer(bytes, 'roofline.dst');
  const sink = gpu.createBuffer(sizes.fmaGroups * WG * 16, 'roofline.sink');
  try {
    const copy = gpu.kernel('roofline', 'copy_vec4');
    const fma = gpu.kernel('roofline', 'fma_chain');
    const opts = { minSeconds, maxReps: 200 };
    const tc = await timeCalls(gpu, () => gpu.dispatch(copy, [dst, src], Math.ceil(words / WG), [words, 0]), opts);
    const threads = sizes.fmaGroups * WG;
    const tf = await timeCalls(gpu, () => gpu.dispatch(fma, [sink], sizes.fmaGroups, [threads, sizes.fmaIters]), opts);
    const copyRec = makeRecord({
      group: 'roofline',
      name: 'copy (vec4)',
      shape: `${bytes >> 20} MiB`,
      flops: 0,
      bytes: 2 * bytes,
      ...tc,
    });
    const fmaRec = makeRecord({
      group: 'roofline',
      name: 'fma (f32 vec4 x8)',
      shape: `${threads} thr x ${sizes.fmaIters} it`,
      flops: fmaFlops(sizes),
      bytes: threads * 16,
      ...tf,
    });
    return { roofline: { copyGBs: copyRec.gbs, fmaGFLOPs: fmaRec.gflops }, records: [copyRec, fmaRec] };
  } finally {
    for (const b of [src, dst, sink]) gpu.releaseBuffer(b);
  }
}
