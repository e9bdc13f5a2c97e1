#!/usr/bin/env python3
"""Exports a Qwen3 checkpoint (Hugging Face layout, bf16 safetensors) to ONNX with a KV cache.

The peer of the benchmark (bench/peer.ts, onnxruntime-web) runs this graph; test/bench/peer.test.ts
checks its logits against our engine's. The forward is the plain-PyTorch reference of
scripts/golden_qwen3.py (TorchQwen3, which follows transformers' modeling_qwen3.py) with the
cache added the way transformers adds it: keys and values of earlier positions come in, the
new ones are appended, and queries at positions past..past+T-1 see keys 0..their own position.

Graph (f32 weights, the bf16 values widened exactly):
  inputs   input_ids (1, T) int64;  past_key_{i}, past_value_{i} (1, NKV, P, HD) f32 for each layer i
  outputs  logits (1, T, V) f32;  present_key_{i}, present_value_{i} (1, NKV, P + T, HD) f32
T and P are dynamic (P may be 0: prefill).

Usage:  /usr/bin/python3 scripts/export_onnx.py --checkpoint test/fixtures/golden/tied \
            --out test/fixtures/onnx/tied.onnx
Needs only torch (the legacy TorchScript exporter of torch 1.13 writes ONNX without the onnx
package); with onnxruntime importable it also checks the graph against the reference.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_qwen3 import TorchQwen3, load_checkpoint, rms_norm, rotate_half  # noqa: E402


class Qwen3WithCache(torch.nn.Module):
    def __init__(self, cfg, weights):
        super().__init__()
        self.cfg = cfg
        self.L = cfg["num_hidden_layers"]
        self.NH, self.NKV, self.HD = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        w = {n: torch.from_numpy(np.array(a, dtype=np.float32)) for n, a in weights.items()}
        # Parameters, so the exporter stores them once as initializers (a tied head shares the embedding).
        self.names = {}
        for i, (n, t) in enumerate(sorted(w.items())):
            key = f"w{i}"
            self.register_parameter(key, torch.nn.Parameter(t, requires_grad=False))
            self.names[n] = key
        HD = self.HD
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HD, 2, dtype=torch.int64).to(torch.float32) / HD))
        self.register_buffer("inv_freq", inv)

    def w(self, name):
        if name == "lm_head.weight" and name not in self.names:
            name = "model.embed_tokens.weight"
        return getattr(self, self.names[name])

    def forward(self, input_ids, *past):
        NH, NKV, HD, eps = self.NH, self.NKV, self.HD, self.eps
        groups = NH // NKV
        T = input_ids.shape[1]
        P = past[0].shape[2]
        x = self.w("model.embed_tokens.weight")[input_ids[0]]  # [T, C]
        pos = torch.arange(T, dtype=torch.int64) + P  # positions P..P+T-1
        freqs = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, HD/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # [T, 1, HD]
        keys = torch.arange(T, dtype=torch.int64) + P  # query i sits at P + i
        kpos = torch.arange(P + T, dtype=torch.int64)
        # f32 operands: Python scalars would make Where run in float64, which onnxruntime-web lacks.
        zero, neg = torch.zeros((), dtype=torch.float32), torch.full((), float("-inf"), dtype=torch.float32)
        mask = torch.where(kpos[None, :] <= keys[:, None], zero, neg)  # [T, P+T]
        present = []
        for i in range(self.L):
            p = f"model.layers.{i}."
            h = rms_norm(x, self.w(p + "input_layernorm.weight"), eps)
            q = (h @ self.w(p + "self_attn.q_proj.weight").T).reshape(-1, NH, HD)
            k = (h @ self.w(p + "self_attn.k_proj.weight").T).reshape(-1, NKV, HD)
            v = (h @ self.w(p + "self_attn.v_proj.weight").T).reshape(-1, NKV, HD)
            q = rms_norm(q, self.w(p + "self_attn.q_norm.weight"), eps)
            k = rms_norm(k, self.w(p + "self_attn.k_norm.weight"), eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k_all = torch.cat((past[2 * i][0], k.transpose(0, 1)), dim=1)  # [NKV, P+T, HD]
            v_all = torch.cat((past[2 * i + 1][0], v.transpose(0, 1)), dim=1)
            present += [k_all[None], v_all[None]]
            qh = q.transpose(0, 1)  # [NH, T, HD]
            # Query head h uses kv head h // groups (repeat_interleave, written as expand + reshape,
            # which the exporter keeps dynamic in the key length).
            kh = k_all[:, None].expand(-1, groups, -1, -1).reshape(NH, -1, HD)
            vh = v_all[:, None].expand(-1, groups, -1, -1).reshape(NH, -1, HD)
            s = (qh @ kh.transpose(1, 2)) * (HD ** -0.5) + mask
            a = torch.softmax(s, dim=-1) @ vh  # [NH, T, HD]
            a = a.transpose(0, 1).reshape(-1, NH * HD)
            x = x + a @ self.w(p + "self_attn.o_proj.weight").T
            h = rms_norm(x, self.w(p + "post_attention_layernorm.weight"), eps)
            g = h @ self.w(p + "mlp.gate_proj.weight").T
            u = h @ self.w(p + "mlp.up_proj.weight").T
            x = x + (torch.nn.functional.silu(g) * u) @ self.w(p + "mlp.down_proj.weight").T
        x = rms_norm(x, self.w("model.norm.weight"), eps)
        return (x @ self.w("lm_head.weight").T)[None], *present


def io_names(L):
    past = [n for i in range(L) for n in (f"past_key_{i}", f"past_value_{i}")]
    present = [n for i in range(L) for n in (f"present_key_{i}", f"present_value_{i}")]
    return past, present


def export(checkpoint, out, opset):
    with open(os.path.join(checkpoint, "config.json")) as f:
        cfg = json.load(f)
    weights = load_checkpoint(checkpoint)
    model = Qwen3WithCache(cfg, weights).eval()
    L, NKV, HD = model.L, model.NKV, model.HD
    past_names, present_names = io_names(L)
    # Traced with P = 3, T = 2 so both stay symbolic (a 0 or 1 would be specialised away).
    ids = torch.tensor([[1, 2]], dtype=torch.int64)
    past = [torch.zeros(1, NKV, 3, HD) for _ in range(2 * L)]
    dyn = {"input_ids": {1: "T"}, "logits": {1: "T"}}
    dyn.update({n: {2: "P"} for n in past_names})
    dyn.update({n: {2: "PT"} for n in present_names})
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, (ids, *past), out, input_names=["input_ids", *past_names], output_names=["logits", *present_names],
                          dynamic_axes=dyn, opset_version=opset, do_constant_folding=True)
    print(f"wrote {out} ({os.path.getsize(out)} bytes): L={L} C={cfg['hidden_size']} NH={model.NH} NKV={NKV} HD={HD} V={cfg['vocab_size']}, opset {opset}")
    self_check(cfg, weights, model, out)


def self_check(cfg, weights, model, out):
    """The cached module against the golden no-cache reference, then the ONNX file when onnxruntime is here."""
    ref = TorchQwen3(cfg, weights)
    ids = [5, 17, 300, 9, 1024, 77, 3][: 7]
    ids = [i % cfg["vocab_size"] for i in ids]
    want = ref(ids).numpy()
    L, NKV, HD = model.L, model.NKV, model.HD
    with torch.no_grad():
        empty = [torch.zeros(1, NKV, 0, HD) for _ in range(2 * L)]
        res = model(torch.tensor([ids[:5]]), *empty)
        step = model(torch.tensor([ids[5:]]), *res[1:])
    got = np.concatenate([res[0][0].numpy(), step[0][0].numpy()])
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"cached module vs golden reference (prefill 5 + 2 cached): max rel error {err:.2e}")
    assert err < 1e-5, err
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not importable: the ONNX file itself is checked by test/bench/peer.test.ts")
        return
    sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.array([ids[:5]], dtype=np.int64)}
    past_names, _ = io_names(L)
    feeds.update({n: np.zeros((1, NKV, 0, HD), dtype=np.float32) for n in past_names})
    o = sess.run(None, feeds)
    feeds = {"input_ids": np.array([ids[5:]], dtype=np.int64)}
    feeds.update({n: o[1 + j] for j, n in enumerate(past_names)})
    o2 = sess.run(None, feeds)
    got = np.concatenate([o[0][0], o2[0][0]])
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"onnxruntime vs golden reference: max rel error {err:.2e}")
    assert err < 1e-5, err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="folder with config.json and model.safetensors (or an index)")
    ap.add_argument("--out", required=True, help="the .onnx file to write")
    ap.add_argument("--opset", type=int, default=17)
    args = ap.parse_args()
    export(args.checkpoint, args.out, args.opset)


if __name__ == "__main__":
    main()
