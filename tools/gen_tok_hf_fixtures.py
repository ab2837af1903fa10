#!/usr/bin/env python3
"""tokenizer.json fixtures: ids from the Hugging Face `tokenizers` package (the oracle).

For SmolLM2 and Gemma 3, transformers exports tokenizer.json from the GGUF files in models/ (its
GGUF converter); for the hand-made Metaspace / byte-fallback tokenizers (tools/make_tok_json.py
style, written below) the file is our own. `tokenizers` then encodes every string of
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


def main() -> int:
    from tokenizers import Tokenizer
    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    corpus = [json.loads(l) for l in open(os.path.join(FIX, "corpus.jsonl"), encoding="utf-8")]
    jobs = {}
    for name, gguf in [("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), ("gemma3", "gemma-3-270m-q4_k_m.gguf")]:
        d = os.path.join(OUT, name)
        if not os.path.exists(os.path.join(d, "tokenizer.json")) or "--export" in sys.argv:
            AutoTokenizer.from_pretrained(os.path.join(ROOT, "models"), gguf_file=gguf).save_pretrained(d)
        jobs[name] = d
    for name, scheme, split in [("metaspace-always", "always", True), ("metaspace-first-nosplit", "first", False)]:
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(metaspace_tokenizer(scheme, split), f, ensure_ascii=False, indent=2)
        jobs[name] = d
    for name, d in jobs.items():
        path = os.path.join(d, "tokenizer.json")
        tok = Tokenizer.from_file(path)
        sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
        out = os.path.join(FIX, f"hf-{name}.jsonl")
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps({"name": name, "tokenizer_sha256": sha, "tokenizers": tokenizers.__version__,
                                "transformers": transformers.__version__}) + "\n")
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
