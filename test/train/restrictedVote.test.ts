// A vote's log-probability is renormalised over the candidate labels; its gradient must be the
// gradient of that restricted log-softmax. Checked against central finite differences of the
// loss (f32 forward, so the step is 1e-2 and the tolerance 2% on the largest entries).
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { loadQwen3 } from '../../src/model/load.ts';
import { LoraAdapter } from '../../src/model/lora.ts';
import { initLora, loraConfig } from '../../src/model/peft.ts';
import { TrainingPass } from '../../src/train/trainingPass.ts';

let gpu: Gpu;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

describe('restricted (vote) log-probabilities', () => {
  it('match a CPU renormalisation and have finite-difference gradients', async () => {
    const { model, cfg } = await loadQwen3(gpu, nodeFolderSource(join(import.meta.dirname, '../fixtures/golden/mha')));
    const lora = loraConfig({ r: 2, alpha: 4, targetModules: ['v_proj', 'down_proj'] });
    const w = initLora(cfg, lora, 1);
    for (const [k, v] of w) if (k.includes('lora_B')) v.forEach((_, i) => (v[i] = Math.cos(i) * 0.1));
    const adapter = new LoraAdapter(gpu, cfg, lora);
    adapter.setWeights(w);
    const prompt = [5, 77, 300, 12, 9, 41];
    const cands = [16, 17, 19];
    const ids = [...prompt, 17];
    const targets = ids.map((_, t) => (t === prompt.length - 1 ? 17 : -1));
    const lossOf = async () => {
      const p = new TrainingPass(model, adapter, ids, targets, cands);
      const lp = await p.forward();
      p.release();
      return -lp[0];
    };
    // Restricted log-prob equals log softmax over the candidates' full-model logits.
    model.lora = adapter;
    const cache = model.createCache(1, ids.length);
    const buf = model.forward(
      { ids: prompt, slots: prompt.map(() => 0), positions: prompt.map((_, i) => i), logitRows: [prompt.length - 1] },
      cache,
    );
    const logits = await gpu.readF32(buf, cfg.vocabSize);
    gpu.releaseBuffer(buf);
    cache.destroy();
    const z = cands.map((c) => logits[c]);
    const mx = Math.max(...z);
    const expected = z[1] - mx - Math.log(z.reduce((s, x) => s + Math.exp(x - mx), 0));
    expect(Math.abs(-(await lossOf()) - expected)).toBeLessThan(1e-4);

    const pass = new TrainingPass(model, adapter, ids, targets, cands);
    await pass.forward();
    pass.backward([-1]);
    pass.release();
    const g = await adapter.getTensors('grads');
    let checked = 0;
    for (const [key, grad] of g) {
      const i = grad.reduce((best, x, j) => (Math.abs(x) > Math.abs(grad[best]) ? j : best), 0);
      const h = 1e-2,
        orig = w.get(key)![i];
      w.get(key)![i] = orig + h;
      adapter.setWeights(w);
      const up = await lossOf();
      w.get(key)![i] = orig - h;
      adapter.setWeights(w);
      const dn = await lossOf();
      w.get(key)![i] = orig;
      adapter.setWeights(w);
      const fd = (up - dn) / (2 * h);
      expect(Math.abs(grad[i]), `${key} has no gradient`).toBeGreaterThan(1e-3);
      expect(Math.abs(fd - grad[i]), `${key}[${i}]: analytic ${grad[i]} fd ${fd}`).toBeLessThanOrEqual(
        0.02 * Math.abs(grad[i]) + 1e-4,
      );
      checked++;
    }
    expect(checked).toBe(4);
    adapter.destroy();
  });
});
