#!/usr/bin/env python3
"""Golden Q4 fixtures: the golden Qwen3 checkpoints quantized to 4 bits, with reference logits,
drift from bf16, packed words, and QLoRA gradients.

The q4 format (one f16 scale per group of 32 along the last dimension, symmetric):
  amax = max |w| over the group (w the bf16 value);
  s = the f16 nearest to the exact amax / 7 (ties to even, subnormals kept; s may be 0);
  q = clamp(round_half_even(w / s), -8, 7), q = 0 where s = 0;  dequantized weight q * s.
Packed (u32 words, little-endian), for a weight (N, K), element i = n*K + k, group g = i >> 5:
  word i >> 3, bits 4*(i & 7)..+3: the nibble q + 8;
  word N*K/8 + (g >> 1): f16 bits of s_g, low 16 bits for even g, high for odd; ceil(N*K/64) words.

Every Linear weight (q/k/v/o/gate/up/down_proj), the embedding and an untied lm_head are
quantized; norms stay bf16. For each checkpoint in test/fixtures/golden/<variant> (read only)
this writes:

  <out>/<variant>/logits.f32      logits [T, V] with the dequantized weights, float32 LE row-major
  <out>/<variant>/expected.json   tokens, shape, tolerance, drift vs the bf16 logits, sha256 of
                                  every packed tensor, self-checks
  <out>/tied/embed.q4             packed words of model.embed_tokens.weight of 'tied'
  <out>/lora-tied-all/            golden_lora.py's 'tied-all' (same adapter, same tokens) with
                                  the q4 base: loss.json, grads.safetensors, logits.f32

The forward is transformers' Qwen3ForCausalLM with --impl hf (golden_qwen3.py's plain-PyTorch
TorchQwen3 with --impl torch, and as a cross-check), fed the dequantized weights in f32; the
LoRA gradients are PEFT's (PeftModel on that model) with --impl hf, golden_lora.py's plain
autograd with --impl torch and as a cross-check. The quantizer below is numpy float64 and shares no code with the TypeScript side;
it is checked against an exact rational (fractions.Fraction) implementation of the spec.

Usage:  .venv-ref/bin/python scripts/golden_q4.py --out test/fixtures/golden-q4 --impl hf
        (scripts/ref-venv.sh makes .venv-ref)
"""

import argparse
import hashlib
import json
import math
import os
import sys
from fractions import Fraction

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import golden_qwen3 as gq  # noqa: E402  checkpoint reader, TorchQwen3, HF wrapper
import golden_lora as gl  # noqa: E402  adapter files, LoRA forward + autograd

GROUP = 32
F16_OVERFLOW = 65520.0   # midpoint of 65504 (f16 max) and 2^16: it and everything above round to Inf
ENGINE_REL_TOL = 2e-3    # engine passes if max|logit - ref| <= 2e-3 * max|ref|
VARIANTS = ("tied", "untied-sharded", "mha")
PACKED_FILES = {"tied": {"embed.q4": "model.embed_tokens.weight"}}
LORA = {"lora-tied-all": "tied-all"}  # q4 folder -> golden_lora.py variant

# --------------------------------------------------------------------------------------
# Quantizer (numpy float64)
#
# Why float64 gives the exact result. Every point where a rounding decision flips (an f16
# midpoint for s, a half-integer for q) is a float64 number, and float64 division is correctly
# rounded, hence monotone: it can carry a value across such a point only by landing on it,
# which needs the exact value within 2^-53 (relative) of it. amax has 8 significant bits, so
# amax / 7 is either exact or has 1/7's endless binary expansion, >= 2^-15 (relative) from every
# f16 midpoint; w (8 bits) / s (11 bits) is either exactly a half-integer or >= 2^-20 from one
# (|w / s| < 16). So float64 amax / 7 and w / s sit on the same side of every rounding point as
# the exact values, and exact ties stay exact ties. The f16 rounding is numpy's float64 ->
# float16 cast, which rounds the float64 bits once, half to even, subnormals included. torch's
# double -> half is not used: it rounds through float (torch 1.13: 1 + 2^-11 + 2^-40 -> 1.0).
# np.rint is round-half-even. self_check_exact() and check_rounding() verify all of this.


def is_target(name):
    return name.endswith("_proj.weight") or name in ("model.embed_tokens.weight", "lm_head.weight")


def quantize(w, name):
    """w: float32 [N, K] (bf16 values). Returns q int8 [N, K] and the f16 scale bits uint16 [N, K/32]."""
    N, K = w.shape
    if K % GROUP:
        raise ValueError(f"q4: {name}: last dimension {K} is not a multiple of {GROUP}")
    g = w.astype(np.float64).reshape(N, K // GROUP, GROUP)
    amax = np.abs(g).max(axis=-1)
    if not np.all(amax / 7 < F16_OVERFLOW):  # also catches NaN
        raise ValueError(f"q4: {name}: max |w| = {float(np.nanmax(amax))} needs a scale beyond f16, or NaN")
    s16 = (amax / 7).astype(np.float16)
    s = s16.astype(np.float64)[..., None]
    q = np.where(s > 0, np.clip(np.rint(g / np.where(s > 0, s, 1.0)), -8, 7), 0.0)
    return q.astype(np.int8).reshape(N, K), s16.view(np.uint16)


def pack(q, sbits):
    nib = (q.reshape(-1, 8).astype(np.int64) + 8).astype(np.uint32)
    words = np.zeros(nib.shape[0], dtype=np.uint32)
    for j in range(8):
        words |= nib[:, j] << np.uint32(4 * j)
    sb = sbits.reshape(-1).astype(np.uint32)
    if sb.size % 2:
        sb = np.append(sb, np.uint32(0))
    return np.concatenate([words, sb[0::2] | (sb[1::2] << np.uint32(16))]).astype("<u4")


def unpack(words, N, K):
    """Inverse of pack: q int8 [N, K], scale bits uint16 [N, K/32]."""
    n_nib = N * K // 8
    assert words.size == n_nib + (N * K // GROUP + 1) // 2
    nib = np.stack([(words[:n_nib] >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], axis=1)
    q = (nib.astype(np.int64) - 8).astype(np.int8).reshape(N, K)
    sw = words[n_nib:]
    sb = np.stack([sw & np.uint32(0xFFFF), sw >> np.uint32(16)], axis=1).reshape(-1)[:N * K // GROUP]
    return q, sb.astype(np.uint16).reshape(N, K // GROUP)


def dequantize(q, sbits):
    """q * s in float32 (exact: 4-bit q times 11-bit s)."""
    N, K = q.shape
    s = sbits.view(np.float16).astype(np.float64)
    return (q.astype(np.float64).reshape(N, K // GROUP, GROUP) * s[..., None]).reshape(N, K).astype(np.float32)


def quantize_checkpoint(weights):
    """name -> (packed words, dequantized f32, exact ties) for every target tensor; checks each
    round trip."""
    out = {}
    for name in sorted(weights):
        if not is_target(name):
            continue
        w = weights[name]
        q, sb = quantize(w, name)
        words = pack(q, sb)
        q2, sb2 = unpack(words, *w.shape)
        assert np.array_equal(q2, q) and np.array_equal(sb2, sb), name
        out[name] = (words, dequantize(q2, sb2), check_rounding(w, q, sb, name))
    return out


def check_rounding(w, q, sbits, name):
    """Exact check of q for every element, without dividing: r = w - q*s is exact in float64
    (where q != 0, w and q*s are multiples of one power of two >= s * 2^-12, both below 16 s),
    and round-half-even(w/s) = q  <=>  |r| < s/2, or |r| = s/2 with q even; clamped values sit
    beyond 6.5 s (q = 7) or at or below -7.5 s (q = -8). Returns the number of exact ties."""
    N, K = w.shape
    g = w.astype(np.float64).reshape(N, K // GROUP, GROUP)
    qq = q.astype(np.float64).reshape(g.shape)
    s = sbits.view(np.float16).astype(np.float64)[..., None] + 0 * g
    r, half = g - qq * s, s / 2
    plain = (np.abs(r) < half) | ((np.abs(r) == half) & (qq % 2 == 0))
    ok = np.where(s == 0, qq == 0,
                  plain | ((qq == 7) & (g > 6.5 * s)) | ((qq == -8) & (g <= -7.5 * s)))
    assert ok.all(), (name, int((~ok).sum()))
    return int(((np.abs(r) == half) & (s > 0)).sum())  # exact ties w / s = k + 1/2


# --------------------------------------------------------------------------------------
# Exact (rational) reference of the spec, for self-checks


def f16_nearest_exact(x):
    """Nearest f16 to the Fraction x >= 0 (ties to even), or None beyond the f16 range."""
    if x >= F16_OVERFLOW:
        return None
    if x == 0:
        return Fraction(0)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    quantum = Fraction(2) ** (max(e, -14) - 10)
    return round(x / quantum) * quantum  # Fraction.__round__: half to even


def quantize_group_exact(ws):
    """The spec on exact rationals: ws are the group's floats. Returns (q list, s Fraction)."""
    fr = [Fraction(float(w)) for w in ws]
    s = f16_nearest_exact(max(abs(f) for f in fr) / 7)
    return [0 if s == 0 else max(-8, min(7, round(f / s))) for f in fr], s


def bf16_values(bits):
    return gq.bf16_bits_to_f32(np.asarray(bits, dtype="<u2"))


def bf(x):
    """x rounded to bf16, as a float."""
    return float(bf16_values(gq.f32_to_bf16_bits(np.float32([x])))[0])


def self_check_exact():
    """1. s for every possible amax (every non-negative finite bf16 whose amax/7 fits f16).
    2. Hand-built groups with exact ties, subnormal scales, clamping and s = 0.
    Returns counts for expected.json."""
    amax = bf16_values(np.arange(0, 0x7F80)).astype(np.float64)
    amax = amax[amax / 7 < F16_OVERFLOW]
    s16 = (amax / 7).astype(np.float16).astype(np.float64)
    for a, s in zip(amax.tolist(), s16.tolist()):
        assert Fraction(s) == f16_nearest_exact(Fraction(a) / 7), a
    # bf16 values around the overflow: 456704 / 7 -> 65248 (finite), 458752 / 7 = 65536 -> Inf
    assert f16_nearest_exact(Fraction(456704, 7)) == 65248 and f16_nearest_exact(Fraction(458752, 7)) is None

    u = 2.0 ** -24  # smallest f16 subnormal
    groups = [
        [7.0, 2.5, -2.5, 3.5, 0.5, -0.5, 1.5, -1.5, 6.5, -6.5, 4.5, -5.5],  # s = 1: q ties -> even
        [-7.0, 0.25, 0.75],                                                  # s = 1, w = -amax
        [21 * u / 2, 5 * u / 2, 3 * u / 2],   # amax/7 = 1.5u, an f16 tie -> s = 2u; w/s = 5.25, 1.25, 0.75
        [35 * u / 2, 5 * u],                  # amax/7 = 2.5u -> s = 2u (even); 17.5u/2u = 8.75 -> clamp 7; 5u/2u = 2.5 -> 2
        [7 * u / 2, -u],                      # amax/7 = u/2, tie between 0 and u -> s = 0, all q = 0
        [-10 * u, 7.5 * u, 3 * u, -8.5 * u],  # amax/7 = 10u/7 -> s = u: -10 -> clamp -8, 7.5 -> 8 -> clamp 7, -8.5 -> -8
        [-7.5 * u, 6.5 * u, 2.5 * u],         # s = u (7.5/7 = 1.07): -7.5 -> -8, 6.5 -> 6, 2.5 -> 2
        [3 * 2.0 ** -30, -2.0 ** -27],        # amax/7 < u/2 -> s = 0
        [0.0] * 4,                            # all zero -> s = 0
        [bf(1e-3), bf(-3e-4), bf(2e-4)],      # normal f16 scales, no ties
        [300.0, -123.0, bf(0.01)],
        [456704.0, -65536.0],                 # largest bf16 amax with a finite scale (65248)
    ]
    for i, vals in enumerate(groups):
        w = np.zeros((1, GROUP), dtype=np.float32)
        w[0, :len(vals)] = vals
        assert np.array_equal(bf16_values(gq.f32_to_bf16_bits(w)), w), (i, "not bf16 values")
        q, sb = quantize(w, f"group {i}")
        q_exact, s_exact = quantize_group_exact(w[0])
        assert q[0].tolist() == q_exact and Fraction(float(sb.view(np.float16)[0, 0])) == s_exact, (i, q[0].tolist(), q_exact)
        check_rounding(w, q, sb, f"group {i}")
    # the cases above really are what they say (a half-away-from-zero rounding would fail these)
    assert quantize(np.float32([[7.0, 2.5, -2.5, 3.5] + [0] * 28]), "t")[0][0, :4].tolist() == [7, 2, -2, 4]
    assert quantize(np.float32([[-10 * u, 7.5 * u] + [0] * 30]), "t")[0][0, :2].tolist() == [-8, 7]
    assert quantize(np.float32([[7 * u / 2] + [0] * 31]), "t")[1][0, 0] == 0
    for bad, what in (([[1.0] * 16], "K % 32"), ([[458752.0] + [0.0] * 31], "overflow")):
        try:
            quantize(np.float32(bad), "model.bad.weight")
            raise AssertionError(f"{what} not refused")
        except ValueError as e:
            assert "model.bad.weight" in str(e), e
    return {"exhaustive_scales_checked": int(amax.size), "hand_built_groups_checked": len(groups)}


# --------------------------------------------------------------------------------------
# Forward and drift


def hf_forward(cfg, weights):
    """transformers' Qwen3ForCausalLM (f32, eager attention) with the given f32 weights."""
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version")})
    config._attn_implementation = "eager"
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    missing, unexpected = model.load_state_dict({n: torch.from_numpy(np.array(a)) for n, a in weights.items()}, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= ({"lm_head.weight"} if cfg["tie_word_embeddings"] else set()), missing
    if cfg["tie_word_embeddings"]:
        model.tie_weights()
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)

    @torch.no_grad()
    def fwd(ids):
        return model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()
    fwd.version = transformers.__version__
    fwd.model = model
    return fwd


def drift(ref, got):
    """ref, got [T, V]. KL(softmax(ref) || softmax(got)) per row in float64, averaged."""
    a, b = ref.astype(np.float64), got.astype(np.float64)
    la = a - (a.max(-1, keepdims=True) + np.log(np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    lb = b - (b.max(-1, keepdims=True) + np.log(np.exp(b - b.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    max_abs = float(np.abs(a - b).max())
    return {
        "max_abs": max_abs,
        "max_rel": max_abs / float(np.abs(a).max()),
        "mean_kl": float((np.exp(la) * (la - lb)).sum(-1).mean()),
        "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()),
    }


def read_logits(path, shape):
    return np.fromfile(path, dtype="<f4").reshape(shape)


def relpath(p):
    return os.path.relpath(p, ROOT).replace(os.sep, "/")


def checkpoint_sha256(model_dir):
    return {f: gq.sha256(os.path.join(model_dir, f)) for f in sorted(os.listdir(model_dir))
            if f == "config.json" or f.endswith(".safetensors") or f.endswith(".index.json")}


def load_quantized(model_dir):
    """cfg, bf16 weights, {name: (words, dequantized)}, weights with the targets dequantized."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = gq.load_checkpoint(model_dir)
    quant = quantize_checkpoint(weights)
    L = cfg["num_hidden_layers"]
    assert len(quant) == 7 * L + 1 + (0 if cfg["tie_word_embeddings"] else 1), sorted(quant)
    qweights = {n: (quant[n][1] if n in quant else a) for n, a in weights.items()}
    return cfg, weights, quant, qweights


def build_variant(name, golden_dir, out_dir, impl, exact_checks):
    model_dir = os.path.join(golden_dir, name)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(model_dir, "expected.json")) as f:
        base = json.load(f)
    toks, (T, V) = base["tokens"], base["shape"]
    cfg, weights, quant, qweights = load_quantized(model_dir)

    torch_fwd = gq.TorchQwen3(cfg, qweights, torch.float32)
    hf = hf_forward(cfg, qweights) if impl == "hf" else None
    logits = (hf or torch_fwd)(toks).to(torch.float32).contiguous()
    assert tuple(logits.shape) == (T, V)
    maxabs = float(logits.abs().max())

    # self-checks: float64 forward, numpy loop forward, HF vs plain torch
    err64 = float((logits.double() - gq.TorchQwen3(cfg, qweights, torch.float64)(toks)).abs().max())
    assert err64 <= 1e-5 * maxabs, (name, err64)
    errnp = float(np.abs(logits.double().numpy() - gq.numpy_forward_f64(cfg, qweights, toks)).max())
    assert errnp <= 1e-5 * maxabs, (name, errnp)
    hf_vs_torch = None
    if hf is not None:
        hf_vs_torch = float((logits - torch_fwd(toks)).abs().max())
        assert hf_vs_torch <= 1e-4 * maxabs, (name, hf_vs_torch)

    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
    for fname, tensor in PACKED_FILES.get(name, {}).items():
        quant[tensor][0].tofile(os.path.join(d, fname))

    ref_path = os.path.join(model_dir, "logits.f32")
    dr = drift(read_logits(ref_path, (T, V)), logits.numpy())
    expected = {
        "variant": name,
        "impl": "hf" if hf is not None else "torch",
        "reference": gq.REFERENCE["hf" if hf is not None else "torch"] + "; dequantized q4 weights (state dict)",
        "torch_version": torch.__version__,
        "transformers_version": hf.version if hf is not None else None,
        "numpy_version": np.__version__,
        "model_dir": relpath(model_dir),
        "model_sha256": checkpoint_sha256(model_dir),
        "format": {
            "group": GROUP,
            "scale": "f16 nearest to amax/7 (ties to even, subnormals kept), amax = max|w| over the group",
            "q": "clamp(round_half_even(w / s), -8, 7); 0 where s = 0; dequantized q * s",
            "layout": "u32 LE words: nibble q+8 of element i=n*K+k at word i>>3 bits 4*(i&7); "
                      "from word N*K/8 the f16 scale bits of group i>>5, two per word, even group in the low half",
            "quantized": "every *_proj.weight, model.embed_tokens.weight, lm_head.weight (untied); norms stay bf16",
        },
        "q4": {n: {"shape": list(qweights[n].shape), "words": int(quant[n][0].size), "sha256": sha256_bytes(quant[n][0]),
                   "rel_rms_error": rel_rms(weights[n], qweights[n])}
               for n in sorted(quant)},
        "q4_note": "sha256 of the packed little-endian u32 words; rel_rms_error = ||w - q*s|| / ||w||",
        "packed_files": PACKED_FILES.get(name, {}),
        "tokens": toks,
        "shape": [T, V],
        "logits_file": "logits.f32",
        "logits_layout": "float32 little-endian, row-major [T, V]; row t = logits after tokens[0..t] at position t",
        "max_abs_logit": maxabs,
        "tolerance": {
            "rel": ENGINE_REL_TOL,
            "abs": ENGINE_REL_TOL * maxabs,
            "note": "engine passes if max over all t,v of |logit - ref| <= rel * max_abs_logit (= abs). "
                    "Reference: float32 forward with the dequantized weights q*s (exact in float32).",
        },
        "drift_vs_bf16": dict(dr, reference=relpath(ref_path),
                              note="max_abs = max|bf16 - q4|, max_rel = max_abs / max|bf16|, mean_kl = mean over "
                                   "positions of KL(softmax(bf16) || softmax(q4)) in float64, top1_agreement = "
                                   "share of positions with the same argmax"),
        "reference_checks": dict(exact_checks, **{
            "exact_ties_w_over_s": sum(t[2] for t in quant.values()),
            "max_abs_diff_vs_float64_forward": err64,
            "max_abs_diff_vs_numpy_loop_float64": errnp,
            "max_abs_diff_hf_vs_plain_torch": hf_vs_torch,
        }),
        "sha256": {f: gq.sha256(os.path.join(d, f)) for f in ["logits.f32"] + sorted(PACKED_FILES.get(name, {}))},
    }
    gq.dump_json(os.path.join(d, "expected.json"), expected)
    print(f"{name:15s} impl={expected['impl']} tensors={len(quant)} max|logit|={maxabs:.4f} drift: max_abs={dr['max_abs']:.4f} "
          f"max_rel={dr['max_rel']:.2e} mean_kl={dr['mean_kl']:.2e} top1={dr['top1_agreement']:.3f} "
          f"f64diff={err64:.1e} npdiff={errnp:.1e} hf_vs_torch={hf_vs_torch}")


def rel_rms(w, dq):
    w = w.astype(np.float64)
    return float(np.sqrt(((w - dq) ** 2).sum() / (w ** 2).sum()))


def sha256_bytes(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


# --------------------------------------------------------------------------------------
# QLoRA gradients: golden_lora.py's computation with the q4 base weights


def build_lora(name, lora_name, golden_dir, golden_lora_dir, out_dir, impl):
    v = gl.VARIANTS[lora_name]
    model_dir = os.path.join(golden_dir, v["model"])
    adapter_dir = os.path.join(golden_lora_dir, lora_name)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    cfg, _, _, qweights = load_quantized(model_dir)
    with open(os.path.join(adapter_dir, "loss.json")) as f:
        bf16_ref = json.load(f)
    adapter = gl.read_safetensors_f32(os.path.join(adapter_dir, "adapter_model.safetensors"))
    made = gl.make_adapter(cfg, v)  # the committed adapter is what golden_lora.py makes
    assert set(made) == set(adapter) and all(np.array_equal(made[k], adapter[k]) for k in made)
    ids = bf16_ref["tokens"]
    pairs = gl.lora_pairs(cfg, v["targets"])
    scale = v["alpha"] / math.sqrt(v["r"]) if v["use_rslora"] else v["alpha"] / v["r"]
    assert scale == bf16_ref["scale"]

    plain = gl.loss_and_grads(cfg, qweights, adapter, pairs, scale, ids, torch.float32)
    # impl "hf": PEFT's LoRA on transformers' Qwen3ForCausalLM (dequantized weights) writes the
    # numbers; the plain-PyTorch autograd, checked below, must agree (golden_lora.compare_impls).
    cross_check = None
    if impl == "hf":
        loss, logits, grads = gl.peft_loss_and_grads(hf_forward(cfg, qweights).model, adapter_dir, adapter, ids)
        cross_check = gl.compare_impls((loss, logits, grads), plain)
    else:
        loss, logits, grads = plain
    T, V = logits.shape
    maxabs = float(logits.abs().max())

    # self-check 1: with B = 0 the hooked forward is the q4 base forward, bit for bit
    zero_b = {k: (np.zeros_like(a) if k.endswith("lora_B.weight") else a) for k, a in adapter.items()}
    assert torch.equal(gl.loss_and_grads(cfg, qweights, zero_b, pairs, scale, ids, torch.float32)[1],
                       gq.TorchQwen3(cfg, qweights, torch.float32)(ids))
    grad_max = {k: float(g.abs().max()) for k, g in grads.items()}
    assert min(grad_max.values()) > gl.MIN_GRAD
    # self-check 2: float64
    loss64, logits64, grads64 = gl.loss_and_grads(cfg, qweights, adapter, pairs, scale, ids, torch.float64)
    rel64 = {k: float((grads[k].double() - grads64[k]).abs().max()) / float(grads64[k].abs().max()) for k in grads}
    assert max(rel64.values()) <= gl.F64_REL_BUDGET, rel64
    # self-check 3: central differences (float64) at the largest-gradient element of the first A and the last B
    fd = []
    for key in (pairs[0][2], pairs[-1][3]):
        idx = int(grads64[key].abs().view(-1).argmax())
        num = gl.finite_difference(cfg, qweights, adapter, pairs, scale, ids, key, idx)
        ana = float(grads64[key].view(-1)[idx])
        fd.append({"tensor": key, "index": idx, "autograd": ana, "finite_difference": num, "rel_err": abs(num - ana) / abs(ana)})
        assert fd[-1]["rel_err"] < 1e-5, fd[-1]

    gl.write_safetensors_f32(os.path.join(d, "grads.safetensors"), {k: g.numpy() for k, g in grads.items()})
    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))

    bf16_grads = gl.read_safetensors_f32(os.path.join(adapter_dir, "grads.safetensors"))
    grad_drift = {k: float(np.abs(grads[k].numpy().astype(np.float64) - bf16_grads[k]).max()) / float(np.abs(bf16_grads[k]).max())
                  for k in sorted(grads)}
    bf16_logits = read_logits(os.path.join(adapter_dir, "logits.f32"), (T, V))
    files = ["grads.safetensors", "logits.f32"]
    result = {
        "variant": name,
        "impl": "peft" if impl == "hf" else "torch",
        "reference": gl.REFERENCE["peft" if impl == "hf" else "torch"],
        "torch_version": torch.__version__,
        **(gl.library_versions() if impl == "hf" else {"peft_version": None, "transformers_version": None}),
        "numpy_version": np.__version__,
        "base_weights": "q4: every *_proj.weight and the (tied) embedding dequantized to q*s (scripts/golden_q4.py); norms bf16",
        "model_dir": relpath(model_dir),
        "model_sha256": checkpoint_sha256(model_dir),
        "adapter_dir": relpath(adapter_dir),
        "adapter_dir_note": f"golden_lora.py variant '{lora_name}': the adapter and tokens are that folder's",
        "adapter_sha256": gq.sha256(os.path.join(adapter_dir, "adapter_model.safetensors")),
        "tokens": ids,
        "loss": float(loss),
        "loss_definition": "mean over t=0..T-2 of cross_entropy(logits[t], tokens[t+1])",
        "r": v["r"],
        "lora_alpha": v["alpha"],
        "use_rslora": v["use_rslora"],
        "scale": scale,
        "target_modules": [t for t in gl.TARGETS if t in v["targets"]],
        "lora_forward": "y = x W^T + scale * (x A^T) B^T on each targeted projection; W = q4 dequantized (q*s, f32)",
        "logits_file": "logits.f32",
        "logits_shape": [T, V],
        "logits_layout": "float32 little-endian, row-major [T, V], adapter applied",
        "max_abs_logit": maxabs,
        "grads_file": "grads.safetensors",
        "grad_max_abs": grad_max,
        "tolerance": {
            "rel": gl.ENGINE_REL_TOL,
            "note": "engine passes if, for every LoRA tensor, max|g - ref| <= rel * max|ref| of that tensor; "
                    "logits: max|logit - ref| <= rel * max_abs_logit; loss: |loss - ref| <= rel * loss",
        },
        "drift_vs_bf16": {
            "reference": relpath(adapter_dir),
            "loss_bf16": bf16_ref["loss"],
            "loss_abs_diff": abs(float(loss) - bf16_ref["loss"]),
            "logits": drift(bf16_logits, logits.numpy()),
            "grads_max_rel": grad_drift,
            "note": "grads_max_rel per tensor = max|g_q4 - g_bf16| / max|g_bf16|",
        },
        "reference_checks": {
            "grads_f32_vs_f64_max_rel_err": max(rel64.values()),
            "grads_f32_vs_f64_rel_err": rel64,
            "loss_f32_vs_f64_abs_err": abs(float(loss) - float(loss64)),
            "logits_f32_vs_f64_max_abs_err": float((logits.double() - logits64).abs().max()),
            "finite_difference_f64": fd,
            "plain_torch_vs_peft": cross_check,
        },
        "sha256": {f: gq.sha256(os.path.join(d, f)) for f in files},
    }
    gq.dump_json(os.path.join(d, "loss.json"), result)
    print(f"{name:15s} loss={float(loss):.6f} (bf16 {bf16_ref['loss']:.6f}) max|logit|={maxabs:.4f} "
          f"f64 grads rel {max(rel64.values()):.1e}; fd rel {max(x['rel_err'] for x in fd):.1e}; "
          f"grad drift vs bf16 max {max(grad_drift.values()):.3e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "test/fixtures/golden-q4"))
    ap.add_argument("--golden", default=os.path.join(ROOT, "test/fixtures/golden"), help="golden_qwen3.py checkpoints (read only)")
    ap.add_argument("--golden-lora", default=os.path.join(ROOT, "test/fixtures/golden-lora"), help="golden_lora.py adapters (read only)")
    ap.add_argument("--impl", choices=["hf", "torch", "auto"], default="auto")
    ap.add_argument("--only", nargs="*", help="folder names (default: all): " + " ".join(VARIANTS + tuple(LORA)))
    args = ap.parse_args()

    torch.set_num_threads(1)  # deterministic reduction order on CPU
    have_hf = gq.hf_available()
    if args.impl == "hf" and not have_hf:
        sys.exit("--impl hf requested but transformers (with Qwen3ForCausalLM) is not importable")
    impl = "hf" if (args.impl == "hf" or (args.impl == "auto" and have_hf)) else "torch"
    print(f"torch {torch.__version__}, numpy {np.__version__}; transformers importable: {have_hf}; using impl={impl}")
    exact = self_check_exact()
    print(f"exact self-check: {exact}")
    os.makedirs(args.out, exist_ok=True)
    for name in VARIANTS:
        if not args.only or name in args.only:
            build_variant(name, os.path.abspath(args.golden), args.out, impl, exact)
    for name, lora_name in LORA.items():
        if not args.only or name in args.only:
            build_lora(name, lora_name, os.path.abspath(args.golden), os.path.abspath(args.golden_lora), args.out, impl)


if __name__ == "__main__":
    main()
