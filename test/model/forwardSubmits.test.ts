// One command buffer per forward: the small uploads of a decode step (token ids, slots,
// positions, the page table when a new page is mapped, the logit rows) are staged in the command
// stream (src/gpu/launch.ts UploadArena), and a step of a deep model stays under the
// params-per-submit bound, so Qwen3Model.forward submits nothing; the read of the logits is the
// step's one submit, and a repeated step reuses its bind groups. The logits of the decode steps equal a single prefill over the same tokens.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { loadQwen3 } from '../../src/model/load.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';
import { KV_PAGE_SIZE } from '../../src/model/kvCache.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import * as K from '../../src/ops/index.ts';
import { attachAdapter, movedLora } from '../helpers/train.ts';

// ~9 dispatches a layer with the CPU adapters' kernels, ~6 with a GPU's fusions (SPYRL_KERNELS=autoFor=gpu):
// more than the old 256-dispatch submit bound either way
const LAYERS = 48;
let gpu: Gpu, tmp: string, model: Qwen3Model;
beforeAll(async () => {
  gpu = await createGpu();
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-submits-'));
  await writeTinyCheckpoint(tmp, {
    layers: LAYERS,
    hidden: 32,
    heads: 4,
    kvHeads: 2,
    headDim: 8,
    intermediate: 64,
    seed: 5,
  });
  model = (await loadQwen3(gpu, nodeFolderSource(tmp))).model;
});
afterAll(async () => {
  gpu?.destroy();
  await rm(tmp, { recursive: true, force: true });
});

describe('decode step', () => {
  it('submits nothing inside forward (ids, positions, page table and logit rows staged), and matches one prefill', async () => {
    const V = model.cfg.vocabSize;
    const ids = Array.from({ length: KV_PAGE_SIZE + 5 }, (_, i) => (i * 7919 + 11) % 5000);
    const prompt = KV_PAGE_SIZE - 1;
    const cache = model.createCache(1, 64);
    const pre = model.forward(
      {
        ids: ids.slice(0, prompt),
        slots: new Array(prompt).fill(0),
        positions: ids.slice(0, prompt).map((_, i) => i),
        logitRows: [prompt - 1],
      },
      cache,
    );
    await gpu.readF32(pre, V);
    gpu.releaseBuffer(pre);
    const stepLogits: Float32Array[] = [];
    const perStep: { dispatches: number; submits: number; bindGroups: number }[] = [];
    for (let pos = prompt; pos < ids.length; pos++) {
      // the step at position KV_PAGE_SIZE maps a new page
      const d0 = gpu.dispatchCount,
        s0 = gpu.submitCount,
        b0 = gpu.bindGroupCount;
      const out = model.forward({ ids: [ids[pos]], slots: [0], positions: [pos], logitRows: [0] }, cache);
      perStep.push({
        dispatches: gpu.dispatchCount - d0,
        submits: gpu.submitCount - s0,
        bindGroups: gpu.bindGroupCount - b0,
      });
      stepLogits.push(await gpu.readF32(out, V));
      gpu.releaseBuffer(out);
    }
    cache.destroy();
    // The first step meets new buffer sizes: making them may destroy free buffers, and the pool
    // submits pending work first if those are not enough without it (src/gpu/device.ts makeRoom).
    // From then on, including the step that maps a new page: none.
    expect(perStep[0].submits).toBeLessThanOrEqual(1);
    for (const s of perStep.slice(1)) {
      expect(s.dispatches).toBeGreaterThan(256);
      expect(s.submits).toBe(0);
    }
    // Bind groups are made once per buffer set: once the pool hands out the same buffers again,
    // a step makes none (src/gpu/device.ts bindGroup).
    expect(perStep[0].bindGroups).toBeGreaterThan(256);
    expect(perStep.at(-1)!.bindGroups).toBe(0);
    // The same tokens in one prefill: the decode steps' logits are its last rows.
    const whole = model.createCache(1, 64);
    const rows = Array.from({ length: ids.length - prompt }, (_, i) => prompt + i);
    const all = model.forward(
      { ids, slots: new Array(ids.length).fill(0), positions: ids.map((_, i) => i), logitRows: rows },
      whole,
    );
    const want = await gpu.readF32(all, rows.length * V);
    gpu.releaseBuffer(all);
    whole.destroy();
    let worst = 0,
      scale = 0;
    stepLogits.forEach((got, r) => {
      for (let i = 0; i < V; i++) {
        worst = Math.max(worst, Math.abs(got[i] - want[r * V + i]));
        scale = Math.max(scale, Math.abs(want[r * V + i]));
      }
    });
    expect(worst).toBeLessThanOrEqual(1e-5 * scale + 1e-6);
  });
});

describe('decode steps with a LoRA adapter and sampling on the GPU, two sequences', () => {
  // The LoRA products' (T, r) scratch and the logit rows are made after the layers: a release
  // before a later make let that make's pool miss destroy the released buffers, so every step
  // missed them again and made new bind groups (46 a step at 4 layers) and a second submit
  // (src/model/qwen3.ts releases them together at the end; src/gpu/device.ts makeRoom keeps free
  // buffers that fit under the peak).
  it('make no bind groups and submit nothing once warm, each step as the sampler leaves it', async () => {
    const { lora, weights } = movedLora(model, 4, 2);
    const adapter = attachAdapter(model, lora, weights);
    const B = 2,
      prompt = 5;
    const cache = model.createCache(B, 32);
    const sampled = gpu.createBuffer(B * 4, 'sampled');
    try {
      const pre = model.forward(
        {
          ids: Array.from({ length: B * prompt }, (_, i) => (i * 104729 + 7) % 5000),
          slots: Array.from({ length: B * prompt }, (_, i) => Math.floor(i / prompt)),
          positions: Array.from({ length: B * prompt }, (_, i) => i % prompt),
          logitRows: [prompt - 1, 2 * prompt - 1],
        },
        cache,
      );
      K.sample(gpu, sampled, pre, B, model.cfg.vocabSize, { temperature: 0.7, topK: 20, topP: 0.8 }, 1, 0);
      gpu.releaseBuffer(pre);
      await gpu.sync();
      const perStep: { dispatches: number; submits: number; bindGroups: number }[] = [];
      for (let step = 0; step < 4; step++) {
        const ids = Array.from(await gpu.readU32(sampled, B)); // submits the step before
        const d0 = gpu.dispatchCount,
          s0 = gpu.submitCount,
          b0 = gpu.bindGroupCount;
        const out = model.forward(
          { ids, slots: [0, 1], positions: [prompt + step, prompt + step], logitRows: [0, 1] },
          cache,
        );
        K.sample(gpu, sampled, out, B, model.cfg.vocabSize, { temperature: 0.7, topK: 20, topP: 0.8 }, 1, step + 1);
        perStep.push({
          dispatches: gpu.dispatchCount - d0,
          submits: gpu.submitCount - s0,
          bindGroups: gpu.bindGroupCount - b0,
        });
        gpu.releaseBuffer(out);
      }
      await gpu.sync();
      // The LoRA branch runs in every layer (its dispatches are there to cache).
      expect(perStep[0].dispatches).toBeGreaterThan(LAYERS * 10);
      for (const s of perStep.slice(1))
        expect({ submits: s.submits, bindGroups: s.bindGroups }).toEqual({ submits: 0, bindGroups: 0 });
    } finally {
      gpu.releaseBuffer(sampled);
      cache.destroy();
      model.lora = null;
      adapter.destroy();
    }
  });
});
