#!/usr/bin/env python3
"""What half precision costs PyTorch itself on the LoRA golden fixtures: the outside calibration
of the f16 GEMM's budgets (test/helpers/gemmBudget.ts).

For each test/fixtures/golden-lora variant: PEFT's PeftModel on transformers' Qwen3ForCausalLM
(eager attention), the whole model and adapter cast to float32, float16 and bfloat16; loss and
every LoRA gradient by autograd, against the fixture's float32 ones (grads.safetensors, loss.json).
Prints the loss's relative error and the worst per-tensor max|g - g_ref| / max|g_ref|.

Measured 2026-12-04 (torch 2.13 CPU, transformers 5.17, peft): float16 loss 4e-5 and 7e-5
relative, gradients 7.3e-3 x max|g_ref| on both variants; bfloat16 4e-2 to 8e-2.

Usage:  .venv-ref/bin/python scripts/half_precision_budget.py   (scripts/ref-venv.sh makes .venv-ref)
"""

import json
import os

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "test", "fixtures", "golden-lora")


def main() -> None:
    for variant in ("tied-all", "untied-rslora"):
        folder = os.path.join(FIXTURES, variant)
        with open(os.path.join(folder, "loss.json")) as f:
            meta = json.load(f)
        want = load_file(os.path.join(folder, "grads.safetensors"))
        ids = torch.tensor([meta["tokens"]])
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            base = Qwen3ForCausalLM.from_pretrained(
                os.path.join(ROOT, meta["model_dir"]), dtype=dtype, attn_implementation="eager"
            )
            model = PeftModel.from_pretrained(base, folder, is_trainable=True).to(dtype)
            logits = model(input_ids=ids).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
            loss.backward()
            worst, worst_key = 0.0, ""
            for name, p in model.named_parameters():
                if "lora_" not in name:
                    continue
                key = name.replace(".default", "")
                g = want[key]
                err = (p.grad.float() - g).abs().max().item() / g.abs().max().item()
                if err > worst:
                    worst, worst_key = err, key
            rel = abs(loss.item() - meta["loss"]) / meta["loss"]
            print(f"{variant} {str(dtype).removeprefix('torch.')}: loss {rel:.1e} relative, "
                  f"worst gradient {worst:.2e} x max|g_ref| ({worst_key or '-'})")


if __name__ == "__main__":
    main()
