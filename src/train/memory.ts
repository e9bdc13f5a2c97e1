// GPU memory of a LoRA training step, and the check that refuses a configuration that cannot
// fit the adapter's limits, saying what to change.
import type { Qwen3Config } from '../model/config.ts';
import { gpuMemoryBytes } from '../model/config.ts';
import { targetDims, type LoraConfig } from '../model/peft.ts';

export interface TrainingMemory {
  weights: number; // frozen bf16 base
  lora: number; // A, B, dA, dB, AdamW m and v: 6 f32 copies of the adapter
  checkpoints: number; // (L+1) layer inputs + final norm, (T, C) f32 each
  layerWorkspace: number; // one layer's recomputed intermediates and their gradients
  head: number; // (rows, V) logits and their gradient for the LM-head chunk
  kvCache: number; // for generation in the same session (slots x maxT)
  total: number;
  /** The largest single buffer: it must fit maxStorageBufferBindingSize. */
  largestBuffer: { bytes: number; what: string };
}

const HEAD_ROWS = 64;

export function trainingMemoryBytes(cfg: Qwen3Config, lora: LoraConfig, opts: { seqLen: number; kvSlots?: number; kvMaxT?: number }): TrainingMemory {
  const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I, vocabSize: V, numLayers: L } = cfg;
  const T = opts.seqLen;
  const base = gpuMemoryBytes(cfg, { maxT: opts.kvMaxT ?? 0, slots: opts.kvSlots ?? 0 });
  let loraParams = 0;
  for (const t of lora.targetModules) {
    const d = targetDims(cfg, t);
    loraParams += lora.r * (d.in + d.out);
  }
  const loraBytes = 6 * L * loraParams * 4;
  const checkpoints = (L + 2) * T * C * 4;
  // forward intermediates (h1 q k v qr kr att lse xMid h2 gate up act) and backward scratch
  // (dAct dGate dUp dh dAtt dqr dkr dv dq dk xOut dx dhN) of one layer.
  const perToken = 6 * C + 4 * NH * HD + 5 * NKV * HD + NH + 6 * I + 2 * NH * HD + 3 * NKV * HD;
  const layerWorkspace = T * perToken * 4 + lora.targetModules.length * T * lora.r * 4;
  const head = 2 * HEAD_ROWS * V * 4;
  const candidates: [number, string][] = [
    [V * C * 2, 'the embedding / LM head weight'],
    [I * C * 2, 'an MLP weight'],
    [T * I * 4, `one (T=${T}, I=${I}) MLP activation`],
    [HEAD_ROWS * V * 4, 'the LM-head logits chunk'],
  ];
  const [bytes, what] = candidates.reduce((a, b) => (b[0] > a[0] ? b : a));
  const total = base.weights + base.kvCache + loraBytes + checkpoints + layerWorkspace + head;
  return { weights: base.weights, lora: loraBytes, checkpoints, layerWorkspace, head, kvCache: base.kvCache, total, largestBuffer: { bytes, what } };
}

const gib = (b: number) => `${(b / 2 ** 30).toFixed(2)} GiB`;

/**
 * Throws with a message that says what to change when the step cannot fit: a buffer above the
 * adapter's binding limit, or a total above `budgetBytes` (the GPU memory the user allows).
 */
export function checkTrainingFits(m: TrainingMemory, limits: { maxStorageBufferBindingSize: number; maxBufferSize: number }, seqLen: number, budgetBytes?: number): void {
  const limit = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
  if (m.largestBuffer.bytes > limit) {
    const hint = m.largestBuffer.what.includes('activation')
      ? `use a shorter sequence length (at most ${Math.floor((seqLen * limit) / m.largestBuffer.bytes)} tokens)`
      : 'use a GPU/browser that allows larger storage buffers, or a smaller model';
    throw new RangeError(`${m.largestBuffer.what} needs ${gib(m.largestBuffer.bytes)}, above this GPU's ${gib(limit)} buffer limit: ${hint}`);
  }
  if (budgetBytes !== undefined && m.total > budgetBytes) {
    const perToken = (m.checkpoints + m.layerWorkspace) / seqLen;
    const room = budgetBytes - (m.total - m.checkpoints - m.layerWorkspace);
    const hint = room > perToken ? `reduce the sequence length to at most ${Math.floor(room / perToken)} tokens` : 'use a smaller model or a lower LoRA rank';
    throw new RangeError(`training needs about ${gib(m.total)} of GPU memory (weights ${gib(m.weights)}, LoRA state ${gib(m.lora)}, activations ${gib(m.checkpoints + m.layerWorkspace + m.head)}), above the ${gib(budgetBytes)} available: ${hint}`);
  }
}
