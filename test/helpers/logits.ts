// The logits of every position of one sequence, one prefill on a fresh cache: what the golden
// tests and bench/gpu-check.ts compare with the PyTorch fixtures.
import type { Qwen3Model } from '../../src/model/qwen3.ts';

/** (T, V) logits of `tokens` at positions 0..T-1, read back as f32. */
export async function logitsOf(model: Qwen3Model, tokens: readonly number[]): Promise<Float32Array> {
  const T = tokens.length;
  const rows = tokens.map((_, t) => t);
  const cache = model.createCache(1, T);
  try {
    const buf = model.forward({ ids: [...tokens], slots: rows.map(() => 0), positions: rows, logitRows: rows }, cache);
    const out = await model.gpu.readF32(buf, T * model.cfg.vocabSize);
    model.gpu.releaseBuffer(buf);
    return out;
  } finally {
    cache.destroy();
  }
}
