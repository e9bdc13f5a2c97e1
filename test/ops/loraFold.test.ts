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

// The tiled GEMM (prefill, T > GEMV_MAX_T) takes the branch in its store too (shaders/matmul.wgsl
// LORA; test/ops/gemmLoraStore.test.ts tests it at length): one dispatch, within the same bound.
describe('in the tiled GEMM store', () => {
  beforeAll(() => {
    current = gpu;
  });
  it("a GPU's 'auto' at T > GEMV_MAX_T: one gemm_tiled dispatch with LORA", async () => {
    K.resetTuning({ matmul: 'auto', autoFor: 'gpu', gemmF16: 'off' });
    for (const accumulate of [false, true]) {
      const { dispatches, label } = await check('q4', K.GEMV_MAX_T + 2, 40, 96, 4, accumulate);
      expect(dispatches, 'one dispatch').toBe(1);
      expect(label).toContain('matmul.gemm_tiled[');
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
    [
      `tuning.loraFold 'off' (the tiled GEMM, T > GEMV_MAX_T)`,
      { matmul: 'auto', autoFor: 'gpu', gemmF16: 'off', loraFold: 'off' },
      K.GEMV_MAX_T + 2,
    ],
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

// matmul's `lora.A`: matmul runs the branch's A product u = x A^T itself (of silu(x) * up with
// `up`, SwiGLU folded: down_proj's). Where that product splits over K (a GPU's 'auto': few
// columns, a long K) and the GEMV takes the branch in its store, its slices' partial sums go
// straight to the store, which adds them up (shaders/gemv.wgsl UPART, tuning.loraAFold): 2
// dispatches, against 3 with the reduce between ('off'); unsplit (a short K) u is written whole
// first. Against the CPU reference (f64): x W^T + s (x A^T) B^T.
describe("with its A product (LoraEpilogue's A)", () => {
  beforeAll(() => {
    current = gpu;
  });

  /** matmul with { u, A, B } on gpu; checks against f64 and returns dispatches and the labels of the kernels. */
  async function withA(
    format: 'bf16' | 'q4',
    T: number,
    N: number,
    Kd: number,
    r: number,
    accumulate: boolean,
    silu: boolean,
  ): Promise<{ dispatches: number; labels: string[] }> {
    const name = `A product: ${format} T=${T} N=${N} K=${Kd} r=${r}${accumulate ? ' +=' : ''}${silu ? ' silu' : ''} ${K.tuning.loraAFold}`;
    const rand = ref.rng(T * 17 + N * 3 + Kd + r + (silu ? 1 : 0));
    const x = ref.randn(T * Kd, rand);
    const upVals = ref.randn(T * Kd, rand);
    const A = ref.randn(r * Kd, rand, 0.05);
    const B = ref.randn(N * r, rand, 0.3);
    const scale = 0.75;
    const { w, vals } = h.weight(format, N, Kd, T + N + r + 5);
    const init = ref.randn(T * N, rand);
    const out = accumulate ? f32Buf(init, 'out') : outBuf(T * N);
    const branch = { u: outBuf(T * r), A: f32Buf(A, 'A'), B: f32Buf(B, 'B'), r, scale };
    const labels: string[] = [];
    const dispatch = gpu.dispatch.bind(gpu);
    gpu.dispatch = (kernel, ...rest) => {
      labels.push(kernel.label);
      dispatch(kernel, ...rest);
    };
    try {
      K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, accumulate, branch, silu ? f32Buf(upVals, 'up') : undefined);
    } finally {
      gpu.dispatch = dispatch;
    }
    let act = x;
    if (silu) {
      act = new Float32Array(T * Kd);
      ref.siluMul(act, x, upVals, T * Kd);
    }
    const u = new Float64Array(T * r);
    ref.matmulF32(u, act, A, T, r, Kd);
    const want = new Float64Array(T * N);
    if (accumulate) want.set(init);
    ref.matmul(want, act, vals, T, N, Kd, accumulate);
    ref.matmulF32(want, u, B, T, N, r, true, scale);
    expectClose(name, await gpu.readF32(out, T * N), want, 2e-6, 1e-6);
    return { dispatches: labels.length, labels };
  }

  // (format, T, N, K, r, silu): K 2,048 and 1,280 split the f32 A product over K on a GPU.
  it.each([
    ['q4', 1, 300, 2048, 16, false],
    ['bf16', 3, 70, 1280, 4, true],
    ['q4', 4, 33, 2048, 8, true],
    ['bf16', 8, 40, 1280, 16, false],
  ] as const)('%s T=%i N=%i K=%i r=%i silu %s: the slices added up in the store', async (format, T, N, Kd, r, silu) => {
    K.resetTuning({ autoFor: 'gpu' });
    for (const accumulate of [false, true]) {
      const folded = await withA(format, T, N, Kd, r, accumulate, silu);
      expect(folded.labels.map((l) => l.split('[')[0])).toEqual(['gemv.gemv_lanes', 'gemv.gemv_lanes']);
      expect(folded.labels[1]).toContain(`UPART=${Math.min(8, 2 ** Math.ceil(Math.log2(T))) * r}`);
      expect(folded.labels[1]).toContain('LORA=1');
      expect(folded.labels[0]).not.toContain('LORA=1');
      expect(folded.labels[0]).toContain('WEIGHTS=f32');
      expect(folded.labels[1]).toContain(silu ? 'SILU=1' : 'WEIGHTS=');
    }
    K.tuning.loraAFold = 'off';
    const off = await withA(format, T, N, Kd, r, false, silu);
    expect(off.dispatches, 'the split product, its reduce, the GEMV').toBe(3);
    expect(off.labels[1]).toContain('gemv_cols_reduce');
    expect(off.labels.some((l) => l.includes('UPART'))).toBe(false);
  });

  it('unsplit (a short K), or on a CPU adapter: u written whole first, then the GEMV', async () => {
    K.resetTuning({ autoFor: 'gpu' });
    const short = await withA('q4', 2, 64, 256, 16, true, true);
    expect(short.dispatches).toBe(2);
    expect(short.labels.some((l) => l.includes('UPART'))).toBe(false);
    K.resetTuning({ matmul: 'lanes' }); // SwiftShader's own 'auto': no split over K
    const cpu = await withA('bf16', 3, 40, 2048, 4, false, false);
    expect(cpu.dispatches).toBe(2);
    expect(cpu.labels.some((l) => l.includes('UPART'))).toBe(false);
  });

  it('a bad A names it', () => {
    const w = h.weight('bf16', 8, 32, 1).w;
    const x = f32Buf(new Float32Array(2 * 32)),
      out = outBuf(2 * 8);
    const u = f32Buf(new Float32Array(2 * 4)),
      B = f32Buf(new Float32Array(8 * 4));
    expect(() => K.matmul(gpu, out, x, w, 2, 8, 32, false, { u, A: B, B, r: 4, scale: 1 })).toThrow(/matmul lora A/);
    const A = f32Buf(new Float32Array(4 * 32));
    expect(() => K.matmul(gpu, out, x, w, 2, 8, 32, false, { u, A: x, B, r: 1, scale: 1 })).toThrow();
    expect(() => K.matmul(gpu, out, x, w, 2, 8, 32, false, { u, A, B, r: 4, scale: 1 })).not.toThrow();
  });
});

// matmulGroup's `next` (K.PairAProduct): the gate/up group GEMV with its norm folded and its
// branches packed from partial sums pairs its columns (shaders/gemv.wgsl PAIR: a workgroup writes
// gate and up for the same columns) and begins down_proj's LoRA A product over silu(gate) * up as
// per-workgroup partial sums. Against the CPU reference (f64): gate and up (with the rstd times the
// summed u partials through the stacked B), and the partials' sum against (silu(gate) * up) A^T.
describe('the gate/up group paired, beginning the next A product (PairAProduct)', () => {
  let gpuWith: Gpu;
  beforeAll(() => {
    gpuWith = gpu;
  });
  it.each([
    ['q4', 1, 96, 256, 16, 'subgroups'],
    ['bf16', 4, 200, 512, 4, 'subgroups'],
    ['q4', 8, 72, 320, 8, 'subgroups'],
    ['q4', 2, 200, 256, 16, 'shared-memory'],
  ] as const)('%s T=%i N=%i K=%i r=%i, %s reduction', async (format, T, N, Kd, r, reduction) => {
    const gpu = reduction === 'subgroups' ? gpuWith : tree;
    current = gpu;
    K.resetTuning({ autoFor: 'gpu' });
    const name = `paired ${format} T=${T} N=${N} K=${Kd} r=${r}`;
    const rand = ref.rng(T * 7 + N + Kd + r);
    const xv = ref.randn(T * Kd, rand);
    const normVals = ref.roundBf16(ref.randn(Kd, rand));
    const ws = [0, 1].map((i) => h.weight(format, N, Kd, 900 + 13 * i + T));
    const P = 3; // the u partials o_proj would have written: (P, T, 2 r), before the rstd
    const uParts = ref.randn(P * T * 2 * r, rand, 0.5);
    const B = ref.randn(2 * N * r, rand, 0.3); // gate's rows, then up's
    const A = ref.randn(r * N, rand, 0.1); // down_proj's A (r, N)
    const scale = 1.25;
    const eps = 1e-6;
    const x = f32Buf(xv);
    const norm = { w: h.bf16Buf(normVals), eps };
    const wbs = ws.map((w) => w.w);
    expect(K.groupPairs(gpu, x, wbs, T, [N, N], Kd, r, norm)).toBe(true);
    expect(K.groupPairs(gpu, x, wbs, T, [N, N], Kd, r), 'no norm').toBe(false);
    const outs = [outBuf(T * N), outBuf(T * N)];
    const parts = outBuf(K.pairParts(N) * T * r, 'parts');
    const lora = { u: f32Buf(uParts, 'u'), B: f32Buf(B, 'B'), r, scale, parts: P };
    const next = { A: f32Buf(A, 'A'), parts, R: r };
    const d0 = gpu.dispatchCount;
    const written = K.matmulGroup(gpu, outs, x, wbs, T, [N, N], Kd, norm, lora, next);
    expect(gpu.dispatchCount - d0, 'one dispatch').toBe(1);
    expect(K.kernelVariant(gpu, 'matmulGroup')?.label).toContain('PAIR=1');
    expect(written).toBeGreaterThan(0);
    expect(written).toBeLessThanOrEqual(K.pairParts(N));
    // The reference: rows h = rmsNorm(x), gate and up = h W^T + scale rstd u B^T.
    const hv = new Float64Array(T * Kd);
    ref.rmsNorm(hv, xv, normVals, T, Kd, eps);
    const act: Float64Array[] = [];
    for (let i = 0; i < 2; i++) {
      const want = new Float64Array(T * N);
      ref.matmul(want, hv, ws[i].vals, T, N, Kd);
      for (let t = 0; t < T; t++) {
        let ss = 0;
        for (let k = 0; k < Kd; k++) ss += xv[t * Kd + k] ** 2;
        const rstd = 1 / Math.sqrt(ss / Kd + eps);
        for (let n = 0; n < N; n++) {
          let s = 0;
          for (let j = 0; j < r; j++) {
            let u = 0;
            for (let p = 0; p < P; p++) u += uParts[(p * T + t) * 2 * r + i * r + j];
            s += u * B[(i * N + n) * r + j];
          }
          want[t * N + n] += scale * rstd * s;
        }
      }
      expectClose(`${name}: ${i ? 'up' : 'gate'}`, await gpu.readF32(outs[i], T * N), want, 2e-6, 1e-6);
      act.push(want);
    }
    const silu = new Float64Array(T * N);
    for (let i = 0; i < T * N; i++) silu[i] = (act[0][i] / (1 + Math.exp(-act[0][i]))) * act[1][i];
    const u = new Float64Array(T * r);
    ref.matmulF32(u, silu, A, T, r, N);
    const got = await gpu.readF32(parts, written * T * r);
    const sum = new Float64Array(T * r);
    for (let g = 0; g < written; g++) for (let i = 0; i < T * r; i++) sum[i] += got[g * T * r + i];
    expectClose(`${name}: down_proj's u from the partial sums`, sum, u, 1e-5, 1e-6);
    // Where it does not pair, matmulGroup says so.
    const { u: _, parts: __, ...unpacked } = lora;
    expect(() => K.matmulGroup(gpu, outs, x, wbs, T, [N, N], Kd, norm, { ...unpacked, u: lora.u }, next)).toThrow(
      /pairs its columns/,
    );
  });
});

// matmulGroup's `lora` (K.GroupLora): the q/k/v or gate/up group product takes each weight's LoRA
// B product in its store (define LORA with GROUP) where its u and B bindings fit (4 G + 1, plus the
// folded norm's weights: 13 or 14 for q/k/v, 9 or 10 for gate/up), one dispatch in all; elsewhere
// (too few bindings, tuning.loraFold 'off') the B products follow as K.matmulEachF32. Against the
// CPU reference (f64) either way, with the folded RMSNorm where gemv_lanes_group takes it.
describe("a group's LoRA branches (matmulGroup's lora)", () => {
  const cases = [
    // (label, tuning.matmul, gpu, format, T, Ns, K, r, norm)
    ['gemv_rows_group, gate/up', 'blocks', () => gpu, 'bf16', 3, [70, 70], 288, 4, false],
    ['gemv_rows_group, q/k/v', 'blocks', () => gpu, 'q4', 2, [64, 16, 16], 256, 8, false],
    ['gemv_lanes_group, gate/up with the norm', 'lanes', () => gpu, 'q4', 4, [40, 40], 512, 16, true],
    ['gemv_lanes_group, q/k/v with the norm', 'lanes', () => gpu, 'bf16', 1, [48, 16, 16], 264, 4, true],
    ['gemv_lanes_group, q/k/v, shared-memory reduction', 'lanes', () => tree, 'q4', 5, [33, 9, 9], 320, 2, false],
  ] as const;
  it.each(cases)('%s', async (what, matmul, getGpu, format, T, Ns, Kd, r, withNorm) => {
    current = getGpu();
    for (const loraFold of ['auto', 'off'] as const) {
      K.resetTuning({ matmul, loraFold });
      const G = Ns.length;
      const rand = ref.rng(T * 17 + Kd + G);
      const xv = ref.randn(T * Kd, rand);
      const normVals = ref.roundBf16(ref.randn(Kd, rand));
      const ws = Ns.map((N, i) => h.weight(format, N, Kd, 300 + 11 * i + T));
      const us = Ns.map(() => ref.randn(T * r, rand));
      const Bs = Ns.map((N) => ref.randn(N * r, rand, 0.3));
      const outs = Ns.map((N) => outBuf(T * N));
      const scale = 1.5;
      const norm = withNorm ? { w: h.bf16Buf(normVals), eps: 1e-6 } : undefined;
      const lora = { us: us.map((u) => f32Buf(u, 'u')), Bs: Bs.map((B) => f32Buf(B, 'B')), r, scale };
      K.forgetKernelVariants(current);
      const d0 = current.dispatchCount;
      K.matmulGroup(
        current,
        outs,
        f32Buf(xv),
        ws.map((w) => w.w),
        T,
        Ns,
        Kd,
        norm,
        lora,
      );
      const dispatches = current.dispatchCount - d0;
      const label = K.kernelVariant(current, 'matmulGroup')?.label ?? '';
      const fits = 4 * G + 1 + (withNorm ? 1 : 0) <= current.limits.maxStorageBuffersPerShaderStage;
      const folds = loraFold === 'auto' && fits;
      expect(label).toContain(`gemv.gemv_${matmul === 'blocks' ? 'rows' : 'lanes'}_group[`);
      expect(label.includes('LORA=1'), `${what} ${loraFold}: ${label}`).toBe(folds);
      if (folds) expect(dispatches, 'one dispatch').toBe(1);
      else expect(dispatches, 'the group product, then the B products').toBeGreaterThanOrEqual(2);
      // The reference: the norm in f64, then each product and its branch.
      const xs = withNorm ? normedRows(xv, normVals, T, Kd) : new Float64Array(xv);
      for (let i = 0; i < G; i++) {
        const want = new Float64Array(T * Ns[i]!);
        ref.matmul(want, xs, ws[i]!.vals, T, Ns[i]!, Kd);
        ref.matmulF32(want, us[i]!, Bs[i]!, T, Ns[i]!, r, true, scale);
        expectClose(
          `${what} ${loraFold} weight ${i}`,
          await current.readF32(outs[i]!, T * Ns[i]!),
          want,
          withNorm ? 1e-5 : 2e-6,
          1e-6,
        );
      }
    }
  });
  it('bad LoRA operands name what is wrong', () => {
    current = gpu;
    const ws = [h.weight('bf16', 8, 32, 1).w, h.weight('bf16', 8, 32, 2).w];
    const x = f32Buf(new Float32Array(2 * 32));
    const outs = [outBuf(2 * 8), outBuf(2 * 8)];
    const u = () => f32Buf(new Float32Array(2 * 4));
    const B = () => f32Buf(new Float32Array(8 * 4));
    const run = (lora: K.GroupLora) => K.matmulGroup(gpu, outs, x, ws, 2, [8, 8], 32, undefined, lora);
    expect(() => run({ us: [u()], Bs: [B(), B()], r: 4, scale: 1 })).toThrow(/one u and one B per weight/);
    expect(() => run({ us: [u(), u()], Bs: [B(), B()], r: 0, scale: 1 })).toThrow(/LoRA rank/);
    expect(() => run({ us: [u(), u()], Bs: [B(), u()], r: 4, scale: 1 })).toThrow(/matmulGroup lora B 1/);
    expect(() => run({ us: [outs[0]!, u()], Bs: [B(), B()], r: 4, scale: 1 })).toThrow(/matmulGroup/);
  });
});

/** x (T, K) normed row by row in f64 with bf16 weights normVals (RMSNorm, eps 1e-6). */
function normedRows(xv: Float32Array, normVals: ArrayLike<number>, T: number, Kd: number): Float64Array {
  const xs = new Float64Array(xv);
  for (let t = 0; t < T; t++) {
    let ss = 0;
    for (let k = 0; k < Kd; k++) ss += xv[t * Kd + k]! ** 2;
    const rs = 1 / Math.sqrt(ss / Kd + 1e-6);
    for (let k = 0; k < Kd; k++) xs[t * Kd + k] = xv[t * Kd + k]! * rs * normVals[k]!;
  }
  return xs;
}

describe("a group's LoRA branches packed (PackedGroupLora: one u, one stacked B)", () => {
  const cases = [
    // (label, tuning.matmul, gpu, format, T, Ns, K, r, norm)
    ['gemv_rows_group, gate/up', 'blocks', () => gpu, 'bf16', 3, [70, 70], 288, 4, false],
    ['gemv_rows_group, q/k/v', 'blocks', () => gpu, 'q4', 2, [64, 16, 16], 256, 8, false],
    ['gemv_lanes_group, gate/up with the norm', 'lanes', () => gpu, 'q4', 4, [40, 40], 512, 16, true],
    ['gemv_lanes_group, q/k/v with the norm', 'lanes', () => gpu, 'bf16', 1, [48, 16, 16], 264, 4, true],
    [
      'gemv_lanes_group, q/k/v with the norm, shared-memory reduction',
      'lanes',
      () => tree,
      'q4',
      5,
      [33, 9, 9],
      320,
      2,
      true,
    ],
  ] as const;
  it.each(cases)('%s', async (what, matmul, getGpu, format, T, Ns, Kd, r, withNorm) => {
    current = getGpu();
    const G = Ns.length;
    const limit = current.limits.maxStorageBuffersPerShaderStage;
    const own = 2 * G + 1 + (withNorm ? 1 : 0);
    for (const loraFold of ['auto', 'packed', 'off'] as const) {
      K.resetTuning({ matmul, loraFold });
      const rand = ref.rng(T * 23 + Kd + G);
      const xv = ref.randn(T * Kd, rand);
      const normVals = ref.roundBf16(ref.randn(Kd, rand));
      const ws = Ns.map((N, i) => h.weight(format, N, Kd, 500 + 11 * i + T));
      const u = ref.randn(T * G * r, rand); // (T, G r)
      const NT = Ns.reduce((n, N) => n + N, 0);
      const B = ref.randn(NT * r, rand, 0.3); // (NT, r): weight i's rows after the earlier weights'
      const outs = Ns.map((N) => outBuf(T * N));
      const scale = 1.25;
      const norm = withNorm ? { w: h.bf16Buf(normVals), eps: 1e-6 } : undefined;
      const x = f32Buf(xv);
      const packs = K.groupLoraPacks(
        current,
        x,
        ws.map((w) => w.w),
        T,
        Ns,
        Kd,
        norm,
      );
      // 'auto' packs only where one u and B per weight do not fit; 'packed' wherever 2 more fit.
      const fitsPacked = own + 2 <= limit,
        fitsEach = own + 2 * G <= limit;
      const want = loraFold === 'packed' ? fitsPacked : loraFold === 'auto' && fitsPacked && !fitsEach;
      expect(packs, `${what} ${loraFold}: groupLoraPacks (limit ${limit})`).toBe(want);
      const lora = { u: f32Buf(u, 'u'), B: f32Buf(B, 'B'), r, scale };
      const run = () =>
        K.matmulGroup(
          current,
          outs,
          x,
          ws.map((w) => w.w),
          T,
          Ns,
          Kd,
          norm,
          lora,
        );
      if (!packs) {
        expect(run, `${what} ${loraFold}`).toThrow(/packed LoRA branches only where the group GEMV takes them/);
        continue;
      }
      K.forgetKernelVariants(current);
      const d0 = current.dispatchCount;
      run();
      expect(current.dispatchCount - d0, 'one dispatch').toBe(1);
      const label = K.kernelVariant(current, 'matmulGroup')?.label ?? '';
      expect(label).toContain(`gemv.gemv_${matmul === 'blocks' ? 'rows' : 'lanes'}_group[`);
      expect(label).toContain('LORA=1');
      expect(label).toContain('LORAPACK=1');
      expect(label.includes('NORM=1')).toBe(withNorm);
      const xs = withNorm ? normedRows(xv, normVals, T, Kd) : new Float64Array(xv);
      let row0 = 0;
      for (let i = 0; i < G; i++) {
        const N = Ns[i]!;
        // Weight i's branch: columns [i r, (i + 1) r) of u, rows [row0, row0 + N) of B.
        const ui = new Float32Array(T * r);
        for (let t = 0; t < T; t++) for (let j = 0; j < r; j++) ui[t * r + j] = u[t * G * r + i * r + j]!;
        const Bi = B.subarray(row0 * r, (row0 + N) * r);
        const want = new Float64Array(T * N);
        ref.matmul(want, xs, ws[i]!.vals, T, N, Kd);
        ref.matmulF32(want, ui, Bi, T, N, r, true, scale);
        expectClose(
          `${what} ${loraFold} packed weight ${i}`,
          await current.readF32(outs[i]!, T * N),
          want,
          withNorm ? 1e-5 : 2e-6,
          1e-6,
        );
        row0 += N;
      }
    }
  });

  it.each([
    ['gemv_lanes, the norm folded', 'lanes', 3, 48, 264],
    ['rmsNorm first (gemv_rows)', 'blocks', 2, 32, 288],
  ] as const)('the packed A product: matmulF32 over rmsNorm(x), %s', async (what, matmul, T, N, Kd) => {
    current = gpu;
    K.resetTuning({ matmul });
    const rand = ref.rng(T * 5 + N + Kd);
    const xv = ref.randn(T * Kd, rand);
    const normVals = ref.roundBf16(ref.randn(Kd, rand));
    const A = ref.randn(N * Kd, rand, 0.2);
    const out = outBuf(T * N);
    K.forgetKernelVariants(current);
    const d0 = current.dispatchCount;
    K.matmulF32(current, out, f32Buf(xv), f32Buf(A), T, N, Kd, false, 1, undefined, {
      w: h.bf16Buf(normVals),
      eps: 1e-6,
    });
    const folded = matmul === 'lanes';
    expect(current.dispatchCount - d0, what).toBe(folded ? 1 : 2);
    expect(K.kernelVariant(current, 'matmulF32')?.label.includes('NORM=1')).toBe(folded);
    const want = new Float64Array(T * N);
    ref.matmulF32(want, normedRows(xv, normVals, T, Kd), A, T, N, Kd);
    expectClose(`packed A, ${what}`, await current.readF32(out, T * N), want, 1e-5, 1e-6);
  });

  it('bad packed operands name what is wrong', () => {
    current = gpu;
    K.resetTuning({ matmul: 'blocks', loraFold: 'packed' });
    const ws = [h.weight('bf16', 8, 32, 1).w, h.weight('bf16', 8, 32, 2).w];
    const x = f32Buf(new Float32Array(2 * 32));
    const outs = [outBuf(2 * 8), outBuf(2 * 8)];
    const run = (u: GPUBuffer, B: GPUBuffer, r = 4) =>
      K.matmulGroup(gpu, outs, x, ws, 2, [8, 8], 32, undefined, { u, B, r, scale: 1 });
    const u = () => f32Buf(new Float32Array(2 * 2 * 4));
    const B = () => f32Buf(new Float32Array(16 * 4));
    expect(() => run(f32Buf(new Float32Array(2 * 4)), B())).toThrow(/matmulGroup packed lora u/);
    expect(() => run(u(), f32Buf(new Float32Array(8 * 4)))).toThrow(/matmulGroup packed lora B/);
    expect(() => run(u(), B(), 0)).toThrow(/LoRA rank/);
    expect(() => run(outs[0]!, B())).toThrow(/matmulGroup/);
  });
});
