"""Hugging Face model directories vs transformers, and vs the same weights as GGUF.

* tools/make_tiny_hf.py regenerates the tiny directories (numpy only) byte-identical to what
  transformers' save_pretrained wrote when the fixtures were made (sha256 of every safetensors file);
* tests/golden_check: teacher-forced top-20 logits and 64 greedy tokens against transformers for
  llama / qwen2 / qwen3 in bf16, f16 and f32 (llama bf16 sharded);
* tests/hf_check: a directory and the GGUF of the same bf16 weights give bit-identical logits, and
  `--quantize q8_0|q4_0` at load gives bit-identical logits to a GGUF quantized by the gguf package;
* the CLI on a directory and on a repo id in a hub cache (info, tokenize against transformers'
  prompt ids, generation_config defaults), and clear errors for broken side files.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_tiny_hf as mth  # noqa: E402

FIX = os.path.join(ROOT, "tests", "fixtures", "golden")
BUILD = os.environ.get("DSP_BUILD_DIR", os.path.join(ROOT, "build", "release"))
DSPARK = os.environ.get("DSPARK_BIN", os.path.join(BUILD, "dspark"))


def fixture(name):
    with open(os.path.join(FIX, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return mth.make_all(str(tmp_path_factory.mktemp("tiny-hf")))


def run(*args, env=None, ok=True):
    r = subprocess.run([DSPARK, *args], capture_output=True, text=True, timeout=300, env=env)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.mark.parametrize("name", sorted(mth.HF_SPECS))
def test_regenerated_files_match_fixture(dirs, name):
    assert dirs[name][1] == fixture(name)["model_files_sha256"], (
        f"{name}: tools/make_tiny_hf.py no longer writes what transformers wrote; rerun tools/gen_golden.py --hf")


def test_one_model_is_sharded(dirs):
    d = dirs["tiny-llama-hf-bf16"][0]
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    assert len(dirs["tiny-llama-hf-bf16"][1]) > 1


@pytest.mark.parametrize("name", sorted(mth.HF_SPECS))
def test_golden(dirs, name):
    tool = os.path.join(BUILD, "tests", "golden_check")
    r = subprocess.run([tool, os.path.join(FIX, name + ".json"), dirs[name][0]], capture_output=True, text=True, timeout=1200)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr


def hf_check(a, b, *extra):
    r = subprocess.run([os.path.join(BUILD, "tests", "hf_check"), a, b, *extra], capture_output=True, text=True, timeout=600)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("base", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_directory_equals_gguf_bitwise(dirs, tmp_path, base):
    d = dirs[base + "-hf-bf16"][0]
    hf_check(d + ".gguf", d)  # llama: HF rotate-half rows permuted at load == GGUF's permuted rows
    for q in ("q8_0", "q4_0"):
        g = str(tmp_path / f"{base}-{q}.gguf")
        mth.write_gguf_twin(base, g, q)
        hf_check(g, d, "--quantize", q)


def test_quantize_thread_count_does_not_matter(dirs, tmp_path):
    d = dirs["tiny-qwen3-hf-bf16"][0]  # 2 threads above, 1 here: the same bits as the gguf package's
    g = str(tmp_path / "q.gguf")
    mth.write_gguf_twin("tiny-qwen3", g, "q8_0")
    hf_check(g, d, "--quantize", "q8_0", "--threads", "1")


def test_quantize_q4_k(tmp_path):
    """--quantize q4_k has no gguf-package oracle (its quantizer is checked byte for byte against
    llama.cpp's in test_dequant.py): on a Qwen3 whose every matrix has rows of whole super-blocks,
    the logits stay close to bf16 and closer than Q4_0's, and 1 or 2 threads give the same bits."""
    import make_random_hf as mrh
    d = str(tmp_path / "q256")
    mrh.make("qwen3-256", d)
    rms = {}
    for q in ("q4_k", "q4_0"):
        r = subprocess.run([os.path.join(BUILD, "tests", "hf_check"), d, d, "--quantize", q, "--close", "8"], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        rms[q] = float(r.stdout.split("rms ")[1].split()[0])
    assert 0 < rms["q4_k"] < rms["q4_0"], rms
    hf_check(d, d, "--quantize", "q4_k", "--quantize-a", "q4_k", "--threads-a", "1")


def test_info_json(dirs):
    d = dirs["tiny-llama-hf-bf16"][0]
    info = json.loads(run("info", d, "--json").stdout)
    assert info["format"] == "safetensors" and info["architecture"] == "llama"
    assert info["n_files"] == len(dirs["tiny-llama-hf-bf16"][1])
    assert info["n_layers"] == 3 and info["n_head_kv"] == 2 and info["tokenizer"]["vocab_size"] == 512
    assert info["tensor_types"]["BF16"]["tensors"] == 30
    assert info["chat_template"] is True and info["chat_template_origin"] == "tokenizer_config.json"
    gd = info["sampling_defaults"]
    assert gd["temperature"]["value"] == pytest.approx(0.7) and gd["temperature"]["source"].endswith("generation_config.json")
    assert gd["top_k"]["value"] == 40 and gd["min_p"]["source"] == "dspark default"


@pytest.mark.parametrize("name", ["tiny-llama-hf-bf16", "tiny-qwen2-hf-f16"])
def test_tokenize_matches_transformers(dirs, name):
    for p in fixture(name)["prompts"]:
        got = json.loads(run("tokenize", "-m", dirs[name][0], "--special", p["text"]).stdout)
        assert got == p["prompt_ids"], p["name"]


def test_repo_id_from_hub_cache(dirs, tmp_path):
    src = dirs["tiny-qwen3-hf-bf16"][0]
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny-org--tiny-qwen3"
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in os.listdir(src):  # as the hub cache lays them out: snapshot entries link to blobs
        shutil.copy(os.path.join(src, f), repo / "blobs" / f)
        os.symlink(os.path.join("..", "..", "blobs", f), snap / f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"))
    info = json.loads(run("info", "tiny-org/tiny-qwen3", "--json", env=env).stdout)
    assert info["path"] == str(snap) and info["architecture"] == "qwen3"
    assert json.loads(run("info", f"tiny-org/tiny-qwen3@{commit}", "--json", env=env).stdout)["path"] == str(snap)
    r = run("info", "tiny-org/tiny-qwen3@v2", env=env, ok=False)
    assert r.returncode != 0 and "not in the Hugging Face cache" in r.stderr and "dspark pull" in r.stderr
    r = run("info", "tiny-org/absent", env=env, ok=False)
    assert r.returncode != 0 and "tiny-org/absent" in r.stderr


BROKEN = [
    ("config.json", "{", "config.json: line"),
    ("config.json", '{"model_type": "bert"}', "model_type 'bert' is not supported"),
    ("config.json", '{"model_type": "llama", "vocab_size": 512, "hidden_size": "x"}', "\"hidden_size\" is not an integer"),
    ("tokenizer.json", '{"model": {"type": "WordPiece", "vocab": {}}}', "model type WordPiece is not supported"),
    ("tokenizer.json", '{"model": {"type": "Unigram", "vocab": []}}', "model type Unigram is not supported"),
    ("tokenizer.json", None, "normalizer Lowercase is not supported"),
    ("generation_config.json", '{"temperature": -1}', "\"temperature\" = -1 is out of range"),
    ("tokenizer_config.json", '{"chat_template": 5}', "neither a string nor a list"),
]


@pytest.mark.parametrize("fname,content,msg", BROKEN, ids=[f"{b[0]}-{i}" for i, b in enumerate(BROKEN)])
def test_broken_side_files(dirs, tmp_path, fname, content, msg):
    d = tmp_path / "m"
    shutil.copytree(dirs["tiny-qwen2-hf-f32"][0], d)
    if content is None:  # a real tokenizer.json with a normalizer we do not implement
        tj = json.loads((d / fname).read_text())
        tj["normalizer"] = {"type": "Lowercase"}
        content = json.dumps(tj)
    (d / fname).write_text(content)
    r = run("info", str(d), ok=False)
    assert r.returncode == 1 and msg in r.stderr, r.stderr
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr


def test_missing_and_corrupt_weights(dirs, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(dirs["tiny-qwen2-hf-f32"][0], d)
    st = d / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[:-10])
    r = run("generate", "-m", str(d), "-p", "hi", "-n", "1", ok=False)
    assert r.returncode == 1 and "model.safetensors" in r.stderr and "bytes of data" in r.stderr or "past the end" in r.stderr, r.stderr
    st.unlink()
    r = run("generate", "-m", str(d), "-p", "hi", "-n", "1", ok=False)
    assert r.returncode == 1 and "no weights" in r.stderr, r.stderr
