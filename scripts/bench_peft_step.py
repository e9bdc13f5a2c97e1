#!/usr/bin/env python3
"""The PyTorch + PEFT peer of our LoRA training step (issue 12, "on a real GPU").

Builds transformers' Qwen3ForCausalLM at a model's exact shapes with random weights (no
download), wraps it in a PEFT LoRA adapter on every projection (q, k, v, o, gate, up, down; r 16,
alpha 32: what `npm run bench` trains), and times one training step the way bench/e2e.ts times
ours: a forward over T tokens, the mean next-token cross-entropy over T - 1 targets, and the
backward into the LoRA tensors. Eager PyTorch, no compile, no gradient checkpointing (ours
recomputes each layer in the backward: more FLOPs, less memory). The AdamW update is timed apart
(ours is a separate op as well).

Prints one JSON object: the config, the device, and per step the median and all seconds, tokens
per second, FLOPs (counted as bench/e2e.ts counts ours: 3x the forward's matmuls, LM head
included, plus 6 per LoRA parameter per token) and achieved TFLOP/s.

  .venv-ref/bin/python scripts/bench_peft_step.py --model tiny --tokens 64            # CPU, here
  python3 scripts/bench_peft_step.py --model 4b --layers 36 --tokens 512 --device cuda  # a GPU

Then the ratio against ours: `npm run bench -- --parts e2e --model 4b --train-len 512` on the
same GPU, record "4b LoRA step 512 tok r=16" (seconds / seconds).
"""

import argparse
import json
import statistics
import sys
import time

import torch

# bench/e2e.ts MODELS (src/model/config.ts QWEN3_PRESETS, the Hub's config.json of each repo).
COMMON = dict(vocab_size=151936, rms_norm_eps=1e-6, head_dim=128, num_key_value_heads=8,
              rope_theta=1_000_000, max_position_embeddings=40960)
MODELS = {
    "tiny": dict(COMMON, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True),
    "0.6b": dict(COMMON, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                 intermediate_size=3072, tie_word_embeddings=True),
    "1.7b": dict(COMMON, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                 intermediate_size=6144, tie_word_embeddings=True),
    "4b": dict(COMMON, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
               intermediate_size=9728, tie_word_embeddings=True, rope_theta=5_000_000),
    "8b": dict(COMMON, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
               intermediate_size=12288, tie_word_embeddings=False),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def token_flops(c, context):
    """Forward FLOPs of one token at `context` keys (bench/e2e.ts tokenFlops, LM head apart)."""
    C, NH, NKV, HD, I = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                         c["head_dim"], c["intermediate_size"])
    per_layer = 2 * C * (NH * HD * 2 + NKV * HD * 2) + 2 * 3 * C * I + 4 * NH * HD * context
    return c["num_hidden_layers"] * per_layer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--layers", type=int, help="layers to build (default: all)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                    help="weights and activations (ours: bf16 weights, f32 activations)")
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation (eager|sdpa)")
    a = ap.parse_args()

    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = dict(MODELS[a.model])
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    config = Qwen3Config(**cfg, attn_implementation=a.attn)
    with torch.device(a.device):
        model = Qwen3ForCausalLM(config).to(dtype)
    model.requires_grad_(False)
    lora = LoraConfig(r=a.r, lora_alpha=2 * a.r, lora_dropout=0.0, target_modules=TARGETS, bias="none")
    model = get_peft_model(model, lora)
    for n, p in model.named_parameters():
        if "lora_B" in n:  # PEFT starts B at 0; any value times the same
            torch.nn.init.normal_(p, std=0.01)
    lora_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    T = a.tokens
    ids = (torch.arange(T, device=a.device) * 104729) % cfg["vocab_size"]  # bench/e2e.ts tIds
    ids = ids.unsqueeze(0)

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    def step():
        out = model(input_ids=ids)
        logits = out.logits[0, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
        loss.backward()
        return loss

    # Warm-up: cuBLAS's and the allocator's first calls (the two H100 runs of 2026-12-06 gave
    # medians of 19 and 29 ms after one warm-up step, 3 reps).
    for _ in range(3):
        step()
    opt.zero_grad(set_to_none=True)
    sync()
    seconds, adam = [], []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        seconds.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        adam.append(time.perf_counter() - t1)
    flops = sum(3 * token_flops(cfg, t + 1) for t in range(T))
    flops += 3 * 2 * (T - 1) * cfg["vocab_size"] * cfg["hidden_size"] + 6 * T * lora_params
    med = statistics.median(seconds)
    print(json.dumps({
        "engine": "PyTorch + PEFT (eager)",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
        "model": a.model, "layers": cfg["num_hidden_layers"], "tokens": T, "r": a.r,
        "dtype": a.dtype, "attn": a.attn, "lora_params": lora_params,
        "loss": float(loss.detach()), "seconds": seconds, "median_s": med, "tok_per_s": T / med,
        "flops": flops, "tflops_per_s": flops / med / 1e12, "adamw_median_s": statistics.median(adam),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
