// The ops of ahead decoding (src/ops/forward.ts): sampleRows, one dispatch over B rows with
// per-row (seed, step, hash row), against sample() one-row dispatches (the policy's former path)
// and rows of one sample() dispatch: bitwise the same ids and log-probs. embedPicked against embed
// of the ids gathered on the CPU: the same rows, exactly.
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import * as ref from '../helpers/reference.ts';
import { gpuHarness } from '../helpers/gpuHarness.ts';

let gpu: Gpu;
const h = gpuHarness(() => gpu);
const { f32Buf, u32Buf, bf16Buf, outBuf } = h;

beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

const OPTIONS: [string, K.SampleOptions][] = [
  ['greedy', { temperature: 0, topK: 0, topP: 1 }],
  ['temperature 1', { temperature: 1, topK: 0, topP: 1 }],
  ['temperature 0.7, top-k 20, top-p 0.8', { temperature: 0.7, topK: 20, topP: 0.8 }],
];

describe('sampleRows', () => {
  // Each case with the chunked draw ('on': the GPUs' 'auto' for greedy and untruncated sampling)
  // and with one workgroup a row ('off': the CPU adapters' 'auto', and top-k / top-p anywhere).
  for (const mode of ['on', 'off'] as const)
    for (const V of [300, 8192]) {
      for (const [name, opts] of OPTIONS) {
        it(`${name}, V = ${V}, sampleChunks ${mode}: each row as a one-row sample() with its seed and step, bit for bit`, async () => {
          K.tuning.sampleChunks = mode;
          onTestFinished(() => void (K.tuning.sampleChunks = 'auto'));
          const B = 5;
          const logits = ref.randn(B * V, ref.rng(V + opts.topK), 2);
          const rng = [
            [7, 0, 0],
            [8, 3, 0],
            [0xffffffff, 1, 0],
            [7, 0, 0], // same inputs as row 0, other logits
            [123456, 40, 0],
          ];
          const out = outBuf(2 * B, 'picked');
          K.sampleRows(gpu, out, f32Buf(logits), u32Buf(rng.flat()), B, V, opts);
          // Greedy and untruncated draws go through the chunks (shaders/sample.wgsl sample_chunks,
          // sample_pick; 4 chunks at V = 8192), top-k / top-p through one workgroup a row.
          const chunked = mode === 'on' && opts.topK === 0 && opts.topP >= 1;
          expect(K.kernelVariant(gpu, 'sampleRows')?.label).toContain(
            chunked ? 'sample.sample_pick' : 'sample.sample_rows',
          );
          const got = await gpu.readU32(out, 2 * B);
          const ids: number[] = [],
            logps: number[] = [];
          const one = outBuf(1, 'one'),
            oneLp = outBuf(1, 'oneLp');
          for (let b = 0; b < B; b++) {
            K.sample(gpu, one, f32Buf(logits.slice(b * V, (b + 1) * V)), 1, V, opts, rng[b][0], rng[b][1], oneLp);
            ids.push((await gpu.readU32(one, 1))[0]);
            logps.push(new Uint32Array((await gpu.readF32(oneLp, 1)).buffer)[0]);
          }
          expect(Array.from(got.subarray(0, B))).toEqual(ids);
          expect(Array.from(got.subarray(B))).toEqual(logps); // the f32 bits
          if (opts.temperature > 0) {
            // The seed matters (a kernel that ignored rowRng would fail here).
            expect(new Set(ids).size).toBeGreaterThan(1);
            K.sampleRows(gpu, out, f32Buf(logits), u32Buf(rng.map(([, step]) => [99, step, 0]).flat()), B, V, opts);
            expect(Array.from((await gpu.readU32(out, B)).subarray(0, B))).not.toEqual(ids);
          }
        });
      }
    }

  it('the hash row: row r of one sample() dispatch is sampleRows with (seed, step, r)', async () => {
    const [B, V] = [6, 500];
    const logits = f32Buf(ref.randn(B * V, ref.rng(3), 2));
    const opts = { temperature: 1, topK: 0, topP: 0.95 };
    const ids = outBuf(B, 'ids'),
      lp = outBuf(B, 'lp');
    K.sample(gpu, ids, logits, B, V, opts, 42, 5, lp);
    const want = [...(await gpu.readU32(ids, B)), ...new Uint32Array((await gpu.readF32(lp, B)).buffer)];
    const out = outBuf(2 * B, 'picked');
    const rows = Array.from({ length: B }, (_, r) => [42, 5, r]).flat();
    K.sampleRows(gpu, out, logits, u32Buf(rows), B, V, opts);
    expect(Array.from(await gpu.readU32(out, 2 * B))).toEqual(want);
  });

  it('refuses an output too small for ids and log-probs, by name', () => {
    expect(() =>
      K.sampleRows(gpu, outBuf(3, 'tooSmall'), f32Buf(new Array(3 * 10).fill(0)), u32Buf(new Array(9).fill(0)), 3, 10, {
        temperature: 0,
        topK: 0,
        topP: 1,
      }),
    ).toThrow(/sampleRows out.*tooSmall/);
  });
});

describe('embedPicked', () => {
  it('embeds ids[pick[t]] exactly as embed of the gathered ids', async () => {
    const [V, C] = [50, 24];
    const table = bf16Buf(ref.roundBf16(ref.randn(V * C, ref.rng(4))));
    const ids = [7, 49, 0, 13, 0xdead, 0xbeef]; // the last two stand for the log-prob words after B ids
    const pick = [3, 0, 0, 1, 2];
    const T = pick.length;
    const a = outBuf(T * C, 'picked'),
      b = outBuf(T * C, 'plain');
    K.embedPicked(gpu, a, u32Buf(ids), u32Buf(pick), table, T, C, V, ids.length);
    K.embed(gpu, b, u32Buf(pick.map((i) => ids[i])), table, T, C, V);
    const [got, want] = [await gpu.readF32(a, T * C), await gpu.readF32(b, T * C)];
    expect(Array.from(got)).toEqual(Array.from(want));
    expect(got.some((x) => x !== 0)).toBe(true);
  });
});
