#!/usr/bin/env python3
"""A tiny Qwen3 target (Hugging Face directory) and block drafters for it in every published layout.

numpy only (CI's .venv runs it); every file is bit-reproducible (numpy's frozen legacy MT19937
stream through make_tiny_models._Rng, plain IEEE arithmetic, float32 safetensors written as the
reference writer does by make_tiny_hf.write_safetensors). The sha256 of every file is
recorded in tests/fixtures/drafters/manifest.json and checked by tests/py/test_tiny_drafters.py.

Written (under --out, default build/tiny-drafters):

    target/                   Qwen3ForCausalLM: config.json, generation_config.json,
                              model.safetensors, tokenizer.json, tokenizer_config.json
    zlab-dflash-b16/          z-lab DFlash (DFlashDraftModel, dflash_config, block 16;
                              slots 1..15 draft; no embed/lm_head of its own)
    deepspec-dspark-b7/       DeepSpec DSpark (Qwen3DSparkModel, top-level keys, block 7,
                              slots 0..6 draft, Markov head (vanilla, rank 80), confidence head
                              with Markov features, embed_tokens/lm_head copies, rope_parameters)
    deepspec-dflash-b7/       DeepSpec DFlash (Qwen3DSparkModel with markov_rank 0 and no
                              confidence head, block 7, slots 0..6)
    deepspec-dspark-gated-b7/ deepspec-dspark-b7's backbone and heads with DeepSpec's gated Markov
                              head (markov_head.gate_proj [80, 144] + bias), tapping the target's
                              embedding output (target_layer_ids [-1, 1, 2]: -1 is hidden state 0)
    deepspec-dspark-rnn-b7/   the same with the rnn Markov head (markov_head.joint_proj [240, 224]
                              + bias; its output third maps W1[prev] through, so the bias stays a
                              bigram-like signal) and the taps [0, 1, 2]
    modelopt-dspark-b7/       the same weights as deepspec-dspark-b7 in NVIDIA ModelOpt's
                              "z-lab-compatible" DSpark export (DFlashDraftModel + dflash_config
                              {projector_type: dspark, shift_label: true, ...}; tensors
                              markov_w1/markov_w2/confidence_proj without the markov_head. /
                              confidence_head. prefixes; no embed/lm_head copies)

Shapes are chosen pairwise distinct where a C loader could mix them up: hidden 64, head_dim 32
(4 query / 2 KV heads, so q is 128 wide), target FFN 128, drafter FFN 96, Markov rank 80, vocab 512,
target 4 layers, drafters 2 layers, 2 (z-lab) or 3 (DeepSpec) tap layers.

How the random weights are made to draft well (so that acceptance is far from zero and every
field of a round is exercised):

* The target is close to a bigram model: its residual branches are scaled down (out_gain 0.15), so
  the final hidden state of a token is mostly its own embedding and the greedy next token is
  usually g(x) = argmax_y lm_head[y] . (w_final * rmsnorm(embed[x])). It is not exactly bigram:
  attention over the context still moves the logits, so drafts are rejected too.
* Embedding column 62 is +2 for every token except the mask token (a "real token" flag), column
  63 is +6 for the mask token only (a "mask" flag).
* In drafter layer 0, query heads 0 and 2 read only the two flags and every key reads the real-token
  flag, both in the last (slowest, ~2e-6 rad/position) RoPE pair. With q_norm/k_norm gains of 2.5
  each the score on the anchor slot is ~35 and ~0 on everything else (context rows have a zero flag:
  hidden_norm's weight is 0 there), so every block slot (the anchor's own too) copies the anchor. v_proj is the identity
  and o_proj writes heads 0/2 back with gain 8, so a mask slot's residual becomes ~rmsnorm(anchor
  embedding), and the drafter's final norm uses the target's final-norm weights: each slot then
  predicts g(anchor). Query heads 1/3, the rest of the keys, layer 1 and the MLPs are ordinary
  random weights at low gain: they perturb the logits (so context K/V injection, RoPE, the MLP
  and layer 1 all matter for the result) without erasing the signal.
  -> z-lab DFlash: slot 1 predicts position start+1 = g(anchor): usually accepted, later slots
     rarely. DeepSpec DFlash: slot 0 is the anchor itself and predicts g(anchor) too.
* The DSpark Markov head encodes g: W1[x] = P^T (w_final * rmsnorm(embed[x])) with P a random
  64x80 matrix with orthonormal rows, W2 = 4 * lm_head @ P, so W2 W1[x] = 4 * the target's bigram
  logits of x (rank 80 > hidden 64, so that a loader that mixes up r and H fails). With the Markov bias the drafts follow the chain
  x_k = g(x_{k-1}), which is what the near-bigram target does: long accepted runs.
* The confidence head is random (logit std ~1.5, bias +1.2), so sigmoid(c_k) falls below a
  threshold of 0.5 at some slots and confidence truncation happens in a fair share of rounds.

Usage:
    python tools/make_tiny_drafters.py [--out build/tiny-drafters]
Prints one line per file: sha256  path.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_tiny_hf as mth  # noqa: E402
import make_tiny_models as mtm  # noqa: E402

VOCAB = 512
MASK_ID = 511
MASK_TOKEN = "<|mask|>"
H, N_LAYERS, N_HEADS, N_KV, HD, FFN = 64, 4, 4, 2, 32, 128
D_LAYERS, D_FFN, RANK = 2, 96, 80
ROPE_THETA, EPS = 1000000.0, 1e-6
FLAG_REAL, FLAG_MASK = 62, 63      # embedding columns (see module docstring)
SLOW = HD // 2 - 1                 # rotate-half pair (SLOW, SLOW + HD/2) has the lowest frequency
TARGET_SEED, DRAFT_SEED = 4242, 5353
MARKOV_GAIN = 4.0
K = math.sqrt(3.0)                 # uniform(-K s, K s) has std s

DRAFTERS = ("zlab-dflash-b16", "deepspec-dspark-b7", "deepspec-dflash-b7", "modelopt-dspark-b7",
            "deepspec-dspark-gated-b7", "deepspec-dspark-rnn-b7")


# --------------------------------------------------------------------------------------------
# target

def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


TARGET_SPEC = dict(arch="qwen3", seed=TARGET_SEED, vocab=VOCAB, dim=H, n_layers=N_LAYERS, n_heads=N_HEADS,
                   n_kv_heads=N_KV, head_dim=HD, ffn=FFN, tied=False,
                   out_gain=0.15)  # residual-branch gain: the model stays close to a bigram model


def target_weights() -> dict[str, np.ndarray]:
    """HF Qwen3ForCausalLM state dict (float32): make_tiny_models' random weights for TARGET_SPEC,
    plus the two flag columns of the embedding and a zero lm_head row for the mask token."""
    w = mtm._raw_hf_weights(TARGET_SPEC)
    emb = w["model.embed_tokens.weight"]
    emb[:, FLAG_REAL] = 2.0
    emb[:, FLAG_MASK] = 0.0
    emb[MASK_ID, FLAG_REAL] = 0.0
    emb[MASK_ID, FLAG_MASK] = 6.0
    w["lm_head.weight"][MASK_ID] = 0.0  # the mask token is never a likely next token
    return {k: _f32(v) for k, v in w.items()}


def target_config() -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": H,
        "intermediate_size": FFN,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_KV,
        "head_dim": HD,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": mtm.BOS_ID,
        "eos_token_id": mtm.EOS_ID,
        "pad_token_id": mtm.PAD_ID,
        "torch_dtype": "float32",
    }


def tokenizer_files() -> dict[str, dict]:
    """tokenizer.json (make_tiny_hf's byte-level BPE with Qwen2's pre-tokenizer, vocabulary
    make_tiny_models.build_vocab(511)) plus the mask token as id 511, and tokenizer_config.json."""
    tok = mth.tokenizer_json({"vocab": VOCAB - 1, "pre": "qwen2"})
    tok["model"]["vocab"][MASK_TOKEN] = MASK_ID
    tok["added_tokens"].append({"id": MASK_ID, "content": MASK_TOKEN, "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": mtm.CHAT_TEMPLATE,
        "errors": "replace",
    }
    return {"tokenizer.json": tok, "tokenizer_config.json": cfg}


# --------------------------------------------------------------------------------------------
# drafters

def _rmsnorm_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + EPS) * w.astype(np.float64)


def _orthonormal(r: mtm._Rng, n: int, m: int) -> np.ndarray:
    """n x m with orthonormal columns: modified Gram-Schmidt in float64 (no LAPACK, so the bits do
    not depend on the BLAS build)."""
    a = r.uniform((n, m), 1.0).astype(np.float64)
    for j in range(m):
        v = a[:, j].copy()
        for i in range(j):
            v -= (a[:, i] @ v) * a[:, i]
        a[:, j] = v / math.sqrt(float(v @ v))
    return a


def backbone_weights(tw: dict[str, np.ndarray], n_taps: int, seed: int) -> dict[str, np.ndarray]:
    """Drafter backbone (DFlash/DSpark shared names, no prefix), float32."""
    r = mtm._Rng(seed)
    lo = 0.25  # gain of the ordinary random branches
    w: dict[str, np.ndarray] = {}
    w["fc.weight"] = r.uniform((H, n_taps * H), K / math.sqrt(n_taps * H))
    hn = r.uniform((H,), 0.2, 1.0)
    hn[FLAG_REAL] = 0.0  # context rows carry no real-token flag: designed heads ignore them
    w["hidden_norm.weight"] = hn
    for i in range(D_LAYERS):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(H) if i == 0 else r.uniform((H,), 0.2, 1.0)
        q = r.uniform((N_HEADS * HD, H), K / math.sqrt(H))
        k = r.uniform((N_KV * HD, H), K / math.sqrt(H))
        v = r.uniform((N_KV * HD, H), K / math.sqrt(H))
        qn = r.uniform((HD,), 0.3, 1.0)
        kn = r.uniform((HD,), 0.3, 1.0)
        o = r.uniform((H, N_HEADS * HD), lo * K / math.sqrt(N_HEADS * HD))
        if i == 0:
            for head in (0, 2):  # anchor-copy heads, one per KV group
                q[head * HD:(head + 1) * HD, :] = 0.0
                q[head * HD + SLOW, FLAG_MASK] = 1.0  # every block row (anchor or mask) ...
                q[head * HD + SLOW, FLAG_REAL] = 1.0  # ... looks for the anchor
            for kv in range(N_KV):
                k[kv * HD:(kv + 1) * HD, :] *= 0.02
                k[kv * HD + SLOW, :] = 0.0
                k[kv * HD + SLOW, FLAG_REAL] = 1.0
            v[:, :] = np.eye(N_KV * HD, H)  # value = the normed input, dims 0..63 over the 2 KV heads
            qn[SLOW] = 2.5
            kn[SLOW] = 2.5
            for head, kv in ((0, 0), (2, 1)):
                o[:, head * HD:(head + 1) * HD] = 0.0
                o[kv * HD:(kv + 1) * HD, head * HD:(head + 1) * HD] = 8.0 * np.eye(HD)
        w[p + "self_attn.q_proj.weight"] = q
        w[p + "self_attn.k_proj.weight"] = k
        w[p + "self_attn.v_proj.weight"] = v
        w[p + "self_attn.q_norm.weight"] = qn
        w[p + "self_attn.k_norm.weight"] = kn
        w[p + "self_attn.o_proj.weight"] = o
        w[p + "post_attention_layernorm.weight"] = r.uniform((H,), 0.2, 1.0)
        w[p + "mlp.gate_proj.weight"] = r.uniform((D_FFN, H), K / math.sqrt(H))
        w[p + "mlp.up_proj.weight"] = r.uniform((D_FFN, H), K / math.sqrt(H))
        w[p + "mlp.down_proj.weight"] = r.uniform((H, D_FFN), lo * K / math.sqrt(D_FFN))
    w["norm.weight"] = tw["model.norm.weight"].copy()
    return {k2: _f32(v2) for k2, v2 in w.items()}


def dspark_heads(tw: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Markov head (vanilla) and confidence head, DeepSpec names."""
    r = mtm._Rng(seed)
    p = _orthonormal(r, RANK, H).T  # [H, r] with orthonormal rows: p @ p.T = I, so W2 W1^T is exact
    feat = _rmsnorm_rows(tw["model.embed_tokens.weight"], tw["model.norm.weight"])  # [V, H]
    w1 = feat @ p                                                                     # [V, r]
    w2 = MARKOV_GAIN * tw["lm_head.weight"].astype(np.float64) @ p                           # [V, r]
    conf_w = r.uniform((1, H + RANK), 1.5 * K / math.sqrt(H + RANK))
    conf_b = np.array([1.2])
    return {
        "markov_head.markov_w1.weight": _f32(w1),
        "markov_head.markov_w2.weight": _f32(w2),
        "confidence_head.proj.weight": _f32(conf_w),
        "confidence_head.proj.bias": _f32(conf_b),
    }


def markov_projection(kind: str, seed: int) -> dict[str, np.ndarray]:
    """The gated (gate_proj) or rnn (joint_proj) Markov head's projection, DeepSpec names. Gated:
    sigmoid of a random map of [h ; e] around +1, so gates vary between ~0.5 and ~0.95. Rnn: random
    gate / candidate rows; the output rows copy e (W1[prev]) with a random part from [s ; h]."""
    r = mtm._Rng(seed)
    if kind == "gated":
        w = r.uniform((RANK, H + RANK), 1.5 * K / math.sqrt(H + RANK))
        b = r.uniform((RANK,), 0.5, 1.5)
        return {"markov_head.gate_proj.weight": _f32(w), "markov_head.gate_proj.bias": _f32(b)}
    w = r.uniform((3 * RANK, 2 * RANK + H), 0.5 * K / math.sqrt(2 * RANK + H)).astype(np.float64)
    w[2 * RANK:, RANK:2 * RANK] += np.eye(RANK)
    b = r.uniform((3 * RANK,), 0.2)
    return {"markov_head.joint_proj.weight": _f32(w), "markov_head.joint_proj.bias": _f32(b)}


def _deepspec_config(block: int, taps: list[int], dspark: bool) -> dict:
    c = copy.deepcopy(target_config())
    del c["rope_theta"], c["rope_scaling"]
    c["rope_parameters"] = {"rope_theta": ROPE_THETA, "rope_type": "default"}
    c.update({
        "architectures": ["Qwen3DSparkModel"],
        "num_target_layers": N_LAYERS,
        "num_hidden_layers": D_LAYERS,
        "intermediate_size": D_FFN,
        "block_size": block,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * D_LAYERS,
        "mask_token_id": MASK_ID,
        "target_layer_ids": taps,
        "num_anchors": 512,
        "enable_confidence_head": dspark,
        "markov_rank": RANK if dspark else 0,
    })
    if dspark:
        c["confidence_head_with_markov"] = True
        c["markov_head_type"] = "vanilla"
    return c


def _zlab_config(block: int, taps: list[int], extra: dict | None = None) -> dict:
    c = copy.deepcopy(target_config())
    c.update({
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "num_target_layers": N_LAYERS,
        "num_hidden_layers": D_LAYERS,
        "intermediate_size": D_FFN,
        "block_size": block,
        "layer_types": ["full_attention"] * D_LAYERS,
        "dflash_config": dict({"target_layer_ids": taps, "mask_token_id": MASK_ID}, **(extra or {})),
    })
    return c


DEEPSPEC_TAPS = [0, 1, 2]
ZLAB_TAPS = [1, 2]


def drafter(name: str, tw: dict[str, np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """(config, tensors) of one drafter."""
    copies = {"embed_tokens.weight": tw["model.embed_tokens.weight"].copy(),
              "lm_head.weight": tw["lm_head.weight"].copy()}
    if name == "zlab-dflash-b16":
        return _zlab_config(16, ZLAB_TAPS), backbone_weights(tw, len(ZLAB_TAPS), DRAFT_SEED)
    if name == "deepspec-dflash-b7":
        w = backbone_weights(tw, len(DEEPSPEC_TAPS), DRAFT_SEED + 1)
        return _deepspec_config(7, DEEPSPEC_TAPS, False), dict(w, **copies)
    w = backbone_weights(tw, len(DEEPSPEC_TAPS), DRAFT_SEED + 2)
    heads = dspark_heads(tw, DRAFT_SEED + 3)
    if name == "deepspec-dspark-b7":
        return _deepspec_config(7, DEEPSPEC_TAPS, True), dict(w, **heads, **copies)
    if name in ("deepspec-dspark-gated-b7", "deepspec-dspark-rnn-b7"):
        kind = "gated" if "gated" in name else "rnn"
        taps = [-1, 1, 2] if kind == "gated" else DEEPSPEC_TAPS
        cfg = _deepspec_config(7, taps, True)
        cfg["markov_head_type"] = kind
        return cfg, dict(w, **heads, **markov_projection(kind, DRAFT_SEED + (4 if kind == "gated" else 5)), **copies)
    if name == "modelopt-dspark-b7":
        renamed = {k.split(".", 1)[1] if k.startswith("markov_head.") else
                   k.replace("confidence_head.proj.", "confidence_proj."): v for k, v in heads.items()}
        cfg = _zlab_config(7, DEEPSPEC_TAPS, {
            "projector_type": "dspark", "markov_rank": RANK, "markov_head_type": "vanilla",
            "use_confidence_head": True, "shift_label": True})
        return cfg, dict(w, **renamed)
    raise KeyError(name)


# --------------------------------------------------------------------------------------------
# writing

def make_all(out_dir: str) -> dict[str, str]:
    """Write the target and every drafter; returns {relative path: sha256}."""
    tw = target_weights()
    dirs: dict[str, tuple[dict, dict[str, np.ndarray], dict]] = {}
    gen_cfg = {"bos_token_id": mtm.BOS_ID, "eos_token_id": mtm.EOS_ID, "pad_token_id": mtm.PAD_ID,
               "do_sample": False}
    dirs["target"] = (target_config(), tw, dict(tokenizer_files(), **{"generation_config.json": gen_cfg}))
    for name in DRAFTERS:
        cfg, w = drafter(name, tw)
        dirs[name] = (cfg, w, {})
    out: dict[str, str] = {}
    for name, (cfg, w, extra) in dirs.items():
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        mth.write_json(os.path.join(d, "config.json"), cfg)
        mth.write_safetensors(os.path.join(d, "model.safetensors"),
                              [(k, v.shape, v.tobytes()) for k, v in w.items()], "f32")
        for fname, obj in extra.items():
            mth.write_json(os.path.join(d, fname), obj)
        for fname in sorted(os.listdir(d)):
            out[f"{name}/{fname}"] = mtm.sha256_file(os.path.join(d, fname))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/tiny-drafters", help="output directory")
    a = ap.parse_args(argv)
    for rel, sha in make_all(a.out).items():
        print(f"{sha}  {os.path.join(a.out, rel)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
