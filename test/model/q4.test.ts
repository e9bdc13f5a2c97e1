// The q4 quantizer (src/model/q4.ts) on hand-built groups with exact ties, subnormal scales and
// clamping, its f16 rounding against a brute-force nearest search, and byte for byte against the
// independent Python packing of scripts/golden_q4.py (test/fixtures/golden-q4) for every
// quantized tensor of the three golden checkpoints. No GPU.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  dequantizeQ4,
  f16BitsToF32,
  f32ToF16Bits,
  logitDrift,
  Q4_GROUP,
  q4ScaleOffsetWords,
  q4Words,
  quantizeQ4,
} from '../../src/model/q4.ts';
import { openSafetensorsModel } from '../../src/model/safetensors.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';

const ROOT = join(import.meta.dirname, '../..');
const U = 2 ** -24; // smallest f16 subnormal

/** bf16 bits of x, which must be a bf16 value exactly. */
function bf16(x: number): number {
  const u = new Uint32Array(Float32Array.of(x).buffer)[0]!;
  if ((u & 0xffff) !== 0 || new Float32Array(Uint32Array.of(u).buffer)[0] !== x)
    throw new Error(`${x} is not a bf16 value`);
  return u >>> 16;
}

/** q and scale of one group (1, 32): `values` then zeros. Decoded from the words by the spec. */
function quantGroup(values: number[]): { q: number[]; sBits: number; s: number } {
  const w = new Uint16Array(Q4_GROUP);
  values.forEach((x, i) => {
    w[i] = bf16(x);
  });
  const packed = quantizeQ4(w, 1, Q4_GROUP, 'group');
  expect(packed.length).toBe(5); // 4 nibble words + 1 scale word (one group: high half unused)
  expect(packed[4]! >>> 16).toBe(0);
  const q = values.map((_, i) => ((packed[i >> 3]! >>> (4 * (i & 7))) & 15) - 8);
  const sBits = packed[4]! & 0xffff;
  return { q, sBits, s: f16BitsToF32(sBits) };
}

/** bf16 bits of x > 0, truncated (the largest bf16 <= the f32 of x). */
function bf16AtMost(x: number): number {
  return new Uint32Array(Float32Array.of(x).buffer)[0]! >>> 16;
}

/** Scale of one group (1, 32) given as bf16 bits. */
function quantGroupBits(w: Uint16Array): { s: number } {
  const p = quantizeQ4(w, 1, 32, 'g');
  return { s: f16BitsToF32(p[4]! & 0xffff) };
}

describe('f16 conversion', () => {
  it('f16BitsToF32: values increase by one ulp per step from 0 to 65504, signs and specials', () => {
    expect(f16BitsToF32(0)).toBe(0);
    for (let h = 0; h < 0x7bff; h++) {
      const e = Math.max((h >> 10) & 31, 1);
      expect(f16BitsToF32(h + 1) - f16BitsToF32(h)).toBe(2 ** (e - 25));
    }
    expect([f16BitsToF32(0x3c00), f16BitsToF32(0x7bff), f16BitsToF32(0x0400), f16BitsToF32(1)]).toEqual([
      1,
      65504,
      2 ** -14,
      U,
    ]);
    expect(f16BitsToF32(0xbc00)).toBe(-1);
    expect(f16BitsToF32(0x7c00)).toBe(Infinity);
    expect(f16BitsToF32(0xfc00)).toBe(-Infinity);
    expect(f16BitsToF32(0x7e00)).toBeNaN();
  });

  it('f32ToF16Bits: every f16 value, every midpoint (ties to even) and its neighbours, both signs', () => {
    const next = (x: number, dir: 1 | -1) => {
      // the adjacent f64 (x > 0)
      const b = new BigUint64Array(Float64Array.of(x).buffer);
      b[0] = b[0]! + BigInt(dir);
      return new Float64Array(b.buffer)[0]!;
    };
    const bad: string[] = [];
    const check = (x: number, want: number) => {
      if (f32ToF16Bits(x) !== want) bad.push(`${x} -> ${f32ToF16Bits(x)}, want ${want}`);
    };
    for (let h = 0; h <= 0x7bff; h++) {
      const v = f16BitsToF32(h);
      check(v, h);
      check(-v, h | 0x8000);
      const mid = h < 0x7bff ? (v + f16BitsToF32(h + 1)) / 2 : 65520; // exact in f64
      const even = h % 2 === 0 ? h : h + 1; // h + 1 = 0x7c00 (Inf) past 65504
      check(mid, even);
      check(-mid, even | 0x8000);
      check(next(mid, -1), h);
      check(next(mid, 1), h + 1);
    }
    expect(bad.slice(0, 5)).toEqual([]);
    expect(f32ToF16Bits(1e10)).toBe(0x7c00);
    expect(f32ToF16Bits(-Infinity)).toBe(0xfc00);
    expect(f32ToF16Bits(-0)).toBe(0x8000);
    expect(f32ToF16Bits(1e-300)).toBe(0);
    expect(f16BitsToF32(f32ToF16Bits(NaN))).toBeNaN();
  });

  it('f32ToF16Bits agrees with a brute-force nearest search on random values of every magnitude', () => {
    const values = Array.from({ length: 0x7c00 }, (_, h) => f16BitsToF32(h));
    let seed = 12345;
    const rand = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
    for (let n = 0; n < 3000; n++) {
      const x = 2 ** (-27 + 44 * rand()) * (rand() < 0.5 ? -1 : 1);
      let best = 0;
      for (let h = 1; h < values.length; h++) {
        const d = Math.abs(Math.abs(x) - values[h]!) - Math.abs(Math.abs(x) - values[best]!);
        if (d < 0 || (d === 0 && h % 2 === 0)) best = h;
      }
      const want = Math.abs(x) >= 65520 ? 0x7c00 : best;
      expect(f32ToF16Bits(x), `${x}`).toBe(want | (x < 0 ? 0x8000 : 0));
    }
  });
});

describe('quantizeQ4 on hand-built groups', () => {
  it('w / s exactly half-way rounds to even (half away from zero would give 3, -3, 1, -1, 7, -7, 5)', () => {
    const { q, sBits } = quantGroup([7, 2.5, -2.5, 3.5, 0.5, -0.5, 1.5, -1.5, 6.5, -6.5, 4.5, -5.5]);
    expect(sBits).toBe(0x3c00); // s = 1
    expect(q).toEqual([7, 2, -2, 4, 0, 0, 2, -2, 6, -6, 4, -6]);
  });

  it('w = -amax gives -7; zeros and -0 give 0', () => {
    expect(quantGroup([-7, 1, 0, -0])).toEqual({ q: [-7, 1, 0, 0], sBits: 0x3c00, s: 1 });
  });

  // amax / 7 can only land exactly half-way between two f16 values in the subnormal range: a
  // normal midpoint has 12 significant bits, and 7 times it has more than bf16's 8.
  it('amax / 7 exactly half-way between two f16 values rounds to the even one', () => {
    expect(quantGroup([(21 * U) / 2, (5 * U) / 2, (3 * U) / 2])).toEqual({ q: [5, 1, 1], sBits: 2, s: 2 * U }); // 1.5u -> 2u
    expect(quantGroup([(35 * U) / 2, 5 * U])).toEqual({ q: [7, 2], sBits: 2, s: 2 * U }); // 2.5u -> 2u; 8.75 -> 9 -> 7; 2.5 -> 2
    expect(quantGroup([(7 * U) / 2, -U]).s).toBe(0); // 0.5u -> 0: s = 0 although amax != 0
  });

  it('a scale rounded down (subnormal) clamps w / s to -8 and 7', () => {
    // amax / 7 = 10u/7 = 1.43u -> s = u: -10 -> -8, 7.5 -> 8 -> 7, 3 -> 3, -8.5 -> -8 (even; clamped anyway)
    expect(quantGroup([-10 * U, 7.5 * U, 3 * U, -8.5 * U])).toEqual({ q: [-8, 7, 3, -8], sBits: 1, s: U });
    // amax / 7 = 7.5u/7 -> s = u: -7.5 -> -8 (tie to even), 6.5 -> 6, 2.5 -> 2
    expect(quantGroup([-7.5 * U, 6.5 * U, 2.5 * U])).toEqual({ q: [-8, 6, 2], sBits: 1, s: U });
  });

  it('s = 0 groups (all zero, or amax below half the smallest subnormal) quantize to 0', () => {
    expect(quantGroup([0, 0])).toEqual({ q: [0, 0], sBits: 0, s: 0 });
    expect(quantGroup([3 * 2 ** -30, -(2 ** -27), 2 ** -126])).toEqual({ q: [0, 0, 0], sBits: 0, s: 0 });
    const w = new Uint16Array(32).fill(bf16(-(2 ** -27)));
    expect([...dequantizeQ4(quantizeQ4(w, 1, 32, 'z'), 1, 32)].every((x) => Object.is(x, 0))).toBe(true);
  });

  it('subnormal scales (not ties) are the nearest f16 subnormal', () => {
    expect(quantGroup([48 * U, -6 * U, 5 * U, -4 * U])).toEqual({ q: [7, -1, 1, -1], sBits: 7, s: 7 * U }); // 48u/7 = 6.86u -> 7u
    expect(quantGroup([512 * U, 100 * U, -256 * U])).toEqual({ q: [7, 1, -4], sBits: 73, s: 73 * U }); // 73.14u -> 73u; -3.51 -> -4
  });

  it('refuses K % 32 != 0, a wrong length, NaN and a scale beyond f16, naming the tensor', () => {
    expect(() => quantizeQ4(new Uint16Array(48), 1, 48, 'model.layers.3.mlp.up_proj.weight')).toThrow(
      /model\.layers\.3\.mlp\.up_proj\.weight.*multiple of 32/,
    );
    expect(() => quantizeQ4(new Uint16Array(64), 1, 32, 'lm_head.weight')).toThrow(/lm_head\.weight/);
    const big = new Uint16Array(32);
    big[5] = bf16(456704); // the largest bf16 amax whose scale is finite: 456704 / 7 -> 65248
    expect(quantGroupBits(big).s).toBe(65248);
    big[5] = bf16(-458752); // 458752 / 7 = 65536 >= 65520 -> Inf
    expect(() => quantizeQ4(big, 1, 32, 'model.embed_tokens.weight')).toThrow(RangeError);
    expect(() => quantizeQ4(big, 1, 32, 'model.embed_tokens.weight')).toThrow(/model\.embed_tokens\.weight.*row 0/);
    big[5] = 0x7f80; // +Inf
    expect(() => quantizeQ4(big, 1, 32, 'x.weight')).toThrow(/x\.weight/);
    big[5] = 0x7fc0; // NaN
    expect(() => quantizeQ4(big, 1, 32, 'y.weight')).toThrow(/y\.weight.*NaN/);
  });
});

describe('q4 layout', () => {
  it('sizes: N*K/8 nibble words, then ceil(N*K/64) scale words', () => {
    expect([q4ScaleOffsetWords(3, 32), q4Words(3, 32)]).toEqual([12, 14]);
    expect([q4ScaleOffsetWords(4, 64), q4Words(4, 64)]).toEqual([32, 36]);
    expect(() => q4Words(2, 40)).toThrow(/multiple of 32/);
  });

  it('nibble of (n, k) at word i >> 3, bits 4(i & 7); scale of group g in half g & 1 of word N*K/8 + g/2', () => {
    const N = 3,
      K = 64; // 6 groups
    const w = new Uint16Array(N * K);
    const qOf = (i: number) => (i % 32 === 0 ? 7 : ((i * 5) % 15) - 7);
    for (let i = 0; i < N * K; i++) w[i] = bf16(qOf(i) * ((i >> 5) + 1)); // group g: s = g + 1 exactly
    const p = quantizeQ4(w, N, K, 't');
    expect(p.length).toBe((N * K) / 8 + Math.ceil((N * K) / 64));
    for (let n = 0; n < N; n++) {
      for (let k = 0; k < K; k++) {
        const i = n * K + k;
        expect((p[i >> 3]! >>> (4 * (i & 7))) & 15).toBe(qOf(i) + 8);
      }
    }
    for (let g = 0; g < (N * K) / 32; g++)
      expect((p[(N * K) / 8 + (g >> 1)]! >>> (16 * (g & 1))) & 0xffff).toBe(f32ToF16Bits(g + 1));
    const dq = dequantizeQ4(p, N, K);
    for (let i = 0; i < N * K; i++) expect(dq[i]).toBe(qOf(i) * ((i >> 5) + 1));
  });

  it('an odd number of groups leaves the high half of the last scale word zero', () => {
    const w = new Uint16Array(3 * 32).fill(bf16(-3.5));
    const p = quantizeQ4(w, 3, 32, 't');
    expect(p.length).toBe(14);
    expect(p[13]! >>> 16).toBe(0);
    expect(p[13]! & 0xffff).toBe(f32ToF16Bits(0.5));
  });

  it('dequantize(quantize(w)) is within s / 2 of w on random tensors of every scale', () => {
    let seed = 7;
    const rand = () => (seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32;
    const N = 7,
      K = 96;
    for (const mag of [1e-4, 0.02, 1, 300, 5e4]) {
      const w = new Uint16Array(N * K);
      for (let i = 0; i < w.length; i++)
        w[i] = bf16AtMost(mag * (0.001 + rand()) * (rand() < 0.05 ? 8 : 1)) | (rand() < 0.5 ? 0x8000 : 0); // outliers x8
      const p = quantizeQ4(w, N, K, 'rand');
      const dq = dequantizeQ4(p, N, K);
      const value = (b: number) => new Float32Array(Uint32Array.of(b << 16).buffer)[0]!;
      for (let i = 0; i < w.length; i++) {
        const g = i >> 5;
        const s = f16BitsToF32((p[(N * K) / 8 + (g >> 1)]! >>> (16 * (g & 1))) & 0xffff);
        expect(Math.abs(value(w[i]!) - dq[i]!), `mag ${mag} i ${i}`).toBeLessThanOrEqual(s / 2);
      }
    }
  });
});

describe('against scripts/golden_q4.py (independent numpy packing)', () => {
  interface Q4Entry {
    shape: [number, number];
    words: number;
    sha256: string;
  }
  interface Expected {
    q4: Record<string, Q4Entry>;
    shape: [number, number];
    drift_vs_bf16: { max_abs: number; max_rel: number; mean_kl: number };
  }

  it.each(['tied', 'untied-sharded', 'mha'])('%s: every quantized tensor packs to the same bytes', async (variant) => {
    const exp = JSON.parse(
      await readFile(join(ROOT, 'test/fixtures/golden-q4', variant, 'expected.json'), 'utf8'),
    ) as Expected;
    const st = await openSafetensorsModel(nodeFolderSource(join(ROOT, 'test/fixtures/golden', variant)));
    const quantized = [...st.tensors.keys()]
      .filter((n) => n.endsWith('_proj.weight') || n === 'model.embed_tokens.weight' || n === 'lm_head.weight')
      .sort();
    expect(quantized).toEqual(Object.keys(exp.q4).sort());
    for (const name of quantized) {
      const [N, K] = st.tensors.get(name)!.shape as [number, number];
      const b = await st.readTensor(name);
      const packed = quantizeQ4(new Uint16Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)), N, K, name);
      expect([N, K, packed.length]).toEqual([...exp.q4[name]!.shape, exp.q4[name]!.words]);
      expect(createHash('sha256').update(new Uint8Array(packed.buffer)).digest('hex'), name).toBe(exp.q4[name]!.sha256);
      if (variant === 'tied' && name === 'model.embed_tokens.weight') {
        const file = await readFile(join(ROOT, 'test/fixtures/golden-q4/tied/embed.q4'));
        expect(Buffer.compare(Buffer.from(packed.buffer), file)).toBe(0);
      }
    }
  });

  it.each(['tied', 'untied-sharded', 'mha'])(
    "%s: logitDrift reproduces the script's drift numbers",
    async (variant) => {
      const exp = JSON.parse(
        await readFile(join(ROOT, 'test/fixtures/golden-q4', variant, 'expected.json'), 'utf8'),
      ) as Expected;
      const f32 = async (p: string) => new Float32Array((await readFile(p)).buffer.slice(0));
      const bf16Logits = await f32(join(ROOT, 'test/fixtures/golden', variant, 'logits.f32'));
      const q4Logits = await f32(join(ROOT, 'test/fixtures/golden-q4', variant, 'logits.f32'));
      const d = logitDrift(bf16Logits, q4Logits, exp.shape[1]);
      expect(d.maxAbs).toBe(exp.drift_vs_bf16.max_abs);
      expect(d.maxRel).toBe(exp.drift_vs_bf16.max_rel);
      expect(Math.abs(d.meanKl - exp.drift_vs_bf16.mean_kl)).toBeLessThanOrEqual(1e-9 * exp.drift_vs_bf16.mean_kl);
    },
  );
});

describe('logitDrift', () => {
  it('max abs, max rel and the mean KL(softmax(a) || softmax(b)) of small rows', () => {
    const a = Float32Array.of(0, 0, 2, 2);
    const b = Float32Array.of(Math.fround(Math.log(3)), 0, 2, 2);
    const d = logitDrift(a, b, 2);
    expect(d.maxAbs).toBe(Math.fround(Math.log(3)));
    expect(d.maxRel).toBe(Math.fround(Math.log(3)) / 2);
    // row 0: p = (1/2, 1/2), q ~ (3/4, 1/4): KL = ln(4/3) / 2; row 1: 0
    expect(d.meanKl).toBeCloseTo(Math.log(4 / 3) / 4, 7);
    expect(() => logitDrift(a, b.subarray(1), 2)).toThrow(RangeError);
  });
});
