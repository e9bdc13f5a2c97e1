// The peer's graph is a second, independent implementation of every op of the model: the ONNX
// export of the golden "tied" checkpoint (scripts/export_onnx.py, with a KV cache) run by
// onnxruntime-web's wasm EP in Node. Checked against the PyTorch golden logits (the export itself)
// and against our engine on the same prefill + cached-decode schedule.
// Tolerances: ORT and PyTorch both compute in f32 from the same f32 weights (bf16 widened), so
// 1e-5 x max|logit|; ours against ORT uses the golden budget of test/model/golden.test.ts, 1e-3.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as ort from 'onnxruntime-web';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { loadQwen3 } from '../../src/model/load.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { PEER_FILES, maxRelDiff, ortLogits, ourLogits, type Ort } from '../../bench/peer.ts';

const ROOT = join(import.meta.dirname, '../..');
const checkpoint = join(ROOT, PEER_FILES.checkpoint);

let gpu: Gpu;
let session: ort.InferenceSession;
beforeAll(async () => {
  gpu = await createGpu();
  ort.env.wasm.numThreads = 1;
  session = await ort.InferenceSession.create(await readFile(join(ROOT, PEER_FILES.onnx)), {
    executionProviders: ['wasm'],
  });
});
afterAll(async () => {
  await session?.release();
  gpu?.destroy();
});

describe('onnxruntime-web peer (tiny Qwen3 with KV cache)', () => {
  it('has the KV-cache inputs and outputs of scripts/export_onnx.py', () => {
    expect(session.inputNames).toEqual(['input_ids', 'past_key_0', 'past_value_0', 'past_key_1', 'past_value_1']);
    expect(session.outputNames).toEqual([
      'logits',
      'present_key_0',
      'present_value_0',
      'present_key_1',
      'present_value_1',
    ]);
  });

  it('matches the PyTorch golden logits: prefill 10 tokens, then 6 one at a time through the cache', async () => {
    const exp = JSON.parse(await readFile(join(checkpoint, 'expected.json'), 'utf8')) as {
      tokens: number[];
      shape: [number, number];
    };
    const ref = new Float32Array((await readFile(join(checkpoint, 'logits.f32'))).buffer.slice(0));
    const { cfg } = await loadQwen3(gpu, nodeFolderSource(checkpoint));
    const got = await ortLogits(ort as unknown as Ort, session, cfg, exp.tokens, 10);
    const err = maxRelDiff(got, ref);
    console.log(`ORT vs PyTorch: max|diff| / max|ref| = ${err.toExponential(2)}`);
    expect(err).toBeLessThan(1e-5);
  });

  it('agrees with our engine on the same schedule, and a wrong token shows', async () => {
    const { model } = await loadQwen3(gpu, nodeFolderSource(checkpoint));
    const ids = [549, 0, 418, 1849, 107, 2016, 942, 725, 961];
    const theirs = await ortLogits(ort as unknown as Ort, session, model.cfg, ids, 4);
    const ours = await ourLogits(model, ids, 4);
    const err = maxRelDiff(ours, theirs);
    console.log(`ours vs ORT: max|diff| / max|ref| = ${err.toExponential(2)}`);
    expect(err).toBeLessThan(1e-3);
    // The comparison can fail: one changed token in the cached part moves the later logits.
    const other = await ourLogits(model, [...ids.slice(0, 5), 7, ...ids.slice(6)], 4);
    expect(maxRelDiff(other, theirs)).toBeGreaterThan(1e-2);
  });
});
