#!/usr/bin/env python3
"""tokenizer.json fixtures: ids from the Hugging Face `tokenizers` package (the oracle).

For SmolLM2 and Gemma 3, transformers exports tokenizer.json from the GGUF files in models/ (its
GGUF converter); for the hand-made Metaspace / byte-fallback tokenizers (tools/make_tok_json.py
style, written below) the file is our own, and so is "qwen2-nfc": SmolLM2's vocabulary and merges
laid out as transformers' Qwen2 converter writes a Qwen2/Qwen3 tokenizer.json (NFC normalizer,
Qwen2's Split regex, ByteLevel without its own regex), which exercises the NFC normalizer on a real
vocabulary (88 corpus strings are not NFC). `tokenizers` then encodes every string of
tests/fixtures/tok/corpus.jsonl (add_special_tokens=False) and decodes the ids back.

Writes build/tok-hf/<name>/tokenizer.json (+ tokenizer_config.json) and
tests/fixtures/tok/hf-<name>.jsonl: a header line {"name", "tokenizer_sha256", versions}, then
{"i", "ids"[, "decoded"]} per corpus string ("decoded": tokenizers' decode of ids when it is not the text).
The Gemma 3 and SmolLM2 tokenizer.json files are too large to commit; tests that need them skip
visibly when build/tok-hf is absent. Needs requirements-tools.txt.
"""
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "build", "tok-hf")
FIX = os.path.join(ROOT, "tests", "fixtures", "tok")


def metaspace_tokenizer(prepend_scheme: str, split: bool) -> dict:
    """A small SentencePiece-style BPE: Metaspace, byte fallback, ByteFallback/Fuse/Metaspace decoder."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    words = ["▁", "e", "t", "a", "o", "n", "h", "s", "r", "l", "i", "d", "▁t", "he", "▁the", "▁a", "in", "er", "an", "▁s",
             "on", "re", "▁he", "ll", "▁w", "or", "▁o", "▁b", "at", "en", "▁c", "it", "is", "▁is", "▁it", "▁in", "▁an",
             "▁hello", "hello", "▁wor", "ld", "▁world", "▁▁", "▁▁▁", "x▁", "é", "▁é", "T", "H", "W", ",", ".", "!", "?"]
    vocab = {p: i for i, p in enumerate(pieces + words)}
    merges = []
    for w in words:
        if len(w) > 1:
            for k in range(1, len(w)):
                a, b = w[:k], w[k:]
                if a in vocab and b in vocab and [a, b] not in merges:
                    merges.append([a, b])
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
             for i, c in enumerate(["<unk>", "<s>", "</s>"])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": prepend_scheme, "split": split},
            "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                          {"type": "ByteFallback"}, {"type": "Fuse"},
                                                          {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": True, "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges}}


# transformers' Qwen2Converter: the pre-tokenizer regex of Qwen2 and Qwen3
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def qwen2_style_tokenizer(gguf_path: str) -> dict:
    """The byte-level vocabulary, merges and control tokens of a GGUF file (gguf package only, so CI
    can regenerate it) in the layout of a Qwen2/Qwen3 tokenizer.json."""
    from gguf import GGUFReader
    r = GGUFReader(gguf_path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
             for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [m.split(" ") for m in merges]}}


def write_json(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)


def main() -> int:
    """usage: gen_tok_hf_fixtures.py [--export] [--only=NAME,...]"""
    from tokenizers import Tokenizer
    import tokenizers

    corpus = [json.loads(l) for l in open(os.path.join(FIX, "corpus.jsonl"), encoding="utf-8")]
    names = ["smollm2", "gemma3", "metaspace-always", "metaspace-first-nosplit", "qwen2-nfc"]
    only = [a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--only=")]
    jobs, versions = {}, {"tokenizers": tokenizers.__version__}
    for name in (n for n in names if not only or n in only[0]):
        d = jobs[name] = os.path.join(OUT, name)
        gguf = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}.get(name)
        if gguf:  # exported by transformers
            import transformers
            from transformers import AutoTokenizer
            versions["transformers"] = transformers.__version__
            if not os.path.exists(os.path.join(d, "tokenizer.json")) or "--export" in sys.argv:
                AutoTokenizer.from_pretrained(os.path.join(ROOT, "models"), gguf_file=gguf).save_pretrained(d)
        elif name == "qwen2-nfc":
            write_json(os.path.join(d, "tokenizer.json"), qwen2_style_tokenizer(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")))
        else:
            write_json(os.path.join(d, "tokenizer.json"), metaspace_tokenizer(name.split("-")[1], name == "metaspace-always"))
    for name, d in jobs.items():
        path = os.path.join(d, "tokenizer.json")
        tok = Tokenizer.from_file(path)
        sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
        out = os.path.join(FIX, f"hf-{name}.jsonl")
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps({"name": name, "tokenizer_sha256": sha, **versions}) + "\n")
            for c in corpus:  # invalid UTF-8 is read as Python's errors="replace" (as dspark does)
                text = c["text"] if "text" in c else bytes.fromhex(c["hex"]).decode("utf-8", "replace")
                ids = tok.encode(text, add_special_tokens=False).ids
                dec = tok.decode(ids, skip_special_tokens=False)
                row = {"i": c["i"], "ids": ids}
                if dec != text:  # the decode round trip is exact unless this says otherwise
                    row["decoded"] = dec
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(corpus)} strings -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
