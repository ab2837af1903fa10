#!/usr/bin/env python3
"""Random-weight GGUF models of real shapes, for speed work (bench/README.md).

    python tools/make_random_model.py --shape qwen3-0.6b --type q8_0 --out build/models/qwen3-0.6b-q8_0.gguf
    python tools/make_random_model.py --shape smollm2-135m --type q4_0 --out ...

Shapes are the published configurations (layer count, widths, heads, vocabulary); the weights
are uniform random with the tiny models' scales (tools/make_tiny_models.py: numpy's frozen
MT19937 stream, so a file is reproducible byte for byte from --shape/--type/--seed). The numbers
such a model computes are meaningless; its speed is that of the real model of the same shape
and types, which is all a benchmark needs.

Types (what llama.cpp's quantize would typically write):
    q8_0       every 2-D weight Q8_0 (the tied embedding/output too)
    q4_0       2-D weights Q4_0, token embedding / output Q8_0
    q4_1       2-D weights Q4_1, token embedding / output Q8_0 (like the default SmolLM2 file)
    q4_0-pure  every 2-D weight Q4_0
Norms are F32. The tokenizer is a byte-level BPE on a small corpus padded with unused tokens up
to the shape's vocabulary size, enough for `dspark benchmark` to tokenize its prompt.

Needs numpy and gguf only (the project .venv). Model files are never committed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as mtm  # noqa: E402

SHAPES: dict[str, dict] = {
    # Qwen/Qwen3-0.6B config.json: tied embeddings, q/k norm, GQA 16/8, head_dim 128
    "qwen3-0.6b": dict(arch="qwen3", vocab=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                       ffn=3072, rope_base=1000000.0, ctx=40960, eps=1e-6, tied=True, pre="qwen2"),
    # HuggingFaceTB/SmolLM2-135M-Instruct: the default model's shape
    "smollm2-135m": dict(arch="llama", vocab=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                         ffn=1536, rope_base=100000.0, ctx=8192, eps=1e-5, tied=True, pre="smollm"),
}

TYPES = {
    # (2-D weights, token embedding/output)
    "q8_0": (QT.Q8_0, QT.Q8_0),
    "q4_0": (QT.Q4_0, QT.Q8_0),
    "q4_1": (QT.Q4_1, QT.Q8_0),
    "q4_0-pure": (QT.Q4_0, QT.Q4_0),
}
FILE_TYPE = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
             "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "q4_0-pure": gguf.LlamaFileType.MOSTLY_Q4_0}


def tensors(spec: dict, seed: int):
    """(gguf name, float32 array) in file order, generated one at a time (a 0.6B model's
    float64 draws do not all fit in memory comfortably)."""
    r = mtm._Rng(seed)
    d, hd, nh, nkv, f, v = spec["dim"], spec["head_dim"], spec["n_heads"], spec["n_kv_heads"], spec["ffn"], spec["vocab"]
    k = math.sqrt(3.0)
    yield "token_embd.weight", r.uniform((v, d), k)
    for i in range(spec["n_layers"]):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", r.uniform((d,), 0.2, 1.0)
        yield p + "attn_q.weight", r.uniform((nh * hd, d), k / math.sqrt(d))
        yield p + "attn_k.weight", r.uniform((nkv * hd, d), k / math.sqrt(d))
        yield p + "attn_v.weight", r.uniform((nkv * hd, d), k / math.sqrt(d))
        if spec["arch"] == "qwen3":
            yield p + "attn_q_norm.weight", r.uniform((hd,), 0.3, 1.0)
            yield p + "attn_k_norm.weight", r.uniform((hd,), 0.3, 1.0)
        yield p + "attn_output.weight", r.uniform((d, nh * hd), k / math.sqrt(nh * hd))
        yield p + "ffn_norm.weight", r.uniform((d,), 0.2, 1.0)
        yield p + "ffn_gate.weight", r.uniform((f, d), k / math.sqrt(d))
        yield p + "ffn_up.weight", r.uniform((f, d), k / math.sqrt(d))
        yield p + "ffn_down.weight", r.uniform((d, f), k / math.sqrt(f))
    yield "output_norm.weight", r.uniform((d,), 0.2, 1.0)
    if not spec["tied"]:
        yield "output.weight", r.uniform((v, d), 2.0 * k / math.sqrt(d))


def vocab(size: int):
    tokens, types, merges = mtm.build_vocab(512)
    while len(tokens) < size:
        tokens.append(f"<|unused_{len(tokens)}|>")
        types.append(int(gguf.TokenType.UNUSED))
    return tokens, types, merges


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--type", required=True, choices=sorted(TYPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4242)
    a = ap.parse_args()
    spec = SHAPES[a.shape]
    wt, et = TYPES[a.type]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    w = gguf.GGUFWriter(a.out, spec["arch"])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"random {a.shape} {a.type}")
    w.add_description("dspark random-weight benchmark model (tools/make_random_model.py); not a trained model")
    mtm.write_hparams(w, spec)
    w.add_file_type(int(FILE_TYPE[a.type]))
    toks, types, merges = vocab(spec["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(spec["pre"])
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(mtm.BOS_ID)
    w.add_eos_token_id(mtm.EOS_ID)
    w.add_pad_token_id(mtm.PAD_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(mtm.CHAT_TEMPLATE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_params = 0
    for name, arr in tensors(spec, a.seed):
        n_params += arr.size
        if arr.ndim == 1:
            w.add_tensor(name, np.ascontiguousarray(arr))
            continue
        qt = et if name in ("token_embd.weight", "output.weight") else wt
        q = gguf.quants.quantize(np.ascontiguousarray(arr), qt)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
        print(f"  {name:28s} {qt.name:5s} {tuple(arr.shape)}", file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {a.shape} {a.type}, {n_params / 1e6:.0f}M parameters, {os.path.getsize(a.out) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
