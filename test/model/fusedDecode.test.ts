// The decode fusions in Qwen3Model.forward (K.matmulGroup for q/k/v and gate/up, K.qkNormRopeKv for
// q/k norms + RoPE + the KV write): logits bitwise equal to the unfused kernels
// (K.fusions.enabled = false) over a prefill of two prompts and batched decode steps, with LoRA
// on every projection, bf16 and q4 weights, f32 and f16 KV, the CPU-adapter GEMV ('auto' here) and
// the GPU ones (tuning.matmul 'lanes', 'gemv'); and 7 dispatches fewer per layer per step (the
// LoRA A products of q/k/v and of gate/up fused too, K.matmulGroupF32), 10 with 'lanes' (their B
// products too, K.matmulEachF32). The LoRA B fold (tuning.loraFold) takes those B products into
// the GEMVs' stores, o_proj's, down_proj's and the groups' where their bindings fit. With 'lanes' the two
// RMSNorms also fold into those GEMVs (tuning.normFold): 2 dispatches fewer, logits within f32
// rounding of 'off'; an adapter on part of a group keeps that group's norm. With 'lanes' the
// SwiGLU activation folds into down_proj's GEMVs (tuning.siluFold): 1 dispatch fewer, bitwise.
// Run: npx vitest run test/model/fusedDecode.test.ts   (SwiftShader in Node; see docs/ENGINE.md)
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';
import { loadQwen3 } from '../../src/model/load.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import { initLora, loraConfig } from '../../src/model/peft.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';
import * as K from '../../src/ops/index.ts';
import { attachAdapter, movedLora } from '../helpers/train.ts';

const LAYERS = 2;
let gpu: Gpu, tmp: string;
beforeAll(async () => {
  gpu = await createGpu();
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-fused-'));
  // C, I multiples of 32 (q4); NKV * HD = 32 and NH * HD = 64 columns per projection.
  await writeTinyCheckpoint(tmp, {
    layers: LAYERS,
    hidden: 64,
    heads: 4,
    kvHeads: 2,
    headDim: 16,
    intermediate: 96,
    vocab: 1024,
    seed: 11,
  });
});
afterEach(() => {
  K.fusions.enabled = true;
  K.resetTuning();
});
afterAll(async () => {
  gpu?.destroy();
  await rm(tmp, { recursive: true, force: true });
});

/**
 * got within rounding of want (the folded RMSNorm): max |got - want| <= rel x max |want|, rel 1e-5
 * (f32 rounding) by default; an f16 KV cache rounds a slightly different k or v to the next f16
 * (5e-4 apart) now and then, so 2e-4 there.
 */
function expectClose(got: number[], want: number[], what: string, rel = 1e-5): void {
  expect(got.every(Number.isFinite), what).toBe(true);
  const scale = Math.max(...want.map(Math.abs));
  const err = Math.max(...got.map((g, i) => Math.abs(g - want[i])));
  expect(err, `${what}: max |err| ${err} against max |logit| ${scale}`).toBeLessThanOrEqual(rel * scale);
}

/**
 * Prefill of 2 prompts (3 tokens each) then 3 batched decode steps, in a cache of maxT positions a
 * sequence; logits of every step and dispatches per decode step.
 */
async function decode(model: Qwen3Model, maxT = 32): Promise<{ logits: number[][]; dispatches: number[] }> {
  const { gpu } = model;
  const V = model.cfg.vocabSize;
  const cache = model.createCache(2, maxT);
  const prompt = [
    [5, 17, 300],
    [900, 2, 41],
  ];
  const logits: number[][] = [];
  const dispatches: number[] = [];
  const pre = model.forward(
    {
      ids: prompt.flat(),
      slots: [0, 0, 0, 1, 1, 1],
      positions: [0, 1, 2, 0, 1, 2],
      logitRows: [2, 5],
    },
    cache,
  );
  logits.push(Array.from(await gpu.readF32(pre, 2 * V)));
  gpu.releaseBuffer(pre);
  for (let step = 0; step < 3; step++) {
    const d0 = gpu.dispatchCount;
    const out = model.forward(
      {
        ids: [(step * 131 + 7) % V, (step * 37 + 500) % V],
        slots: [0, 1],
        positions: [3 + step, 3 + step],
        logitRows: [0, 1],
      },
      cache,
    );
    dispatches.push(gpu.dispatchCount - d0);
    logits.push(Array.from(await gpu.readF32(out, 2 * V)));
    gpu.releaseBuffer(out);
  }
  cache.destroy();
  return { logits, dispatches };
}

/** run()'s result and the labels of the kernels it dispatched on g, in order. */
async function withLabels<R>(g: Gpu, run: () => Promise<R>): Promise<{ result: R; labels: string[] }> {
  const labels: string[] = [];
  const dispatch = g.dispatch.bind(g);
  g.dispatch = (kernel, ...rest) => {
    labels.push(kernel.label);
    dispatch(kernel, ...rest);
  };
  try {
    return { result: await run(), labels };
  } finally {
    g.dispatch = dispatch;
  }
}

describe.each([
  ['bf16', 'f32', 'auto'],
  ['q4', 'f16', 'auto'],
  ['bf16', 'f16', 'gemv'],
  ['q4', 'f32', 'gemv'],
  ['bf16', 'f32', 'lanes'],
  ['q4', 'f16', 'lanes'],
] as const)('weights %s, KV %s, tuning.matmul %s', (weights, kv, matmul) => {
  it('fused logits are bitwise the unfused ones, with LoRA on every projection; 7 dispatches fewer per layer', async () => {
    const { model } = await loadQwen3(gpu, nodeFolderSource(tmp), { weights, kv });
    const { lora, weights: loraWeights } = movedLora(model, 4, 3);
    const adapter = attachAdapter(model, lora, loraWeights);
    K.tuning.matmul = matmul;
    // The RMSNorm fold (on with 'lanes') and the LoRA B fold are not bitwise: they have their own
    // comparisons below.
    K.tuning.normFold = 'off';
    K.tuning.loraFold = 'off';
    K.tuning.siluFold = 'off';
    K.tuning.loraAFold = 'off'; // its own test below
    const fused = await decode(model);
    expect(K.kernelVariant(gpu, 'matmulGroup')?.label).toContain(
      { auto: 'gemv.gemv_rows_group', gemv: 'matmul.matmul_gemv_group', lanes: 'gemv.gemv_lanes_group' }[matmul],
    );
    expect(K.kernelVariant(gpu, 'qkNormRopeKv')?.label).toContain(`rope.qk_norm_rope[KV=${kv}`);
    K.fusions.enabled = false;
    const unfused = await decode(model);
    for (let s = 0; s < fused.logits.length; s++) {
      expect(fused.logits[s].every(Number.isFinite)).toBe(true);
      expect(fused.logits[s], `step ${s}`).toEqual(unfused.logits[s]);
    }
    // Per layer: q/k/v 3 -> 1 and their LoRA A products 3 -> 1, gate/up 2 -> 1 and their LoRA A
    // products 2 -> 1, kv_write folded into qk_norm_rope; with 'lanes' the LoRA B products of
    // q/k/v 3 -> 1 and of gate/up 2 -> 1 too (K.matmulEachF32).
    for (let s = 0; s < fused.dispatches.length; s++)
      expect(unfused.dispatches[s] - fused.dispatches[s]).toBe((matmul === 'lanes' ? 10 : 7) * LAYERS);
    expect(K.kernelVariant(gpu, 'matmulGroupF32')?.label).toContain(
      { auto: 'gemv.gemv_rows_group', gemv: 'matmul.matmul_gemv_group', lanes: 'gemv.gemv_lanes_group' }[matmul],
    );
    // The fold ('auto'): with 'lanes' the input and post-attention RMSNorms run inside the q/k/v
    // and gate/up GEMVs and their LoRA A products, 2 dispatches fewer per layer, the logits within
    // f32 rounding; elsewhere nothing changes.
    K.fusions.enabled = true;
    K.tuning.normFold = 'auto';
    const folded = await decode(model);
    const label = K.kernelVariant(gpu, 'matmulGroup')?.label ?? '';
    if (matmul === 'lanes') {
      expect(label).toContain('NORM=1');
      expect(K.kernelVariant(gpu, 'matmulGroupF32')?.label).toContain('NORM=1');
      for (let s = 0; s < fused.logits.length; s++)
        expectClose(folded.logits[s], fused.logits[s], `step ${s}`, kv === 'f16' ? 2e-4 : 1e-5);
    } else {
      expect(label).not.toContain('NORM');
      for (let s = 0; s < fused.logits.length; s++) expect(folded.logits[s], `step ${s}`).toEqual(fused.logits[s]);
    }
    for (let s = 0; s < fused.dispatches.length; s++)
      expect(fused.dispatches[s] - folded.dispatches[s]).toBe(matmul === 'lanes' ? 2 * LAYERS : 0);
    // The LoRA B fold (tuning.loraFold 'auto'): where the projections take shaders/gemv.wgsl
    // (gemv_rows here, gemv_lanes), the o_proj and down_proj B products run in their GEMVs' stores,
    // 2 dispatches fewer per layer, and so do the q/k/v and gate/up groups': each branch's u and B
    // bound where their 4 G + 1 storage buffers (and the folded norm's) fit, else packed (2 G + 3:
    // one u over the stacked A's, one stacked B) where those fit; each group's B products were one
    // dispatch with 'lanes' (K.matmulEachF32), G elsewhere; the logits within f32 rounding;
    // matmul_gemv keeps them apart.
    K.tuning.loraFold = 'auto';
    const loraFolded = await decode(model);
    const gemvFile = matmul !== 'gemv';
    if (gemvFile) {
      expect(K.kernelVariant(gpu, 'matmulLora')?.label).toContain(
        `${matmul === 'lanes' ? 'gemv.gemv_lanes' : 'gemv.gemv_rows'}[`,
      );
      expect(K.kernelVariant(gpu, 'matmulLora')?.label).toContain('LORA=1');
      for (let s = 0; s < fused.logits.length; s++)
        expectClose(loraFolded.logits[s], folded.logits[s], `LoRA fold, step ${s}`, kv === 'f16' ? 2e-4 : 1e-5);
    } else {
      for (let s = 0; s < fused.logits.length; s++) expect(loraFolded.logits[s], `step ${s}`).toEqual(folded.logits[s]);
    }
    const limit = gpu.limits.maxStorageBuffersPerShaderStage;
    const groupFold = (G: number) =>
      2 * G + 3 + (matmul === 'lanes' ? 1 : 0) <= limit ? (matmul === 'lanes' ? 1 : G) : 0;
    const groupPacks = (G: number) => 4 * G + 1 + (matmul === 'lanes' ? 1 : 0) > limit && groupFold(G) > 0;
    const fewer = gemvFile ? (2 + groupFold(3) + groupFold(2)) * LAYERS : 0;
    for (let s = 0; s < fused.dispatches.length; s++)
      expect(folded.dispatches[s] - loraFolded.dispatches[s]).toBe(fewer);
    if (gemvFile && groupFold(2) > 0) expect(K.kernelVariant(gpu, 'matmulGroup')?.label).toContain('LORA=1');
    // The last group product of a step is gate/up's: packed where it does not fit unpacked.
    if (gemvFile) expect(K.kernelVariant(gpu, 'matmulGroup')?.label.includes('LORAPACK=1')).toBe(groupPacks(2));
    // The SwiGLU fold (tuning.siluFold 'auto'): with 'lanes' down_proj's GEMV and its LoRA A
    // product form silu(gate) * up as they stage x (no silu_mul dispatch: 1 fewer per layer), the
    // logits bitwise those of the separate kernel; elsewhere nothing changes.
    K.tuning.siluFold = 'auto';
    const siluFolded = await decode(model);
    if (matmul === 'lanes') {
      expect(K.kernelVariant(gpu, 'matmulLora')?.label).toContain('SILU=1');
      expect(K.kernelVariant(gpu, 'matmulF32')?.label).toContain('SILU=1');
    } else expect(K.kernelVariant(gpu, 'matmulLora')?.label ?? '').not.toContain('SILU');
    for (let s = 0; s < fused.logits.length; s++)
      expect(siluFolded.logits[s], `step ${s}`).toEqual(loraFolded.logits[s]);
    for (let s = 0; s < fused.dispatches.length; s++)
      expect(loraFolded.dispatches[s] - siluFolded.dispatches[s]).toBe(matmul === 'lanes' ? LAYERS : 0);
    // Both groups' branches packed (tuning.loraFold 'packed', what 'auto' takes where each
    // branch's bindings do not fit): the A product over the stacked A's (LoraAdapter.packed, one
    // matmulF32, its norm folded with 'lanes'), the group GEMV's store over the stacked B's; the
    // same dispatches, the logits within f32 rounding (the same sums).
    K.tuning.loraFold = 'packed';
    const packed = await decode(model);
    if (gemvFile) {
      expect(K.kernelVariant(gpu, 'matmulGroup')?.label).toContain('LORAPACK=1');
      for (let s = 0; s < fused.logits.length; s++)
        expectClose(packed.logits[s], siluFolded.logits[s], `packed, step ${s}`, kv === 'f16' ? 2e-4 : 1e-5);
    } else
      for (let s = 0; s < fused.logits.length; s++) expect(packed.logits[s], `step ${s}`).toEqual(siluFolded.logits[s]);
    expect(packed.dispatches).toEqual(siluFolded.dispatches);
    // New weights: the stacked copies follow them (LoraAdapter.weightsChanged).
    adapter.setWeights(movedLora(model, 4, 8, 0.2).weights);
    const packedNew = await decode(model);
    K.tuning.loraFold = 'off';
    const unpackedNew = await decode(model);
    for (let s = 0; s < fused.logits.length; s++) {
      expect(packedNew.logits[s], `new weights, step ${s}`).not.toEqual(packed.logits[s]);
      expectClose(
        packedNew.logits[s],
        unpackedNew.logits[s],
        `packed, new weights, step ${s}`,
        kv === 'f16' ? 2e-4 : 1e-5,
      );
    }
    adapter.destroy();
  });
});

it("an adapter on some projections of a group: that group's norm runs alone, the other's folds ('lanes')", async () => {
  const { model } = await loadQwen3(gpu, nodeFolderSource(tmp), { weights: 'bf16', kv: 'f32' });
  // q_proj and v_proj (each LoRA A product alone needs the normed rows), down_proj (not a group's).
  const lora = loraConfig({ r: 4, alpha: 8, targetModules: ['q_proj', 'v_proj', 'down_proj'] });
  const weights = initLora(model.cfg, lora, 5);
  for (const [k, v] of weights) if (k.includes('lora_B')) v.forEach((_, i) => (v[i] = 0.1 * Math.cos(i + k.length)));
  const adapter = attachAdapter(model, lora, weights);
  K.tuning.matmul = 'lanes';
  const folded = await decode(model);
  K.tuning.normFold = 'off';
  const normed = await decode(model);
  for (let s = 0; s < folded.logits.length; s++) expectClose(folded.logits[s], normed.logits[s], `step ${s}`);
  // Only the post-attention norm (gate/up: no adapter) folds.
  for (let s = 0; s < folded.dispatches.length; s++) expect(normed.dispatches[s] - folded.dispatches[s]).toBe(LAYERS);
  adapter.destroy();
});

// A device with fewer storage buffers a stage (requested lower on this one): Chrome's 10
// (gpuweb#4235) and WebGPU's default 8. With the norms folded ('lanes') q/k/v's own bindings are 8
// and gate/up's 6, each LoRA branch's u and B 2 more: at 10 q/k/v's branches bind packed (one u
// over the stacked A's, one stacked B: 10), and gate/up's too, with down_proj's A and partials
// (paired, 10); at 8 q/k/v's cannot fold (10) and gate/up's pack (8). The logits within f32 rounding of the unfolded branches either way, and the
// dispatches fewer by what folds: o_proj's and down_proj's B products and each folded group's.
describe.each([
  [10, 'q/k/v packed, gate/up packed and paired', true, true],
  [8, 'q/k/v apart, gate/up packed', false, true],
] as const)('a device with %i storage buffers a stage: %s', (limit, _what, qkvFolds, gateUpFolds) => {
  it('decodes within rounding of the unfolded branches', async () => {
    const small = await createGpu({ limitsAtMost: { maxStorageBuffersPerShaderStage: limit } });
    try {
      expect(small.limits.maxStorageBuffersPerShaderStage).toBe(limit);
      const { model } = await loadQwen3(small, nodeFolderSource(tmp), { weights: 'q4', kv: 'f32' });
      const { lora, weights } = movedLora(model, 4, 3);
      const adapter = attachAdapter(model, lora, weights);
      K.tuning.matmul = 'lanes';
      K.tuning.loraFold = 'off';
      const off = await decode(model);
      K.tuning.loraFold = 'auto';
      const { result: auto, labels } = await withLabels(small, () => decode(model));
      for (let s = 0; s < off.logits.length; s++) expectClose(auto.logits[s], off.logits[s], `step ${s}`);
      const groups = labels.filter((l) => l.startsWith('gemv.gemv_lanes_group[') && /WEIGHTS=q4/.test(l));
      const qkv = groups.filter((l) => l.includes('GROUP=3')),
        gateUp = groups.filter((l) => l.includes('GROUP=2'));
      expect(qkv.length).toBeGreaterThan(0);
      expect(gateUp.length).toBeGreaterThan(0);
      expect(qkv.every((l) => l.includes('LORA=1') === qkvFolds && l.includes('LORAPACK=1') === qkvFolds)).toBe(true);
      expect(gateUp.every((l) => l.includes('LORA=1') === gateUpFolds)).toBe(true);
      // Where a group's u can come as partial sums (tuning.loraAFold: q/k/v's packed, 10 storage
      // buffers), its A product is begun in the GEMV before it (the previous layer's down_proj,
      // o_proj): at 10 one dispatch fewer for gate/up every layer and for q/k/v every layer after
      // the first; and gate/up, packed too, pairs its columns to begin down_proj's A product
      // (K.groupPairs, 10): one fewer every layer again. At 8 none fits, and gate/up packs for
      // its own bindings.
      const partial = limit >= 10;
      expect(gateUp.every((l) => l.includes('LORAPACK=1'))).toBe(true);
      expect(gateUp.every((l) => l.includes('PAIR=1') === partial)).toBe(true);
      const fewer = (2 + (qkvFolds ? 1 : 0) + (gateUpFolds ? 1 : 0)) * LAYERS + (partial ? 3 * LAYERS - 1 : 0);
      for (let s = 0; s < off.dispatches.length; s++) expect(off.dispatches[s] - auto.dispatches[s]).toBe(fewer);
      expect(labels.some((l) => l.startsWith('gemv.gemv_lanes[') && l.includes('NEXTA=1'))).toBe(partial);
      expect(qkv.some((l) => l.includes('UPART='))).toBe(partial);
      expect(gateUp.some((l) => l.includes('UPART='))).toBe(partial);
      adapter.destroy();
    } finally {
      small.destroy();
    }
  });
});

// The groups' LoRA A products begun in the GEMV before them (tuning.loraAFold, 'auto' with
// 'lanes'): down_proj's workgroups write their columns' shares of the next layer's q/k/v
// u = rmsNorm(x) A^T before the rstd (shaders/gemv.wgsl NEXTA, over the stacked A's), o_proj's of
// its layer's gate/up u, and the group GEMVs add them up and scale them (UPART). Two ways for
// gate/up:
// - paired (the SwiGLU folded into down_proj, down_proj adapted: K.groupPairs): o_proj over
//   gate's and up's stacked A (NEXTA), the gate/up GEMV with its branches packed and its columns
//   paired, beginning down_proj's own A product over silu(gate) * up (PAIR), which down_proj's
//   GEMV adds up (UPART): LAYERS dispatches fewer again;
// - not (siluFold 'off'): o_proj over gate's and up's own A's (NEXTA2), each branch its own B.
// Against the A products of their own ('off'): logits within f32 rounding, 2 LAYERS - 1 (3 LAYERS
// - 1 paired) dispatches fewer a decode step (two rows of x, B = 2), bf16 and q4, f32 and f16 KV;
// new LoRA weights are followed (the stacked A's the producers read, LoraAdapter.packed).
describe.each([
  ['bf16', 'f32', true],
  ['q4', 'f16', true],
  ['q4', 'f32', false],
] as const)(
  'weights %s, KV %s: the LoRA A products begun in the GEMV before (gate/up paired: %s)',
  (weights, kv, paired) => {
    it('decodes within rounding of their own A products, with fewer dispatches', async () => {
      const { model } = await loadQwen3(gpu, nodeFolderSource(tmp), { weights, kv });
      const { lora, weights: loraWeights } = movedLora(model, 4, 3);
      const adapter = attachAdapter(model, lora, loraWeights);
      const base: Partial<K.Tuning> = { matmul: 'lanes', ...(paired ? {} : { siluFold: 'off' }) };
      K.resetTuning({ ...base, loraAFold: 'off' });
      const off = await decode(model);
      K.tuning.loraAFold = 'auto';
      const { result: folded, labels } = await withLabels(gpu, () => decode(model));
      const rel = kv === 'f16' ? 2e-4 : 1e-5;
      for (let s = 0; s < off.logits.length; s++) expectClose(folded.logits[s], off.logits[s], `step ${s}`, rel);
      for (let s = 0; s < off.dispatches.length; s++)
        expect(off.dispatches[s] - folded.dispatches[s]).toBe(2 * LAYERS - 1 + (paired ? LAYERS : 0));
      // Each of the 3 decode steps (the prefill of 6 rows may fold too, where u (8, 3 r) fits the
      // workgroup memory): o_proj with gate/up's A's every layer, down_proj with q/k/v's stacked A
      // all but the last; their consumers.
      const count = (f: (l: string) => boolean) => labels.filter(f).length;
      const lanes = (l: string) => l.startsWith('gemv.gemv_lanes[');
      const nexta = (l: string) => lanes(l) && l.includes('NEXTA=1');
      const upart = (l: string) => l.startsWith('gemv.gemv_lanes_group[') && l.includes('UPART=');
      // o_proj: over gate/up's stacked A where paired, their own (NEXTA2) where not; down_proj: the
      // SwiGLU folded where paired, not where not
      const oProj = (l: string) => nexta(l) && (paired ? !l.includes('SILU=1') : l.includes('NEXTA2=1'));
      const down = (l: string) => nexta(l) && (paired ? l.includes('SILU=1') : !l.includes('NEXTA2=1'));
      expect(count(oProj)).toBeGreaterThanOrEqual(3 * LAYERS);
      expect(count((l) => oProj(l) && l.includes('NEXTA2=1'))).toBe(paired ? 0 : count(oProj));
      expect(count(down)).toBeGreaterThanOrEqual(3 * (LAYERS - 1));
      const gateUp = (l: string) => upart(l) && l.includes('GROUP=2');
      expect(count((l) => gateUp(l) && l.includes('LORAPACK=1') === paired)).toBeGreaterThanOrEqual(3 * LAYERS);
      expect(count((l) => gateUp(l) && l.includes('PAIR=1'))).toBe(paired ? count(gateUp) : 0);
      // down_proj adds up the paired GEMV's partial sums
      expect(count((l) => lanes(l) && l.includes('SILU=1') && l.includes('UPART='))).toBe(
        paired ? count((l) => gateUp(l) && l.includes('PAIR=1')) : 0,
      );
      expect(count((l) => upart(l) && l.includes('GROUP=3') && l.includes('LORAPACK=1'))).toBeGreaterThanOrEqual(
        3 * (LAYERS - 1),
      );
      // New weights: both paths follow them.
      adapter.setWeights(movedLora(model, 4, 8, 0.2).weights);
      const foldedNew = await decode(model);
      K.tuning.loraAFold = 'off';
      const offNew = await decode(model);
      for (let s = 0; s < off.logits.length; s++) {
        expect(foldedNew.logits[s], `new weights, step ${s}`).not.toEqual(folded.logits[s]);
        expectClose(foldedNew.logits[s], offNew.logits[s], `new weights, step ${s}`, rel);
      }
      adapter.destroy();
    });
  },
);

// o_proj's and down_proj's own LoRA A products where they split over K (a GPU's 'auto': at
// Qwen3-4B's widths, K 4,096 and 9,728 over r = 16 columns): their slices' partial sums go to the
// projection's GEMV, which adds them up in its store (K.matmul's `lora.A`, shaders/gemv.wgsl
// UPART on gemv_lanes; tuning.loraAFold), instead of a reduce dispatch between. A checkpoint with
// NH HD = I = 1,024 splits both; against 'off': logits within f32 rounding, 2 LAYERS dispatches
// fewer a decode step for this alone (4 LAYERS - 1 with the groups' folds above), and down_proj's
// GEMV adds up its own u while it begins the next layer's q/k/v u (UPART with NEXTA). Where the
// decode attention splits over the keys (a longer cache), its attention_combine begins o_proj's
// A product itself (K.attention's `next`, shaders/attention.wgsl APART): LAYERS fewer again.
describe('the split LoRA A products added up in the projection', () => {
  let wide: string;
  beforeAll(async () => {
    wide = await mkdtemp(join(tmpdir(), 'spyrl-fused-wide-'));
    await writeTinyCheckpoint(wide, {
      layers: LAYERS,
      hidden: 64,
      heads: 8,
      kvHeads: 2,
      headDim: 128,
      intermediate: 1024,
      vocab: 1024,
      seed: 12,
    });
  });
  afterAll(async () => {
    await rm(wide, { recursive: true, force: true });
  });

  it.each([
    ['q4', 'f16'],
    ['bf16', 'f32'],
  ] as const)('weights %s, KV %s: within rounding of their own A products and reduces', async (weights, kv) => {
    const { model } = await loadQwen3(gpu, nodeFolderSource(wide), { weights, kv });
    const { lora, weights: loraWeights } = movedLora(model, 4, 5);
    const adapter = attachAdapter(model, lora, loraWeights);
    K.resetTuning({ autoFor: 'gpu', loraAFold: 'off' });
    const off = await decode(model);
    K.tuning.loraAFold = 'auto';
    const { result: folded, labels } = await withLabels(gpu, () => decode(model));
    const rel = kv === 'f16' ? 2e-4 : 1e-5;
    for (let s = 0; s < off.logits.length; s++) expectClose(folded.logits[s], off.logits[s], `step ${s}`, rel);
    // 2 LAYERS for the reduces, 3 LAYERS - 1 for the groups' A products and down_proj's (paired)
    for (let s = 0; s < off.dispatches.length; s++)
      expect(off.dispatches[s] - folded.dispatches[s]).toBe(5 * LAYERS - 1);
    const single = (l: string) => l.startsWith('gemv.gemv_lanes[') && l.includes('LORA=1') && l.includes('UPART=');
    // o_proj (with gate/up's stacked A, NEXTA) and down_proj (SILU; from the paired gate/up GEMV,
    // the next layer's q/k/v A but in the last layer) in each of the 3 decode steps.
    expect(
      labels.filter((l) => single(l) && l.includes('NEXTA=1') && !l.includes('SILU')).length,
    ).toBeGreaterThanOrEqual(3 * LAYERS);
    expect(labels.filter((l) => single(l) && l.includes('SILU=1')).length).toBeGreaterThanOrEqual(3 * LAYERS);
    expect(
      labels.filter((l) => single(l) && l.includes('SILU=1') && l.includes('NEXTA=1')).length,
    ).toBeGreaterThanOrEqual(3 * (LAYERS - 1));
    expect(labels.some((l) => l.includes('gemv_cols_reduce'))).toBe(false);
    expect(labels.some((l) => l.includes('APART'))).toBe(false); // one split: no attention_combine

    // A cache of 512 positions: the decode attention splits over the keys, and its combine begins
    // o_proj's A product (shaders/attention.wgsl APART), which o_proj's GEMV adds up: LAYERS more
    // dispatches fewer (o_proj's split A product).
    K.tuning.loraAFold = 'off';
    const offLong = await decode(model, 512);
    K.tuning.loraAFold = 'auto';
    const { result: long, labels: longLabels } = await withLabels(gpu, () => decode(model, 512));
    for (let s = 0; s < offLong.logits.length; s++)
      expectClose(long.logits[s], offLong.logits[s], `cache 512, step ${s}`, rel);
    for (let s = 0; s < offLong.dispatches.length; s++)
      expect(offLong.dispatches[s] - long.dispatches[s]).toBe(6 * LAYERS - 1);
    const combines = longLabels.filter((l) => l.startsWith('attention.attention_combine['));
    expect(combines.length).toBeGreaterThanOrEqual(3 * LAYERS);
    expect(combines.every((l) => l.includes('APART=1'))).toBe(true);
    adapter.destroy();
  });
});
