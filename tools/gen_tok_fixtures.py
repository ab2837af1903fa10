#!/usr/bin/env python3
"""Run the Hugging Face oracle over the tokenizer corpus and write the expected ids.

For each model, tests/fixtures/tok/<model>.jsonl gets a header line
  {"model": file, "transformers": version, "tokenizers": version, "prefix": [...], "suffix": [...]}
then one line per corpus string:
  {"i": index, "ids": [...]}          ids with add_special_tokens=False, split_special_tokens=True
                                       (= dspark flags 0: no BOS/EOS, special-token text is plain text)
  "sp": [...]   only when tok(text) (add special + parse special = dspark ADD_SPECIAL|PARSE_SPECIAL)
                differs from prefix + ids + suffix
  "dec": "..."  only when tok.decode(ids) differs from the text
Invalid-UTF-8 corpus entries are given to the oracle as bytes.decode("utf-8", "replace").

The oracle is AutoTokenizer.from_pretrained(models_dir, gguf_file=...) exactly as transformers
builds it from the GGUF metadata (needs transformers + tokenizers + torch + gguf: not in the CI venv,
hence the committed output).

usage: tools/gen_tok_fixtures.py [--models DIR] [--corpus PATH] [--outdir DIR]
"""
import argparse
import json
import os

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="models")
    ap.add_argument("--corpus", default="tests/fixtures/tok/corpus.jsonl")
    ap.add_argument("--outdir", default="tests/fixtures/tok")
    args = ap.parse_args()

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    corpus = [json.loads(line) for line in open(args.corpus, encoding="utf-8")]
    texts = [c["text"] if "text" in c else bytes.fromhex(c["hex"]).decode("utf-8", "replace") for c in corpus]
    for model in MODELS:
        tok = AutoTokenizer.from_pretrained(args.models, gguf_file=model)
        empty = tok("")["input_ids"]
        # The post-processor wraps the sequence; read its prefix/suffix off the empty string.
        prefix, suffix = empty, []
        name = model[: -len(".gguf")]
        out = os.path.join(args.outdir, name + ".jsonl")
        n_sp = n_dec = 0
        with open(out, "w", encoding="utf-8") as f:
            head = {"model": model, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                    "prefix": prefix, "suffix": suffix}
            f.write(json.dumps(head) + "\n")
            for c, text in zip(corpus, texts):
                ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                sp = tok(text)["input_ids"]
                rec = {"i": c["i"], "ids": ids}
                if sp != prefix + ids + suffix:
                    rec["sp"] = sp
                    n_sp += 1
                dec = tok.decode(ids)
                if dec != text:
                    rec["dec"] = dec
                    n_dec += 1
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        print(f"{out}: {len(corpus)} strings, {n_sp} with special-token differences, {n_dec} lossy decodes")


if __name__ == "__main__":
    main()
