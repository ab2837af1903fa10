#!/usr/bin/env python3
"""Tiny random-weight Hugging Face model directories (config.json + safetensors + tokenizer.json).

The same weights as tools/make_tiny_models.py's tiny-llama / tiny-qwen2 / tiny-qwen3 GGUF models,
stored in bf16, f16 or f32 the way transformers' `save_pretrained` writes them: the safetensors
files written here are byte-identical to save_pretrained's (tools/gen_golden.py --hf checks that
with transformers before recording each file's sha256 in the fixture), so CI, which has no torch,
regenerates them with numpy alone and checks the sha256. One model per architecture is sharded
(model-0000N-of-0000M.safetensors + model.safetensors.index.json, split as save_pretrained's
max_shard_size="400KB" does).

The JSON side files (config.json, generation_config.json, tokenizer.json, tokenizer_config.json)
are written by this script (deterministically); they carry what transformers writes for these
models (the fixture generator loads the directory with transformers, so they must be right).

Usage:
    python tools/make_tiny_hf.py [--out build/tiny-hf] [--only NAME,...]
Also writes a bf16 GGUF twin of each bf16 model (tiny-*-hf-bf16.gguf) for the GGUF == directory test;
write_gguf_twin() makes the q8_0 / q4_0 ones.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as mtm  # noqa: E402

import gguf  # noqa: E402

HF_SPECS: dict[str, dict] = {}
for _base in ("tiny-llama", "tiny-qwen2", "tiny-qwen3"):
    for _dt in ("bf16", "f16", "f32"):
        HF_SPECS[f"{_base}-hf-{_dt}"] = dict(base=_base, dtype=_dt, shard_bytes=(400_000 if (_base, _dt) == ("tiny-llama", "bf16") else None))

ST_DTYPE = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
TORCH_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even (torch's and gguf's rule)."""
    n = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    n = np.where((n & 0x7FFFFFFF) > 0x7F800000, (n & 0xFFFF0000) | (64 << 16), n)
    n = (n + (0x7FFF + ((n >> 16) & 1))) >> 16
    return n.astype(np.uint16)


def stored_bytes(a: np.ndarray, dtype: str) -> bytes:
    if dtype == "bf16":
        return to_bf16_bits(a).tobytes()
    if dtype == "f16":
        return np.ascontiguousarray(a.astype(np.float16)).tobytes()
    return np.ascontiguousarray(a, dtype=np.float32).tobytes()


def state_dict_order(spec: dict) -> list[str]:
    """HF state_dict order of the *ForCausalLM module (what save_pretrained shards in)."""
    names = ["model.embed_tokens.weight"]
    for i in range(spec["n_layers"]):
        p = f"model.layers.{i}."
        names += [p + "self_attn.q_proj.weight"] + ([p + "self_attn.q_proj.bias"] if spec["arch"] == "qwen2" else [])
        names += [p + "self_attn.k_proj.weight"] + ([p + "self_attn.k_proj.bias"] if spec["arch"] == "qwen2" else [])
        names += [p + "self_attn.v_proj.weight"] + ([p + "self_attn.v_proj.bias"] if spec["arch"] == "qwen2" else [])
        names += [p + "self_attn.o_proj.weight"]
        if spec["arch"] == "qwen3":
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight",
                  p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not spec["tied"]:
        names.append("lm_head.weight")
    return names


def write_safetensors(path: str, tensors: list[tuple[str, tuple[int, ...], bytes]], dtype: str) -> None:
    """The safetensors layout of the reference writer: tensors sorted by name (one dtype), a compact
    JSON header with __metadata__ {"format": "pt"} first, padded with spaces to 8 bytes."""
    tensors = sorted(tensors, key=lambda t: t[0])
    hdr = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape, data in tensors:
        hdr[name] = {"dtype": ST_DTYPE[dtype], "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in tensors:
            f.write(data)


def tokenizer_json(spec: dict) -> dict:
    """A byte-level BPE tokenizer.json for the tiny vocabulary, pre-tokenized as the base model's
    family (llama-bpe: Llama 3's Split regex + ByteLevel; qwen2: Qwen2's regex, as Qwen's files)."""
    tokens, types, merges = mtm.build_vocab(spec["vocab"])
    regex = {"llama-bpe": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
             "qwen2": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}[spec["pre"]]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
             for i, t in enumerate(mtm.SPECIAL_TOKENS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": spec["pre"] == "llama-bpe",
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [m.split(" ") for m in merges]},
    }


def config_json(spec: dict, dtype: str) -> dict:
    cfg = mtm.hf_config(spec)
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[spec["arch"]]
    cfg = dict(architectures=[arch], **cfg, hidden_act="silu", dtype=TORCH_DTYPE[dtype])
    if spec["arch"] in ("llama", "qwen3"):
        cfg["attention_bias"] = False
    return cfg


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False, sort_keys=True)
        f.write("\n")


def make_dir(name: str, hs: dict, out: str) -> dict[str, str]:
    """Write one directory; returns {safetensors file name: sha256}."""
    spec = mtm.SPECS[hs["base"]]
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    w = mtm.hf_weights(spec)
    order = state_dict_order(spec)
    assert set(order) == set(w), set(order) ^ set(w)
    items = [(n, w[n].shape, stored_bytes(w[n], hs["dtype"])) for n in order]
    if hs["shard_bytes"]:  # transformers 5 shards the state dict in name order
        items.sort(key=lambda it: it[0])
    shards: list[list] = [[]]
    if hs["shard_bytes"]:
        size = 0
        for it in items:  # save_pretrained: a new shard when the next tensor would overflow this one
            if shards[-1] and size + len(it[2]) > hs["shard_bytes"]:
                shards.append([])
                size = 0
            shards[-1].append(it)
            size += len(it[2])
    else:
        shards = [items]
    files = {}
    if len(shards) == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), shards[0], hs["dtype"])
        files["model.safetensors"] = mtm.sha256_file(os.path.join(d, "model.safetensors"))
    else:
        wm = {}
        for k, sh in enumerate(shards):
            fn = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(d, fn), sh, hs["dtype"])
            files[fn] = mtm.sha256_file(os.path.join(d, fn))
            wm.update({n: fn for n, _, _ in sh})
        total = sum(len(b) for _, _, b in items)
        write_json(os.path.join(d, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))})
    write_json(os.path.join(d, "config.json"), config_json(spec, hs["dtype"]))
    write_json(os.path.join(d, "generation_config.json"),
               {"bos_token_id": mtm.BOS_ID, "eos_token_id": [mtm.EOS_ID, 1], "temperature": 0.7, "top_p": 0.9, "top_k": 40})
    write_json(os.path.join(d, "tokenizer.json"), tokenizer_json(spec))
    write_json(os.path.join(d, "tokenizer_config.json"),
               {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
                "chat_template": mtm.CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"})
    if hs["dtype"] == "bf16":  # the GGUF twin: same bf16 values, llama.cpp's layout
        write_gguf_twin(hs["base"], os.path.join(out, name + ".gguf"))
    return files


def write_gguf_twin(base: str, path: str, mat_type: str = "bf16") -> None:
    """The bf16 model as llama.cpp would store it: matrices in `mat_type` (bf16, or q8_0 / q4_0
    quantized by the gguf package from the bf16 values), vectors and rope_freqs F32."""
    spec = dict(mtm.SPECS[base])
    qt = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
          "q4_0": gguf.GGMLQuantizationType.Q4_0}[mat_type]
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, spec["arch"])
    w.add_name(f"{base}-{mat_type}")
    mtm.write_hparams(w, spec)
    tokens, types, merges = mtm.build_vocab(spec["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(spec["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(mtm.EOS_ID)
    for g, arr, _ in mtm.gguf_tensors(spec):
        bits = to_bf16_bits(arr)
        if g == "rope_freqs.weight":  # computed, not a checkpoint weight
            w.add_tensor(g, arr)
            continue
        if arr.ndim != 2:  # the checkpoint's bf16 values, widened to F32 as llama.cpp stores vectors
            w.add_tensor(g, (bits.astype(np.uint32) << 16).view(np.float32))
            continue
        if mat_type == "bf16":
            w.add_tensor(g, bits, raw_shape=arr.shape, raw_dtype=qt)
        else:
            f32 = (bits.astype(np.uint32) << 16).view(np.float32)
            q = gguf.quants.quantize(f32, qt)
            w.add_tensor(g, q, raw_shape=q.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)


def make_all(out: str, only: list[str] | None = None) -> dict[str, tuple[str, dict[str, str]]]:
    os.makedirs(out, exist_ok=True)
    return {n: (os.path.join(out, n), make_dir(n, hs, out)) for n, hs in HF_SPECS.items() if not only or n in only}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/tiny-hf")
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    for name, (d, files) in make_all(a.out, [s for s in a.only.split(",") if s]).items():
        for fn, sha in files.items():
            print(f"{sha}  {os.path.join(d, fn)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
