#!/usr/bin/env python3
"""Random-weight Hugging Face model directories of real shapes (bf16 safetensors), for the loading
and --quantize targets (README "Model sources") and the Q4_K end-to-end test.

    python tools/make_random_hf.py --shape qwen3-0.6b --out build/models/qwen3-0.6b-hf
    python tools/make_random_hf.py --shape qwen3-256 --out /tmp/q256       # small, rows of 256

Shapes are tools/make_random_model.py's (the published configurations) plus "qwen3-256", a
two-layer Qwen3 whose every matrix has rows of whole Q4_K super-blocks. Each tensor is uniform
random with the random GGUF models' scales, from a generator seeded by --seed and the tensor's
name, so a directory is reproducible byte for byte. The safetensors file is written as the
reference writer lays it out (tensors sorted by name) and streamed one tensor at a time; the
side files are make_tiny_hf's (config.json, generation_config.json, a 512-token byte-level
tokenizer.json, tokenizer_config.json). Model files are never committed. Needs numpy only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_random_model as mrm  # noqa: E402
import make_tiny_hf as mth  # noqa: E402
import make_tiny_models as mtm  # noqa: E402

SHAPES = dict(mrm.SHAPES)
SHAPES["qwen3-256"] = dict(arch="qwen3", vocab=512, dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512,
                           rope_base=1000000.0, ctx=4096, eps=1e-6, tied=True, pre="qwen2")


def shapes(spec: dict) -> dict[str, tuple[tuple[int, ...], float, float]]:
    """HF name -> (PyTorch shape, low, high) of its uniform distribution."""
    d, hd, nh, nkv, f, v = spec["dim"], spec["head_dim"], spec["n_heads"], spec["n_kv_heads"], spec["ffn"], spec["vocab"]
    k = math.sqrt(3.0)
    t = {"model.embed_tokens.weight": ((v, d), -k, k), "model.norm.weight": ((d,), 0.2, 1.0)}
    for i in range(spec["n_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ((d,), 0.2, 1.0)
        t[p + "post_attention_layernorm.weight"] = ((d,), 0.2, 1.0)
        for n, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            t[p + f"self_attn.{n}.weight"] = ((rows, d), -k / math.sqrt(d), k / math.sqrt(d))
        t[p + "self_attn.o_proj.weight"] = ((d, nh * hd), -k / math.sqrt(nh * hd), k / math.sqrt(nh * hd))
        if spec["arch"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = ((hd,), 0.3, 1.0)
            t[p + "self_attn.k_norm.weight"] = ((hd,), 0.3, 1.0)
        t[p + "mlp.gate_proj.weight"] = ((f, d), -k / math.sqrt(d), k / math.sqrt(d))
        t[p + "mlp.up_proj.weight"] = ((f, d), -k / math.sqrt(d), k / math.sqrt(d))
        t[p + "mlp.down_proj.weight"] = ((d, f), -k / math.sqrt(f), k / math.sqrt(f))
    if not spec["tied"]:
        t["lm_head.weight"] = ((v, d), -2 * k / math.sqrt(d), 2 * k / math.sqrt(d))
    return t


def make(shape: str, out: str, seed: int = 4242) -> str:
    spec = dict(SHAPES[shape], rope_scaling=None)
    os.makedirs(out, exist_ok=True)
    t = shapes(spec)
    names = sorted(t)
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for n in names:
        nbytes = 2 * math.prod(t[n][0])
        hdr[n] = {"dtype": "BF16", "shape": list(t[n][0]), "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path = os.path.join(out, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for n in names:
            shp, lo, hi = t[n]
            rng = np.random.default_rng([seed, zlib.crc32(n.encode())])
            rows = shp[0]
            step = max(1, (1 << 24) // max(1, math.prod(shp[1:])))  # ~16M values at a time
            for r in range(0, rows, step):
                part = rng.random((min(step, rows - r),) + shp[1:], dtype=np.float32) * np.float32(hi - lo) + np.float32(lo)
                f.write(mth.to_bf16_bits(part).tobytes())
    os.replace(path + ".tmp", path)
    cfg = mth.config_json(dict(spec, rope_scaling=None), "bf16")
    mth.write_json(os.path.join(out, "config.json"), cfg)
    tok_spec = dict(spec, vocab=512)
    mth.write_json(os.path.join(out, "generation_config.json"), {"bos_token_id": mtm.BOS_ID, "eos_token_id": mtm.EOS_ID})
    mth.write_json(os.path.join(out, "tokenizer.json"), mth.tokenizer_json(tok_spec))
    mth.write_json(os.path.join(out, "tokenizer_config.json"),
                   {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
                    "chat_template": mtm.CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"})
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4242)
    a = ap.parse_args()
    p = make(a.shape, a.out, a.seed)
    print(f"{a.out}: {a.shape}, {os.path.getsize(p) / 1e6:.0f} MB of bf16 weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
