// Shared setup of the test/train tests: the tiny random Qwen3 with the real tokenizer, and a LoRA
// adapter whose B is not zero (PEFT's init leaves B = 0, where the adapter changes nothing and a
// test of "the adapter is on" could not fail).
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Gpu } from '../../src/gpu/index.ts';
import { loadQwen3WithTokenizer } from '../../src/model/load.ts';
import { LoraAdapter } from '../../src/model/lora.ts';
import { initLora, loraConfig, type LoraConfig, type LoraTensors } from '../../src/model/peft.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { writeTinyCheckpoint } from '../../src/model/tinyModel.node.ts';
import type { Qwen3Tokenizer } from '../../src/model/tokenizer.ts';

export const FULL =
  'The agency spent $2 billion on the new system. It hired 300 staff in three regions. Audits found gaps in the records. The plan ends in 2030.';

export interface TinySetup {
  dir: string;
  model: Qwen3Model;
  tokenizer: Qwen3Tokenizer;
  cleanup: () => Promise<void>;
}

export async function tinySetup(gpu: Gpu, seed = 3): Promise<TinySetup> {
  const dir = await mkdtemp(join(tmpdir(), 'spyrl-train-'));
  await writeTinyCheckpoint(dir, { layers: 2, hidden: 32, heads: 4, kvHeads: 2, headDim: 16, intermediate: 64, seed });
  const loaded = await loadQwen3WithTokenizer(gpu, nodeFolderSource(dir));
  return {
    dir,
    model: loaded.model,
    tokenizer: loaded.tokenizer!,
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
}

/** LoRA weights with B = scale * cos(i): the adapter visibly changes the model. */
export function movedLora(model: Qwen3Model, r = 4, seed = 1, scale = 0.1): { lora: LoraConfig; weights: LoraTensors } {
  const lora = loraConfig({ r, alpha: 2 * r });
  const weights = initLora(model.cfg, lora, seed);
  for (const [k, v] of weights) if (k.includes('lora_B')) v.forEach((_, i) => (v[i] = scale * Math.cos(i + k.length)));
  return { lora, weights };
}

export function attachAdapter(model: Qwen3Model, lora: LoraConfig, weights: LoraTensors): LoraAdapter {
  const adapter = new LoraAdapter(model.gpu, model.cfg, lora);
  adapter.setWeights(weights);
  model.lora = adapter;
  return adapter;
}
