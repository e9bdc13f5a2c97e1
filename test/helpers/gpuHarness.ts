// Shared by the kernel tests: upload helpers and the comparator that records each op's measured
// error (printed at the end of a file) and fails with the worst element named.
import { expect } from 'vitest';
import type { Gpu } from '../../src/gpu/index.ts';
import * as ref from './reference.ts';

export function gpuHarness(getGpu: () => Gpu) {
  const measured: Record<string, string> = {};
  const upload = (data: Float32Array | Uint32Array, label: string): GPUBuffer => {
    const buf = getGpu().createBuffer(Math.max(4, data.byteLength), label);
    getGpu().write(buf, data);
    return buf;
  };
  return {
    measured,
    upload,
    f32Buf: (data: ArrayLike<number>, label = 'f32') => upload(Float32Array.from(data), label),
    u32Buf: (data: ArrayLike<number>, label = 'u32') => upload(Uint32Array.from(data), label),
    bf16Buf: (data: Float32Array, label = 'bf16') => upload(ref.packBf16(data), label),
    outBuf: (n: number, label = 'out') => getGpu().createBuffer(Math.max(4, n * 4), label),
    /** |got - want|max <= rel * |want|max + abs. */
    expectClose(name: string, got: ArrayLike<number>, want: ArrayLike<number>, rel: number, abs: number): void {
      const d = ref.compare(got, want, rel, abs);
      measured[name] =
        `max|err| ${d.maxAbs.toExponential(2)}  max|ref| ${d.maxRef.toExponential(2)}  rel ${(d.maxAbs / (d.maxRef || 1)).toExponential(2)}`;
      expect(
        d.ok,
        `${name}: max|err| ${d.maxAbs} at ${d.worst} (got ${got[d.worst]}, want ${want[d.worst]}) > ${rel}*${d.maxRef}+${abs}`,
      ).toBe(true);
    },
    report(title: string): void {
      const g = getGpu();
      console.log(
        `${title} on ${g?.info.architecture || g?.info.description}:\n` +
          Object.entries(measured)
            .map(([k, v]) => `  ${k}: ${v}`)
            .join('\n'),
      );
    },
  };
}
