#!/usr/bin/env python3
"""Random-weight GGUF models of real shapes, for speed work (bench/README.md).

    python tools/make_random_model.py --shape qwen3-0.6b --type q8_0 --out build/models/qwen3-0.6b-q8_0.gguf
    python tools/make_random_model.py --shape smollm2-135m --type q4_0 --out ...
    python tools/make_random_model.py --shape qwen3-4b --type q4_k_m --fast --out /dev/shm/qwen3-4b-q4_k_m.gguf

Shapes are the published configurations (layer count, widths, heads, vocabulary); the weights
are uniform random with the tiny models' scales (tools/make_tiny_models.py: numpy's frozen
MT19937 stream, so a file is reproducible byte for byte from --shape/--type/--seed). The numbers
such a model computes are meaningless; its speed is that of the real model of the same shape
and types, which is all a benchmark needs.

Types (what llama.cpp's quantize would typically write):
    bf16       every 2-D weight BF16
    q8_0       every 2-D weight Q8_0 (the tied embedding/output too)
    q4_0       2-D weights Q4_0, token embedding / output Q8_0
    q4_1       2-D weights Q4_1, token embedding / output Q8_0 (like the default SmolLM2 file)
    q4_0-pure  every 2-D weight Q4_0
    q4_k_m     llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output matrix and for attn_v and
               ffn_down of the first and last eighth of the layers and every third one between
               (gguf only dequantizes K-quants: without --fast, Q4_K/Q6_K blocks are made here by plain
               min/max rounding: valid blocks of the real layout, not llama.cpp's search)
Norms are F32.

--fast builds each tensor by tiling a pool of random blocks (valid scales, the same magnitudes)
instead of drawing and quantizing every value: seconds instead of minutes for a 4B model, which
is what generating one on a lent GPU machine needs. The values repeat, the speed does not change. The tokenizer is a byte-level BPE on a small corpus padded with unused tokens up
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
    # Qwen/Qwen3-4B's layer shapes with an untied output matrix (4.41 B parameters), the shape of
    # the llama.cpp figures the CUDA issue records
    "qwen3-4b": dict(arch="qwen3", vocab=151936, dim=2560, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
                     ffn=9728, rope_base=1000000.0, ctx=40960, eps=1e-6, tied=False, pre="qwen2"),
}

TYPES = {
    # (2-D weights, token embedding/output)
    "bf16": (QT.BF16, QT.BF16),
    "q8_0": (QT.Q8_0, QT.Q8_0),
    "q4_0": (QT.Q4_0, QT.Q8_0),
    "q4_1": (QT.Q4_1, QT.Q8_0),
    "q4_0-pure": (QT.Q4_0, QT.Q4_0),
    "q4_k_m": (QT.Q4_K, QT.Q4_K),  # plus Q6_K where q4_k_m_type says
}
FILE_TYPE = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
             "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1, "q4_0-pure": gguf.LlamaFileType.MOSTLY_Q4_0}


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).reshape(-1, 1).view(np.uint8)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """(rows, n) float32 -> (rows, n / 256 * 144) uint8 Q4_K blocks: per 32-weight sub-block
    w = d * sc * q - dmin * m with 6-bit sc, m and 4-bit q (layout of gguf's Q4_K.dequantize_blocks)."""
    rows = x.shape[0]
    b = x.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(b.min(axis=-1), 0.0)
    hi = b.max(axis=-1)
    scale = (hi - lo) / 15.0
    mn = -lo
    d = (scale.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    dmin = (mn.max(axis=-1) / 63.0).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.clip(np.rint(scale / d[:, None]), 0, 63), 0).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.clip(np.rint(mn / dmin[:, None]), 0, 63), 0).astype(np.uint8)
        step = d[:, None] * sc
        q = np.where(step[..., None] > 0, np.rint((b + (dmin[:, None] * m)[..., None]) / step[..., None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)  # (nb, 8, 32)
    scales = np.empty((b.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)  # sub-block 2c low nibbles, 2c+1 high
    out = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, qs], axis=1)
    return out.reshape(rows, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """(rows, n) float32 -> (rows, n / 256 * 210) uint8 Q6_K blocks: per 16 weights
    w = d * sc * (q - 32) with int8 sc and 6-bit q (layout of gguf's Q6_K.dequantize_blocks)."""
    rows = x.shape[0]
    b = x.reshape(-1, 16, 16).astype(np.float32)
    s = np.abs(b).max(axis=-1) / 31.0
    d = (s.max(axis=-1) / 127.0).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.clip(np.rint(s / d[:, None]), -128, 127), 0).astype(np.int8)
        step = d[:, None] * sc.astype(np.float32)
        q = np.where(step[..., None] != 0, np.rint(b / step[..., None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128
    ql = (q[:, :, 0:64] & 15) | ((q[:, :, 64:128] & 15) << 4)  # element e < 64: low nibble, e >= 64: high
    qh = q.reshape(-1, 2, 4, 32) >> 4
    qh = qh[:, :, 0] | (qh[:, :, 1] << 2) | (qh[:, :, 2] << 4) | (qh[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16_bytes(d)], axis=1)
    return out.reshape(rows, -1)


def quantize(arr: np.ndarray, qt) -> np.ndarray:
    """llama.cpp's blocks of type qt for a 2-D float32 array, row chunks at a time (memory)."""
    fn = {QT.Q4_K: quantize_q4_k, QT.Q6_K: quantize_q6_k}.get(qt)
    if fn is None:
        return gguf.quants.quantize(np.ascontiguousarray(arr), qt)
    return np.concatenate([fn(arr[i:i + 4096]) for i in range(0, arr.shape[0], 4096)], axis=0)


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


def q4_k_m_type(name: str, n_layers: int):
    """llama.cpp's Q4_K_M choice for one 2-D tensor (its use_more_bits rule for attn_v / ffn_down)."""
    if name == "output.weight":
        return QT.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(name.split(".")[1])
        if i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2:
            return QT.Q6_K
    return QT.Q4_K


def random_blocks(qt, n_blocks: int, amp: float, rng) -> np.ndarray:
    """n_blocks random blocks of type qt (uint8, (n_blocks, block bytes)) whose values lie within
    about +-amp: random codes, scales sized for amp."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    if qt in (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.BF16):
        x = rng.uniform(-amp, amp, size=(n_blocks, bs)).astype(np.float32)
        return gguf.quants.quantize(x, qt).reshape(n_blocks, -1)
    b = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    f16 = lambda v: np.full((n_blocks,), v, dtype=np.float16).view(np.uint8).reshape(n_blocks, 2)
    if qt in (QT.Q4_K, QT.Q5_K):  # d, dmin, then 6-bit scales/mins: y = d*sc*q - dmin*m
        qmax = 15 if qt == QT.Q4_K else 31
        b[:, 0:2] = f16(2 * amp / (63 * qmax))
        b[:, 2:4] = f16(amp / 63)
    elif qt == QT.Q6_K:  # ql, qh, int8 scales, d: y = d*sc*(q-32)
        b[:, 192:208] = rng.integers(-32, 32, size=(n_blocks, 16)).astype(np.int8).view(np.uint8)
        b[:, 208:210] = f16(amp / (32 * 32))
    else:
        raise SystemExit(f"--fast: no random blocks for {qt.name}")
    return b


def tiled(qt, shape: tuple[int, int], amp: float, rng, pools: dict) -> np.ndarray:
    """A (rows, row bytes) tensor of qt tiled from a pool of random blocks (cached per type/amp)."""
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    key = (qt, round(amp, 6))
    if key not in pools:
        pools[key] = random_blocks(qt, 1 << 16, amp, rng).reshape(-1)
    pool = pools[key]
    rows, cols = shape
    n = rows * (cols // bs) * ts
    start = int(rng.integers(0, len(pool) // ts)) * ts  # a different phase per tensor
    out = np.resize(np.roll(pool, -start), n)
    return out.reshape(rows, (cols // bs) * ts)


class Shape:
    """A 2-D tensor --fast makes: its shape and the amplitude of its values."""

    def __init__(self, shape: tuple[int, int], amp: float):
        self.shape, self.amp = shape, amp


def fast_tensors(spec: dict):
    """tensors()'s names and shapes; norms as arrays, matrices as Shape (amplitude as tensors())."""
    d, hd, nh, nkv, f, v = spec["dim"], spec["head_dim"], spec["n_heads"], spec["n_kv_heads"], spec["ffn"], spec["vocab"]
    k = math.sqrt(3.0)
    norm = lambda n: np.linspace(0.5, 1.0, n, dtype=np.float32)
    yield "token_embd.weight", Shape((v, d), k)
    for i in range(spec["n_layers"]):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", norm(d)
        yield p + "attn_q.weight", Shape((nh * hd, d), k / math.sqrt(d))
        yield p + "attn_k.weight", Shape((nkv * hd, d), k / math.sqrt(d))
        yield p + "attn_v.weight", Shape((nkv * hd, d), k / math.sqrt(d))
        if spec["arch"] == "qwen3":
            yield p + "attn_q_norm.weight", norm(hd)
            yield p + "attn_k_norm.weight", norm(hd)
        yield p + "attn_output.weight", Shape((d, nh * hd), k / math.sqrt(nh * hd))
        yield p + "ffn_norm.weight", norm(d)
        yield p + "ffn_gate.weight", Shape((f, d), k / math.sqrt(d))
        yield p + "ffn_up.weight", Shape((f, d), k / math.sqrt(d))
        yield p + "ffn_down.weight", Shape((d, f), k / math.sqrt(f))
    yield "output_norm.weight", norm(d)
    if not spec["tied"]:
        yield "output.weight", Shape((v, d), 2.0 * k / math.sqrt(d))


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
    ap.add_argument("--fast", action="store_true", help="tile random blocks instead of quantizing draws (see above)")
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
    rng, pools = np.random.default_rng(a.seed), {}
    for name, arr in (fast_tensors(spec) if a.fast else tensors(spec, a.seed)):
        n_params += int(np.prod(arr.shape))
        if len(arr.shape) == 1:
            w.add_tensor(name, np.ascontiguousarray(arr))
            continue
        qt = et if name in ("token_embd.weight", "output.weight") else wt
        if a.type == "q4_k_m":
            qt = q4_k_m_type(name, spec["n_layers"])
        if a.fast:
            q = tiled(qt, arr.shape, arr.amp, rng, pools)
        else:
            q = quantize(arr, qt)
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
