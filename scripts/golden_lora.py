#!/usr/bin/env python3
"""Golden LoRA fixtures: PEFT adapters and their loss gradients from PyTorch autograd.

For each variant this script takes one of the Qwen3 checkpoints that golden_qwen3.py wrote
(test/fixtures/golden/<model>; nothing is copied), makes a random LoRA adapter and writes it
in PEFT's on-disk format with its own F32 safetensors writer. Then it runs golden_qwen3's
plain-PyTorch forward with LoRA added to the targeted projections,
y = x W^T + s (x A^T) B^T, and writes:

  <out>/<variant>/adapter_config.json        PEFT LoraConfig fields (sorted, indent 2, as PEFT saves)
  <out>/<variant>/adapter_model.safetensors  F32, keys base_model.model.model.layers.{i}.{self_attn|mlp}.{t}.lora_{A|B}.weight
  <out>/<variant>/grads.safetensors          F32, same keys: d loss / d (each LoRA tensor)
  <out>/<variant>/logits.f32                 logits with the adapter, float32 LE row-major [T, V]
  <out>/<variant>/loss.json                  tokens, loss, scale, model_dir, checks, tolerances

loss = mean over t = 0..T-2 of cross_entropy(logits[t], tokens[t + 1]).

B is random and non-zero (PEFT initialises it to 0, which would make every dA zero and the
test weak). With --impl peft (the default when peft and transformers are importable) the
written logits, loss and gradients are PEFT's own: the adapter folder loaded with
PeftModel.from_pretrained on transformers' Qwen3ForCausalLM, autograd through it. The plain
PyTorch LoRA forward above must agree with it, and is itself checked against float64 and
central differences. --impl torch writes the plain-PyTorch numbers instead.

Usage:  .venv-ref/bin/python scripts/golden_lora.py --out test/fixtures/golden-lora --impl peft
        (scripts/ref-venv.sh makes .venv-ref)
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import golden_qwen3 as gq  # noqa: E402  checkpoint reader and the plain-PyTorch Qwen3 forward

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# model: a folder of test/fixtures/golden. b_std: std of the random B (larger s, smaller B, so
# the adapter moves the logits visibly without swamping the base model).
VARIANTS = {
    "tied-all": dict(model="tied", targets=TARGETS, r=4, alpha=8, use_rslora=False,
                     b_std=0.04, seq_len=16, seed=5001),
    "untied-rslora": dict(model="untied-sharded", targets=("q_proj", "v_proj", "down_proj"), r=2,
                          alpha=16, use_rslora=True, b_std=0.015, seq_len=14, seed=5002),
}

ENGINE_REL_TOL = 1e-3      # engine passes if, per tensor, max|g - ref| <= 1e-3 * max|ref|
F64_REL_BUDGET = 1e-4      # the f32 reference must sit well inside that: checked against f64
PEFT_REL_TOL = 1e-4        # plain forward vs PEFT + transformers (both f32)
REFERENCE = {
    "peft": "peft.PeftModel.from_pretrained(adapter folder) on transformers.Qwen3ForCausalLM "
            "(float32, eager attention); loss and gradients from torch.autograd through PEFT",
    "torch": "golden_qwen3.TorchQwen3 (plain PyTorch, float32) with y = x W^T + scale * (x A^T) B^T; torch.autograd",
}
MIN_GRAD = 1e-6            # every tensor's max|g| must exceed this (non-trivial gradients)

# --------------------------------------------------------------------------------------
# Adapter: shapes, random values, PEFT files


def block_of(t):
    return "mlp" if t in ("gate_proj", "up_proj", "down_proj") else "self_attn"


def dims(cfg, t):
    """(out, in) of a projection's weight, from config.json."""
    C, I = cfg["hidden_size"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    return {"q_proj": (q, C), "k_proj": (kv, C), "v_proj": (kv, C), "o_proj": (C, q),
            "gate_proj": (I, C), "up_proj": (I, C), "down_proj": (C, I)}[t]


def lora_pairs(cfg, targets):
    """[(layer, target, A key, B key, weight name)] layer-major, targets in module order."""
    out = []
    for i in range(cfg["num_hidden_layers"]):
        for t in TARGETS:
            if t in targets:
                p = f"base_model.model.model.layers.{i}.{block_of(t)}.{t}"
                out.append((i, t, p + ".lora_A.weight", p + ".lora_B.weight", f"model.layers.{i}.{block_of(t)}.{t}.weight"))
    return out


def make_adapter(cfg, v):
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform(a=sqrt(5))), B ~ N(0, b_std)."""
    gen = torch.Generator().manual_seed(v["seed"])
    r = v["r"]
    out = {}
    for _, t, ka, kb, _ in lora_pairs(cfg, v["targets"]):
        n_out, n_in = dims(cfg, t)
        bound = 1.0 / math.sqrt(n_in)
        out[ka] = ((torch.rand(r, n_in, generator=gen, dtype=torch.float32) * 2 - 1) * bound).numpy()
        out[kb] = (torch.randn(n_out, r, generator=gen, dtype=torch.float32) * v["b_std"]).numpy()
    return out


def adapter_config(v, base_model):
    """What PEFT 0.18's LoraConfig.save_pretrained writes (every field at its default but ours),
    minus peft_version: this file is not written by PEFT."""
    return {
        "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None, "auto_mapping": None,
        "base_model_name_or_path": base_model, "bias": "none", "corda_config": None,
        "ensure_weight_tying": False, "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "layer_replication": None, "layers_pattern": None,
        "layers_to_transform": None, "loftq_config": {}, "lora_alpha": v["alpha"], "lora_bias": False,
        "lora_dropout": 0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
        "peft_type": "LORA", "qalora_group_size": 16, "r": v["r"], "rank_pattern": {}, "revision": None,
        "target_modules": [t for t in TARGETS if t in v["targets"]], "target_parameters": None,
        "task_type": "CAUSAL_LM", "trainable_token_indices": None, "use_dora": False, "use_qalora": False,
        "use_rslora": v["use_rslora"],
    }


def write_json_peft(path, obj):
    """PEFT's formatting: json.dumps(indent=2, sort_keys=True), no final newline."""
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True))


def write_safetensors_f32(path, tensors):
    """tensors: name -> np.float32 array. Names sorted (as safetensors' save_file orders one
    dtype), header padded with spaces to 8 bytes, metadata {"format": "pt"}."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for n in sorted(tensors):
        t = np.ascontiguousarray(tensors[n], dtype="<f4")
        header[n] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        blobs.append(t.tobytes())
        offset += t.nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors_f32(path):
    """Strict reader for what write_safetensors_f32 writes."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    assert header.pop("__metadata__") == {"format": "pt"}
    body, out, pos = data[8 + hlen:], {}, 0
    for name in sorted(header, key=lambda n: header[n]["data_offsets"][0]):
        info = header[name]
        b, e = info["data_offsets"]
        assert info["dtype"] == "F32" and b == pos and e - b == 4 * int(np.prod(info["shape"])), name
        out[name] = np.frombuffer(body[b:e], dtype="<f4").reshape(info["shape"]).copy()
        pos = e
    assert pos == len(body), "trailing bytes"
    return out

# --------------------------------------------------------------------------------------
# LoRA forward + autograd, reusing golden_qwen3.TorchQwen3 unchanged


class LoraWeight:
    """Stands in for a projection weight W in TorchQwen3.w. The forward computes `h @ W.T`;
    here `.T` gives an object whose __rmatmul__ adds PEFT's LoRA term:
    h W^T + lora_B(lora_A(h)) * s, in PEFT's order of operations."""

    def __init__(self, W, A, B, s, calls):
        self.W, self.A, self.B, self.s, self.calls = W, A, B, s, calls

    @property
    def T(self):
        return self

    def __rmatmul__(self, h):
        self.calls.append(1)
        return h @ self.W.T + (h @ self.A.T) @ self.B.T * self.s


def lora_forward(model, params, pairs, scale, ids):
    """Logits [T, V] of TorchQwen3 `model` with LoRA on `pairs`, recorded by autograd.
    TorchQwen3.__call__ is decorated with @torch.no_grad(); __wrapped__ is its undecorated body."""
    forward = getattr(gq.TorchQwen3.__call__, "__wrapped__", None)
    assert forward is not None, "TorchQwen3.__call__ lost its __wrapped__ (torch.no_grad decorator changed?)"
    saved = {}
    calls = []
    for _, _, ka, kb, wname in pairs:
        saved[wname] = model.w[wname]
        model.w[wname] = LoraWeight(model.w[wname], params[ka], params[kb], scale, calls)
    try:
        with torch.enable_grad():
            logits = forward(model, ids)
    finally:
        model.w.update(saved)
    assert len(calls) == len(pairs), f"LoRA applied {len(calls)} times, expected {len(pairs)}"
    return logits


def next_token_loss(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:], dtype=torch.long))


def loss_and_grads(cfg, weights, adapter, pairs, scale, ids, dtype):
    model = gq.TorchQwen3(cfg, weights, dtype)
    params = {k: torch.tensor(a, dtype=dtype, requires_grad=True) for k, a in adapter.items()}
    logits = lora_forward(model, params, pairs, scale, ids)
    loss = next_token_loss(logits, ids)
    keys = sorted(params)
    grads = torch.autograd.grad(loss, [params[k] for k in keys])
    return loss.detach(), logits.detach(), {k: g for k, g in zip(keys, grads)}


def finite_difference(cfg, weights, adapter, pairs, scale, ids, key, index, h=1e-5):
    """Central difference of the float64 loss in one element of one LoRA tensor."""
    model = gq.TorchQwen3(cfg, weights, torch.float64)
    vals = []
    for sign in (1, -1):
        params = {k: torch.tensor(a, dtype=torch.float64) for k, a in adapter.items()}
        params[key].view(-1)[index] += sign * h
        with torch.no_grad():
            vals.append(float(next_token_loss(lora_forward(model, params, pairs, scale, ids), ids)))
    return (vals[0] - vals[1]) / (2 * h)

# --------------------------------------------------------------------------------------
# PEFT + transformers cross-check (only where importable)


def peft_available():
    try:
        import peft  # noqa: F401
        from transformers import Qwen3ForCausalLM  # noqa: F401
        return True
    except Exception:
        return False


def peft_loss_and_grads(hf_model, adapter_dir, adapter, ids):
    """PEFT's own LoRA: PeftModel.from_pretrained(adapter_dir) on transformers' Qwen3ForCausalLM
    `hf_model` (f32, eager). Checks that the adapter loaded into exactly the file's values, then
    returns loss, logits [T, V] and d loss / d (each LoRA tensor) from autograd through PEFT."""
    from peft import PeftModel
    model = PeftModel.from_pretrained(hf_model, adapter_dir, is_trainable=True).eval()
    lora_params = {n.replace(".default.weight", ".weight"): p for n, p in model.named_parameters() if p.requires_grad}
    assert set(lora_params) == set(adapter), sorted(set(lora_params) ^ set(adapter))
    for k, p in lora_params.items():  # the files loaded into exactly these values
        assert p.dtype == torch.float32 and torch.equal(p.detach(), torch.from_numpy(adapter[k])), k
    logits = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()
    loss = next_token_loss(logits, ids)
    keys = sorted(lora_params)
    grads = torch.autograd.grad(loss, [lora_params[k] for k in keys])
    return loss.detach(), logits.detach(), {k: g for k, g in zip(keys, grads)}


def compare_impls(ref, other):
    """Diffs of (loss, logits, grads) `other` from `ref`, asserted within PEFT_REL_TOL (relative
    to max|ref|, per tensor for the gradients)."""
    (loss, logits, grads), (loss2, logits2, grads2) = ref, other
    assert set(grads) == set(grads2)
    maxabs = float(logits.abs().max())
    d_logits = float((logits2 - logits).abs().max())
    d_loss = abs(float(loss2) - float(loss))
    d_grads = max(float((grads2[k] - g).abs().max()) / float(g.abs().max()) for k, g in grads.items())
    assert d_logits <= PEFT_REL_TOL * maxabs, (d_logits, maxabs)
    assert d_loss <= PEFT_REL_TOL * abs(float(loss)), (d_loss, float(loss))
    assert d_grads <= PEFT_REL_TOL, d_grads
    return {"max_abs_diff_logits": d_logits, "abs_diff_loss": d_loss, "max_rel_diff_grads": d_grads}


def library_versions():
    import peft
    import transformers
    return {"peft_version": peft.__version__, "transformers_version": transformers.__version__}

# --------------------------------------------------------------------------------------
# Fixture generation


def build_variant(name, v, golden_dir, out_dir, impl):
    model_dir = os.path.join(golden_dir, v["model"])
    model_rel = os.path.relpath(model_dir, ROOT).replace(os.sep, "/")
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = gq.load_checkpoint(model_dir)
    pairs = lora_pairs(cfg, v["targets"])
    r, alpha = v["r"], v["alpha"]
    scale = alpha / math.sqrt(r) if v["use_rslora"] else alpha / r

    # The adapter goes to disk first; everything below uses what reads back from the file.
    write_json_peft(os.path.join(d, "adapter_config.json"), adapter_config(v, model_rel))
    write_safetensors_f32(os.path.join(d, "adapter_model.safetensors"), make_adapter(cfg, v))
    adapter = read_safetensors_f32(os.path.join(d, "adapter_model.safetensors"))
    assert set(adapter) == {k for p in pairs for k in p[2:4]}

    g = torch.Generator().manual_seed(v["seed"])
    ids = torch.randint(0, cfg["vocab_size"], (v["seq_len"],), generator=g).tolist()

    plain = loss_and_grads(cfg, weights, adapter, pairs, scale, ids, torch.float32)
    # impl "peft": the written numbers are PEFT's, on transformers' Qwen3ForCausalLM, and the
    # plain-PyTorch autograd (checked below against float64 and finite differences) must agree.
    cross_check = None
    if impl == "peft":
        hf_model = gq.HFQwen3(model_dir, cfg["tie_word_embeddings"]).model
        loss, logits, grads = peft_loss_and_grads(hf_model, d, adapter, ids)
        cross_check = compare_impls((loss, logits, grads), plain)
    else:
        loss, logits, grads = plain
    T, V = logits.shape
    maxabs = float(logits.abs().max())

    # self-check 1: with B = 0 the hooked forward is golden_qwen3's forward, bit for bit, and
    # the adapter moves the logits when B != 0.
    base_logits = gq.TorchQwen3(cfg, weights, torch.float32)(ids)
    zero_b = {k: (np.zeros_like(a) if k.endswith("lora_B.weight") else a) for k, a in adapter.items()}
    _, logits_b0, _ = loss_and_grads(cfg, weights, zero_b, pairs, scale, ids, torch.float32)
    assert torch.equal(logits_b0, base_logits), name
    adapter_effect = float((logits - base_logits).abs().max())
    assert adapter_effect > 0.05 * maxabs, (name, adapter_effect, maxabs)

    # self-check 2: non-trivial gradients everywhere
    grad_max = {k: float(gr.abs().max()) for k, gr in grads.items()}
    for k, m in grad_max.items():
        assert m > MIN_GRAD, (name, k, m)

    # self-check 3: the same computation in float64 (same bf16 weights, same f32 adapter values)
    loss64, logits64, grads64 = loss_and_grads(cfg, weights, adapter, pairs, scale, ids, torch.float64)
    rel64 = {k: float((grads[k].double() - grads64[k]).abs().max()) / float(grads64[k].abs().max()) for k in grads}
    worst64 = max(rel64.values())
    assert worst64 <= F64_REL_BUDGET, (name, worst64)
    loss_err64 = abs(float(loss) - float(loss64))
    logits_err64 = float((logits.double() - logits64).abs().max())

    # self-check 4: autograd vs central differences (float64) at the largest-gradient element of
    # the first A and the last B
    fd = []
    for key in (pairs[0][2], pairs[-1][3]):
        idx = int(grads64[key].abs().view(-1).argmax())
        num = finite_difference(cfg, weights, adapter, pairs, scale, ids, key, idx)
        ana = float(grads64[key].view(-1)[idx])
        fd.append({"tensor": key, "index": idx, "autograd": ana, "finite_difference": num,
                   "rel_err": abs(num - ana) / abs(ana)})
        assert fd[-1]["rel_err"] < 1e-5, (name, fd[-1])

    # files
    write_safetensors_f32(os.path.join(d, "grads.safetensors"), {k: gr.numpy() for k, gr in grads.items()})
    assert all(np.array_equal(a, grads[k].numpy()) for k, a in read_safetensors_f32(os.path.join(d, "grads.safetensors")).items())
    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))

    files = ["adapter_config.json", "adapter_model.safetensors", "grads.safetensors", "logits.f32"]
    result = {
        "variant": name,
        "impl": impl,
        "reference": REFERENCE[impl],
        "torch_version": torch.__version__,
        **(library_versions() if impl == "peft" else {"peft_version": None, "transformers_version": None}),
        "numpy_version": np.__version__,
        "model_dir": model_rel,
        "model_dir_note": "relative to the repository root; a checkpoint written by scripts/golden_qwen3.py",
        "model_sha256": {f: gq.sha256(os.path.join(model_dir, f)) for f in sorted(os.listdir(model_dir))
                         if f == "config.json" or f.endswith(".safetensors") or f.endswith(".index.json")},
        "tokens": ids,
        "loss": float(loss),
        "loss_definition": "mean over t=0..T-2 of cross_entropy(logits[t], tokens[t+1])",
        "r": r,
        "lora_alpha": alpha,
        "use_rslora": v["use_rslora"],
        "scale": scale,
        "target_modules": [t for t in TARGETS if t in v["targets"]],
        "lora_forward": "y = x W^T + scale * (x A^T) B^T on each targeted projection; W bf16 upcast exactly to f32",
        "adapter_init": f"A ~ U(-1/sqrt(in), 1/sqrt(in)), B ~ N(0, {v['b_std']}^2), torch.Generator seed {v['seed']}",
        "logits_file": "logits.f32",
        "logits_shape": [T, V],
        "logits_layout": "float32 little-endian, row-major [T, V], adapter applied",
        "max_abs_logit": maxabs,
        "max_abs_logit_change_from_adapter": adapter_effect,
        "grads_file": "grads.safetensors",
        "grad_max_abs": grad_max,
        "tolerance": {
            "rel": ENGINE_REL_TOL,
            "note": "engine passes if, for every LoRA tensor, max|g - ref| <= rel * max|ref| of that tensor; "
                    "logits: max|logit - ref| <= rel * max_abs_logit; loss: |loss - ref| <= rel * loss",
        },
        "reference_checks": {
            "grads_f32_vs_f64_max_rel_err": worst64,
            "grads_f32_vs_f64_rel_err": rel64,
            "loss_f32_vs_f64_abs_err": loss_err64,
            "logits_f32_vs_f64_max_abs_err": logits_err64,
            "finite_difference_f64": fd,
            "plain_torch_vs_peft": cross_check,
        },
        "sha256": {f: gq.sha256(os.path.join(d, f)) for f in files},
    }
    gq.dump_json(os.path.join(d, "loss.json"), result)

    print(f"{name:14s} model={v['model']} T={T} V={V} r={r} alpha={alpha} rslora={v['use_rslora']} "
          f"scale={scale:.6g} loss={float(loss):.6f} max|logit|={maxabs:.4f} adapter moves logits by {adapter_effect:.4f}")
    print(f"  f32 vs f64: grads max rel err {worst64:.2e}, loss {loss_err64:.2e}, logits {logits_err64:.2e}; "
          f"finite diff rel err {max(x['rel_err'] for x in fd):.1e}; plain torch vs peft: {cross_check}")
    for k in sorted(grads):
        print(f"  max|g| {grad_max[k]:.4e}  rel64 {rel64[k]:.1e}  {k}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "test/fixtures/golden-lora"))
    ap.add_argument("--golden", default=os.path.join(ROOT, "test/fixtures/golden"),
                    help="folder of golden_qwen3.py checkpoints (read only)")
    ap.add_argument("--impl", choices=["peft", "torch", "auto"], default="auto",
                    help="peft: PEFT on transformers' Qwen3ForCausalLM writes the numbers and the plain-PyTorch "
                         "autograd must agree; torch: the plain-PyTorch autograd only; auto: peft when importable")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # deterministic reduction order on CPU
    have = peft_available()
    if args.impl == "peft" and not have:
        sys.exit("--impl peft requested but peft / transformers (with Qwen3ForCausalLM) are not importable")
    impl = "peft" if (args.impl == "peft" or (args.impl == "auto" and have)) else "torch"
    print(f"torch {torch.__version__}; peft + transformers importable: {have}; using impl={impl}")
    os.makedirs(args.out, exist_ok=True)
    for name, v in VARIANTS.items():
        if not args.only or name in args.only:
            build_variant(name, v, os.path.abspath(args.golden), args.out, impl)


if __name__ == "__main__":
    main()
