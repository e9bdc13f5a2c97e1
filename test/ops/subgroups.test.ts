// The subgroup variants of the reduction kernels (rmsNorm, rmsNormBackward, the GEMV matmul,
// sample, logSoftmaxGather) and their shared-memory fallbacks, side by side on two devices: the
// default one (SwiftShader offers `subgroups`, subgroup size 4) and one created with the feature
// disabled. Each op runs on both and is compared with the CPU reference at the tolerances of
// test/ops/kernels.test.ts, test/ops/backward.test.ts and test/ops/trainKernels.test.ts, and the test checks
// from the pipeline label which variant actually ran, so a silent fallback fails.
// Run: npx vitest run test/ops/subgroups.test.ts

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import * as TK from '../../src/ops/index.ts';
import * as ref from '../helpers/reference.ts';

const REL = 1e-5; // reductions: test/ops/kernels.test.ts
const ABS = 1e-6;
const LSE_ABS = 2e-5; // logSoftmaxGather: test/ops/trainKernels.test.ts

let sg: Gpu;
let tree: Gpu;
const measured: Record<string, string> = {};

beforeAll(async () => {
  sg = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
});

afterAll(() => {
  console.log(
    'subgroup vs shared-memory kernel errors:\n' +
      Object.entries(measured)
        .map(([k, v]) => `  ${k}: ${v}`)
        .join('\n'),
  );
  sg?.destroy();
  tree?.destroy();
});

const variants = [
  ['subgroups', () => sg],
  ['shared', () => tree],
] as const;

function upload(gpu: Gpu, data: Float32Array | Uint32Array, label: string): GPUBuffer {
  const buf = gpu.createBuffer(Math.max(4, data.byteLength), label);
  gpu.write(buf, data);
  return buf;
}
const f32Buf = (gpu: Gpu, data: ArrayLike<number>, label = 'f32') => upload(gpu, Float32Array.from(data), label);
const u32Buf = (gpu: Gpu, data: ArrayLike<number>, label = 'u32') => upload(gpu, Uint32Array.from(data), label);
const bf16Buf = (gpu: Gpu, data: Float32Array, label = 'bf16') => upload(gpu, ref.packBf16(data), label);
const outBuf = (gpu: Gpu, n: number, label = 'out') => gpu.createBuffer(Math.max(4, n * 4), label);

function expectClose(name: string, got: ArrayLike<number>, want: ArrayLike<number>, rel: number, abs: number): void {
  const d = ref.compare(got, want, rel, abs);
  measured[name] =
    `max|err| ${d.maxAbs.toExponential(2)}  max|ref| ${d.maxRef.toExponential(2)}  rel ${(d.maxAbs / (d.maxRef || 1)).toExponential(2)}`;
  expect(
    d.ok,
    `${name}: max|err| ${d.maxAbs} at ${d.worst} (got ${got[d.worst]}, want ${want[d.worst]}) > ${rel}*${d.maxRef}+${abs}`,
  ).toBe(true);
}

/** The pipeline `op` last ran on gpu is the subgroup one exactly on the subgroup device. */
function expectVariant(gpu: Gpu, op: string): void {
  const v = K.kernelVariant(gpu, op);
  expect(v, `${op} was not launched`).toBeDefined();
  expect(v!.subgroups, `${op} ran ${v!.label}`).toBe(gpu === sg);
}

describe('devices', () => {
  it('the default device has subgroups, the other does not', () => {
    expect(sg.features.subgroups).toBe(true);
    expect(tree.features.subgroups).toBe(false);
    expect(K.useSubgroups(sg)).toBe(true);
    expect(K.useSubgroups(tree)).toBe(false);
  });
});

describe.each(variants)('%s', (name, getGpu) => {
  // D <= 512 runs 64 threads per row, D > 512 256; D=1000 leaves threads without work.
  it.each([
    [3, 100],
    [17, 16],
    [2, 1000],
    [5, 33],
    [1, 2048],
  ])('rmsNorm + backward R=%i D=%i', async (R, D) => {
    const gpu = getGpu();
    const rand = ref.rng(3 + D);
    const x = ref.randn(R * D, rand, 3);
    const w = ref.roundBf16(ref.randn(D, rand));
    const dy = ref.randn(R * D, rand);
    const init = ref.randn(R * D, rand);
    const xb = f32Buf(gpu, x, 'x');
    const wb = bf16Buf(gpu, w, 'w');
    const out = outBuf(gpu, R * D);
    K.rmsNorm(gpu, out, xb, wb, R, D, 1e-6);
    expectVariant(gpu, 'rmsNorm');
    const want = new Float32Array(R * D);
    ref.rmsNorm(want, x, w, R, D, 1e-6);
    expectClose(`${name} rmsNorm R=${R} D=${D}`, await gpu.readF32(out, R * D), want, REL, ABS);

    const dx = f32Buf(gpu, init, 'dx');
    K.rmsNormBackward(gpu, dx, f32Buf(gpu, dy, 'dy'), xb, wb, R, D, 1e-6);
    expectVariant(gpu, 'rmsNormBackward');
    const wantDx = Float64Array.from(init);
    ref.rmsNormBackward(wantDx, dy, x, w, R, D, 1e-6);
    expectClose(`${name} rmsNormBackward R=${R} D=${D}`, await gpu.readF32(dx, R * D), wantDx, REL, ABS);
  });

  describe('matmul gemv', () => {
    beforeAll(() => {
      K.tuning.matmul = 'gemv';
    });
    afterAll(() => {
      K.tuning.matmul = 'auto';
    });
    // LANES = clamp(2^floor(log2(K/8)), 4, 64): K=3..63 -> 4 lanes (= SwiftShader's subgroup size),
    // K=130 -> 16, K >= 512 -> 64 lanes over 16 subgroups (the shared step). Odd and even K.
    it.each([
      [1, 7, 3],
      [4, 9, 8],
      [3, 50, 99],
      [8, 17, 130],
      [1, 1000, 100],
      [2, 33, 1024],
      [5, 70, 513],
    ])('T=%i N=%i K=%i', async (T, N, Kd) => {
      const gpu = getGpu();
      const rand = ref.rng(40 + T + Kd);
      const x = ref.randn(T * Kd, rand);
      const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
      const out = outBuf(gpu, T * N);
      K.matmul(gpu, out, f32Buf(gpu, x), bf16Buf(gpu, w), T, N, Kd);
      expectVariant(gpu, 'matmul');
      const want = new Float32Array(T * N);
      ref.matmul(want, x, w, T, N, Kd);
      expectClose(`${name} matmul gemv T=${T} N=${N} K=${Kd}`, await gpu.readF32(out, T * N), want, REL, ABS);
    });

    it('accumulate T=2 N=33 K=600', async () => {
      const gpu = getGpu();
      const [T, N, Kd] = [2, 33, 600];
      const rand = ref.rng(5);
      const x = ref.randn(T * Kd, rand);
      const w = ref.roundBf16(ref.randn(N * Kd, rand, 0.1));
      const init = ref.randn(T * N, rand);
      const out = f32Buf(gpu, init);
      K.matmul(gpu, out, f32Buf(gpu, x), bf16Buf(gpu, w), T, N, Kd, true);
      expectVariant(gpu, 'matmul');
      const want = init.slice();
      ref.matmul(want, x, w, T, N, Kd, true);
      expectClose(`${name} matmul+= gemv`, await gpu.readF32(out, T * N), want, REL, ABS);
    });
  });

  describe('sample', () => {
    const greedy = { temperature: 0, topK: 0, topP: 1 };

    it('greedy equals CPU argmax (ties, -inf, -0 vs +0, threads without tokens)', async () => {
      const gpu = getGpu();
      // WG = 16 (V=10: 6 threads own no token), 64 (V=1000), 256 (V=151936).
      for (const [B, V] of [
        [5, 10],
        [5, 1000],
        [1, 151936],
      ]) {
        const logits = ref.randn(B * V, ref.rng(11 + V), 3);
        if (B === 5) {
          logits[1 * V + 3] = logits[1 * V + V - 1] = 50; // tie: lowest index
          for (let i = 0; i < V; i++) logits[2 * V + i] = -Infinity; // all -inf: index 0
          for (let i = 0; i < V; i++) logits[3 * V + i] = -1 - i;
          logits[3 * V + 5] = 0;
          logits[3 * V + 2] = -0; // -0 ties with +0: index 2
          logits[4 * V + V - 1] = 60; // max at the very end
        }
        const ids = outBuf(gpu, B, 'ids');
        K.sample(gpu, ids, f32Buf(gpu, logits), B, V, greedy, 1, 0);
        expectVariant(gpu, 'sample');
        const got = Array.from(await gpu.readU32(ids, B));
        const want = Array.from({ length: B }, (_, b) => ref.argmax(logits, b * V, V));
        expect(got, `V=${V}`).toEqual(want);
        if (B === 5) expect(got.slice(1)).toEqual([3, 0, 2, V - 1]);
      }
    });

    // V=8 (WG 16) and V=700 (WG 64): 2000 draws, one row each; Pearson chi-square over the kept
    // tokens as in test/ops/kernels.test.ts (P(chi2 > 40) < 1e-6 for <= 7 degrees of freedom; for
    // V=700 only the <= 12 kept tokens count). Excluded tokens must never be drawn.
    const cases: [string, number, number, number, number][] = [
      ['V=8 plain softmax', 8, 1, 0, 1],
      ['V=8 temperature 1.5, top-k 6, top-p 0.7', 8, 1.5, 6, 0.7],
      ['V=700 top-k 5', 700, 1, 5, 1],
      ['V=700 temperature 0.5, top-p 0.9', 700, 0.5, 0, 0.9],
    ];
    it.each(cases)('distribution matches CPU: %s', async (label, V, temperature, topK, topP) => {
      const gpu = getGpu();
      const N = 2000;
      const row = V === 8 ? Float32Array.from([1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.9, 2.2]) : ref.randn(V, ref.rng(77), 1);
      if (V !== 8) for (let i = 0; i < 12; i++) row[i * 50] = 4 + 0.1 * i; // a few likely tokens
      const logits = new Float32Array(N * V);
      for (let b = 0; b < N; b++) logits.set(row, b * V);
      const ids = outBuf(gpu, N, 'ids');
      K.sample(gpu, ids, f32Buf(gpu, logits), N, V, { temperature, topK, topP }, 1234, 7);
      expectVariant(gpu, 'sample');
      const got = await gpu.readU32(ids, N);
      const p = ref.sampleDistribution(row, temperature, topK, topP);
      const counts = new Array(V).fill(0);
      for (const id of got) counts[id]++;
      let chi2 = 0;
      let kept = 0;
      for (let i = 0; i < V; i++) {
        if (p[i] === 0) expect(counts[i], `excluded token ${i} drawn`).toBe(0);
        else {
          kept++;
          chi2 += (counts[i] - N * p[i]) ** 2 / (N * p[i]);
        }
      }
      measured[`${name} sample chi2 ${label}`] = `${chi2.toFixed(2)} (df ${kept - 1})`;
      expect(kept).toBeLessThanOrEqual(13);
      expect(chi2).toBeLessThan(40);
    });
  });

  describe('logSoftmaxGather', () => {
    // (R, V, sigma): WG 64 with V=5 (threads without tokens), V=37 and V=1000; WG 256 at V=151936.
    it.each([
      [4, 5, 3],
      [70, 37, 10],
      [3, 1000, 10],
      [3, 151936, 10],
    ])('R=%i V=%i sigma=%i', async (R, V, sigma) => {
      const gpu = getGpu();
      const rand = ref.rng(V + sigma);
      const logits = ref.randn(R * V, rand, sigma);
      const targets = Array.from({ length: R }, (_, r) => (r * 7919 + 3) % V);
      const logp = outBuf(gpu, R, 'logp');
      const lse = outBuf(gpu, R, 'lse');
      TK.logSoftmaxGather(gpu, logp, lse, f32Buf(gpu, logits, 'logits'), u32Buf(gpu, targets), R, V);
      expectVariant(gpu, 'logSoftmaxGather');
      const wantLse = new Float64Array(R);
      const wantLogp = new Float64Array(R);
      for (let r = 0; r < R; r++) {
        let mx = -Infinity;
        for (let v = 0; v < V; v++) mx = Math.max(mx, logits[r * V + v]);
        let s = 0;
        for (let v = 0; v < V; v++) s += Math.exp(logits[r * V + v] - mx);
        wantLse[r] = mx + Math.log(s);
        wantLogp[r] = logits[r * V + targets[r]] - wantLse[r];
      }
      expectClose(`${name} logSoftmaxGather R=${R} V=${V} lse`, await gpu.readF32(lse, R), wantLse, 0, LSE_ABS);
      expectClose(`${name} logSoftmaxGather R=${R} V=${V} logp`, await gpu.readF32(logp, R), wantLogp, 0, LSE_ABS);
    });
  });
});

describe('both variants agree', () => {
  it('sample draws the same ids from the same seed (sums differ only in rounding)', async () => {
    const [B, V] = [256, 300];
    const logits = ref.randn(B * V, ref.rng(12), 2);
    const opts = { temperature: 0.8, topK: 40, topP: 0.9 };
    const draw = async (gpu: Gpu) => {
      const ids = outBuf(gpu, B, 'ids');
      K.sample(gpu, ids, f32Buf(gpu, logits), B, V, opts, 42, 3);
      return Array.from(await gpu.readU32(ids, B));
    };
    const a = await draw(sg);
    const b = await draw(tree);
    const same = a.filter((id, i) => id === b[i]).length;
    measured['sample same ids (subgroups vs shared)'] = `${same} / ${B}`;
    expect(same).toBeGreaterThanOrEqual(B - 2);
    expect(await draw(sg)).toEqual(a); // deterministic
  });
});
