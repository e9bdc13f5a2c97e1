// The LoRA target modules of a Qwen3 decoder layer and their shapes: plain data and arithmetic,
// shared by the game config, the memory plan and the UI without pulling in the PEFT file code.
import type { Qwen3Config } from './config.ts';

/** The seven Linear layers of a Qwen3 decoder layer, in module order. */
export const LORA_TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;
export type LoraTarget = (typeof LORA_TARGETS)[number];

/** (out, in) of a target's frozen weight, i.e. its (N, K). */
export function targetDims(modelCfg: Qwen3Config, t: LoraTarget): { out: number; in: number } {
  const { hiddenSize: C, numHeads: NH, numKvHeads: NKV, headDim: HD, intermediateSize: I } = modelCfg;
  switch (t) {
    case 'q_proj':
      return { out: NH * HD, in: C };
    case 'k_proj':
    case 'v_proj':
      return { out: NKV * HD, in: C };
    case 'o_proj':
      return { out: C, in: NH * HD };
    case 'gate_proj':
    case 'up_proj':
      return { out: I, in: C };
    case 'down_proj':
      return { out: C, in: I };
  }
}
