#!/usr/bin/env python3
"""Independent PyTorch reference + golden fixtures for the Qwen3 engine.

Creates small random Qwen3 checkpoints in exact Hugging Face layout (config.json,
generation_config.json, BF16 safetensors written by hand, optionally sharded with
model.safetensors.index.json), then runs a reference forward pass and writes:

  <out>/<variant>/logits.f32      full logits [T, V], float32 little-endian, row-major
  <out>/<variant>/expected.json   tokens, shape, impl, versions, max_abs_logit, tolerance
  <out>/<variant>/greedy.json     greedy generation (full recompute) + top-2 margins

The reference is transformers' Qwen3ForCausalLM when importable (--impl hf|auto),
otherwise (or with --impl torch) the plain-PyTorch forward below, written to follow
transformers/models/qwen3/modeling_qwen3.py. This file deliberately shares no code
with the TypeScript engine.

Usage:  .venv-ref/bin/python scripts/golden_qwen3.py --out test/fixtures/golden --impl hf
        (scripts/ref-venv.sh makes .venv-ref; --impl torch needs only PyTorch and numpy)
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys

import numpy as np
import torch

# --------------------------------------------------------------------------------------
# Variants

# out_gain: extra factor on o_proj/down_proj. With tied random embeddings the residual
# stream is otherwise dominated by the input token's own embedding and greedy decoding
# just repeats one token; a larger layer contribution gives less trivial greedy runs.
# min_distinct: reseed the prompt until greedy produces at least this many distinct ids.
VARIANTS = {
    "tied": dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=160, vocab_size=2048, tie_word_embeddings=True,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, shards=1, seq_len=16, seed=1001,
        out_gain=4.0, min_distinct=4,
    ),
    "untied-sharded": dict(
        num_hidden_layers=3, hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
        head_dim=32, intermediate_size=256, vocab_size=3000, tie_word_embeddings=False,
        rope_theta=5_000_000.0, rms_norm_eps=1e-6, shards=2, seq_len=12, seed=2002,
        out_gain=1.0, min_distinct=8,
    ),
    # seq_len 64 with rope_theta 1e4 so that (almost) every RoPE frequency rotates
    # through a meaningful angle (pos*inv_freq at pos 63: 63, 20, 6.3, 2, .63, .2, .06, .02 rad).
    "mha": dict(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, intermediate_size=64, vocab_size=512, tie_word_embeddings=True,
        rope_theta=10_000.0, rms_norm_eps=1e-5, shards=1, seq_len=64, seed=3003,
        out_gain=4.0, min_distinct=4,
    ),
}

GREEDY_PROMPT_LEN = 5
GREEDY_NEW_TOKENS = 16
ENGINE_REL_TOL = 1e-3          # engine must satisfy max|logit - ref| <= 1e-3 * max|ref|
MARGIN_FACTOR = 10.0           # require min greedy top-2 margin >= 10 * tol * max|logit|
MAX_RESEEDS = 500
REFERENCE = {  # what `impl` in expected.json / greedy.json means
    "hf": "transformers.Qwen3ForCausalLM.from_pretrained(checkpoint folder), float32, eager attention, no cache",
    "torch": "TorchQwen3 in scripts/golden_qwen3.py (plain PyTorch, float32, follows modeling_qwen3.py)",
}

# --------------------------------------------------------------------------------------
# BF16 + safetensors (hand-written; no safetensors lib needed)


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round-to-nearest-even. No NaN/Inf expected."""
    a = np.ascontiguousarray(a, dtype="<f4")
    assert np.all(np.isfinite(a))
    bits = a.view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype("<u4") << 16).view("<f4")


def write_safetensors(path, tensors):
    """tensors: dict name -> np.uint16 array of bf16 bits. Names sorted, data contiguous."""
    names = sorted(tensors)
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    blobs = []
    for n in names:
        t = np.ascontiguousarray(tensors[n], dtype="<u2")
        nbytes = t.size * 2
        header[n] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        blobs.append(t.tobytes())
        offset += nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    return offset  # total tensor bytes


def read_safetensors(path):
    """Tiny strict reader: returns dict name -> float32 np.ndarray (bf16 upcast exactly)."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    assert hlen % 8 == 0, "header not 8-byte padded"
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    body = data[8 + hlen:]
    header.pop("__metadata__", None)
    spans = []
    out = {}
    for name, info in header.items():
        assert info["dtype"] == "BF16", (name, info["dtype"])
        b, e = info["data_offsets"]
        n = int(np.prod(info["shape"])) if info["shape"] else 1
        assert e - b == 2 * n, name
        spans.append((b, e))
        bits = np.frombuffer(body[b:e], dtype="<u2").reshape(info["shape"])
        out[name] = bf16_bits_to_f32(bits)
    spans.sort()
    pos = 0
    for b, e in spans:
        assert b == pos, "gap/overlap in data section"
        pos = e
    assert pos == len(body), "trailing bytes in data section"
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()

# --------------------------------------------------------------------------------------
# Random checkpoint


def make_weights(v, gen):
    """Returns dict HF-name -> float32 torch tensor (before bf16 rounding)."""
    H, I, V = v["hidden_size"], v["intermediate_size"], v["vocab_size"]
    NH, NKV, HD = v["num_attention_heads"], v["num_key_value_heads"], v["head_dim"]

    def mat(out_f, in_f, gain=1.0):
        return torch.randn(out_f, in_f, generator=gen, dtype=torch.float32) * (gain / math.sqrt(in_f))

    def norm(n):
        return 1.0 + 0.2 * torch.randn(n, generator=gen, dtype=torch.float32)

    w = {}
    w["model.embed_tokens.weight"] = torch.randn(V, H, generator=gen, dtype=torch.float32)
    for i in range(v["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = mat(NH * HD, H)
        w[p + "self_attn.k_proj.weight"] = mat(NKV * HD, H)
        w[p + "self_attn.v_proj.weight"] = mat(NKV * HD, H)
        w[p + "self_attn.q_norm.weight"] = norm(HD)
        w[p + "self_attn.k_norm.weight"] = norm(HD)
        w[p + "self_attn.o_proj.weight"] = mat(H, NH * HD, v["out_gain"])
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "mlp.gate_proj.weight"] = mat(I, H)
        w[p + "mlp.up_proj.weight"] = mat(I, H)
        w[p + "mlp.down_proj.weight"] = mat(H, I, v["out_gain"])
    w["model.norm.weight"] = norm(H)
    if not v["tie_word_embeddings"]:
        # N(0,1)*0.5 rather than 1/sqrt(H) so untied logits have a spread comparable to tied.
        w["lm_head.weight"] = 0.5 * torch.randn(V, H, generator=gen, dtype=torch.float32)
    return w


def config_json(v):
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": v["head_dim"],
        "hidden_act": "silu",
        "hidden_size": v["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": v["intermediate_size"],
        "max_position_embeddings": 4096,
        "max_window_layers": v["num_hidden_layers"],
        "model_type": "qwen3",
        "num_attention_heads": v["num_attention_heads"],
        "num_hidden_layers": v["num_hidden_layers"],
        "num_key_value_heads": v["num_key_value_heads"],
        "rms_norm_eps": v["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": v["rope_theta"],
        "sliding_window": None,
        "tie_word_embeddings": v["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": v["vocab_size"],
    }


GENERATION_CONFIG = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}


def dump_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_checkpoint(d, v, bits):
    """bits: dict name -> uint16 bf16 array. Returns list of checkpoint file names."""
    dump_json(os.path.join(d, "config.json"), config_json(v))
    dump_json(os.path.join(d, "generation_config.json"), GENERATION_CONFIG)
    for stale in os.listdir(d):
        if stale.endswith(".safetensors") or stale == "model.safetensors.index.json":
            os.remove(os.path.join(d, stale))
    if v["shards"] == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), bits)
        return ["config.json", "generation_config.json", "model.safetensors"]
    assert v["shards"] == 2
    L = v["num_hidden_layers"]
    split = (L + 1) // 2  # layers [0, split) in shard 1 with embeddings; rest + norm + lm_head in 2

    def shard_of(name):
        if name.startswith("model.embed_tokens."):
            return 0
        if name.startswith("model.layers."):
            return 0 if int(name.split(".")[2]) < split else 1
        return 1

    names = [f"model-{i + 1:05d}-of-00002.safetensors" for i in range(2)]
    groups = [{}, {}]
    for n, b in bits.items():
        groups[shard_of(n)][n] = b
    total = 0
    for fname, g in zip(names, groups):
        total += write_safetensors(os.path.join(d, fname), g)
    index = {
        "metadata": {"total_size": total},
        "weight_map": {n: names[shard_of(n)] for n in sorted(bits)},
    }
    dump_json(os.path.join(d, "model.safetensors.index.json"), index)
    return ["config.json", "generation_config.json", "model.safetensors.index.json"] + names


def load_checkpoint(d):
    """Reads the checkpoint back from disk with the tiny reader (single or sharded)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        out = {}
        for fname in sorted(set(index["weight_map"].values())):
            part = read_safetensors(os.path.join(d, fname))
            for n in part:
                assert index["weight_map"][n] == fname, n
            out.update(part)
        assert set(out) == set(index["weight_map"])
        assert index["metadata"]["total_size"] == sum(a.size * 2 for a in out.values())
        return out
    return read_safetensors(os.path.join(d, "model.safetensors"))

# --------------------------------------------------------------------------------------
# Plain-PyTorch Qwen3 forward (mirrors HF modeling_qwen3.py, eager attention, no cache)


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class TorchQwen3:
    def __init__(self, cfg, weights, dtype=torch.float32):
        self.cfg = cfg
        self.dtype = dtype
        self.w = {n: torch.from_numpy(np.array(a)).to(dtype) for n, a in weights.items()}
        if "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        HD = cfg["head_dim"]
        # Same expression as HF compute_default_rope_parameters (float32 there; dtype here).
        self.inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HD, 2, dtype=torch.int64).to(dtype) / HD))

    @torch.no_grad()
    def __call__(self, ids):
        c, w, dt = self.cfg, self.w, self.dtype
        T = len(ids)
        NH, NKV, HD, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
        groups = NH // NKV
        x = w["model.embed_tokens.weight"][torch.tensor(ids, dtype=torch.long)]  # [T, H]
        pos = torch.arange(T, dtype=torch.int64).to(dt)
        freqs = (self.inv_freq[:, None] @ pos[None, :]).transpose(0, 1)  # [T, HD/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # [T, 1, HD]
        mask = torch.full((T, T), float("-inf"), dtype=dt).triu(1)
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, NH, HD)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, NKV, HD)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, NKV, HD)
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, T, HD]
            k = k.repeat_interleave(groups, dim=0)  # query head h uses kv head h // groups
            v = v.repeat_interleave(groups, dim=0)
            s = (q @ k.transpose(1, 2)) * (HD ** -0.5) + mask
            a = torch.softmax(s, dim=-1) @ v  # [NH, T, HD]
            a = a.transpose(0, 1).reshape(T, NH * HD)
            x = x + a @ w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            g = h @ w[p + "mlp.gate_proj.weight"].T
            u = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
        x = rms_norm(x, w["model.norm.weight"], eps)
        return x @ w["lm_head.weight"].T  # [T, V]

def numpy_forward_f64(cfg, weights, ids):
    """Second, structurally different reference (explicit loops over heads/positions, float64,
    pairwise RoPE on (i, i + HD/2)). Used only as a self-check of TorchQwen3."""
    W = {n: np.asarray(a, dtype=np.float64) for n, a in weights.items()}
    lm = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    NH, NKV, HD, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    half = HD // 2
    T = len(ids)

    def rms(v, g):
        return g * v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)

    def rope(v, t):  # v: [HD]
        out = np.empty_like(v)
        for i in range(half):
            ang = t * (1.0 / cfg["rope_theta"] ** (2 * i / HD))
            c, s_ = math.cos(ang), math.sin(ang)
            out[i] = v[i] * c - v[i + half] * s_
            out[i + half] = v[i + half] * c + v[i] * s_
        return out

    x = np.stack([W["model.embed_tokens.weight"][t] for t in ids])
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, NH, HD)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, NKV, HD)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, NKV, HD)
        attn = np.zeros((T, NH * HD))
        for t in range(T):
            for hh in range(NH):
                kv = hh // (NH // NKV)
                qv = rope(rms(q[t, hh], W[p + "self_attn.q_norm.weight"]), t)
                sc = np.array([qv @ rope(rms(k[j, kv], W[p + "self_attn.k_norm.weight"]), j)
                               for j in range(t + 1)]) / math.sqrt(HD)
                pr = np.exp(sc - sc.max())
                pr /= pr.sum()
                attn[t, hh * HD:(hh + 1) * HD] = pr @ v[:t + 1, kv]
        x = x + attn @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    return rms(x, W["model.norm.weight"]) @ lm.T


# --------------------------------------------------------------------------------------
# Hugging Face reference


def hf_available():
    try:
        import transformers  # noqa: F401
        from transformers import Qwen3ForCausalLM  # noqa: F401
        return True
    except Exception:
        return False


class HFQwen3:
    def __init__(self, d, tied):
        import transformers
        from transformers import Qwen3ForCausalLM
        self.version = transformers.__version__
        try:  # `dtype` since transformers 4.56; `torch_dtype` before
            model, info = Qwen3ForCausalLM.from_pretrained(
                d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        except TypeError:
            model, info = Qwen3ForCausalLM.from_pretrained(
                d, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        model = model.to(torch.float32).eval()  # bf16 -> f32 upcast is exact
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert not info.get("unexpected_keys"), info
        missing = set(info.get("missing_keys") or [])
        assert missing <= ({"lm_head.weight"} if tied else set()), info
        self.model = model

    @torch.no_grad()
    def __call__(self, ids):
        out = self.model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
        return out.logits[0].float()

# --------------------------------------------------------------------------------------
# Fixture generation


def greedy(fwd, prompt, n):
    toks = list(prompt)
    margins, maxabs = [], 0.0
    for _ in range(n):
        last = fwd(toks)[-1].double()
        top2 = torch.topk(last, 2)
        margins.append(float(top2.values[0] - top2.values[1]))
        maxabs = max(maxabs, float(last.abs().max()))
        toks.append(int(top2.indices[0]))
    return toks[len(prompt):], margins, maxabs


def pick_tokens(v, vseed, fwd):
    """Seeded token sequence (contains 0 and V-1) whose greedy run has a safe top-2 margin
    and is not a trivial repetition."""
    V, T = v["vocab_size"], v["seq_len"]
    for attempt in range(MAX_RESEEDS):
        g = torch.Generator().manual_seed(vseed * 1000 + attempt)
        toks = torch.randint(0, V, (T,), generator=g).tolist()
        # place 0 and V-1 at seeded positions (one inside the greedy prompt, one after it)
        toks[int(torch.randint(0, GREEDY_PROMPT_LEN, (1,), generator=g))] = 0
        toks[int(torch.randint(GREEDY_PROMPT_LEN, T, (1,), generator=g))] = V - 1
        prompt = toks[:GREEDY_PROMPT_LEN]
        gen, margins, maxabs = greedy(fwd, prompt, GREEDY_NEW_TOKENS)
        threshold = MARGIN_FACTOR * ENGINE_REL_TOL * maxabs
        if min(margins) >= threshold and len(set(gen)) >= v["min_distinct"]:
            return toks, prompt, gen, margins, maxabs, threshold, attempt
    raise RuntimeError("could not find a prompt with a safe greedy margin")


def build_variant(name, v, out_dir, impl):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(v["seed"])
    w32 = make_weights(v, gen)
    bits = {n: f32_to_bf16_bits(t.numpy()) for n, t in w32.items()}

    # self-check 1: my RNE bf16 rounding == torch's bf16 cast
    for n, t in w32.items():
        mine = bf16_bits_to_f32(bits[n])
        theirs = t.to(torch.bfloat16).to(torch.float32).numpy()
        assert np.array_equal(mine, theirs), f"bf16 rounding mismatch in {n}"

    files = write_checkpoint(d, v, bits)

    # self-check 2: the files read back identically with the tiny reader
    weights = load_checkpoint(d)
    assert set(weights) == set(bits)
    for n in bits:
        assert np.array_equal(f32_to_bf16_bits(weights[n]), bits[n]), n
        assert weights[n].shape == bits[n].shape
        assert np.array_equal(weights[n], bf16_bits_to_f32(bits[n])), n

    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    torch_fwd = TorchQwen3(cfg, weights, torch.float32)
    torch_fwd64 = TorchQwen3(cfg, weights, torch.float64)
    hf_fwd = HFQwen3(d, cfg["tie_word_embeddings"]) if impl == "hf" else None
    fwd = hf_fwd if hf_fwd is not None else torch_fwd

    toks, prompt, gtoks, margins, gmax, threshold, attempt = pick_tokens(v, v["seed"], fwd)

    logits = fwd(toks).to(torch.float32).contiguous()
    T, V = logits.shape
    assert (T, V) == (v["seq_len"], v["vocab_size"])
    maxabs = float(logits.abs().max())

    # self-check 3: f32 reference vs float64 forward of the same bf16 weights
    l64 = torch_fwd64(toks)
    err64 = float((logits.double() - l64).abs().max())
    assert err64 <= 1e-5 * maxabs, (name, err64, maxabs)

    # self-check 4: structurally different numpy float64 implementation
    errnp = float(np.abs(logits.double().numpy() - numpy_forward_f64(cfg, weights, toks)).max())
    assert errnp <= 1e-5 * maxabs, (name, errnp, maxabs)
    assert 0 in toks and v["vocab_size"] - 1 in toks

    # self-check 5: HF vs plain torch (when HF is used)
    hf_vs_torch = None
    if hf_fwd is not None:
        lt = torch_fwd(toks)
        hf_vs_torch = float((logits - lt).abs().max())
        assert hf_vs_torch <= 1e-4 * maxabs, (name, hf_vs_torch, maxabs)
        gt, _, _ = greedy(torch_fwd, prompt, GREEDY_NEW_TOKENS)
        assert gt == gtoks, (name, gt, gtoks)

    # sanity: every position's logits are non-degenerate
    assert float(logits.std(dim=-1).min()) > 0.1, name

    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))

    tf_version = hf_fwd.version if hf_fwd is not None else None
    impl_used = "hf" if hf_fwd is not None else "torch"
    common = {"variant": name, "impl": impl_used, "reference": REFERENCE[impl_used],
              "torch_version": torch.__version__, "transformers_version": tf_version,
              "numpy_version": np.__version__}
    expected = dict(common)
    expected.update({
        "tokens": toks,
        "shape": [T, V],
        "logits_file": "logits.f32",
        "logits_dtype": "float32",
        "logits_byte_order": "little",
        "logits_layout": "row-major [T, V]; row t = logits after tokens[0..t] at position t",
        "max_abs_logit": maxabs,
        "tolerance": {
            "rel": ENGINE_REL_TOL,
            "abs": ENGINE_REL_TOL * maxabs,
            "note": "engine passes if max over all t,v of |logit - ref| <= rel * max_abs_logit "
                    "(= abs). Reference computed in float32 from the bf16 weights upcast exactly "
                    "to float32; softmax/RMSNorm/RoPE in float32.",
        },
        "reference_checks": {
            "max_abs_diff_vs_float64_forward": err64,
            "max_abs_diff_vs_numpy_loop_float64": errnp,
            "max_abs_diff_hf_vs_plain_torch": hf_vs_torch,
        },
        "checkpoint_sha256": {f: sha256(os.path.join(d, f)) for f in files},
        "logits_sha256": sha256(os.path.join(d, "logits.f32")),
    })
    dump_json(os.path.join(d, "expected.json"), expected)

    greedy_json = dict(common)
    greedy_json.update({
        "prompt": prompt,
        "tokens": gtoks,
        "num_new_tokens": GREEDY_NEW_TOKENS,
        "method": "argmax of last-position logits, full recompute over prompt+generated each step, "
                  "no EOS stop, positions start at 0",
        "top2_margins": margins,
        "min_margin": min(margins),
        "max_abs_logit": gmax,
        "min_margin_over_max_abs_logit": min(margins) / gmax,
        "required_min_margin": threshold,
        "distinct_generated": len(set(gtoks)),
        "reseed_attempt": attempt,
    })
    dump_json(os.path.join(d, "greedy.json"), greedy_json)

    print(f"{name:15s} impl={common['impl']} T={T} V={V} max|logit|={maxabs:.4f} "
          f"f64diff={err64:.2e} npdiff={errnp:.2e} hf_vs_torch={hf_vs_torch} greedy_min_margin={min(margins):.4f} "
          f"(ratio {min(margins) / gmax:.4f}, reseeds {attempt})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="test/fixtures/golden")
    ap.add_argument("--impl", choices=["hf", "torch", "auto"], default="auto")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # deterministic reduction order on CPU
    have_hf = hf_available()
    if args.impl == "hf" and not have_hf:
        sys.exit("--impl hf requested but transformers (with Qwen3ForCausalLM) is not importable")
    impl = "hf" if (args.impl == "hf" or (args.impl == "auto" and have_hf)) else "torch"
    print(f"torch {torch.__version__}; transformers importable: {have_hf}; using impl={impl}")

    os.makedirs(args.out, exist_ok=True)
    for name, v in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        build_variant(name, v, args.out, impl)


if __name__ == "__main__":
    main()
