// packHalf / unpackHalf (shaders/convert.wgsl) against CPU references written separately:
// f32ToF16Bits / f16BitsToF32 of src/model/q4.ts (arithmetic on values, not bits) and
// f32ToBf16 / bf16ToF32 of test/helpers/reference.ts. Casting is exact integer work, so the packed
// words must be bit-identical (NaN: any NaN), and unpacking must reproduce every 16-bit value.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { f16BitsToF32, f32ToF16Bits } from '../../src/model/q4.ts';
import { bf16ToF32, f32ToBf16 } from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';

let gpu: Gpu;
const { f32Buf, u32Buf, outBuf } = gpuHarness(() => gpu);
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

const toBits = { f16: f32ToF16Bits, bf16: f32ToBf16 };
const fromBits = { f16: f16BitsToF32, bf16: bf16ToF32 };
const bitsOf = (x: number) => new Uint32Array(Float32Array.of(x).buffer)[0];
const fromF32Bits = (u: number) => new Float32Array(Uint32Array.of(u).buffer)[0];

/** Values that probe every branch: ties both ways, subnormal edges, overflow edge, specials. */
function probes(): Float32Array {
  const v: number[] = [
    0,
    -0,
    1,
    -1,
    65504,
    65519.996,
    65520,
    -65520,
    65536,
    1e6,
    3.4e38,
    Infinity,
    -Infinity,
    NaN,
    2 ** -14,
    2 ** -14 * (1 - 2 ** -11),
    2 ** -24,
    2 ** -25,
    2 ** -25 * 1.0000001,
    3 * 2 ** -26,
    2 ** -26,
    1e-30,
    1e-40,
    1 + 2 ** -11,
    1 + 3 * 2 ** -11,
    1 + 2 ** -8,
    1 + 3 * 2 ** -8,
    1 + 2 ** -8 + 2 ** -20,
    0.1,
    -0.3,
    1234.5678,
  ];
  // f32 values exactly halfway between neighbouring f16 / bf16 values, and one ulp either side.
  for (const base of [0x3f800000, 0x42c80000, 0x38800000, 0x46fffe00]) {
    for (const low of [0x1000, 0x3000, 0x8000, 0x18000])
      for (const d of [-1, 0, 1]) v.push(fromF32Bits(base + low + d));
  }
  // A spread of magnitudes, as a residual stream has, both signs.
  let s = 12345;
  const rand = () => (s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32;
  for (let i = 0; i < 2000; i++) v.push((rand() - 0.5) * 2 ** (rand() * 60 - 30));
  if (v.length % 2 === 0) v.push(0.5); // odd count: the last word's high half stays 0
  return Float32Array.from(v);
}

describe.each(['f16', 'bf16'] as const)('packHalf / unpackHalf %s', (format) => {
  it('packs to nearest even bit-for-bit like the CPU reference', async () => {
    const x = probes();
    const n = x.length;
    expect(n % 2).toBe(1);
    const packed = outBuf(Math.ceil(n / 2), 'packed');
    K.packHalf(gpu, packed, f32Buf(x), n, format);
    const words = await gpu.readU32(packed, Math.ceil(n / 2));
    let mismatches = 0;
    for (let i = 0; i < n; i++) {
      const got = (words[i >> 1] >>> ((i & 1) * 16)) & 0xffff;
      const want = toBits[format](x[i]);
      const ok = Number.isNaN(x[i]) ? Number.isNaN(fromBits[format](got)) : got === want;
      if (!ok && mismatches++ < 5)
        console.log(
          `${format} x=${x[i]} (0x${bitsOf(x[i]).toString(16)}): got 0x${got.toString(16)} want 0x${want.toString(16)}`,
        );
    }
    expect(mismatches).toBe(0);
    expect(words[(n - 1) >> 1] >>> 16).toBe(0);
  });

  it('unpacks every one of the 65536 16-bit values exactly', async () => {
    const bits = Uint32Array.from({ length: 32768 }, (_, k) => (2 * k) | ((2 * k + 1) << 16));
    const out = outBuf(65536, 'unpacked');
    K.unpackHalf(gpu, out, u32Buf(bits), 65536, format);
    const got = await gpu.readF32(out, 65536);
    let mismatches = 0;
    for (let h = 0; h < 65536; h++) {
      const want = fromBits[format](h);
      const ok = Number.isNaN(want) ? Number.isNaN(got[h]) : Object.is(got[h], Math.fround(want));
      if (!ok && mismatches++ < 5) console.log(`${format} 0x${h.toString(16)}: got ${got[h]} want ${want}`);
    }
    expect(mismatches).toBe(0);
  });

  it('round-trips: unpack(pack(x)) is x rounded once, and packing that again changes nothing', async () => {
    const x = probes().filter((v) => Number.isFinite(v) && Math.abs(v) < 6e4);
    const n = x.length;
    const packed = outBuf(Math.ceil(n / 2)),
      back = outBuf(n),
      again = outBuf(Math.ceil(n / 2));
    K.packHalf(gpu, packed, f32Buf(x), n, format);
    K.unpackHalf(gpu, back, packed, n, format);
    K.packHalf(gpu, again, back, n, format);
    const r = await gpu.readF32(back, n);
    for (let i = 0; i < n; i++)
      expect(Object.is(r[i], Math.fround(fromBits[format](toBits[format](x[i])))), `x=${x[i]}`).toBe(true);
    expect(await gpu.readU32(again, Math.ceil(n / 2))).toEqual(await gpu.readU32(packed, Math.ceil(n / 2)));
  });
});

describe('packHalf / unpackHalf arguments', () => {
  it('refuses a short buffer, the same buffer twice, and an unknown format, naming them', () => {
    const x = outBuf(10, 'x10'),
      small = outBuf(2, 'small');
    expect(() => K.packHalf(gpu, small, x, 10, 'f16')).toThrow(/packHalf out.*'small'/);
    expect(() => K.unpackHalf(gpu, x, x, 10, 'bf16')).toThrow(/same buffer/);
    expect(() => K.packHalf(gpu, outBuf(5), x, 10, 'fp8' as K.HalfFormat)).toThrow(/format must be/);
  });
});
