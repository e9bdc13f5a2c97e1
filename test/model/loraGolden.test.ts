// LoRA against PyTorch autograd: adapters written by scripts/golden_lora.py (its own PEFT files)
// on checkpoints written by scripts/golden_qwen3.py. Tolerances (from the fixtures): per LoRA
// tensor max|g - g_ref| <= 1e-3 x max|g_ref| + 1e-6; loss to 1e-4 relative; logits with the
// adapter within 1e-3 x max|ref|. The reference's own f32-vs-f64 error is ~3e-6 relative. Where
// the run's 'auto' takes the f16 GEMM (a GPU's choices with shader-f16), f16's budgets
// (test/helpers/gemmBudget.ts): 5e-3 for logits, 1e-2 for gradients, 1e-3 for the loss.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { TrainingPass } from '../../src/train/trainingPass.ts';
import { crossEntropyLoss } from '../../src/train/pgLoss.ts';
import { openSafetensorsModel } from '../../src/model/safetensors.ts';
import { memorySource } from '../../src/model/sources.ts';
import { goldenBudget } from '../helpers/gemmBudget.ts';
import { logitsOf } from '../helpers/logits.ts';
import { loadLoraGolden } from '../helpers/loraGolden.ts';

const ROOT = join(import.meta.dirname, '../..');

let gpu: Gpu;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

const setup = (variant: string) => loadLoraGolden(gpu, variant);

/** Reads an F32 safetensors file into a key -> array map. */
async function readF32Tensors(file: string): Promise<Map<string, Float32Array>> {
  const bytes = new Uint8Array(await readFile(file));
  const st = await openSafetensorsModel(memorySource('grads', new Map([['model.safetensors', bytes]])));
  const out = new Map<string, Float32Array>();
  for (const name of st.tensors.keys()) {
    const b = await st.readTensor(name);
    out.set(name, new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)));
  }
  return out;
}

describe.each(['tied-all', 'untied-rslora'])('LoRA vs PyTorch autograd: %s', (variant) => {
  it('logits with the adapter match within 1e-3 x max|ref| (f16 GEMM: 5e-3)', async () => {
    const { dir, ref, model, adapter } = await setup(variant);
    const got = await logitsOf(model, ref.tokens);
    const want = new Float32Array((await readFile(join(dir, 'logits.f32'))).buffer.slice(0));
    let err = 0;
    for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i] - want[i]));
    expect(err).toBeLessThanOrEqual(goldenBudget(gpu).logits * ref.max_abs_logit);
    adapter.destroy();
  });

  // Decode with the adapter: a prefill of the first 3 tokens, then one token a step for two
  // sequences batched (T = 2 rows a step), each step's logits against the fixture's at that
  // position. With a GPU's choices (npm test's autoFor=gpu stages) the steps run the lane GEMVs
  // with the LoRA branches, the norms, the SwiGLU and (tied-all: every projection targeted) q/k/v's
  // LoRA A product begun in the previous layer's down_proj folded in; on a CPU adapter, gemv_rows.
  it('decode steps with the adapter, two sequences batched, match the logits within the same budget', async () => {
    const { dir, ref, model, adapter } = await setup(variant);
    const want = new Float32Array((await readFile(join(dir, 'logits.f32'))).buffer.slice(0));
    const V = model.cfg.vocabSize;
    const ids = ref.tokens;
    const n = Math.min(ids.length, 8);
    const P = 3;
    const cache = model.createCache(2, n);
    const budget = goldenBudget(gpu).logits * ref.max_abs_logit;
    const rows = [...Array(P).keys()];
    const check = async (buf: GPUBuffer, t: number, R: number) => {
      const got = await gpu.readF32(buf, R * V);
      gpu.releaseBuffer(buf);
      let err = 0;
      for (let r = 0; r < R; r++)
        for (let i = 0; i < V; i++) err = Math.max(err, Math.abs(got[r * V + i] - want[t * V + i]));
      expect(err, `position ${t}`).toBeLessThanOrEqual(budget);
    };
    try {
      const pre = model.forward(
        {
          ids: [...ids.slice(0, P), ...ids.slice(0, P)],
          slots: [...rows.map(() => 0), ...rows.map(() => 1)],
          positions: [...rows, ...rows],
          logitRows: [P - 1, 2 * P - 1],
        },
        cache,
      );
      await check(pre, P - 1, 2);
      for (let t = P; t < n; t++) {
        const out = model.forward(
          { ids: [ids[t], ids[t]], slots: [0, 1], positions: [t, t], logitRows: [0, 1] },
          cache,
        );
        await check(out, t, 2);
      }
    } finally {
      cache.destroy();
      adapter.destroy();
    }
  });

  it('loss and the gradient of every LoRA tensor match', async () => {
    const { dir, ref, model, adapter } = await setup(variant);
    const ids = ref.tokens;
    const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1]);
    const logp = await pass.forward();
    const { loss, dlogp } = crossEntropyLoss(logp);
    const budget = goldenBudget(gpu);
    expect(Math.abs(loss - ref.loss) / ref.loss).toBeLessThanOrEqual(budget.loss);
    pass.backward(dlogp);
    pass.release();
    const got = await adapter.getTensors('grads');
    const want = await readF32Tensors(join(dir, 'grads.safetensors'));
    expect([...got.keys()].sort()).toEqual([...want.keys()].sort());
    let worst = 0;
    for (const [key, g] of want) {
      const mine = got.get(key)!;
      let maxRef = 0,
        err = 0;
      for (let i = 0; i < g.length; i++) {
        maxRef = Math.max(maxRef, Math.abs(g[i]));
        err = Math.max(err, Math.abs(mine[i] - g[i]));
      }
      expect(err, key).toBeLessThanOrEqual(budget.grad * maxRef + 1e-6);
      worst = Math.max(worst, err / maxRef);
    }
    console.log(
      `${variant}${budget.f16 ? ' (f16 GEMM)' : ''}: loss ${loss.toFixed(6)} vs ${ref.loss.toFixed(6)}; worst per-tensor gradient error ${worst.toExponential(2)} x max|g_ref|`,
    );
    adapter.destroy();
  });

  it("with the adapter switched off (the KL reference policy) log-probs are the base model's", async () => {
    const { ref, adapter, model } = await setup(variant);
    const baseDir = join(ROOT, ref.model_dir);
    const base = JSON.parse(await readFile(join(baseDir, 'expected.json'), 'utf8')) as {
      tokens: number[];
      shape: [number, number];
    };
    const logits = new Float32Array((await readFile(join(baseDir, 'logits.f32'))).buffer.slice(0));
    const [T, V] = base.shape;
    const ids = base.tokens;
    adapter.enabled = false;
    const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1]);
    const logp = await pass.forward();
    pass.release();
    for (let t = 0; t < T - 1; t++) {
      const row = logits.subarray(t * V, (t + 1) * V);
      const mx = row.reduce((a, b) => Math.max(a, b), -Infinity);
      const lse = mx + Math.log(row.reduce((a, b) => a + Math.exp(b - mx), 0));
      expect(Math.abs(logp[t] - (row[ids[t + 1]] - lse)), `t=${t}`).toBeLessThanOrEqual(
        goldenBudget(gpu).logits * Math.max(1, Math.abs(row[ids[t + 1]] - lse)),
      );
    }
    adapter.enabled = true;
    adapter.destroy();
  });
});
