// A LoRA branch added in the tiled GEMM's store (shaders/matmul.wgsl define LORA with VEC,
// tuning.loraFold): the forward K.matmul's `lora`, out (+)= x . W^T + s u . B^T (u = x . A^T
// computed before), and the input gradient K.matmulBackwardInput's `lora`, dx (+)= dy . W + s du . A
// (define BT: A (r, K) read across its rows). Against the f64 CPU reference with the f32 tolerance
// of the other matmul tests, bf16 and q4 weights, across the tile edges in M (64, 128), N (128) and
// R (16), with accumulate, split over R (only slice 0 adds the branch) and in 128-row tiles (TM8).
// The launched kernel is checked to be the LORA one (op matmulLora / matmulBackwardInputLora), and
// the separate product to run instead with tuning.loraFold 'off' and where the 16-byte-load tiles
// do not (K % 8 != 0: the r-major tiles), within f32 rounding of the same reference.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, outBuf } = h;
const REL = 1e-5;
const ABS = 1e-6;
const R = 16; // the LoRA rank
const S = 0.5; // its scale

beforeAll(async () => {
  gpu = await createGpu();
  K.tuning.matmul = 'tiled';
  K.tuning.gemmF16 = 'off';
  K.tuning.gemmSubgroups = 'off';
});

afterAll(() => {
  K.resetTuning();
  h.report('gemm_tiled LORA errors');
  gpu?.destroy();
});

const definesOf = (op: string) => K.kernelVariant(gpu, op)?.defines as Record<string, unknown> | undefined;

/** Runs `call` under the switches, restoring them after. */
function withTuning<T>(set: Partial<K.Tuning>, call: () => T): T {
  const saved = { ...K.tuning };
  Object.assign(K.tuning, set);
  try {
    return call();
  } finally {
    Object.assign(K.tuning, saved);
  }
}

// (format, T, N, K, accumulate, split-K, tile)
const CASES = [
  ['bf16', 70, 132, 200, false, 'auto', 'auto'],
  ['bf16', 130, 136, 48, true, 'auto', '128'],
  ['q4', 65, 96, 256, true, 'on', 'auto'],
  ['q4', 200, 40, 96, false, 'on', '128'],
  ['bf16', 9, 256, 64, true, 'auto', 'auto'],
] as const;

describe('the forward product with its LoRA branch in the store', () => {
  it.for(CASES)('%s T=%i N=%i K=%i accumulate=%s splitK=%s tile=%s', async ([format, T, N, Kd, acc, split, tile]) => {
    const rand = ref.rng(T * 17 + N + Kd);
    const x = ref.randn(T * Kd, rand);
    const u = ref.randn(T * R, rand);
    const B = ref.randn(N * R, rand, 0.1);
    const init = acc ? ref.randn(T * N, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + N);
    const want = init ? Float64Array.from(init) : new Float64Array(T * N);
    ref.matmul(want, x, vals, T, N, Kd, acc);
    ref.matmulF32(want, u, B, T, N, R, true, S);
    for (const fold of ['auto', 'off'] as const) {
      const out = init ? f32Buf(init, 'out') : outBuf(T * N);
      withTuning({ gemmSplitK: split, gemmTile: tile, loraFold: fold }, () =>
        K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, acc, { u: f32Buf(u, 'u'), B: f32Buf(B, 'B'), r: R, scale: S }),
      );
      const d = definesOf(fold === 'auto' ? 'matmulLora' : 'matmul')!;
      if (fold === 'auto') {
        expect([d.VEC, d.LORA, d.SPLITK, d.TM8], 'the LoRA store ran').toEqual([
          1,
          1,
          split === 'on' ? 1 : undefined,
          tile === '128' ? 1 : undefined,
        ]);
      } else expect(d.LORA, "loraFold 'off': the plain product, then the branch's").toBeUndefined();
      h.expectClose(
        `matmul ${format} T=${T} N=${N} K=${Kd} ${fold === 'auto' ? 'LORA' : 'separate'}${split === 'on' ? ' split-K' : ''}${tile === '128' ? ' TM8' : ''}`,
        await gpu.readF32(out, T * N),
        want,
        REL,
        ABS,
      );
    }
  });

  it('K % 8 != 0: the r-major tiles, the branch as a product of its own', async () => {
    const [T, N, Kd] = [70, 40, 12];
    const rand = ref.rng(3);
    const x = ref.randn(T * Kd, rand);
    const u = ref.randn(T * R, rand);
    const B = ref.randn(N * R, rand, 0.1);
    const { w, vals } = h.weight('bf16', N, Kd, 11);
    const want = new Float64Array(T * N);
    ref.matmul(want, x, vals, T, N, Kd);
    ref.matmulF32(want, u, B, T, N, R, true, S);
    const out = outBuf(T * N);
    K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, false, { u: f32Buf(u, 'u'), B: f32Buf(B, 'B'), r: R, scale: S });
    expect(definesOf('matmulLora')!.VEC, 'the r-major tiles ran').toBeUndefined();
    expect(definesOf('matmulLora')!.LORA).toBeUndefined();
    h.expectClose(`matmul bf16 T=${T} N=${N} K=${Kd} r-major, separate`, await gpu.readF32(out, T * N), want, REL, ABS);
  });
});

describe("the input gradient with its LoRA branch's part in the store", () => {
  // dx (T, K) (+)= dy (T, N) . W (N, K) + du (T, r) . A (r, K)
  it.for(CASES)('%s T=%i N=%i K=%i accumulate=%s splitK=%s tile=%s', async ([format, T, N, Kd, acc, split, tile]) => {
    const rand = ref.rng(T * 19 + N + Kd);
    const dy = ref.randn(T * N, rand);
    const du = ref.randn(T * R, rand);
    const A = ref.randn(R * Kd, rand, 0.1);
    const init = acc ? ref.randn(T * Kd, rand) : null;
    const { w, vals } = h.weight(format, N, Kd, T + 3 * N);
    const want = init ? Float64Array.from(init) : new Float64Array(T * Kd);
    ref.matmulBackwardInput(want, dy, vals, T, N, Kd, acc);
    ref.matmulBackwardInput(want, du, A, T, R, Kd, true, S);
    for (const fold of ['auto', 'off'] as const) {
      const dx = init ? f32Buf(init, 'dx') : outBuf(T * Kd);
      withTuning({ gemmSplitK: split, gemmTile: tile, loraFold: fold }, () =>
        K.matmulBackwardInput(gpu, dx, f32Buf(dy), w, T, N, Kd, acc, {
          u: f32Buf(du, 'du'),
          B: f32Buf(A, 'A'),
          r: R,
          scale: S,
        }),
      );
      if (fold === 'auto') {
        const d = definesOf('matmulBackwardInputLora')!;
        expect([d.VEC, d.BT, d.LORA, d.SPLITK, d.TM8], 'the LoRA store ran').toEqual([
          1,
          1,
          1,
          split === 'on' ? 1 : undefined,
          tile === '128' ? 1 : undefined,
        ]);
      } else expect(definesOf('matmulBackwardInput')!.LORA, "loraFold 'off'").toBeUndefined();
      h.expectClose(
        `matmulBackwardInput ${format} T=${T} N=${N} K=${Kd} ${fold === 'auto' ? 'LORA' : 'separate'}${split === 'on' ? ' split-K' : ''}${tile === '128' ? ' TM8' : ''}`,
        await gpu.readF32(dx, T * Kd),
        want,
        REL,
        ABS,
      );
    }
  });

  it('names a LoRA part of the wrong size', () => {
    const dx = outBuf(8 * 32);
    const { w } = h.weight('bf16', 16, 32, 1);
    expect(() =>
      K.matmulBackwardInput(gpu, dx, outBuf(8 * 16), w, 8, 16, 32, false, {
        u: outBuf(8 * R),
        B: outBuf(R * 31),
        r: R,
        scale: 1,
      }),
    ).toThrow(/matmulBackwardInput lora A/);
  });
});
