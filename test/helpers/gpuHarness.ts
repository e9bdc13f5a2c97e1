// Shared by the kernel tests: upload helpers and the comparator that records each op's measured
// error (printed at the end of a file) and fails with the worst element named.
import { expect } from 'vitest';
import type { Gpu } from '../../src/gpu/index.ts';
import { dequantizeQ4, quantizeQ4 } from '../../src/model/q4.ts';
import type { Weight } from '../../src/ops/index.ts';
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
    /**
     * A random (N, K) weight (randn x 0.1) on the GPU in `format`, and the values the kernels
     * multiply by: f32 as drawn, bf16 rounded, q4 quantized from the bf16 values and dequantized.
     * A q4 buffer holds whole vec4s, as gemv_rows binds it.
     */
    weight(format: 'f32' | 'bf16' | 'q4', N: number, K: number, seed: number): { w: Weight; vals: Float32Array } {
      const raw = ref.randn(N * K, ref.rng(seed), 0.1);
      if (format === 'f32') return { w: upload(raw, `wf32-${seed}`), vals: raw };
      const vals = ref.roundBf16(raw);
      if (format === 'bf16') return { w: upload(ref.packBf16(vals), `wbf16-${seed}`), vals };
      const bits = new Uint16Array(N * K);
      for (let i = 0; i < bits.length; i++) bits[i] = ref.f32ToBf16(vals[i]!);
      const packed = quantizeQ4(bits, N, K, 'w');
      const buf = getGpu().createBuffer(Math.ceil(packed.byteLength / 16) * 16, `wq4-${seed}`);
      getGpu().write(buf, packed);
      return { w: { format: 'q4', buf, N, K }, vals: dequantizeQ4(packed, N, K) };
    },
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
