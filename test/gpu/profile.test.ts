// Gpu.startProfile / stopProfile: GPU time per kernel from timestamp queries around each dispatch.
// Checked: every dispatch is counted under its pipeline's label (across more dispatches than one
// query set holds, so the profile spans submits), the results are the same with the profile on,
// a kernel doing 256x the work of another reads longer, the per-kernel sums fit inside the wall
// time, and the misuses are clear errors. Run: npx vitest run test/gpu/profile.test.ts
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, GpuError, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

describe('kernel profile', () => {
  it('counts every dispatch per kernel, across submits, without changing results', async () => {
    expect(gpu.features.timestampQuery, 'SwiftShader and lavapipe offer timestamp-query').toBe(true);
    const [T, N, Kd] = [2, 64, 256];
    const x = ref.randn(T * Kd, ref.rng(1));
    const w = ref.roundBf16(ref.randn(N * Kd, ref.rng(2), 0.1));
    const xb = gpu.createBuffer(x.byteLength, 'x');
    gpu.write(xb, x);
    const wb = gpu.createBuffer(w.length * 2, 'w');
    gpu.write(wb, ref.packBf16(w));
    const small = gpu.createBuffer(T * N * 4, 'small');
    const normed = gpu.createBuffer(T * N * 4, 'normed');
    const normW = gpu.createBuffer(N * 2, 'normW');
    gpu.write(normW, ref.packBf16(new Float32Array(N).fill(1)));
    // 256x the rows: on SwiftShader one dispatch's own overhead has read up to 7 ms, which a
    // 32x product (64 rows, about 6 ms a call) did not always clear.
    const BIG = 256;
    const big = gpu.createBuffer(BIG * T * N * 4, 'big');
    const bigX = gpu.createBuffer(BIG * x.byteLength, 'bigX');
    for (let i = 0; i < BIG; i++) gpu.write(bigX, x, i * x.byteLength);
    K.matmul(gpu, small, xb, wb, T, N, Kd);
    const before = await gpu.readF32(small);

    const t0 = performance.now();
    gpu.startProfile();
    const reps = 2100; // past 2048 dispatches: one query set per submit, so the profile spans submits
    for (let i = 0; i < reps; i++) K.rmsNorm(gpu, normed, small, normW, T, N, 1e-6);
    K.matmul(gpu, small, xb, wb, T, N, Kd);
    const smallLabel = K.kernelVariant(gpu, 'matmul')!.label;
    for (let i = 0; i < 3; i++) K.matmul(gpu, big, bigX, wb, BIG * T, N, Kd);
    const bigLabel = K.kernelVariant(gpu, 'matmul')!.label;
    const prof = await gpu.stopProfile();
    const wall = (performance.now() - t0) / 1000;

    expect(Array.from(await gpu.readF32(small))).toEqual(Array.from(before));
    const byLabel = new Map(prof.map((k) => [k.label, k]));
    const norm = byLabel.get(K.kernelVariant(gpu, 'rmsNorm')!.label)!;
    expect(norm.calls).toBe(reps);
    let total = 0;
    for (const k of prof) {
      expect(k.seconds).toBeGreaterThanOrEqual(0);
      total += k.seconds;
    }
    expect(total).toBeGreaterThan(0);
    expect(total).toBeLessThanOrEqual(wall);
    for (let i = 1; i < prof.length; i++) expect(prof[i]!.seconds).toBeLessThanOrEqual(prof[i - 1]!.seconds);
    if (smallLabel === bigLabel) {
      expect(byLabel.get(bigLabel)!.calls).toBe(4);
    } else {
      // 256x the rows of the same weight: more GPU time per call than the 2-row product.
      const perCall = (l: string) => byLabel.get(l)!.seconds / byLabel.get(l)!.calls;
      expect(byLabel.get(smallLabel)!.calls).toBe(1);
      expect(byLabel.get(bigLabel)!.calls).toBe(3);
      expect(perCall(bigLabel)).toBeGreaterThan(perCall(smallLabel));
    }
    // Dispatches after the profile are not counted and run as before.
    K.matmul(gpu, small, xb, wb, T, N, Kd);
    expect(Array.from(await gpu.readF32(small))).toEqual(Array.from(before));
  });

  it('misuse is one clear error', async () => {
    await expect(gpu.stopProfile()).rejects.toThrow(/no profile is running/);
    gpu.startProfile();
    expect(() => gpu.startProfile()).toThrow(/already running/);
    await gpu.stopProfile();
    const plain = await createGpu({ disableFeatures: ['timestamp-query'] });
    try {
      expect(() => plain.startProfile()).toThrow(GpuError);
      expect(() => plain.startProfile()).toThrow(/timestamp-query/);
    } finally {
      plain.destroy();
    }
  });
});
