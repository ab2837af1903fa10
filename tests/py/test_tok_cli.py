"""`dspark tokenize` / `dspark detokenize` against the committed Hugging Face fixtures.

The full corpus is checked through the C API by tests/test_tok_fixtures.c; here a sample goes
through the command line (argument and --file input, --special, --no-bos, JSON output, round trip,
errors). Skips when the model files are absent."""
import json
import os
import subprocess

import pytest

BIN = os.environ.get("DSPARK_BIN", "build/release/dspark")
MODELS = os.environ.get("DSP_MODELS", "models")
FIX = os.path.join(os.environ.get("DSP_FIXTURES", "tests/fixtures"), "tok")
NAMES = ["SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m"]


def run(*args, ok=True):
    p = subprocess.run([BIN, *args], capture_output=True)
    if ok:
        assert p.returncode == 0, p.stderr.decode(errors="replace")
    return p


def load(name):
    corpus = [json.loads(line) for line in open(os.path.join(FIX, "corpus.jsonl"), encoding="utf-8")]
    lines = open(os.path.join(FIX, name + ".jsonl"), encoding="utf-8").read().splitlines()
    return corpus, json.loads(lines[0]), [json.loads(x) for x in lines[1:]]


@pytest.mark.parametrize("name", NAMES)
def test_cli_matches_fixtures(name, tmp_path):
    model = os.path.join(MODELS, name + ".gguf")
    if not os.path.exists(model):
        pytest.skip(f"{model} absent")
    corpus, head, recs = load(name)
    picked = [i for i, c in enumerate(corpus) if "text" in c and c["text"] and "\x00" not in c["text"]][::200]
    assert len(picked) >= 10
    for i in picked:
        text = corpus[i]["text"]
        f = tmp_path / "in.txt"
        f.write_bytes(text.encode())
        plain = json.loads(run("tokenize", "-m", model, "--no-bos", "--file", str(f)).stdout)
        assert plain == recs[i]["ids"], (i, text)
        sp = json.loads(run("tokenize", "-m", model, "--special", "--file", str(f)).stdout)
        assert sp == recs[i].get("sp", head["prefix"] + recs[i]["ids"] + head["suffix"]), (i, text)
        if not text.startswith("-"):
            assert json.loads(run("tokenize", "-m", model, "--no-bos", text).stdout) == plain
        out = run("detokenize", "-m", model, *map(str, plain)).stdout
        assert out == (recs[i].get("dec", text) + "\n").encode(), (i, text)


@pytest.mark.parametrize("name", NAMES)
def test_cli_errors_and_help(name):
    model = os.path.join(MODELS, name + ".gguf")
    for cmd in ("tokenize", "detokenize"):
        p = run(cmd, "--help")
        assert b"usage: dspark " + cmd.encode() in p.stdout
    assert run("tokenize", "x", ok=False).returncode == 1  # no model
    assert run("tokenize", "-m", "/nonexistent.gguf", "x", ok=False).returncode == 1
    if os.path.exists(model):
        p = run("detokenize", "-m", model, "99999999", ok=False)
        assert p.returncode == 1 and b"out of range" in p.stderr
        assert run("detokenize", "-m", model, "12x", ok=False).returncode == 1
