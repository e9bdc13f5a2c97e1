// gemv_lanes with several output columns a thread (shaders/gemv.wgsl CPT, tuning.gemvCols,
// src/ops/colsSplit.ts colsPerThread): each part of x read from workgroup memory serves CPT
// columns, the lanes a column are multiplied by CPT and a workgroup keeps its columns. The rule's
// arithmetic at Qwen3-4B's shapes; then, with the GPU GEMV forced, CPT 2 and 4 bit for bit
// against one column a thread over as many lanes (the same sums in the same order), and against
// the CPU reference (f64): bf16, q4 and f32 weights; one weight, the q/k/v and gate/up groups with
// the folded RMSNorm, a LoRA B product in the store, the SwiGLU formed as x is staged, the LoRA B
// products of a group (matmulEachF32); rows across staging chunks at TMAX 1, 2, 4 and 8; columns
// past N in a thread's later slots; the subgroup and the shared-memory reductions. 'auto' takes
// CPT on a GPU's choices only.
// Run: npx vitest run test/ops/gemvCpt.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { colsPerThread, CPT_LANES_MAX } from '../../src/ops/colsSplit.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

describe('colsPerThread', () => {
  it('takes 4 or 2 columns a thread while the lanes stay within 32 and one chunk of blocks', () => {
    expect(CPT_LANES_MAX).toBe(32);
    // Qwen3-4B q4, B = 1: q/k/v and gate/up (8 lanes, K = 2560: 80 blocks, 2048-element chunks
    // with the folded norm: 64 blocks) take 4; o_proj (K = 4096) and down_proj (9728) at 16 lanes 2.
    expect(colsPerThread(8, 2560, 32, 2048)).toBe(4);
    expect(colsPerThread(16, 4096, 32, 4096)).toBe(2);
    expect(colsPerThread(16, 9728, 32, 4096)).toBe(2);
    // B = 4: the folded norm's chunks of 512 elements (16 q4 blocks) leave 8 lanes 2 columns; the
    // LM head's 1024-element chunks (32 blocks) 4.
    expect(colsPerThread(8, 2560, 32, 512)).toBe(2);
    expect(colsPerThread(8, 2560, 32, 1024)).toBe(4);
    // B = 8 over 16 lanes: chunks of 512 elements hold 16 blocks, one a lane: no room.
    expect(colsPerThread(16, 2560, 32, 512)).toBe(1);
    // Rows shorter than a chunk count their own blocks: the LoRA B products (K = r = 16 f32: 4 blocks).
    expect(colsPerThread(4, 16, 4, 4096)).toBe(1);
    expect(colsPerThread(4, 32, 4, 4096)).toBe(2);
    // bf16 at 16 lanes (K = 2560: 320 blocks) 2; 64 widened lanes none.
    expect(colsPerThread(16, 2560, 8, 4096)).toBe(2);
    expect(colsPerThread(64, 2560, 4, 4096)).toBe(1);
  });
});

let gpu: Gpu;
let tree: Gpu; // no subgroups: the shared-memory reduction
let current: Gpu;
const h = gpuHarness(() => current);
const { f32Buf, bf16Buf, outBuf, expectClose } = h;

beforeAll(async () => {
  gpu = await createGpu();
  tree = await createGpu({ disableFeatures: ['subgroups'] });
  K.tuning.matmul = 'lanes';
  K.tuning.gemvWideLanes = 'off';
  K.tuning.gemvSplitK = 'off';
});

afterEach(() => {
  K.tuning.gemvLanes = 'auto';
  K.tuning.gemvCols = 'auto';
  K.tuning.autoFor = 'auto';
});

afterAll(() => {
  K.tuning.matmul = 'auto';
  K.tuning.gemvWideLanes = 'auto';
  K.tuning.gemvSplitK = 'auto';
  h.report('gemv_lanes, columns a thread: errors');
  gpu?.destroy();
  tree?.destroy();
});

type Lanes = '4' | '8' | '16';
type Cols = '1' | '2' | '4';

/** Runs `product` under the lane and column settings; returns its output and the kernel's defines. */
async function under(
  lanes: Lanes,
  cols: Cols,
  op: string,
  n: number,
  product: () => GPUBuffer,
): Promise<{ out: Float32Array; defines: Record<string, unknown>; label: string }> {
  K.tuning.gemvLanes = lanes;
  K.tuning.gemvCols = cols;
  const out = product();
  const v = K.kernelVariant(current, op)!;
  return { out: await current.readF32(out, n), defines: { ...v.defines }, label: v.label };
}

/**
 * One product three ways: `cpt` columns a thread over `lanes` staged lanes (so lanes * cpt a
 * column), and one column a thread over lanes * cpt: bitwise equal; both within f32 rounding of
 * the f64 reference `want`.
 */
async function againstOneColumn(
  name: string,
  op: string,
  n: number,
  lanes: Lanes,
  cpt: 2 | 4,
  product: () => GPUBuffer,
  want: Float64Array,
  rel = 2e-6,
): Promise<void> {
  const wide = String(Number(lanes) * cpt) as Lanes;
  const many = await under(lanes, String(cpt) as Cols, op, n, product);
  const one = await under(wide, '1', op, n, product);
  const tag = `${name} ${current === tree ? 'shared' : 'subgroups'}`;
  expect(many.label, tag).toContain('gemv.gemv_lanes');
  expect(many.defines.CPT, tag).toBe(cpt);
  expect(many.defines.LANES, tag).toBe(Number(wide));
  expect(many.defines.COLS, tag).toBe(256 / Number(lanes));
  expect(one.defines.CPT, tag).toBeUndefined();
  expect(one.defines.LANES, tag).toBe(Number(wide));
  let differ = 0;
  for (let i = 0; i < n; i++) if (!Object.is(many.out[i], one.out[i])) differ++;
  expect(differ, `${tag}: elements that differ from one column a thread`).toBe(0);
  expectClose(`${tag} CPT ${cpt}`, many.out, want, rel, 1e-6);
}

describe.each([
  ['subgroups', () => gpu],
  ['shared memory', () => tree],
] as const)('gemv_lanes with CPT columns a thread, %s reduction', (_, getGpu) => {
  beforeAll(() => {
    current = getGpu();
  });

  // (format, T, N, K, staged lanes, CPT): N past a workgroup's columns and odd (a thread's later
  // columns past N), K across staging chunks at each TMAX.
  it.each([
    ['q4', 1, 37, 2560, '4', 4], // COLS 64, 16 lanes; one chunk
    ['q4', 3, 70, 1088, '8', 2], // TMAX 4: chunks of 32 blocks, 34 blocks a row
    ['q4', 6, 19, 800, '4', 4], // TMAX 8: chunks of 16 blocks
    ['bf16', 2, 45, 2112, '8', 2], // TMAX 2: chunks of 1024 elements
    ['bf16', 1, 21, 520, '4', 4],
    ['f32', 4, 40, 260, '4', 2], // LoRA-like f32 rows
  ] as const)('%s T=%i N=%i K=%i, %s lanes x %i', async (format, T, N, Kd, lanes, cpt) => {
    const rand = ref.rng(T * 17 + N + Kd);
    const x = f32Buf(ref.randn(T * Kd, rand));
    const xs = ref.randn(T * Kd, ref.rng(T * 17 + N + Kd));
    const { w, vals } = h.weight(format, N, Kd, T + 3 * N);
    const init = ref.randn(T * N, rand);
    const want = new Float64Array(init);
    const op = format === 'f32' ? 'matmulF32' : 'matmul';
    if (format === 'f32') ref.matmulF32(want, xs, vals, T, N, Kd, true, 0.5);
    else ref.matmul(want, xs, vals, T, N, Kd, true);
    const product = () => {
      const out = f32Buf(init, 'out');
      if (format === 'f32') K.matmulF32(current, out, x, w as GPUBuffer, T, N, Kd, true, 0.5);
      else K.matmul(current, out, x, w, T, N, Kd, true);
      return out;
    };
    await againstOneColumn(`${format} T=${T} N=${N} K=${Kd}`, op, T * N, lanes, cpt, product, want);
  });

  it('the q/k/v group with the folded RMSNorm (q4) and the gate/up group (bf16)', async () => {
    for (const [format, T, Ns, Kd, lanes, cpt] of [
      ['q4', 2, [40, 12, 12], 1024, '4', 4],
      ['bf16', 4, [33, 33], 512, '8', 2],
    ] as const) {
      const rand = ref.rng(T * 5 + Kd);
      const xv = ref.randn(T * Kd, rand, 2);
      const normVals = ref.roundBf16(ref.randn(Kd, rand));
      const x = f32Buf(xv);
      const norm = { w: bf16Buf(normVals), eps: 1e-6 };
      const ws = Ns.map((N, i) => h.weight(format, N, Kd, 50 * T + 7 * i));
      const outs = Ns.map((N) => outBuf(T * N));
      // The reference: rmsnorm in f64, then each product.
      const normed = new Float64Array(T * Kd);
      for (let t = 0; t < T; t++) {
        let ss = 0;
        for (let k = 0; k < Kd; k++) ss += xv[t * Kd + k]! ** 2;
        const rs = 1 / Math.sqrt(ss / Kd + 1e-6);
        for (let k = 0; k < Kd; k++) normed[t * Kd + k] = xv[t * Kd + k]! * rs * normVals[k]!;
      }
      for (let i = 0; i < Ns.length; i++) {
        const want = new Float64Array(T * Ns[i]!);
        ref.matmul(want, normed, ws[i]!.vals, T, Ns[i]!, Kd);
        const product = () => {
          K.matmulGroup(
            current,
            outs,
            x,
            ws.map((w) => w.w),
            T,
            Ns,
            Kd,
            norm,
          );
          return outs[i]!;
        };
        await againstOneColumn(
          `group ${format} weight ${i}`,
          'matmulGroup',
          T * Ns[i]!,
          lanes,
          cpt,
          product,
          want,
          1e-5,
        );
      }
    }
  });

  it('down_proj: the SwiGLU formed as x is staged and the LoRA B product in the store (q4)', async () => {
    const [T, N, Kd, r] = [2, 36, 1056, 4];
    const rand = ref.rng(91);
    const gate = ref.randn(T * Kd, rand);
    const up = ref.randn(T * Kd, rand);
    const u = ref.randn(T * r, rand);
    const B = ref.randn(N * r, rand);
    const { w, vals } = h.weight('q4', N, Kd, 92);
    const xs = new Float64Array(T * Kd);
    for (let i = 0; i < xs.length; i++) xs[i] = (gate[i]! / (1 + Math.exp(-gate[i]!))) * up[i]!;
    const want = new Float64Array(T * N);
    ref.matmul(want, xs, vals, T, N, Kd);
    for (let t = 0; t < T; t++)
      for (let n = 0; n < N; n++) {
        let s = 0;
        for (let j = 0; j < r; j++) s += u[t * r + j]! * B[n * r + j]!;
        want[t * N + n] += 0.5 * s;
      }
    const [gb, ub, uBuf, bBuf] = [f32Buf(gate), f32Buf(up), f32Buf(u), f32Buf(B)];
    const product = () => {
      const out = outBuf(T * N);
      K.matmul(current, out, gb, w, T, N, Kd, false, { u: uBuf, B: bBuf, r, scale: 0.5 }, ub);
      return out;
    };
    await againstOneColumn('down_proj SILU LORA', 'matmulLora', T * N, '4', 4, product, want, 1e-5);
  });

  it("a group's LoRA B products, each with its own x (matmulEachF32)", async () => {
    const [T, Ns, r] = [3, [24, 40], 32] as const;
    const rand = ref.rng(7);
    const us = Ns.map(() => ref.randn(T * r, rand));
    const Bs = Ns.map((N) => ref.randn(N * r, rand));
    const inits = Ns.map((N) => ref.randn(T * N, rand));
    const [uBufs, bBufs] = [us.map((u) => f32Buf(u)), Bs.map((b) => f32Buf(b))];
    for (let i = 0; i < Ns.length; i++) {
      const want = new Float64Array(inits[i]!);
      ref.matmulF32(want, us[i]!, Bs[i]!, T, Ns[i]!, r, true, 2);
      const product = () => {
        const outs = inits.map((v) => f32Buf(v, 'out'));
        K.matmulEachF32(current, outs, uBufs, bBufs, T, [...Ns], r, true, 2);
        return outs[i]!;
      };
      await againstOneColumn(`each f32 weight ${i}`, 'matmulEachF32', T * Ns[i]!, '4', 2, product, want);
    }
  });
});

describe("'auto'", () => {
  beforeAll(() => {
    current = gpu;
  });
  it("takes CPT with a GPU's choices, one column a thread with a CPU's", async () => {
    const [T, N, Kd] = [1, 64, 2560];
    const x = f32Buf(ref.randn(T * Kd, ref.rng(3)));
    const { w } = h.weight('q4', N, Kd, 4);
    const run = (autoFor: 'gpu' | 'cpu') => {
      K.tuning.autoFor = autoFor;
      K.matmul(current, outBuf(T * N), x, w, T, N, Kd);
      return K.kernelVariant(current, 'matmul')!.defines;
    };
    // 8 staged lanes over 80 blocks, chunks of 128 blocks: 4 columns a thread over 32 lanes.
    expect(run('gpu')).toMatchObject({ LANES: 32, COLS: 32, CPT: 4 });
    const cpu = run('cpu');
    expect(cpu.CPT).toBeUndefined();
    expect(cpu.COLS).toBe(32);
  });
});
