"""CI-safe checks (numpy + gguf only) of the tiny random-weight models and the golden fixtures.

* tools/make_tiny_models.py regenerates every tiny model bit-for-bit: its sha256 equals the one
  recorded in tests/fixtures/golden/tiny-<name>.json (generator and fixtures cannot drift);
* the files are laid out as llama.cpp writes them (names, types, permuted llama Q/K, rope_freqs);
* every fixture is internally consistent (greedy token == top-1, margins, ordering).

Run: .venv/bin/python -m pytest tests/py
"""

import glob
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gguf  # noqa: E402
import make_tiny_models as mtm  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "golden")


def _fixture(name):
    with open(os.path.join(FIXTURES, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return mtm.make_all(str(tmp_path_factory.mktemp("tiny-models")))


def test_every_spec_has_a_fixture_and_back():
    fixtures = {os.path.basename(p)[:-5] for p in glob.glob(os.path.join(FIXTURES, "tiny-*.json")) if "-hf-" not in p}
    assert fixtures == set(mtm.SPECS)


@pytest.mark.parametrize("name", sorted(mtm.SPECS))
def test_regenerated_sha256_matches_fixture(made, name):
    path, sha = made[name]
    assert sha == mtm.sha256_file(path)
    assert sha == _fixture(name)["model_sha256"], (
        f"{name}: tools/make_tiny_models.py no longer reproduces the model the fixture was made "
        f"from; rerun tools/gen_golden.py --tiny")


def test_generation_is_reproducible(made, tmp_path):
    again = mtm.make_all(str(tmp_path))
    assert {n: s for n, (_, s) in again.items()} == {n: s for n, (_, s) in made.items()}


def test_permutation_roundtrip():
    w = np.arange(4 * 32 * 8, dtype=np.float32).reshape(4 * 32, 8)
    p = mtm.permute_qk(w, 4)
    assert not np.array_equal(p, w)
    assert np.array_equal(mtm.unpermute_qk(p, 4), w)
    # within a head, GGUF rows are the interleaved pairs (x0, y0, x1, y1, ...) of HF's halves
    assert np.array_equal(p[0], w[0]) and np.array_equal(p[1], w[16]) and np.array_equal(p[2], w[1])


@pytest.mark.parametrize("name", sorted(mtm.SPECS))
def test_gguf_layout(made, name):
    spec = mtm.SPECS[name]
    arch = spec["arch"]
    r = gguf.GGUFReader(made[name][0])
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert f["general.architecture"] == arch
    assert f[f"{arch}.embedding_length"] == spec["dim"]
    assert f[f"{arch}.attention.head_count"] == spec["n_heads"]
    assert f[f"{arch}.attention.head_count_kv"] == spec["n_kv_heads"] < spec["n_heads"]
    assert f[f"{arch}.attention.key_length"] == spec["head_dim"]
    assert f[f"{arch}.rope.freq_base"] == spec["rope_base"]
    # llama.cpp asserts on an unknown rope.scaling.type and applies rope.scaling.factor linearly
    assert not any(k.startswith(f"{arch}.rope.scaling.") for k in f)
    assert len(r.fields["tokenizer.ggml.tokens"].data) == spec["vocab"]
    names = {t.name: t for t in r.tensors}
    assert ("output.weight" in names) == (not spec["tied"])
    assert ("rope_freqs.weight" in names) == (spec["rope_scaling"] is not None)
    assert ("blk.0.attn_q.bias" in names) == (arch == "qwen2")
    assert ("blk.0.attn_q_norm.weight" in names) == (arch == "qwen3")
    assert f"blk.{spec['n_layers'] - 1}.ffn_down.weight" in names
    q = names["blk.0.attn_q.weight"]
    assert list(q.shape) == [spec["dim"], spec["n_heads"] * spec["head_dim"]]  # ggml ne order
    if spec["quant"] == "q8_0":
        assert q.tensor_type == gguf.GGMLQuantizationType.Q8_0
        assert names["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    else:
        assert q.tensor_type == gguf.GGMLQuantizationType.F32
    # reading the file back and undoing llama's permutation gives exactly the HF weights
    hf = mtm.hf_weights(spec)
    for hf_name, want in hf.items():
        t = names[mtm.gguf_name(hf_name)]
        got = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(want.shape)
        if arch == "llama" and ".attn_q." in t.name:
            got = mtm.unpermute_qk(got, spec["n_heads"])
        elif arch == "llama" and ".attn_k." in t.name:
            got = mtm.unpermute_qk(got, spec["n_kv_heads"])
        assert np.array_equal(got, want), hf_name


def test_llama3_rope_freqs_values():
    spec = mtm.SPECS["tiny-llama"]
    ff = mtm.llama3_rope_freqs(spec)
    rs = spec["rope_scaling"]
    assert ff.shape == (spec["head_dim"] // 2,)
    assert ff[0] == 1.0 and ff[-1] == rs["factor"]
    assert np.all(np.diff(ff) >= 0)
    # at least one frequency in the smoothed band, so the interpolation is exercised
    assert np.any((ff > 1.0) & (ff < rs["factor"]))


def _check_fixture(fx):
    assert fx["format"] == "dspark-golden-v1"
    steps, k = fx["steps"], fx["top_k"]
    hf_dir = "hf_spec" in fx  # tiny HF directories: 4 prompts (tests/py/test_hf_models.py)
    assert len(fx["prompts"]) >= (4 if hf_dir else 8)
    for p in fx["prompts"]:
        assert len(p["prompt_ids"]) == p["n_prompt"] >= 1
        assert len(p["tokens"]) == len(p["top_ids"]) == len(p["top_logits"]) == len(p["margins"]) == steps
        for s in range(steps):
            ids, lg = p["top_ids"][s], p["top_logits"][s]
            assert len(ids) == len(lg) == k and len(set(ids)) == k
            assert p["tokens"][s] == ids[0]
            assert all(a >= b for a, b in zip(lg, lg[1:]))
            assert np.float32(p["margins"][s]) == np.float32(lg[0]) - np.float32(lg[1])
    kinds = {p["kind"] for p in fx["prompts"]}
    if hf_dir:
        assert {"text", "chat"} <= kinds
        return
    assert {"text", "chat", "one_token"} <= kinds
    assert any(p["n_prompt"] == 1 for p in fx["prompts"])
    assert any(p["n_prompt"] >= 250 for p in fx["prompts"])


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(FIXTURES, "*.json"))),
                         ids=lambda p: os.path.basename(p))
def test_fixture_consistent(path):
    with open(path, encoding="utf-8") as f:
        fx = json.load(f)
    _check_fixture(fx)
    if "roundtrip" in fx:
        assert fx["roundtrip"]["max_abs_logit_diff"] == 0.0
        assert fx["roundtrip"]["max_abs_weight_diff"] == 0.0


def test_real_model_matches_fixture():
    fx = _fixture("smollm2-135m-instruct-q4_1")
    path = os.path.join(os.environ.get("DSP_MODELS", os.path.join(ROOT, "models")), fx["model_file"])
    if not os.path.exists(path):
        pytest.skip(f"{path} absent (scripts/fetch-models fetches it)")
    assert mtm.sha256_file(path) == fx["model_sha256"]
