"""tokenizer.json tokenizers vs the Hugging Face `tokenizers` package (fixtures by
tools/gen_tok_hf_fixtures.py): ids for all 2,420 corpus strings and the decode of those ids.

* hand-made Metaspace / byte-fallback tokenizers (prepend_scheme always + split, first + no split):
  regenerated here from the generator (sha256 checked against the fixture), always run;
* SmolLM2 and Gemma 3 tokenizer.json as transformers exports them from the GGUFs in models/: too
  large to commit; run when tools/gen_tok_hf_fixtures.py has written them to build/tok-hf/
  (sha256 checked), skipped visibly otherwise.
"""

import hashlib
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_tok_hf_fixtures as gen  # noqa: E402

FIX = os.path.join(ROOT, "tests", "fixtures", "tok")
BUILD = os.environ.get("DSP_BUILD_DIR", os.path.join(ROOT, "build", "release"))


def header(name):
    with open(os.path.join(FIX, f"hf-{name}.jsonl"), encoding="utf-8") as f:
        return json.loads(f.readline())


def check(d, name):
    sha = hashlib.sha256(open(os.path.join(d, "tokenizer.json"), "rb").read()).hexdigest()
    assert sha == header(name)["tokenizer_sha256"], f"{d}/tokenizer.json is not the file the fixture was made from"
    r = subprocess.run([os.path.join(BUILD, "tests", "tok_json_check"), d, os.path.join(FIX, f"hf-{name}.jsonl"),
                        os.path.join(FIX, "corpus.jsonl")], capture_output=True, text=True, timeout=600)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name,scheme,split", [("metaspace-always", "always", True), ("metaspace-first-nosplit", "first", False)])
def test_metaspace(tmp_path, name, scheme, split):
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(gen.metaspace_tokenizer(scheme, split), f, ensure_ascii=False, indent=2)
    check(str(tmp_path), name)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_exported(name):
    d = os.path.join(ROOT, "build", "tok-hf", name)
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        pytest.skip(f"{d}/tokenizer.json absent: tools/gen_tok_hf_fixtures.py exports it (needs transformers)")
    check(d, name)


def test_qwen2_nfc(tmp_path):
    """A Qwen2/Qwen3-style tokenizer.json (NFC normalizer, Qwen2's Split regex, ByteLevel) over
    SmolLM2's vocabulary, regenerated from the GGUF in models/ with the gguf package."""
    gguf = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(gguf):
        pytest.skip(f"{gguf} absent (scripts/fetch-models)")
    gen.write_json(str(tmp_path / "tokenizer.json"), gen.qwen2_style_tokenizer(gguf))
    check(str(tmp_path), "qwen2-nfc")
