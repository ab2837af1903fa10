#!/usr/bin/env python3
"""A random-weight Qwen3 target and a DSpark block drafter for it, in real shapes, for speed work.

    python tools/make_random_drafter.py --shape qwen3-4b --out build/models/qwen3-4b-dspark
    -> build/models/qwen3-4b-dspark/target/   Qwen3ForCausalLM Hugging Face directory (bf16)
       build/models/qwen3-4b-dspark/dspark/   DeepSpec DSpark drafter: Qwen3DSparkModel, block 7,
                                              5 layers, taps [1, 9, 17, 25, 33], Markov rank 256,
                                              confidence head (bf16); no embed/lm_head copies, so
                                              the target's are used, as dspark does with real ones

Shapes: `qwen3-4b` is Qwen/Qwen3-4B's config (hidden 2560, 36 layers, 32/8 heads of 128, FFN
9728, vocabulary 151936, tied embeddings) with deepseek-ai/dspark_qwen3_4b_block7's drafter config
(DRAFTERS.md §2.4); `qwen3-4b-half` halves the hidden size, FFN, heads, vocabulary and Markov
rank, so every matrix is 4x smaller and the drafter/target cost ratio is unchanged (the work of a
forward is sum of matrix sizes: layers ~ H^2, LM head and Markov head ~ V H, V r); `tiny` is for
trying the tool. Weights are uniform random (numpy's default generator, --seed): the numbers are
meaningless, the speed is that of the real shapes. Files are written tensor by tensor (a 4B bf16
target is 8 GB; never committed). The tokenizer is make_tiny_hf's byte-level BPE padded with
unused tokens to the vocabulary size.

Needs numpy only (the project .venv).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_tiny_hf as mth  # noqa: E402

SHAPES = {
    "qwen3-4b": dict(H=2560, L=36, heads=32, kv=8, hd=128, ffn=9728, V=151936, r=256, mask=151669),
    "qwen3-4b-half": dict(H=1280, L=36, heads=16, kv=4, hd=128, ffn=4864, V=75968, r=128, mask=75967),
    "tiny": dict(H=64, L=6, heads=4, kv=2, hd=32, ffn=128, V=1024, r=32, mask=1023),
    # the default model's trained drafter (bench/results/drafter-smollm2-135m-dspark.json): use with
    # --drafter-only and the GGUF target (models/SmolLM2-135M-Instruct.Q4_1.gguf)
    "smollm2-135m": dict(H=576, L=30, heads=9, kv=3, hd=64, ffn=1536, V=49152, r=64, mask=16, layers=3, taps=[1, 10, 18, 27],
                         rope_theta=100000.0),
}
DRAFT_LAYERS, BLOCK, TAPS_4B = 5, 7, [1, 9, 17, 25, 33]


def taps(n_layers: int, s: dict | None = None) -> list[int]:
    if s and "taps" in s:
        return s["taps"]
    return TAPS_4B if n_layers == 36 else [round(1 + i * (n_layers - 4) / 4) for i in range(5)]


def stream_safetensors(path: str, specs: list[tuple[str, tuple[int, ...]]], make) -> None:
    """bf16 safetensors written one tensor at a time: make(name, shape) -> float32 array."""
    specs = sorted(specs)
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in specs:
        n = 2 * math.prod(shape)
        hdr[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in specs:
            f.write(mth.to_bf16_bits(make(name, shape)).tobytes())
            print(f"  {name} {shape}", file=sys.stderr)


def layer_specs(s: dict, prefix: str, n: int) -> list[tuple[str, tuple[int, ...]]]:
    H, q, kv = s["H"], s["heads"] * s["hd"], s["kv"] * s["hd"]
    out = []
    for i in range(n):
        p = f"{prefix}layers.{i}."
        out += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (q, H)), (p + "self_attn.k_proj.weight", (kv, H)),
                (p + "self_attn.v_proj.weight", (kv, H)), (p + "self_attn.o_proj.weight", (H, q)),
                (p + "self_attn.q_norm.weight", (s["hd"],)), (p + "self_attn.k_norm.weight", (s["hd"],)),
                (p + "mlp.gate_proj.weight", (s["ffn"], H)), (p + "mlp.up_proj.weight", (s["ffn"], H)),
                (p + "mlp.down_proj.weight", (H, s["ffn"]))]
    return out


def filler(rng: np.random.Generator):
    def make(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if len(shape) == 1:
            return rng.uniform(0.5, 1.0, shape).astype(np.float32)
        k = math.sqrt(3.0) / math.sqrt(shape[1])
        return rng.uniform(-k, k, shape).astype(np.float32)
    return make


def base_config(s: dict) -> dict:
    return {"model_type": "qwen3", "vocab_size": s["V"], "hidden_size": s["H"], "intermediate_size": s["ffn"],
            "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"], "head_dim": s["hd"], "hidden_act": "silu",
            "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "attention_bias": False, "attention_dropout": 0.0,
            "use_sliding_window": False, "sliding_window": None, "bos_token_id": 0, "eos_token_id": 2, "torch_dtype": "bfloat16"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--drafter-only", action="store_true", help="write OUT/dspark only (for an existing target, e.g. a GGUF)")
    a = ap.parse_args(argv)
    s = SHAPES[a.shape]
    rng = np.random.default_rng(a.seed)
    tdir, ddir = os.path.join(a.out, "target"), os.path.join(a.out, "dspark")
    os.makedirs(ddir, exist_ok=True)
    if not a.drafter_only:
        write_target(s, tdir, rng)
    write_drafter(s, ddir, rng)
    print(f"{a.out}: {'' if a.drafter_only else f'target {tdir}, '}drafter {ddir} ({a.shape})")
    return 0


def write_target(s: dict, tdir: str, rng) -> None:
    os.makedirs(tdir, exist_ok=True)
    cfg = dict(base_config(s), architectures=["Qwen3ForCausalLM"], num_hidden_layers=s["L"], tie_word_embeddings=True,
               rope_theta=1000000.0, rope_scaling=None)
    mth.write_json(os.path.join(tdir, "config.json"), cfg)
    specs = [("model.embed_tokens.weight", (s["V"], s["H"])), ("model.norm.weight", (s["H"],))] + layer_specs(s, "model.", s["L"])
    stream_safetensors(os.path.join(tdir, "model.safetensors"), specs, filler(rng))
    tok = mth.tokenizer_json({"vocab": 512, "pre": "qwen2"})
    vocab = tok["model"]["vocab"]
    for i in range(len(vocab), s["V"]):
        vocab[f"<|unused_{i}|>"] = i
    mth.write_json(os.path.join(tdir, "tokenizer.json"), tok)
    mth.write_json(os.path.join(tdir, "tokenizer_config.json"),
                   {"tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False, "eos_token": "<|im_end|>", "bos_token": None})


def write_drafter(s: dict, ddir: str, rng) -> None:
    """the drafter (DeepSpec layout; DRAFTERS.md §2.4-2.5)"""
    r, H, nl, tl = s["r"], s["H"], s.get("layers", DRAFT_LAYERS), taps(s["L"], s)
    dcfg = dict(base_config(s), architectures=["Qwen3DSparkModel"], num_hidden_layers=nl, num_target_layers=s["L"],
                block_size=BLOCK, tie_word_embeddings=False, layer_types=["full_attention"] * nl, mask_token_id=s["mask"],
                target_layer_ids=tl, num_anchors=512, enable_confidence_head=True, confidence_head_with_markov=True,
                markov_rank=r, markov_head_type="vanilla",
                rope_parameters={"rope_theta": s.get("rope_theta", 1000000.0), "rope_type": "default"})
    mth.write_json(os.path.join(ddir, "config.json"), dcfg)
    dspecs = [("fc.weight", (H, len(tl) * H)), ("hidden_norm.weight", (H,)), ("norm.weight", (H,)),
              ("markov_head.markov_w1.weight", (s["V"], r)), ("markov_head.markov_w2.weight", (s["V"], r)),
              ("confidence_head.proj.weight", (1, H + r)), ("confidence_head.proj.bias", (1,))] + layer_specs(s, "", nl)
    stream_safetensors(os.path.join(ddir, "model.safetensors"), dspecs, filler(rng))


if __name__ == "__main__":
    sys.exit(main())
