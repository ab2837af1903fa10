#!/usr/bin/env python3
"""Generate tiny random-weight GGUF models for architectures that have no real model here.

Only numpy + gguf are used (CI's .venv can run it). Every file is bit-reproducible from the specs
below: weights come from numpy's legacy MT19937 stream (RandomState, whose output is frozen by
numpy's compatibility policy) mapped to uniform values with plain IEEE arithmetic (no libm calls),
so the bytes do not depend on the CPU's SIMD paths.

Files are laid out as llama.cpp's convert_hf_to_gguf.py would write them for the equivalent
Hugging Face checkpoint:

* tensor names token_embd / blk.N.attn_{q,k,v,output} / blk.N.attn_{q,k}.bias (qwen2) /
  blk.N.attn_{q,k}_norm (qwen3) / blk.N.ffn_{gate,up,down} / blk.N.{attn,ffn}_norm /
  output_norm / output (absent when the embeddings are tied) / rope_freqs (llama3 rope scaling);
* 2-D weights stored row-major as the HF [out, in] matrix (GGUF ne[0] = in, ne[1] = out);
* llama arch only: Q and K rows permuted HF -> GGUF ("permute" in the converter) so that the
  interleaved-pair (GGML_ROPE_TYPE_NORM) rope of llama.cpp applies; qwen2/qwen3 are not permuted
  (they use the NEOX, rotate-half rope, like HF);
* llama3 rope scaling: a F32 `rope_freqs.weight` tensor of head_dim/2 frequency *divisors*
  (llama.cpp: theta_i = pos * base^(-2i/head_dim) / rope_freqs[i]); no `llama.rope.scaling.*`
  keys, exactly like llama.cpp (its loader asserts on an unknown `rope.scaling.type` and would
  apply a `rope.scaling.factor` as extra linear scaling). The HF `rope_scaling` parameters, which
  transformers' GGUF loader cannot read from any llama.cpp key, are kept in non-standard
  `dspark.hf.rope_scaling.*` keys that llama.cpp ignores and tools/gen_golden.py reads.

Usage:
    python tools/make_tiny_models.py [--out build/tiny-models] [--only tiny-llama,...]
Prints one line per file: sha256  path.

The module is importable: gen_golden.py uses SPECS, hf_config() and hf_weights() to build the
equivalent HF model straight from the same numpy weights (no GGUF) for the round-trip check.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

# --------------------------------------------------------------------------------------------
# model specs

SPECS: dict[str, dict] = {
    # llama with llama3 rope scaling, GQA 4/2, untied output
    "tiny-llama": dict(
        arch="llama", seed=1001, vocab=512, dim=128, n_layers=3, n_heads=4, n_kv_heads=2,
        head_dim=32, ffn=320, rope_base=500000.0, ctx=2048, eps=1e-5, tied=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=256),
        pre="llama-bpe", quant=None,
    ),
    # same weights as tiny-llama, stored as llama.cpp "Q8_0" files are (token_embd F16,
    # 2-D weights Q8_0, norms and rope_freqs F32)
    "tiny-llama-q8": dict(
        arch="llama", seed=1001, vocab=512, dim=128, n_layers=3, n_heads=4, n_kv_heads=2,
        head_dim=32, ffn=320, rope_base=500000.0, ctx=2048, eps=1e-5, tied=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=256),
        pre="llama-bpe", quant="q8_0",
    ),
    # qwen2: QKV bias, GQA 6/2, head_dim 16, tied embeddings, rope base 10000
    "tiny-qwen2": dict(
        arch="qwen2", seed=2002, vocab=512, dim=96, n_layers=2, n_heads=6, n_kv_heads=2,
        head_dim=16, ffn=256, rope_base=10000.0, ctx=2048, eps=1e-6, tied=True,
        rope_scaling=None, pre="qwen2", quant=None,
        # tied random embeddings make greedy decoding collapse onto one token; a small embedding
        # and a stronger residual branch keep the continuations varied
        embed_scale=0.1, out_gain=3.0,
    ),
    # qwen3: per-head q/k RMSNorm, GQA 4/2, head_dim 32 with n_heads*head_dim (128) != dim (64)
    "tiny-qwen3": dict(
        arch="qwen3", seed=3003, vocab=512, dim=64, n_layers=3, n_heads=4, n_kv_heads=2,
        head_dim=32, ffn=192, rope_base=1000000.0, ctx=2048, eps=1e-6, tied=False,
        rope_scaling=None, pre="qwen2", quant=None,
    ),
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_ID, EOS_ID, PAD_ID = 0, 2, 0

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Training text for the tiny BPE vocabulary (written for this file).
_CORPUS = """
The small model reads the prompt one token at a time and writes the next token.
A token is a piece of text: a word, a part of a word, a digit, a space or a sign.
def add(a, b):
    return a + b

for i in range(10):
    print(i, i * i)
The numbers 0 1 2 3 4 5 6 7 8 9 10 42 100 365 1024 2048 3.14159 are numbers.
Hello, world! How are you today? I am fine, thank you. What is the capital of France?
The capital of France is Paris. The quick brown fox jumps over the lazy dog.
Le chat est sur la table. Der Hund schläft im Garten. El niño come una manzana.
Это простой текст. 这是一个简单的句子。 これは短い文です。
<|im_start|>user
Write a short poem about the sea.<|im_end|>
<|im_start|>assistant
The sea is wide, the sea is deep, it sings the sailors all to sleep.<|im_end|>
"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_vocab(size: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges): specials, the 256 byte tokens, then BPE merges learned on
    _CORPUS until the vocabulary has `size` entries. Deterministic (ties broken on the pair)."""
    b2u = _bytes_to_unicode()
    tokens = list(SPECIAL_TOKENS) + [b2u[b] for b in range(256)]
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(gguf.TokenType.NORMAL)] * 256
    vocab = set(tokens)
    text = _CORPUS
    for s in SPECIAL_TOKENS:
        text = text.replace(s, " ")
    # a plain-`re` approximation of the GPT-2 split (only affects which merges are learned)
    words = re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d| ?[^\s\w]+|\s+(?!\S)|\s+", text)
    counts: dict[tuple[str, ...], int] = {}
    for w in words:
        sym = tuple(b2u[b] for b in w.encode("utf-8"))
        counts[sym] = counts.get(sym, 0) + 1
    merges: list[str] = []
    while len(tokens) < size:
        pairs: dict[tuple[str, str], int] = {}
        for sym, c in counts.items():
            for a, b in zip(sym, sym[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            raise RuntimeError("corpus too small for the requested vocabulary")
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        if merged not in vocab:
            vocab.add(merged)
            tokens.append(merged)
            types.append(int(gguf.TokenType.NORMAL))
        new_counts: dict[tuple[str, ...], int] = {}
        for sym, c in counts.items():
            out: list[str] = []
            i = 0
            while i < len(sym):
                if i + 1 < len(sym) and sym[i] == best[0] and sym[i + 1] == best[1]:
                    out.append(merged)
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            t = tuple(out)
            new_counts[t] = new_counts.get(t, 0) + c
        counts = new_counts
    return tokens, types, merges


# --------------------------------------------------------------------------------------------
# weights (HF layout and naming)

class _Rng:
    """Uniform values from numpy's frozen legacy MT19937 stream, plain arithmetic only."""

    def __init__(self, seed: int):
        self.rs = np.random.RandomState(seed)

    def uniform(self, shape: tuple[int, ...], scale: float, center: float = 0.0) -> np.ndarray:
        u = self.rs.random_sample(shape)  # float64 in [0, 1), 53-bit, integer-derived
        return (center + scale * (2.0 * u - 1.0)).astype(np.float32)


def _raw_hf_weights(spec: dict) -> dict[str, np.ndarray]:
    """float32 HF-named weights before any storage rounding. Scales chosen so that the logits of a
    random model are spread (std of a few units): fewer near-ties in greedy decoding."""
    r = _Rng(spec["seed"])
    d, hd, nh, nkv, f, v = spec["dim"], spec["head_dim"], spec["n_heads"], spec["n_kv_heads"], spec["ffn"], spec["vocab"]
    k = math.sqrt(3.0)  # uniform(-k/sqrt(n), k/sqrt(n)) has std 1/sqrt(n)
    g = spec.get("out_gain", 1.0)  # residual-branch gain: keeps random models from echoing their input
    w: dict[str, np.ndarray] = {}
    w["model.embed_tokens.weight"] = r.uniform((v, d), k * spec.get("embed_scale", 1.0))
    for i in range(spec["n_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = r.uniform((d,), 0.2, 1.0)
        w[p + "self_attn.q_proj.weight"] = r.uniform((nh * hd, d), k / math.sqrt(d))
        w[p + "self_attn.k_proj.weight"] = r.uniform((nkv * hd, d), k / math.sqrt(d))
        w[p + "self_attn.v_proj.weight"] = r.uniform((nkv * hd, d), k / math.sqrt(d))
        if spec["arch"] == "qwen2":
            w[p + "self_attn.q_proj.bias"] = r.uniform((nh * hd,), 0.5)
            w[p + "self_attn.k_proj.bias"] = r.uniform((nkv * hd,), 0.5)
            w[p + "self_attn.v_proj.bias"] = r.uniform((nkv * hd,), 0.5)
        if spec["arch"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = r.uniform((hd,), 0.3, 1.0)
            w[p + "self_attn.k_norm.weight"] = r.uniform((hd,), 0.3, 1.0)
        w[p + "self_attn.o_proj.weight"] = r.uniform((d, nh * hd), g * k / math.sqrt(nh * hd))
        w[p + "post_attention_layernorm.weight"] = r.uniform((d,), 0.2, 1.0)
        w[p + "mlp.gate_proj.weight"] = r.uniform((f, d), k / math.sqrt(d))
        w[p + "mlp.up_proj.weight"] = r.uniform((f, d), k / math.sqrt(d))
        w[p + "mlp.down_proj.weight"] = r.uniform((d, f), g * k / math.sqrt(f))
    w["model.norm.weight"] = r.uniform((d,), 0.2, 1.0)
    if not spec["tied"]:
        w["lm_head.weight"] = r.uniform((v, d), 2.0 * k / math.sqrt(d))
    return w


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF -> GGUF row order of llama's Q/K (llama.cpp convert_hf_to_gguf.py LlamaModel.permute):
    within each head, rows [x0..x(h/2-1), y0..y(h/2-1)] (HF rotate-half pairs i, i+h/2) become
    [x0, y0, x1, y1, ...] (ggml's interleaved pairs 2i, 2i+1). n_head is the head count of this
    tensor (n_heads for Q, n_kv_heads for K)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of permute_qk (what transformers' GGUF loader applies)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_HF_TO_GGUF = [
    (r"model\.embed_tokens\.weight", "token_embd.weight"),
    (r"model\.norm\.weight", "output_norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"blk.\1.attn_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"blk.\1.ffn_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", r"blk.\1.attn_q.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.(weight|bias)", r"blk.\1.attn_k.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.(weight|bias)", r"blk.\1.attn_v.\2"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"blk.\1.attn_output.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_norm\.weight", r"blk.\1.attn_q_norm.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_norm\.weight", r"blk.\1.attn_k_norm.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"blk.\1.ffn_gate.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"blk.\1.ffn_up.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"blk.\1.ffn_down.weight"),
]


def gguf_name(hf_name: str) -> str:
    for pat, rep in _HF_TO_GGUF:
        if re.fullmatch(pat, hf_name):
            return re.sub(pat, rep, hf_name)
    raise KeyError(hf_name)


def _storage_type(spec: dict, gname: str, arr: np.ndarray) -> QT:
    if spec["quant"] is None or arr.ndim == 1:
        return QT.F32
    if spec["quant"] == "q8_0":
        return QT.F16 if gname == "token_embd.weight" else QT.Q8_0
    raise ValueError(spec["quant"])


def _store(arr: np.ndarray, qt: QT) -> np.ndarray:
    if qt == QT.F32:
        return np.ascontiguousarray(arr, dtype=np.float32)
    if qt == QT.F16:
        return np.ascontiguousarray(arr.astype(np.float16))
    return gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qt)


def _load(stored: np.ndarray, qt: QT) -> np.ndarray:
    if qt == QT.F32:
        return stored
    if qt == QT.F16:
        return stored.astype(np.float32)
    return gguf.quants.dequantize(stored, qt).astype(np.float32)


def gguf_tensors(spec: dict) -> list[tuple[str, np.ndarray, QT]]:
    """(gguf name, stored array, ggml type) in file order."""
    out = []
    raw = _raw_hf_weights(spec)
    if spec["rope_scaling"] is not None:
        out.append(("rope_freqs.weight", llama3_rope_freqs(spec), QT.F32))
    for name, arr in raw.items():
        g = gguf_name(name)
        if spec["arch"] == "llama" and g.endswith((".attn_q.weight", ".attn_q.bias")):
            arr = permute_qk(arr, spec["n_heads"])
        elif spec["arch"] == "llama" and g.endswith((".attn_k.weight", ".attn_k.bias")):
            arr = permute_qk(arr, spec["n_kv_heads"])
        qt = _storage_type(spec, g, arr)
        out.append((g, _store(arr, qt), qt))
    return out


def hf_weights(spec: dict) -> dict[str, np.ndarray]:
    """HF-named float32 weights exactly as the GGUF file represents them (after any F16/Q8_0
    storage rounding, un-permuted): what an HF model built without the GGUF must be given."""
    raw = _raw_hf_weights(spec)
    by_gguf = {g: (a, qt) for g, a, qt in gguf_tensors(spec)}
    hf = {}
    for name, r in raw.items():
        g = gguf_name(name)
        a, qt = by_gguf[g]
        arr = _load(a, qt).reshape(r.shape)
        if spec["arch"] == "llama" and g.endswith((".attn_q.weight", ".attn_q.bias")):
            arr = unpermute_qk(arr, spec["n_heads"])
        elif spec["arch"] == "llama" and g.endswith((".attn_k.weight", ".attn_k.bias")):
            arr = unpermute_qk(arr, spec["n_kv_heads"])
        hf[name] = np.ascontiguousarray(arr, dtype=np.float32)
    return hf


def llama3_rope_freqs(spec: dict) -> np.ndarray:
    """llama.cpp's rope_freqs tensor for HF rope_type llama3: per frequency i, the divisor applied
    to base^(-2i/head_dim). Same rule as convert_hf_to_gguf.py, but original_max_position_embeddings
    is taken from the rope_scaling dict (where HF keeps it). Scalar double math, then float32."""
    rs = spec["rope_scaling"]
    base, dim = spec["rope_base"], spec["head_dim"]
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for i in range(0, dim, 2):
        freq = float(np.float32(1.0 / float(np.float32(base ** (i / dim)))))
        wl = 2 * math.pi / freq
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def hf_config(spec: dict) -> dict:
    """The transformers config (kwargs) of the equivalent HF checkpoint."""
    rope = {"rope_type": "default", "rope_theta": spec["rope_base"]}
    if spec["rope_scaling"] is not None:
        rope = dict(spec["rope_scaling"], rope_theta=spec["rope_base"])
    cfg = dict(
        model_type=spec["arch"],
        vocab_size=spec["vocab"],
        hidden_size=spec["dim"],
        intermediate_size=spec["ffn"],
        num_hidden_layers=spec["n_layers"],
        num_attention_heads=spec["n_heads"],
        num_key_value_heads=spec["n_kv_heads"],
        head_dim=spec["head_dim"],
        max_position_embeddings=spec["ctx"],
        # the GGUF stores eps as float32; use that value so both sides compute the same
        rms_norm_eps=float(np.float32(spec["eps"])),
        rope_parameters=rope,
        tie_word_embeddings=spec["tied"],
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    return cfg


# --------------------------------------------------------------------------------------------
# GGUF writing

def write_hparams(w, spec: dict) -> None:
    """The <arch>.* hyper-parameters, as llama.cpp's converter writes them (shared with
    make_random_model.py)."""
    w.add_context_length(spec["ctx"])
    w.add_embedding_length(spec["dim"])
    w.add_block_count(spec["n_layers"])
    w.add_feed_forward_length(spec["ffn"])
    w.add_head_count(spec["n_heads"])
    w.add_head_count_kv(spec["n_kv_heads"])
    w.add_rope_freq_base(spec["rope_base"])
    w.add_layer_norm_rms_eps(spec["eps"])
    if spec["arch"] == "llama":
        w.add_vocab_size(spec["vocab"])
        w.add_rope_dimension_count(spec["head_dim"])
    # head_dim is written explicitly (the converter does when the HF config has `head_dim`)
    w.add_key_length(spec["head_dim"])
    w.add_value_length(spec["head_dim"])


def write_gguf(name: str, spec: dict, path: str) -> None:
    arch = spec["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_description("dspark tiny random-weight test model (tools/make_tiny_models.py)")
    write_hparams(w, spec)
    ftype = gguf.LlamaFileType.ALL_F32 if spec["quant"] is None else gguf.LlamaFileType.MOSTLY_Q8_0
    w.add_file_type(int(ftype))
    if spec["rope_scaling"] is not None:
        rs = spec["rope_scaling"]
        w.add_string("dspark.hf.rope_scaling.rope_type", rs["rope_type"])
        w.add_float32("dspark.hf.rope_scaling.factor", rs["factor"])
        w.add_float32("dspark.hf.rope_scaling.low_freq_factor", rs["low_freq_factor"])
        w.add_float32("dspark.hf.rope_scaling.high_freq_factor", rs["high_freq_factor"])
        w.add_uint32("dspark.hf.rope_scaling.original_max_position_embeddings",
                     rs["original_max_position_embeddings"])
    tokens, types, merges = build_vocab(spec["vocab"])
    assert len(tokens) == spec["vocab"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(spec["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for g, arr, qt in gguf_tensors(spec):
        if qt in (QT.F32, QT.F16):
            w.add_tensor(g, arr)
        else:
            w.add_tensor(g, arr, raw_shape=arr.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_all(out_dir: str, only: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """Write the models; returns {name: (path, sha256)}."""
    os.makedirs(out_dir, exist_ok=True)
    res = {}
    for name, spec in SPECS.items():
        if only and name not in only:
            continue
        path = os.path.join(out_dir, name + ".gguf")
        tmp = path + ".tmp"
        write_gguf(name, spec, tmp)
        os.replace(tmp, path)
        res[name] = (path, sha256_file(path))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/tiny-models", help="output directory")
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    a = ap.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    for n in only:
        if n not in SPECS:
            print(f"unknown model {n!r}; known: {', '.join(SPECS)}", file=sys.stderr)
            return 2
    for name, (path, sha) in make_all(a.out, only).items():
        print(f"{sha}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
