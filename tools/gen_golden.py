#!/usr/bin/env python3
"""Golden forward-pass fixtures: Hugging Face transformers, float32 on CPU, as the oracle.

For a GGUF model: load it with transformers (`from_pretrained(dir, gguf_file=...)`, which
dequantizes every tensor to float32) and its tokenizer from the same file, then for each prompt
record the prompt token ids, GREEDY_STEPS greedy tokens and the top-k logits at every step.

    .venv-tools/bin/python tools/gen_golden.py                  # SmolLM2 (the default model)
    .venv-tools/bin/python tools/gen_golden.py --model models/X.gguf
    .venv-tools/bin/python tools/gen_golden.py --tiny           # tools/make_tiny_models.py models

--tiny regenerates the tiny random-weight models (into --tiny-dir, default build/tiny-models),
then for each one also builds the equivalent HF model directly from the same numpy weights
(config + state dict, no GGUF) and checks that its logits equal the GGUF-loaded model's; the
result goes into the fixture's `roundtrip` field.

Needs torch + transformers + accelerate (requirements-tools.txt); CI never runs this.
See tests/fixtures/golden/README.md for the fixture format.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import make_tiny_models as mtm  # noqa: E402

FORMAT = "dspark-golden-v1"
DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = "tests/fixtures/golden"

# An original ~300-token text for the long prompt.
LONG_TEXT = (
    "The lighthouse keeper kept a notebook on the table by the window, and every evening she wrote "
    "down the same four things: the direction of the wind, the colour of the sky at sunset, the "
    "number of ships that had passed, and one sentence about something she had noticed for the "
    "first time. After eleven years the notebook had grown into a shelf of notebooks, and the "
    "sentences had become a kind of map. Some of them were about the sea, which was never the same "
    "twice: a green so pale it was nearly white, a grey that moved like smoke, a black with silver "
    "edges under a full moon. Some were about the birds, which arrived in March and left in "
    "October, except for one old gull with a crooked foot who never left at all. Some were about "
    "the visitors, who climbed the one hundred and twelve steps to the lamp room and always said "
    "the same thing when they reached the top, which was nothing, because they were out of breath. "
    "When the harbour office finally replaced the lamp with an automatic light, they asked her what "
    "she wanted to take with her. She thought about it for a long time. Then she packed the "
    "notebooks into three wooden crates, left the kettle for whoever came next, and walked down the "
    "hill to the village without looking back. In the first week of her new life she discovered "
    "that she did not know what to write in the evenings, so she began a new notebook and wrote, "
    "on the first page, a single question:"
)

# (name, kind, content). kind "text": content is the prompt text, tokenized without added
# special tokens beyond what the tokenizer adds by itself; kind "chat": content is a message list
# rendered with the model's own chat template (add_generation_prompt=True); kind "one_token": the
# first token of content's encoding.
PROMPTS: list[tuple[str, str, object]] = [
    ("plain", "text", "The history of the bicycle begins in the early nineteenth century, when"),
    ("code", "text", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"),
    ("chat", "chat", [{"role": "user", "content": "Give me three tips for staying focused while studying."}]),
    ("chat_system_multiturn", "chat", [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Italy?"},
    ]),
    ("numbers", "text", "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584,"),
    ("arithmetic", "text", "Question: 12345 + 67890 = ? Answer: 80235. Question: 3.14159 * 2 = ? Answer:"),
    ("non_english", "text", "La ville de Paris est connue pour ses musées. Берлин — столица Германии. 东京是日本的首都，"),
    ("whitespace", "text", "  Leading spaces,\ttabs,\n\n\nnewlines   and  double  spaces:\n\t-"),
    ("long", "text", LONG_TEXT),
    ("one_token", "one_token", "Hello"),
]


# ------------------------------------------------------------------------------------------
# helpers

def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def f32_str(x) -> float:
    """A float32 as the shortest decimal that round-trips to it (returned as a Python float whose
    repr is that decimal; checked)."""
    v = np.float32(x)
    s = np.format_float_positional(v, unique=True, trim="-") if abs(v) >= 1e-4 or v == 0 \
        else np.format_float_scientific(v, unique=True, trim="-")
    out = float(s)
    assert np.float32(out) == v and np.float32(float(repr(out))) == v, (v, s)
    return out


def dumps_compact(obj, indent: int = 0) -> str:
    """JSON with dicts indented and lists of scalars on one line (small, diffable)."""
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f'{pad} {json.dumps(k, ensure_ascii=False)}: {dumps_compact(v, indent + 1)}' for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and any(isinstance(v, (dict, list)) for v in obj):
        items = [pad + " " + dumps_compact(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def gguf_meta(path: str) -> tuple[dict, list[str]]:
    from gguf import GGUFReader
    r = GGUFReader(path)
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml.") and k not in ("tokenizer.ggml.model", "tokenizer.ggml.pre",
                                                         "tokenizer.ggml.bos_token_id",
                                                         "tokenizer.ggml.eos_token_id"):
            continue
        try:
            meta[k] = f.contents()
        except Exception:  # noqa: BLE001
            pass
    names = [t.name for t in r.tensors]
    rope_freqs = None
    for t in r.tensors:
        if t.name == "rope_freqs.weight":
            rope_freqs = np.array(t.data, dtype=np.float32).reshape(-1)
    meta["_rope_freqs"] = rope_freqs
    return meta, names


# ------------------------------------------------------------------------------------------
# loading

def load_hf_from_gguf(path: str, patch: bool = True):
    """(model, tokenizer, config_patches). Patches fill in what transformers' GGUF loader does not
    read (each is taken from the GGUF's own metadata and recorded in the fixture)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(os.path.abspath(path))
    meta, names = gguf_meta(path)
    arch = meta["general.architecture"]
    cfg = AutoConfig.from_pretrained(d, gguf_file=f)
    patches = []
    if patch:
        kl = meta.get(f"{arch}.attention.key_length")
        if kl is not None and getattr(cfg, "head_dim", None) not in (None, kl):
            patches.append({"key": "head_dim", "from": getattr(cfg, "head_dim"), "to": int(kl),
                            "source": f"{arch}.attention.key_length"})
            cfg.head_dim = int(kl)
        pre = "dspark.hf.rope_scaling."
        if pre + "rope_type" in meta:
            rp = {"rope_type": meta[pre + "rope_type"],
                  "rope_theta": float(meta[f"{arch}.rope.freq_base"]),
                  "factor": float(meta[pre + "factor"]),
                  "low_freq_factor": float(meta[pre + "low_freq_factor"]),
                  "high_freq_factor": float(meta[pre + "high_freq_factor"]),
                  "original_max_position_embeddings": int(meta[pre + "original_max_position_embeddings"])}
            patches.append({"key": "rope_parameters", "from": dict(cfg.rope_parameters), "to": rp,
                            "source": pre + "*"})
            cfg.rope_parameters = rp
        elif meta["_rope_freqs"] is not None:
            raise SystemExit(f"{path}: has rope_freqs.weight, which transformers ignores, and no "
                             f"dspark.hf.rope_scaling.* keys: HF logits would not match the file")
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, config=cfg, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    if meta["_rope_freqs"] is not None and patch:
        # the HF rotary frequencies must be llama.cpp's base^(-2i/d) / rope_freqs[i]
        hd = cfg.head_dim
        base = float(meta[f"{arch}.rope.freq_base"])
        ref = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)) / meta["_rope_freqs"].astype(np.float64)
        got = model.model.rotary_emb.inv_freq.double().numpy()
        rel = float(np.max(np.abs(got - ref) / ref))
        if rel > 1e-6:
            raise SystemExit(f"HF inv_freq disagrees with rope_freqs.weight: max rel diff {rel}")
        patches.append({"check": "hf inv_freq == base^(-2i/d)/rope_freqs[i]", "max_rel_diff": rel})
    return model, tok, patches


def encode_prompt(tok, kind: str, content) -> tuple[str, list[int]]:
    if kind == "chat":
        text = tok.apply_chat_template(content, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return text, ids
    ids = tok(content)["input_ids"]
    if kind == "one_token":
        ids = ids[:1]
        return tok.decode(ids), ids
    return content, ids


# ------------------------------------------------------------------------------------------
# greedy decoding

def topk_row(logits: np.ndarray, k: int):
    """Indices of the k largest, ordered by value descending then id ascending (so index 0 is
    torch.argmax's choice: the lowest id among equal maxima)."""
    order = np.lexsort((np.arange(logits.shape[0]), -logits.astype(np.float64)))[:k]
    return order


def greedy(model, prompt_ids: list[int], steps: int, k: int) -> dict:
    import torch
    with torch.no_grad():
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        out = model(input_ids=ids, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float().numpy()
        tokens, top_ids, top_logits, margins, rows = [], [], [], [], []
        for step in range(steps):
            order = topk_row(logits, k)
            nxt = int(order[0])
            tokens.append(nxt)
            top_ids.append([int(i) for i in order])
            top_logits.append([f32_str(logits[i]) for i in order])
            margins.append(f32_str(np.float32(logits[order[0]]) - np.float32(logits[order[1]])))
            rows.append(logits.copy())
            if step + 1 == steps:
                break
            out = model(input_ids=torch.tensor([[nxt]], dtype=torch.long), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float().numpy()
        # HF's own numerical noise: the same positions from one uncached forward over the whole
        # sequence (prompt + generated tokens but the last)
        full = model(input_ids=torch.tensor([prompt_ids + tokens[:-1]], dtype=torch.long), use_cache=False)
        full_rows = full.logits[0, len(prompt_ids) - 1:].float().numpy()
        self_diff = float(np.max(np.abs(full_rows - np.stack(rows))))
        full_argmax_agree = int(np.sum(np.argmax(full_rows, axis=-1) == np.array(tokens)))
    return dict(tokens=tokens, top_ids=top_ids, top_logits=top_logits, margins=margins,
                hf_cached_vs_uncached_max_abs=f32_str(self_diff),
                hf_uncached_argmax_agree=full_argmax_agree)


# ------------------------------------------------------------------------------------------
# tiny-model round trip

def direct_hf_model(spec: dict):
    """The HF model built straight from make_tiny_models' numpy weights: no GGUF involved."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = mtm.hf_config(spec)
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    sd = {k: torch.from_numpy(v) for k, v in mtm.hf_weights(spec).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed_missing = {"lm_head.weight"} if spec["tied"] else set()
    if set(missing) - allowed_missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if spec["tied"]:
        model.tie_weights()
    model.eval()
    return model


def roundtrip(spec: dict, gguf_model, unpatched_model, prompts: list[list[int]]) -> dict:
    import torch
    direct = direct_hf_model(spec)
    sd_g, sd_d = gguf_model.state_dict(), direct.state_dict()
    if set(sd_g) != set(sd_d):
        raise SystemExit(f"parameter names differ: {set(sd_g) ^ set(sd_d)}")
    w_diff = max(float((sd_g[n].float() - sd_d[n].float()).abs().max()) for n in sd_g)
    l_diff, u_diff = 0.0, 0.0
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids], dtype=torch.long)
            a = direct(input_ids=x).logits
            b = gguf_model(input_ids=x).logits
            l_diff = max(l_diff, float((a - b).abs().max()))
            if unpatched_model is not None and not isinstance(unpatched_model, str):
                c = unpatched_model(input_ids=x).logits
                u_diff = max(u_diff, float((a - c).abs().max()))
    res = {"max_abs_weight_diff": w_diff, "max_abs_logit_diff": l_diff, "prompts_checked": len(prompts)}
    if isinstance(unpatched_model, str):
        res["without_config_patches"] = "does not load: " + unpatched_model
    elif unpatched_model is not None:
        res["without_config_patches_max_abs_logit_diff"] = u_diff
    return res


# ------------------------------------------------------------------------------------------

def make_fixture(path: str, steps: int, k: int, threads: int, spec: dict | None, argv: list[str]) -> dict:
    import torch
    import transformers

    t0 = time.time()
    model, tok, patches = load_hf_from_gguf(path)
    meta, names = gguf_meta(path)
    arch = meta["general.architecture"]
    fx: dict = {
        "format": FORMAT,
        "model_file": os.path.basename(path),
        "model_sha256": sha256_file(path),
        "model_arch": arch,
        "generator": "tools/gen_golden.py",
        "command": " ".join(["tools/gen_golden.py"] + argv),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "gguf": _pkg_version("gguf"),
                     "numpy": np.__version__, "python": platform.python_version()},
        "dtype": "float32",
        "device": "cpu",
        "attn_implementation": "eager",
        "torch_threads": threads,
        "weights": "every GGUF tensor dequantized to float32 by the gguf package (transformers' GGUF loader)",
        "decode": ("greedy; prompt prefilled in one forward, then one token per forward with the KV cache; "
                   f"exactly {steps} steps, EOS does not stop"),
        "steps": steps,
        "top_k": k,
        "step_definition": ("row s of top_ids/top_logits/margins is the next-token distribution from which "
                            "tokens[s] was taken: s=0 is the prompt's last position, s>0 the position of tokens[s-1]"),
        "tie_break": "top-k ordered by logit descending, then token id ascending; tokens[s] == top_ids[s][0]",
        "logit_encoding": "float32, written as the shortest decimal that parses back to the identical float32",
        "margin": "top_logits[s][0] - top_logits[s][1] computed in float32",
        "config_patches": patches,
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
    }
    unpatched = None
    if spec is not None:
        fx["tiny_spec"] = {k2: v for k2, v in spec.items()}
        if patches:
            try:
                unpatched, _, _ = load_hf_from_gguf(path, patch=False)
            except Exception as e:  # noqa: BLE001 -- e.g. qwen3's head_dim: shapes do not even fit
                unpatched = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    prompts_out = []
    prompt_ids_all = []
    for name, kind, content in PROMPTS:
        text, ids = encode_prompt(tok, kind, content)
        prompt_ids_all.append(ids)
        g = greedy(model, ids, steps, k)
        p = {"name": name, "kind": kind}
        if kind == "chat":
            p["messages"] = content
        p["text"] = text
        p["prompt_ids"] = ids
        p["n_prompt"] = len(ids)
        p["tokens"] = g["tokens"]
        p["generated_text"] = tok.decode(g["tokens"])
        p["eos_at_step"] = next((s for s, t in enumerate(g["tokens"]) if t == fx["eos_token_id"]), None)
        p["min_margin"] = min(g["margins"])
        p["hf_cached_vs_uncached_max_abs"] = g["hf_cached_vs_uncached_max_abs"]
        p["hf_uncached_argmax_agree"] = g["hf_uncached_argmax_agree"]
        p["margins"] = g["margins"]
        p["top_ids"] = g["top_ids"]
        p["top_logits"] = g["top_logits"]
        prompts_out.append(p)
        print(f"  {name:24s} n_prompt={len(ids):4d} min_margin={p['min_margin']:.4g} "
              f"self_diff={p['hf_cached_vs_uncached_max_abs']:.3g} :: {p['generated_text'][:70]!r}",
              file=sys.stderr)
    if spec is not None:
        fx["roundtrip"] = roundtrip(spec, model, unpatched, prompt_ids_all)
        print(f"  roundtrip: {fx['roundtrip']}", file=sys.stderr)
    fx["prompts"] = prompts_out
    print(f"  {time.time() - t0:.1f} s", file=sys.stderr)
    return fx


def make_hf_fixture(name: str, d: str, files: dict, steps: int, k: int, threads: int, argv: list[str]) -> dict:
    """Golden fixture of a tiny HF directory (tools/make_tiny_hf.py): transformers loads it with
    from_pretrained (weights upcast to float32 exactly), after checking that its own save_pretrained
    writes byte-identical safetensors files (so CI's numpy-made copies are what transformers made)."""
    import tempfile

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import make_tiny_hf as mth

    hs = mth.HF_SPECS[name]
    m = AutoModelForCausalLM.from_pretrained(d)
    with tempfile.TemporaryDirectory() as tmp:
        m.save_pretrained(tmp, max_shard_size="400KB" if hs["shard_bytes"] else "5GB")
        got = {f: mtm.sha256_file(os.path.join(tmp, f)) for f in os.listdir(tmp) if f.endswith(".safetensors")}
    if got != files:
        raise SystemExit(f"{name}: save_pretrained writes {got}, make_tiny_hf.py wrote {files}")
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tok = AutoTokenizer.from_pretrained(d)
    fx: dict = {
        "format": FORMAT, "model_file": name, "model_files_sha256": files, "model_arch": mtm.SPECS[hs["base"]]["arch"],
        "generator": "tools/gen_golden.py", "command": " ".join(["tools/gen_golden.py"] + argv),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "dtype": "float32 compute; weights stored as " + hs["dtype"], "device": "cpu", "attn_implementation": "eager",
        "torch_threads": threads,
        "weights": "save_pretrained-identical safetensors (" + hs["dtype"] + "), upcast to float32 by from_pretrained(dtype=float32)",
        "decode": f"greedy, exactly {steps} steps, EOS does not stop", "steps": steps, "top_k": k,
        "step_definition": "as dspark-golden-v1 (tests/fixtures/golden/README.md)",
        "tie_break": "top-k ordered by logit descending, then token id ascending; tokens[s] == top_ids[s][0]",
        "logit_encoding": "float32, shortest round-trip decimal", "margin": "top_logits[s][0] - top_logits[s][1] in float32",
        "config_patches": [], "hf_spec": hs,
    }
    prompts_out = []
    for pname, kind, content in PROMPTS[:4]:
        text, ids = encode_prompt(tok, kind, content)
        g = greedy(model, ids, steps, k)
        prompts_out.append({"name": pname, "kind": kind, "text": text, "prompt_ids": ids, "n_prompt": len(ids), "tokens": g["tokens"],
                            "generated_text": tok.decode(g["tokens"]), "min_margin": min(g["margins"]),
                            "hf_cached_vs_uncached_max_abs": g["hf_cached_vs_uncached_max_abs"], "margins": g["margins"],
                            "top_ids": g["top_ids"], "top_logits": g["top_logits"]})
        print(f"  {pname:24s} n_prompt={len(ids):4d} min_margin={prompts_out[-1]['min_margin']:.4g}", file=sys.stderr)
    fx["prompts"] = prompts_out
    return fx


def _pkg_version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


def fixture_name(path: str) -> str:
    stem = os.path.basename(path)
    if stem.endswith(".gguf"):
        stem = stem[:-5]
    return stem.lower().replace(".", "-") + ".json"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description="golden logits fixtures from HF transformers")
    ap.add_argument("--model", action="append", help=f"GGUF file (repeatable; default {DEFAULT_MODEL})")
    ap.add_argument("--tiny", action="store_true", help="fixtures for the tiny random models instead")
    ap.add_argument("--tiny-dir", default="build/tiny-models")
    ap.add_argument("--hf", action="store_true", help="fixtures for the tiny Hugging Face directories (tools/make_tiny_hf.py)")
    ap.add_argument("--hf-dir", default="build/tiny-hf")
    ap.add_argument("--only", default="", help="tiny model names, comma-separated (default all)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)

    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    os.chdir(ROOT)
    os.makedirs(a.out, exist_ok=True)

    jobs: list[tuple[str, str, dict | None]] = []
    if a.hf:
        import make_tiny_hf as mth
        only = [s2 for s2 in a.only.split(",") if s2]
        for name, (d, files) in mth.make_all(a.hf_dir, only).items():
            print(f"{name} -> {d}", file=sys.stderr)
            fx = make_hf_fixture(name, d, files, a.steps, a.top_k, a.threads, argv)
            out = os.path.join(a.out, name + ".json")
            with open(out, "w", encoding="utf-8") as f:
                f.write(dumps_compact(fx) + "\n")
            print(f"  wrote {out} ({os.path.getsize(out)} bytes)", file=sys.stderr)
        return 0
    if a.tiny:
        only = [s for s in a.only.split(",") if s]
        made = mtm.make_all(a.tiny_dir, only)
        for name, (path, sha) in made.items():
            print(f"{sha}  {path}", file=sys.stderr)
            jobs.append((path, os.path.join(a.out, name + ".json"), mtm.SPECS[name]))
    else:
        for m in a.model or [DEFAULT_MODEL]:
            jobs.append((m, os.path.join(a.out, fixture_name(m)), None))
    for path, out, spec in jobs:
        print(f"{path} -> {out}", file=sys.stderr)
        fx = make_fixture(path, a.steps, a.top_k, a.threads, spec, argv)
        with open(out, "w", encoding="utf-8") as f:
            f.write(dumps_compact(fx) + "\n")
        print(f"  wrote {out} ({os.path.getsize(out)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
