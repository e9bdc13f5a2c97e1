#!/usr/bin/env python3
"""A random Qwen3 checkpoint at Qwen3-4B layer shapes, and its ONNX export, for the 4B-shape peer.

bench.html's peer (bench/peer.ts: onnxruntime-web beside our engine) runs on the committed tiny
checkpoint by default. With ?peer-model=4b it runs on the folder this script writes instead:
Qwen3-4B's layers (hidden 2560, intermediate 9728, 32 query / 8 KV heads of 128, q/k norms, RoPE
theta 1e6, tied embeddings) with --layers of them (default 1 of 36) and a --vocab cut (default
8192 of 151936: the LM head's share of a 1-layer model would otherwise be 4x the layer's, and the
f32 ONNX file 2 GB). Weights are random (golden_qwen3.make_weights), written as bf16 safetensors in
Hugging Face layout, then exported by export_onnx.py (f32, KV-cache inputs) and checked there
against the plain-PyTorch reference (and onnxruntime when importable).

Usage:  python3 scripts/peer_checkpoint.py [--layers 1] [--vocab 8192] [--out bench/peer-4b]
        npm run bench:browser -- --model none --peer-model 4b
The folder is git-ignored (about 250 MB of bf16 and 500 MB of ONNX per layer).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_onnx import export  # noqa: E402
from golden_qwen3 import f32_to_bf16_bits, make_weights, write_checkpoint  # noqa: E402

QWEN3_4B = {
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "out_gain": 1.0,
    "shards": 1,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--out", default="bench/peer-4b")
    ap.add_argument("--seed", type=int, default=4)
    args = ap.parse_args()
    if args.layers < 1 or args.vocab < 1024:
        ap.error("--layers must be >= 1 and --vocab >= 1024")
    v = {**QWEN3_4B, "num_hidden_layers": args.layers, "vocab_size": args.vocab}
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)
    w = make_weights(v, gen)
    bits = {n: f32_to_bf16_bits(t.numpy()) for n, t in w.items()}
    files = write_checkpoint(args.out, v, bits)
    print(f"wrote {', '.join(files)} to {args.out}: {args.layers} layer(s) at Qwen3-4B shapes, vocab {args.vocab}")
    export(args.out, os.path.join(args.out, "model.onnx"), 17)


if __name__ == "__main__":
    main()
