// The benchmark's arithmetic (FLOPs, bytes, rates, roofline fractions), its flags, and its two
// roofline kernels doing what their numbers assume (a copy that copies, FMAs that are computed);
// then the op suite end to end at toy shapes, so the benchmark cannot rot unnoticed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { applyRoofline, formatTable, makeRecord } from '../../bench/measure.ts';
import {
  OP_NAMES,
  attentionBackwardCost,
  attentionCost,
  benchOps,
  decodeAttentionCost,
  matmulCost,
  weightBytes,
  type OpShapes,
} from '../../bench/ops.ts';
import { fmaFlops, measureRoofline } from '../../bench/roofline.ts';
import { reportTable, runSuite, suiteOptions } from '../../bench/suite.ts';
import { TINY, benchModel } from '../../bench/e2e.ts';

describe('benchmark arithmetic', () => {
  it('rates and roofline fractions from one measurement', () => {
    const roof = { copyGBs: 10, fmaGFLOPs: 100 };
    const r = makeRecord(
      { group: 'op', name: 'x', shape: '', flops: 2e9, bytes: 1e9, seconds: 0.5, reps: 3, tokens: 4 },
      roof,
    );
    expect(r.gflops).toBeCloseTo(4);
    expect(r.gbs).toBeCloseTo(2);
    expect(r.tokPerS).toBeCloseTo(8);
    expect(r.ofCopy).toBeCloseTo(0.2);
    expect(r.ofFma).toBeCloseTo(0.04);
    // The roof allows max(1e9 B / 10 GB/s, 2e9 / 100 GFLOP/s) = 0.1 s of the 0.5 s measured.
    expect(r.ofRoof).toBeCloseTo(0.2);
    applyRoofline(r, { copyGBs: 1000, fmaGFLOPs: 10 }); // now compute-bound: 0.2 s of 0.5
    expect(r.ofRoof).toBeCloseTo(0.4);
    expect(() => makeRecord({ group: 'op', name: 'zero', shape: '', flops: 1, bytes: 1, seconds: 0, reps: 1 })).toThrow(
      /zero: time 0/,
    );
  });

  it('FLOPs and bytes of each op, written out at Qwen3-4B shapes', () => {
    const N = 9728,
      K = 2560;
    expect(weightBytes(N, K, 'bf16')).toBe(N * K * 2);
    expect(weightBytes(N, K, 'q4')).toBe((N * K) / 2 + ((N * K) / 32) * 2); // nibbles + one f16 scale per 32
    expect(matmulCost(4, N, K, 'bf16')).toEqual({ flops: 2 * 4 * N * K, bytes: N * K * 2 + 4 * 4 * (K + N) });
    // T = 3 causal: 6 (query, key) pairs per head; QK and PV 2*HD FLOPs each.
    expect(attentionCost(3, 32, 8, 128).flops).toBe(6 * 32 * 4 * 128);
    expect(attentionBackwardCost(3, 32, 8, 128).flops).toBe(2.5 * attentionCost(3, 32, 8, 128).flops);
    expect(decodeAttentionCost(4, 2049, 32, 8, 128, 2)).toEqual({
      flops: 4 * 4 * 2049 * 32 * 128,
      bytes: 4 * 2049 * 2 * 8 * 128 * 2 + 8 * 4 * 32 * 128,
    });
    expect(fmaFlops({ copyBytes: 0, fmaGroups: 2, fmaIters: 10 })).toBe(2 * 256 * 10 * 64);
  });

  it('flags: quick shapes by default on a CPU adapter, one clear error per bad flag', () => {
    const cpu = suiteOptions({}, true);
    expect(cpu).toMatchObject({
      mode: 'quick',
      parts: ['roofline', 'ops', 'e2e'],
      ops: [...OP_NAMES],
      models: ['tiny'],
      weights: ['bf16'],
      kv: ['f32'],
      trainLen: 16,
      rounds: 1,
    });
    expect(cpu.prompts).toEqual([128]);
    expect(suiteOptions({}, false)).toMatchObject({
      mode: 'full',
      models: ['tiny', '4b'],
      weights: ['bf16', 'q4'],
      prompts: [128, 2048],
      trainLen: undefined,
      rounds: 2, // one to warm up, one split by stage
    });
    expect(suiteOptions({ full: true, ops: 'gemv,gemm', model: 'none' }, true)).toMatchObject({
      mode: 'full',
      ops: ['gemv', 'gemm'],
      models: [],
    });
    expect(() => suiteOptions({ ops: 'gemv,conv' }, true)).toThrow("--ops: unknown 'conv'");
    expect(() => suiteOptions({ batch: '1,0' }, true)).toThrow("--batch: '0' is not a positive integer");
    expect(() => suiteOptions({ rounds: '0' }, true)).toThrow("--rounds: '0' is not a positive integer");
    expect(() => suiteOptions({ qiuck: true }, true)).toThrow('unknown flag --qiuck');
    // --layers: one count or a list run in turn (a few layers, then the full depth); none: the default.
    expect(suiteOptions({}, false).layers).toBeUndefined();
    expect(suiteOptions({ layers: '4' }, false).layers).toEqual([4]);
    expect(suiteOptions({ layers: '4,36' }, false).layers).toEqual([4, 36]);
    expect(() => suiteOptions({ layers: '4,x' }, true)).toThrow("--layers: 'x' is not a positive integer");
    expect(() => suiteOptions({ quick: true, full: true }, true)).toThrow('exclude each other');
  });
});

describe('benchmark kernels and suite on the GPU', () => {
  let gpu: Gpu;
  beforeAll(async () => {
    gpu = await createGpu();
  });
  afterAll(() => gpu?.destroy());

  it('copy_vec4 copies every word; fma_chain computes its chain', async () => {
    const words = 1000; // not a multiple of 256: the tail guard matters
    const src = gpu.createBuffer(words * 16, 'src'),
      dst = gpu.createBuffer(words * 16, 'dst');
    const data = Uint32Array.from({ length: words * 4 }, (_, i) => (i * 2654435761) >>> 0);
    gpu.write(src, data);
    gpu.clear(dst);
    gpu.dispatch(gpu.kernel('roofline', 'copy_vec4'), [dst, src], Math.ceil(words / 256), [words, 0]);
    expect(await gpu.readU32(dst)).toEqual(data);

    const threads = 300,
      iters = 5;
    const sink = gpu.createBuffer(threads * 16, 'sink');
    gpu.dispatch(gpu.kernel('roofline', 'fma_chain'), [sink], 2, [threads, iters]);
    const got = await gpu.readF32(sink);
    for (const i of [0, 1, 255, 256, 299]) {
      const s = Math.fround((i & 255) * 1e-3);
      for (let lane = 0; lane < 4; lane++) {
        let sum = 0;
        for (let a = 0; a < 8; a++) {
          let x = s + 0.1 * lane + a;
          for (let k = 0; k < iters; k++) x = x * 0.9999 + 1e-4;
          sum += x;
        }
        expect(got[i * 4 + lane]).toBeCloseTo(sum, 3);
      }
    }
    for (const b of [src, dst, sink]) gpu.releaseBuffer(b);
  });

  it('measures a roofline and every op at toy shapes, with finite rates and fractions', async () => {
    const { roofline, records } = await measureRoofline(gpu, { copyBytes: 1 << 20, fmaGroups: 4, fmaIters: 16 }, 0);
    expect(records.map((r) => r.name)).toEqual(['copy (vec4)', 'fma (f32 vec4 x8)']);
    expect(roofline.copyGBs).toBeGreaterThan(0);
    expect(roofline.fmaGFLOPs).toBeGreaterThan(0);
    const toy: OpShapes = {
      C: 64,
      I: 128,
      NH: 4,
      NKV: 2,
      HD: 16,
      gemvN: 128,
      gemvK: 64,
      gemvB: [1, 2],
      gemmM: [16],
      gemmN: 64,
      gemmK: 64,
      attnT: 8,
      decodeCtx: 20,
      decodeB: [1, 2],
    };
    for (const kv of ['f32', 'f16'] as const) {
      const ops = await benchOps(gpu, { shapes: toy, ops: OP_NAMES, kv, minSeconds: 0, roofline });
      expect(ops.map((r) => r.name)).toEqual([
        'gemv bf16 B=1',
        'gemv bf16 B=2',
        'gemv q4 B=1',
        'gemv q4 B=2',
        'gemm bf16 M=16',
        'gemm dx bf16 M=16',
        'attention fwd (train)',
        'attention bwd (train)',
        `decode attention ${kv} B=1`,
        `decode attention ${kv} B=2`,
      ]);
      for (const r of ops) {
        expect(r.seconds).toBeGreaterThan(0);
        expect(Number.isFinite(r.gflops) && Number.isFinite(r.gbs) && r.ofRoof! > 0).toBe(true);
      }
    }
    const table = formatTable([
      ...records,
      makeRecord(
        { group: 'op', name: 'gemv bf16 B=1', shape: 'N=1 K=1', flops: 2, bytes: 6, seconds: 1, reps: 1 },
        roofline,
      ),
    ]);
    expect(table.split('\n')).toHaveLength(5);
    expect(table).toMatch(/^group\s+name\s+shape\s+FLOP\/call/);
  });

  it('end to end at toy shapes: prefill and decode per context with LoRA on (each step waited for, and the generate loop), then a LoRA step', async () => {
    const toy = { ...TINY, hiddenSize: 32, intermediateSize: 64, vocabSize: 256 };
    const recs = await benchModel(gpu, 'toy', toy, {
      prompts: [8, 20],
      decode: 2,
      batches: [1, 2],
      trainLen: 6,
      loraR: 4,
      format: 'q4',
      kv: 'f16',
    });
    expect(recs.map((r) => r.name)).toEqual([
      'toy prefill 8 (LoRA r=4)',
      'toy decode B=1 @ctx 8 (LoRA)',
      'toy decode B=1 @ctx 8 (LoRA, generate loop)',
      'toy decode B=2 @ctx 8 (LoRA)',
      'toy decode B=2 @ctx 8 (LoRA, generate loop)',
      'toy prefill 20 (LoRA r=4)',
      'toy decode B=1 @ctx 20 (LoRA)',
      'toy decode B=1 @ctx 20 (LoRA, generate loop)',
      'toy decode B=2 @ctx 20 (LoRA)',
      'toy decode B=2 @ctx 20 (LoRA, generate loop)',
      'toy LoRA step 6 tok r=4',
      'toy LoRA step 6 tok r=4, every layer kept, one MLP chunk',
    ]);
    expect(recs.every((r) => r.group === 'e2e' && r.seconds > 0 && r.tokPerS! > 0)).toBe(true);
  });

  it('runSuite: roofline and ops only, in one report', async () => {
    const o = { ...suiteOptions({ parts: 'roofline,ops', ops: 'decode-attention' }, true) };
    const report = await runSuite(gpu, o, 'vitest');
    expect(report.roofline).toBeDefined();
    expect(report.records.map((r) => r.group)).toEqual(['roofline', 'roofline', 'op', 'op']);
    expect(reportTable(report)).toContain('roofline (measured): copy');
  });

  // --kernels: set for the run (the decode attention's kernel follows attentionHeads), recorded in
  // the report, and put back after it; a bad switch is refused before anything runs.
  it('runSuite --kernels: the switches for the run only', async () => {
    const notes: string[] = [];
    for (const heads of ['one', 'group']) {
      const o = suiteOptions({ parts: 'ops', ops: 'decode-attention', kernels: `attentionHeads=${heads}` }, true);
      const report = await runSuite(gpu, o, 'vitest');
      expect(report.kernels).toBe(`attentionHeads=${heads}`);
      expect(K.tuning.attentionHeads).toBe('auto');
      notes.push(report.records[0]!.note ?? '');
    }
    expect(notes[0]).toContain('attention');
    expect(notes[0]).not.toBe(notes[1]);
    expect(() => suiteOptions({ kernels: 'attentionHeads=two' }, true)).toThrow(/--kernels: attentionHeads must be/);
  });
});
