// The forward matmul's tiled GEMM with f16 tiles (shaders/matmul.wgsl define F16, tuning.gemmF16):
// f16 operands, each R step's 16 products per output summed as packed vec4<f16> FMAs, that
// partial added to an f32 accumulator. Against the CPU reference (f64) with the error bound of
// that arithmetic, per element: f16 keeps 11 mantissa bits, so each operand is off by at most
// 2^-11 relative and each of the step's 16 additions rounds by at most 2^-11 of the partial,
// |err| <= sum_r |x_r w_r| * (2 * 2^-11 + 16 * 2^-11) ~ 0.0088 sum_r |x_r w_r| (worst case; random
// data sits far below it, and the measured error is printed). The launched kernel is checked to be
// the F16 one, and its error to be above f32's, so the test fails if the f32 tiles ran instead.
// Shapes cross tile edges in M (64), N (128) and R (16); bf16 and q4 weights; accumulate.
//
// shader-f16 is needed: SwiftShader has none, so on it these tests skip; Mesa's lavapipe has it,
// and `npm test` runs this file there with SPYRL_REQUIRE_F16=1, where a missing feature fails.
// Run: VK_ICD_FILENAMES=$(bash scripts/lavapipe.sh) SPYRL_REQUIRE_F16=1 npx vitest run test/ops/gemmF16.test.ts
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';
import * as ref from '../helpers/reference.ts';

let gpu: Gpu;
let noF16: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, outBuf } = h;
const requireF16 = !!process.env.SPYRL_REQUIRE_F16;

beforeAll(async () => {
  gpu = await createGpu();
  noF16 = await createGpu({ disableFeatures: ['shader-f16'] });
  if (requireF16) expect(gpu.features.f16, `SPYRL_REQUIRE_F16: ${gpu.info.description} has no shader-f16`).toBe(true);
});

afterAll(() => {
  K.tuning.matmul = 'auto';
  K.tuning.gemmF16 = 'auto';
  h.report('gemm_tiled F16 errors (bound: 0.0088 sum|x w|)');
  gpu?.destroy();
  noF16?.destroy();
});

/** Runs matmul with the given gemmF16 setting; returns the output and the launched kernel's defines. */
async function run(
  setting: 'on' | 'off',
  x: Float32Array,
  w: K.Weight,
  init: Float32Array | null,
  T: number,
  N: number,
  Kd: number,
): Promise<{ got: Float32Array; defines: Record<string, unknown> }> {
  K.tuning.gemmF16 = setting;
  const out = init ? f32Buf(init, 'out') : outBuf(T * N);
  K.matmul(gpu, out, f32Buf(x), w, T, N, Kd, !!init);
  const got = await gpu.readF32(out, T * N);
  return { got, defines: K.kernelVariant(gpu, 'matmul')!.defines as Record<string, unknown> };
}

// gemmSubgroups 'on': A shared by subgroup shuffles of vec4<f16> (SGA) instead of the shared tile;
// gemmVec4 'auto': the tiles laid out along r, filled by 16-byte loads (VEC), where K % 8 == 0;
// gemmTile '128': those with 128-row tiles (TM8; the T = 130 case crosses both row edges).
describe.each([
  ['off', 'auto', 'auto'],
  ['off', 'off', 'auto'],
  ['on', 'auto', 'auto'],
  ['off', 'auto', '128'],
] as const)('gemm_tiled F16, gemmSubgroups %s, gemmVec4 %s, gemmTile %s', (sga, vec4, tile) => {
  beforeAll(() => {
    K.tuning.matmul = 'tiled';
    K.tuning.gemmSubgroups = sga;
    K.tuning.gemmVec4 = vec4;
    K.tuning.gemmTile = tile;
  });
  afterAll(() => {
    K.tuning.gemmSubgroups = 'auto';
    K.tuning.gemmVec4 = 'auto';
    K.tuning.gemmTile = 'auto';
  });

  // (format, T, N, K, accumulate, x scale): activations up to a few hundred in magnitude (the
  // forward's post-norm and SwiGLU inputs), far inside f16's 65504.
  it.for([
    ['bf16', 17, 100, 99, false, 1],
    ['bf16', 70, 130, 200, false, 1],
    ['bf16', 130, 260, 48, true, 1],
    ['bf16', 65, 129, 17, false, 100],
    ['q4', 40, 96, 256, false, 1],
    ['q4', 9, 200, 96, true, 3],
  ] as const)('%s T=%i N=%i K=%i accumulate=%s x*%i', async ([format, T, N, Kd, accumulate, xs], ctx) => {
    if (!gpu.features.f16 || (sga === 'on' && !gpu.features.subgroups)) return ctx.skip();
    const rand = ref.rng(T * 7 + N + Kd);
    const x = ref.randn(T * Kd, rand, xs);
    const { w, vals } = h.weight(format, N, Kd, T + N);
    const init = accumulate ? ref.randn(T * N, rand) : null;

    const want = new Float64Array(T * N);
    const mag = new Float64Array(T * N); // sum_r |x w|
    for (let t = 0; t < T; t++) {
      for (let n = 0; n < N; n++) {
        let s = init ? init[t * N + n]! : 0;
        let m = 0;
        for (let r = 0; r < Kd; r++) {
          const p = x[t * Kd + r]! * vals[n * Kd + r]!;
          s += p;
          m += Math.abs(p);
        }
        want[t * N + n] = s;
        mag[t * N + n] = m;
      }
    }
    const f16 = await run('on', x, w, init, T, N, Kd);
    expect(f16.defines.F16, 'the F16 tiles ran').toBe(1);
    expect(f16.defines.SGA, 'the subgroup A variant ran as set').toBe(sga === 'on' ? 1 : undefined);
    const vec = sga === 'off' && vec4 === 'auto' && Kd % 8 === 0;
    expect(f16.defines.VEC, 'the 16-byte loads ran where they fit').toBe(vec ? 1 : undefined);
    expect(f16.defines.TM8, 'the 128-row tiles ran as set').toBe(vec && tile === '128' ? 1 : undefined);
    const f32 = await run('off', x, w, init, T, N, Kd);
    expect(f32.defines.F16, 'tuning.gemmF16 off: the f32 tiles ran').toBeUndefined();

    let worst = 0; // err / bound
    let worstAt = 0;
    let err16 = 0;
    let err32 = 0;
    for (let i = 0; i < T * N; i++) {
      const e = Math.abs(f16.got[i]! - want[i]!);
      const bound = 0.0088 * mag[i]! + 1e-6 * Math.abs(want[i]!) + 1e-30;
      if (e / bound > worst) [worst, worstAt] = [e / bound, i];
      err16 = Math.max(err16, e / (mag[i]! || 1));
      err32 = Math.max(err32, Math.abs(f32.got[i]! - want[i]!) / (mag[i]! || 1));
    }
    h.measured[
      `${format} T=${T} N=${N} K=${Kd}${accumulate ? ' +=' : ''} x*${xs}${sga === 'on' ? ' SGA' : vec ? ' VEC' : ''}${vec && tile === '128' ? ' TM8' : ''}`
    ] =
      `max err/sum|xw| f16 ${err16.toExponential(2)}, f32 ${err32.toExponential(2)}; worst err/bound ${worst.toFixed(3)}`;
    expect(
      worst,
      `element ${worstAt}: got ${f16.got[worstAt]}, want ${want[worstAt]}, sum|xw| ${mag[worstAt]}`,
    ).toBeLessThanOrEqual(1);
    // f16 operands are measurably coarser than f32: equal errors would mean the F16 path did not run.
    expect(err16).toBeGreaterThan(4 * err32);
  });
});

describe('tuning.gemmF16', () => {
  beforeAll(() => {
    K.tuning.matmul = 'tiled';
  });
  const [T, N, Kd] = [20, 40, 32];
  const x = ref.randn(T * Kd, ref.rng(1));
  const w = ref.roundBf16(ref.randn(N * Kd, ref.rng(2), 0.1));

  it("'auto' takes f16 only on GPUs with shader-f16, never on CPU adapters", async () => {
    K.tuning.gemmF16 = 'auto';
    expect(K.useGemmF16(gpu)).toBe(gpu.features.f16 && !K.isCpuAdapter(gpu));
    expect(K.useGemmF16(noF16)).toBe(false);
    const buf = (bytes: number) => noF16.createBuffer(bytes, 'auto');
    K.matmul(noF16, buf(T * N * 4), buf(T * Kd * 4), buf(N * Kd * 2), T, N, Kd);
    expect(K.kernelVariant(noF16, 'matmul')!.defines.F16).toBeUndefined();
  });

  it("'on' without shader-f16 is one clear error; 'off' never takes it", () => {
    K.tuning.gemmF16 = 'on';
    expect(() => K.useGemmF16(noF16)).toThrow(/gemmF16 'on'.*no shader-f16/);
    K.tuning.gemmF16 = 'off';
    expect(K.useGemmF16(gpu)).toBe(false);
    K.tuning.gemmF16 = 'auto';
  });

  it("gemmSubgroups: 'auto' only on Intel GPUs, 'on' without subgroups one clear error, never for A read across r", async () => {
    const noSg = await createGpu({ disableFeatures: ['subgroups'] });
    try {
      K.tuning.gemmSubgroups = 'auto';
      const intel = gpu.features.subgroups && !K.isCpuAdapter(gpu) && gpu.info.vendor.toLowerCase() === 'intel';
      expect(K.useGemmSubgroups(gpu, 1)).toBe(intel);
      K.tuning.gemmSubgroups = 'on';
      expect(K.useGemmSubgroups(gpu, 1)).toBe(gpu.features.subgroups);
      expect(K.useGemmSubgroups(gpu, 40), 'A read across r (the LoRA weight gradient)').toBe(false);
      expect(() => K.useGemmSubgroups(noSg, 1)).toThrow(/gemmSubgroups 'on'.*no subgroups/);
      expect(K.tuningProblem(noSg, { gemmSubgroups: 'on' })).toMatch(
        /^gemmSubgroups=on needs subgroups, which this GPU/,
      );
      expect(K.tuningProblem(gpu, { gemmSubgroups: 'on' })).toBeNull();
      K.tuning.gemmSubgroups = 'off';
      expect(K.useGemmSubgroups(gpu, 1)).toBe(false);
    } finally {
      K.tuning.gemmSubgroups = 'auto';
      noSg.destroy();
    }
  });

  it('the backward products keep f32 tiles', async (ctx) => {
    if (!gpu.features.f16) return ctx.skip();
    K.tuning.gemmF16 = 'on';
    const dx = outBuf(T * Kd);
    K.matmulBackwardInput(gpu, dx, f32Buf(ref.randn(T * N, ref.rng(3))), h.bf16Buf(w), T, N, Kd);
    expect(K.kernelVariant(gpu, 'matmulBackwardInput')!.defines.F16).toBeUndefined();
    K.matmul(gpu, outBuf(T * N), f32Buf(x), h.bf16Buf(w), T, N, Kd);
    expect(K.kernelVariant(gpu, 'matmul')!.defines.F16).toBe(1);
    K.tuning.gemmF16 = 'auto';
    await gpu.sync();
  });
});
