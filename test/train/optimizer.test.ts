// LoRA AdamW on the GPU: accumulation over sequences averages the gradients, clipping uses the
// global norm, and a NaN/Inf gradient skips the step (reported, nothing changed).
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { loadQwen3 } from '../../src/model/load.ts';
import { LoraAdapter } from '../../src/model/lora.ts';
import { initLora, loraConfig } from '../../src/model/peft.ts';
import { TrainingPass } from '../../src/train/trainingPass.ts';
import { crossEntropyLoss } from '../../src/train/pgLoss.ts';
import { LoraAdamW, DEFAULT_ADAMW } from '../../src/train/optimizer.ts';

let gpu: Gpu;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

async function setup() {
  const { model, cfg } = await loadQwen3(gpu, nodeFolderSource(join(import.meta.dirname, '../fixtures/golden/mha')));
  const lora = loraConfig({ r: 2, alpha: 4, targetModules: ['q_proj', 'down_proj'] });
  const adapter = new LoraAdapter(gpu, cfg, lora);
  const init = initLora(cfg, lora, 3);
  // Non-zero B so every tensor gets a gradient.
  for (const [k, v] of init) if (k.includes('lora_B')) v.forEach((_, i) => (v[i] = Math.sin(i + 1) * 0.05));
  adapter.setWeights(init);
  return { model, adapter, init };
}

async function accumulate(model: Awaited<ReturnType<typeof setup>>['model'], adapter: LoraAdapter, seq: number[]) {
  const pass = new TrainingPass(model, adapter, seq, [...seq.slice(1), -1]);
  pass.backward(crossEntropyLoss(await pass.forward()).dlogp);
  pass.release();
}

const norm = (m: Map<string, Float32Array>) =>
  Math.sqrt([...m.values()].reduce((s, a) => s + a.reduce((t, x) => t + x * x, 0), 0));

describe('LoraAdamW', () => {
  it('averages gradients accumulated over sequences and reports their global norm', async () => {
    const { model, adapter } = await setup();
    const a = [3, 14, 15, 92, 65, 35],
      b = [89, 79, 32, 38, 46];
    await accumulate(model, adapter, a);
    const ga = await adapter.getTensors('grads');
    adapter.zeroGrad();
    await accumulate(model, adapter, b);
    const gb = await adapter.getTensors('grads');
    adapter.zeroGrad();
    const mean = new Map([...ga].map(([k, v]) => [k, v.map((x, i) => (x + gb.get(k)![i]) / 2)]));
    await accumulate(model, adapter, a);
    await accumulate(model, adapter, b);
    const opt = new LoraAdamW(gpu, adapter, { ...DEFAULT_ADAMW, maxGradNorm: 0 });
    const rep = await opt.update(2);
    expect(rep.skipped).toBe(false);
    expect(rep.gradNorm).toBeCloseTo(norm(mean), 4);
    expect(norm(await adapter.getTensors('grads'))).toBe(0); // zeroed after the step
    adapter.destroy();
  });

  it('skips a step whose gradient is NaN or Inf and leaves the weights alone', async () => {
    const { model, adapter } = await setup();
    await accumulate(model, adapter, [1, 2, 3, 4]);
    const before = await adapter.getTensors('weights');
    const p = adapter.pairs[0];
    gpu.write(p.dA, new Float32Array([NaN]), 4);
    const opt = new LoraAdamW(gpu, adapter);
    const rep = await opt.update(1);
    expect(rep.skipped).toBe(true);
    expect(rep.reason).toMatch(/NaN or Inf/);
    expect(opt.step).toBe(0);
    const after = await adapter.getTensors('weights');
    for (const [k, v] of before)
      expect(Buffer.compare(Buffer.from(v.buffer), Buffer.from(after.get(k)!.buffer)), k).toBe(0);
    // The next finite step goes through.
    await accumulate(model, adapter, [1, 2, 3, 4]);
    expect((await opt.update(1)).skipped).toBe(false);
    expect(opt.step).toBe(1);
    adapter.destroy();
  });
});
