// The fused q/k norm + RoPE of the inference forward (shaders/rope.wgsl qk_norm_rope) against
// the CPU reference (rmsNorm then rope, test/helpers/reference.ts), and bitwise against the four kernels
// it replaces, with and without subgroups.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import * as ref from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';

let sg: Gpu, tree: Gpu, gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, u32Buf, bf16Buf, outBuf, expectClose } = h;
beforeAll(async () => {
  sg = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
});
afterAll(() => {
  h.report('qkNormRope');
  sg?.destroy();
  tree?.destroy();
});

describe.each(['subgroups', 'shared'] as const)('qkNormRope (%s reduction)', (variant) => {
  beforeAll(() => {
    gpu = variant === 'subgroups' ? sg : tree;
  });
  const subgroups = variant === 'subgroups';
  // (T, NH, NKV, HD, positions up to): decode and prefill, GQA, HD 16 and 128, large positions.
  it.each([
    [1, 4, 2, 16, 40000],
    [7, 4, 2, 16, 12],
    [3, 2, 1, 128, 5000],
  ])('T=%i NH=%i NKV=%i HD=%i pos<%i', async (T, NH, NKV, HD, maxPos) => {
    {
      const rand = ref.rng(T * 31 + HD);
      const eps = 1e-6,
        theta = 1e6;
      const q = ref.randn(T * NH * HD, rand, 3);
      const k = ref.randn(T * NKV * HD, rand, 3);
      const qw = ref.roundBf16(ref.randn(HD, rand));
      const kw = ref.roundBf16(ref.randn(HD, rand));
      const pos = Uint32Array.from({ length: T }, () => Math.floor(rand() * maxPos));
      const [qb, kb, qwb, kwb, pb] = [f32Buf(q), f32Buf(k), bf16Buf(qw), bf16Buf(kw), u32Buf(pos)];
      const qo = outBuf(T * NH * HD),
        ko = outBuf(T * NKV * HD);
      K.qkNormRope(gpu, qo, ko, qb, kb, qwb, kwb, pb, T, NH, NKV, HD, eps, theta);
      // The four kernels it replaces.
      const qn = outBuf(T * NH * HD),
        kn = outBuf(T * NKV * HD);
      K.rmsNorm(gpu, qn, qb, qwb, T * NH, HD, eps);
      K.rmsNorm(gpu, kn, kb, kwb, T * NKV, HD, eps);
      K.rope(gpu, qn, pb, T, NH, HD, theta);
      K.rope(gpu, kn, pb, T, NKV, HD, theta);
      const [gq, gk, uq, uk] = [
        await gpu.readF32(qo),
        await gpu.readF32(ko),
        await gpu.readF32(qn),
        await gpu.readF32(kn),
      ];
      expect(Array.from(gq)).toEqual(Array.from(uq));
      expect(Array.from(gk)).toEqual(Array.from(uk));
      // The CPU reference.
      const wq = new Float64Array(T * NH * HD),
        wk = new Float64Array(T * NKV * HD);
      ref.rmsNorm(wq, q, qw, T * NH, HD, eps);
      ref.rmsNorm(wk, k, kw, T * NKV, HD, eps);
      ref.rope(wq, pos, T, NH, HD, theta);
      ref.rope(wk, pos, T, NKV, HD, theta);
      expectClose(`q T=${T} HD=${HD} sg=${subgroups}`, gq, wq, 1e-5, 1e-5);
      expectClose(`k T=${T} HD=${HD} sg=${subgroups}`, gk, wk, 1e-5, 1e-5);
    }
  });
});
