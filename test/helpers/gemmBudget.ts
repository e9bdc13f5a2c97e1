// The error budgets of the golden tests when the forward's tiled GEMM runs with f16 tiles: where
// this run's 'auto' takes it (a GPU's choices on a device with shader-f16: tuning.autoFor=gpu on
// lavapipe in npm test, and every real GPU with shader-f16), products of more than GEMV_MAX_T
// rows carry f16's rounding, not f32's. The logits' budget is test/model/golden.test.ts's
// measured one (5e-3 x max|ref|; transformers in float16 is off its own float32 logits by
// 1.2-2.2e-3). The loss takes 10x its f32 budget, and so do the gradients, whose errors compound
// the rounded activations of every layer above. Calibrated against PyTorch + PEFT run in float16
// on the LoRA fixtures (scripts/half_precision_budget.py): loss 4-7e-5 relative, gradients 7.3e-3
// x max|g_ref|; ours with the f16 GEMM (lavapipe, a GPU's choices): loss 1.5-2.8e-4, logits
// 2.4e-3 x max|ref|, gradients 4.6-7.8e-3 x max|g_ref|.
import type { Gpu } from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';

/** The f16 GEMM's logit budget: max|logit - ref| <= F16_GEMM_REL x max|ref|. */
export const F16_GEMM_REL = 5e-3;

/** Relative budgets for logits, the loss and LoRA gradients in this run (f32's unless the f16 GEMM is 'auto'). */
export function goldenBudget(gpu: Gpu): { f16: boolean; logits: number; loss: number; grad: number } {
  return K.useGemmF16(gpu)
    ? { f16: true, logits: F16_GEMM_REL, loss: 1e-3, grad: 1e-2 }
    : { f16: false, logits: 1e-3, loss: 1e-4, grad: 1e-3 };
}
