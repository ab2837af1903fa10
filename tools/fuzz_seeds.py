#!/usr/bin/env python3
"""Seed inputs for the libFuzzer targets that have no C seed writer (scripts/fuzz runs this).

  fuzz_tok_json: small tokenizer.json files of every kind tok_hf.c accepts (byte-level with Split /
                 Digits / NFC, Metaspace with byte fallback, Replace/Prepend), each followed by a NUL
                 and a text, as fuzz/fuzz_tok_json.c reads them;
  fuzz_nfc:      texts with combining marks, Hangul jamo, singletons and exclusions.
usage: tools/fuzz_seeds.py TARGET OUT_DIR   (standard library only)
"""
import json
import os
import sys

TEXTS = ["Hello, world!", "cafe\u0301 \u212b \u0958 \u1112\u1161\u11ab \uac00\u11a8", "a\u0301\u0316\u0300 s\u0307\u0323",
         "<s>x</s> <|endoftext|>  12 345", "\u65e5\u672c\u8a9e \U0001f600 \t\n", "\u0344\u0f73\u1f82"]


def byte_level(nfc: bool, split: bool) -> dict:
    alphabet = [chr(c) for c in range(0x21, 0x7F)] + ["\u0120", "\u010a", "\u0109", "\u00c3", "\u00a9", "\u00cc", "\u0123"]
    vocab = {t: i for i, t in enumerate(["<|endoftext|>"] + alphabet + ["\u0120t", "he", "\u0120the", "\u00c3\u00a9"])}
    pre = [{"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?\\p{L}+|\\s+"}, "behavior": "Isolated", "invert": False}] if split else []
    pre.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": not split})
    return {"version": "1.0", "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                                                "rstrip": False, "normalized": False, "special": True}],
            "normalizer": {"type": "NFC"} if nfc else None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
            "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": ["\u0120 t", "h e", "\u0120t he", ["\u00c3", "\u00a9"]],
                      "ignore_merges": split}}


def metaspace(replace: bool) -> dict:
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "a", "b", "\u2581a", "ab"])}
    norm = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    return {"added_tokens": [{"id": i, "content": c, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])],
            "normalizer": norm if replace else None,
            "pre_tokenizer": None if replace else {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
            "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                          {"type": "ByteFallback"}, {"type": "Fuse"},
                                                          {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
                               "special_tokens": {"<s>": {"ids": [1]}}},
            "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "vocab": vocab, "merges": ["\u2581 a", "a b"]}}


def main() -> int:
    target, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    seeds = []
    if target == "fuzz_tok_json":
        docs = [byte_level(nfc, split) for nfc in (False, True) for split in (False, True)] + [metaspace(False), metaspace(True)]
        seeds = [json.dumps(d, ensure_ascii=False).encode() + b"\0" + t.encode() for d in docs for t in TEXTS[:3]]
    elif target == "fuzz_nfc":
        seeds = [t.encode() for t in TEXTS]
    else:
        print(f"fuzz_seeds: no seeds for {target}", file=sys.stderr)
        return 2
    for i, s in enumerate(seeds):
        with open(os.path.join(out, f"seed-{i:03d}"), "wb") as f:
            f.write(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
