// matmul's `lora` (K.LoraEpilogue): out (+)= x . W^T + s u . B^T, the LoRA branch's B product added
// in the GEMV's store (shaders/gemv.wgsl define LORA, tuning.loraFold) where matmul takes
// gemv_rows (CPU adapters) or gemv_lanes (GPUs, with the subgroup and the shared-memory
// reductions): against the CPU reference (f64) for bf16 and q4 weights, r = 1, 4 and 16, with and
// without accumulate, rows past M in a TMAX group and more columns than one workgroup's. Where
// it does not ride in the store (tuning.loraFold 'off', the word-by-word matmul_gemv, prefill's
// tiled GEMM) the same call runs the B product as its own matmulF32, to the same values.
// Run: npx vitest run test/ops/loraFold.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
let tree: Gpu; // no subgroups: gemv_lanes' shared-memory reduction
let current: Gpu;
const h = gpuHarness(() => current);
const { f32Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
  current = gpu;
});
afterEach(() => K.resetTuning());
afterAll(() => {
  h.report('LoRA fold errors');
  gpu?.destroy();
  tree?.destroy();
});

/**
 * matmul with a LoRA epilogue on `current`; checks the values against f64 and returns the
 * dispatches it took and the label of the kernel that carried the LoRA ('' where none did).
 */
async function check(
  format: 'bf16' | 'q4',
  T: number,
  N: number,
  Kd: number,
  r: number,
  accumulate: boolean,
): Promise<{ dispatches: number; label: string }> {
  const name = `${format} T=${T} N=${N} K=${Kd} r=${r}${accumulate ? ' +=' : ''} ${K.tuning.matmul}/${K.tuning.loraFold} ${current === gpu ? 'subgroups' : 'shared'}`;
  const rand = ref.rng(T * 131 + N * 7 + Kd + r);
  const x = ref.randn(T * Kd, rand);
  const u = ref.randn(T * r, rand);
  const B = ref.randn(N * r, rand, 0.3);
  const scale = 0.75;
  const { w, vals } = h.weight(format, N, Kd, T + N + r);
  const init = ref.randn(T * N, rand);
  const out = accumulate ? f32Buf(init, 'out') : outBuf(T * N);
  const uBuf = f32Buf(u, 'u'),
    bBuf = f32Buf(B, 'B');
  const d0 = current.dispatchCount;
  K.forgetKernelVariants(current);
  K.matmul(current, out, f32Buf(x), w, T, N, Kd, accumulate, { u: uBuf, B: bBuf, r, scale });
  const dispatches = current.dispatchCount - d0;
  const label = K.kernelVariant(current, 'matmulLora')?.label ?? '';
  const want = new Float64Array(T * N);
  if (accumulate) want.set(init);
  ref.matmul(want, x, vals, T, N, Kd, accumulate);
  ref.matmulF32(want, u, B, T, N, r, true, scale);
  expectClose(name, await current.readF32(out, T * N), want, 2e-6, 1e-6);
  return { dispatches, label };
}

describe.each([
  ['gemv_rows (CPU adapters)', 'blocks', () => gpu],
  ['gemv_lanes, subgroup reduction', 'lanes', () => gpu],
  ['gemv_lanes, shared-memory reduction', 'lanes', () => tree],
] as const)('in the store: %s', (_, matmul, getGpu) => {
  beforeAll(() => {
    current = getGpu();
  });
  // (format, T, N, K, r): odd N past a workgroup's columns, T short of its TMAX group.
  it.each([
    ['bf16', 1, 300, 256, 16],
    ['bf16', 3, 70, 520, 4],
    ['q4', 4, 33, 544, 16],
    ['q4', 5, 260, 256, 1],
    ['bf16', 8, 17, 776, 8],
  ] as const)('%s T=%i N=%i K=%i r=%i, out = and out +=', async (format, T, N, Kd, r) => {
    K.tuning.matmul = matmul;
    for (const accumulate of [false, true]) {
      const { dispatches, label } = await check(format, T, N, Kd, r, accumulate);
      expect(dispatches, 'one dispatch').toBe(1);
      expect(label).toContain(`gemv.gemv_${matmul === 'blocks' ? 'rows' : 'lanes'}[`);
      expect(label).toContain('LORA=1');
    }
  });
});

describe('apart from the product: the B product its own matmulF32', () => {
  beforeAll(() => {
    current = gpu;
  });
  it.each([
    ["tuning.loraFold 'off' (gemv_rows)", { matmul: 'blocks', loraFold: 'off' }, 3],
    ["tuning.loraFold 'off' (gemv_lanes)", { matmul: 'lanes', loraFold: 'off' }, 3],
    ['matmul_gemv', { matmul: 'gemv' }, 3],
    ['unaligned rows (bf16, K % 8 != 0: matmul_gemv)', { matmul: 'lanes' }, 3],
    // f32 tiles: the f16 ones (a GPU's 'auto' with shader-f16, lavapipe) round past this bound.
    [`tiled GEMM (T > GEMV_MAX_T)`, { matmul: 'auto', autoFor: 'gpu', gemmF16: 'off' }, K.GEMV_MAX_T + 2],
  ] as const)('%s', async (what, tuning, T) => {
    K.resetTuning(tuning);
    const unaligned = what.startsWith('unaligned');
    for (const accumulate of [false, true]) {
      const { dispatches, label } = await check(unaligned ? 'bf16' : 'q4', T, 40, unaligned ? 100 : 96, 4, accumulate);
      expect(label, 'no kernel carried the LoRA').toBe('');
      expect(dispatches, 'the product, then the B product').toBeGreaterThanOrEqual(2);
    }
  });
  it('bad LoRA operands name what is wrong', () => {
    const w = h.weight('bf16', 8, 32, 1).w;
    const x = f32Buf(new Float32Array(2 * 32)),
      out = outBuf(2 * 8);
    const u = f32Buf(new Float32Array(2 * 4)),
      B = f32Buf(new Float32Array(8 * 4));
    expect(() => K.matmul(gpu, out, x, w, 2, 8, 32, false, { u, B, r: 0, scale: 1 })).toThrow(/LoRA rank/);
    expect(() => K.matmul(gpu, out, x, w, 2, 8, 32, false, { u, B: u, r: 4, scale: 1 })).toThrow(/matmul lora B/);
    expect(() => K.matmul(gpu, out, x, w, 2, 8, 32, false, { u: out, B, r: 4, scale: 1 })).toThrow();
  });
});
