// The golden LoRA fixtures (scripts/golden_lora.py): a PyTorch checkpoint with a PEFT adapter
// loaded on the GPU, and the reference loss.json that goes with it.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Gpu } from '../../src/gpu/index.ts';
import { loadQwen3 } from '../../src/model/load.ts';
import { LoraAdapter } from '../../src/model/lora.ts';
import { readAdapter } from '../../src/model/peft.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';

export const ROOT = join(import.meta.dirname, '..', '..');
export const LORA_FIX = join(ROOT, 'test/fixtures/golden-lora');

export interface LossJson {
  model_dir: string;
  tokens: number[];
  loss: number;
  logits_shape: [number, number];
  max_abs_logit: number;
}

/** Loads fixture `variant`: its model with the adapter set, and the reference. */
export async function loadLoraGolden(gpu: Gpu, variant: string, weights: 'bf16' | 'q4' = 'bf16') {
  const dir = join(LORA_FIX, variant);
  const ref = JSON.parse(await readFile(join(dir, 'loss.json'), 'utf8')) as LossJson;
  const { model, cfg } = await loadQwen3(gpu, nodeFolderSource(join(ROOT, ref.model_dir)), { weights });
  const { lora, tensors } = await readAdapter(nodeFolderSource(dir), cfg);
  const adapter = new LoraAdapter(gpu, cfg, lora);
  adapter.setWeights(tensors);
  model.lora = adapter;
  return { dir, ref, model, cfg, adapter, tensors };
}
