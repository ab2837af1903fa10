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
  "hf_gguf": [...]  only for files listed in DIGIT_SPLIT_PRES (below) and only when the converter's
                unmodified tokenizer gives other ids than the model's own pre-tokenizer (see there)
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

# tokenizer.ggml.pre values whose tokenizer.json runs Digits(individual_digits=True) before the
# GPT-2 ByteLevel regex (llama.cpp lists the same set with a leading \p{N} split). transformers'
# GGUF converter (integrations/gguf/gguf_tokenizer_mapping.py, GGUF_PRE_TOKENIZER_SPLITS) does not
# know these names and falls back to plain ByteLevel, which the models were not trained with: with
# SmolLM2, "  7" becomes [" ", " ", "7"] instead of ["  ", "7"] and " ½" one piece instead of two.
# We set the oracle's pre-tokenizer to the model's own (still HF tokenizers doing all the work) and
# keep the converter's ids as "hf_gguf" wherever they differ, so the difference stays visible.
DIGIT_SPLIT_PRES = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}


def gguf_pre(path):
    from gguf import GGUFReader

    f = GGUFReader(path).fields.get("tokenizer.ggml.pre")
    return bytes(f.parts[f.data[0]]).decode() if f else None


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
        raw = None
        pre = gguf_pre(os.path.join(args.models, model))
        if pre in DIGIT_SPLIT_PRES:
            from tokenizers import pre_tokenizers

            raw = AutoTokenizer.from_pretrained(args.models, gguf_file=model)
            tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True),
                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        empty = tok("")["input_ids"]
        # The post-processor wraps the sequence; read its prefix/suffix off the empty string.
        prefix, suffix = empty, []
        name = model[: -len(".gguf")]
        out = os.path.join(args.outdir, name + ".jsonl")
        n_sp = n_dec = n_raw = 0
        with open(out, "w", encoding="utf-8") as f:
            head = {"model": model, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                    "prefix": prefix, "suffix": suffix, "pre": pre,
                    "pre_tokenizer_set_to_model_own": raw is not None}
            f.write(json.dumps(head) + "\n")
            for c, text in zip(corpus, texts):
                ids = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                sp = tok(text)["input_ids"]
                rec = {"i": c["i"], "ids": ids}
                if sp != prefix + ids + suffix:
                    rec["sp"] = sp
                    n_sp += 1
                if raw is not None:
                    r = raw(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                    if r != ids:
                        rec["hf_gguf"] = r
                        n_raw += 1
                dec = tok.decode(ids)
                if dec != text:
                    rec["dec"] = dec
                    n_dec += 1
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        print(f"{out}: {len(corpus)} strings, {n_sp} with special-token differences, {n_dec} lossy decodes, "
              f"{n_raw} where the unmodified GGUF converter differs")


if __name__ == "__main__":
    main()
