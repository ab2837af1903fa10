"""CI-safe checks (numpy only) of the tiny drafter models and their reference traces.

* tools/make_tiny_drafters.py regenerates the target and every drafter bit for bit: each file's
  sha256 equals tests/fixtures/drafters/manifest.json (generator and fixtures cannot drift);
* the drafters are in their published layouts (tensor names, shapes, config keys);
* every trace in tests/fixtures/drafters/*.jsonl is internally consistent: draft = argmax of the
  recorded logits, the round arithmetic (pos, ctx_rows, kept, accepted, next) adds up to the
  committed tokens, which equal plain greedy decoding, and DSpark's confidence truncation follows
  DeepSpec's per-slot rule.

Run: .venv/bin/python -m pytest tests/py/test_tiny_drafters.py
"""

import glob
import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
FIX = os.path.join(ROOT, "tests", "fixtures", "drafters")

import numpy as np  # noqa: E402

import make_tiny_drafters as mtd  # noqa: E402


def load_file(path):
    """{name: float32 array} of a safetensors file (8-byte header length, JSON header, data)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(v["shape"])
    return out


def _manifest():
    with open(os.path.join(FIX, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def _runs(name):
    with open(os.path.join(FIX, name + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tiny-drafters"))
    return out, mtd.make_all(out)


def test_models_regenerate_bit_for_bit(made):
    _, hashes = made
    assert hashes == _manifest()["sha256"]


def test_layouts(made):
    out, _ = made
    cfg = {d: json.load(open(os.path.join(out, d, "config.json"), encoding="utf-8")) for d in mtd.DRAFTERS}
    t = {d: load_file(os.path.join(out, d, "model.safetensors")) for d in mtd.DRAFTERS + ("target",)}
    z = cfg["zlab-dflash-b16"]
    assert z["architectures"] == ["DFlashDraftModel"] and z["block_size"] == 16
    assert z["dflash_config"] == {"target_layer_ids": [1, 2], "mask_token_id": 511}
    assert "embed_tokens.weight" not in t["zlab-dflash-b16"] and t["zlab-dflash-b16"]["fc.weight"].shape == (64, 128)
    for d in ("deepspec-dflash-b7", "deepspec-dspark-b7"):
        c = cfg[d]
        assert c["architectures"] == ["Qwen3DSparkModel"] and c["block_size"] == 7
        assert "rope_theta" not in c and c["rope_parameters"]["rope_theta"] == 1e6
        assert (t[d]["embed_tokens.weight"] == t["target"]["model.embed_tokens.weight"]).all()
        assert (t[d]["lm_head.weight"] == t["target"]["lm_head.weight"]).all()
    ds = t["deepspec-dspark-b7"]
    assert ds["markov_head.markov_w1.weight"].shape == (512, 80)
    assert ds["markov_head.markov_w2.weight"].shape == (512, 80)
    assert ds["confidence_head.proj.weight"].shape == (1, 144) and ds["confidence_head.proj.bias"].shape == (1,)
    assert cfg["deepspec-dflash-b7"]["markov_rank"] == 0 and not cfg["deepspec-dflash-b7"]["enable_confidence_head"]
    mo = t["modelopt-dspark-b7"]
    assert cfg["modelopt-dspark-b7"]["dflash_config"]["projector_type"] == "dspark"
    assert (mo["markov_w1.weight"] == ds["markov_head.markov_w1.weight"]).all()
    assert (mo["confidence_proj.weight"] == ds["confidence_head.proj.weight"]).all()
    assert not any(k.startswith(("markov_head.", "confidence_head.", "embed_tokens", "lm_head")) for k in mo)


@pytest.mark.parametrize("name", mtd.DRAFTERS)
def test_trace_consistency(name):
    runs = _runs(name)
    assert runs, name
    block = 16 if name.startswith("zlab") else 7
    n_draft = block - 1 if name.startswith("zlab") else block
    dspark = "dspark" in name
    for run in runs:
        assert run["format"] == "dspark-drafter-trace-v1" and run["drafter"] == name
        pos = len(run["prompt_ids"])
        committed = [run["output_ids"][0]]
        ctx = len(run["prompt_ids"])
        cap = run["max_draft"] if run["max_draft"] is not None else n_draft
        for rd in run["rounds"]:
            assert rd["pos"] == pos and rd["ctx_rows"] == ctx
            assert len(rd["draft"]) == n_draft == len(rd["top"])
            for d, top in zip(rd["draft"], rd["top"]):
                assert top["ids"][0] == d
                assert top["vals"] == sorted(top["vals"], reverse=True)
                assert math.isclose(top["margin"], top["vals"][0] - top["vals"][1], abs_tol=1e-5)
            k = min(n_draft, cap)
            if dspark:
                assert len(rd["conf"]) == block
                if run["threshold"] > 0:
                    below = [i for i, c in enumerate(rd["conf"]) if 1 / (1 + math.exp(-c)) < run["threshold"]]
                    k = min(below[0] if below else block, cap)
            else:
                assert "conf" not in rd
            assert rd["kept"] == k and 0 <= rd["accepted"] <= k
            assert len(rd["target_margin"]) == k + 1
            committed += rd["draft"][:rd["accepted"]] + [rd["next"]]
            pos += rd["accepted"] + 1
            ctx = rd["accepted"] + 1
        n = min(len(committed), len(run["output_ids"]))
        assert committed[:n] == run["output_ids"][:n]
        m = min(len(run["output_ids"]), len(run["greedy_ids"]))
        assert m >= run["max_new_tokens"] or run["output_ids"][m - 1] in run["stop_ids"]
        assert run["output_ids"][:m] == run["greedy_ids"][:m]


def test_traces_accept_drafts():
    """The tiny drafters are built to draft well: a trace where nothing is accepted would not test
    the accept/rollback path."""
    for name in mtd.DRAFTERS:
        rounds = [rd for run in _runs(name) for rd in run["rounds"]]
        mean = sum(rd["accepted"] + 1 for rd in rounds) / len(rounds)
        assert mean > 1.5, (name, mean)
        # DFlash slots all copy the anchor (they predict its successor): at most 1 accepted
        most = 3 if "dspark" in name else 1
        assert any(rd["accepted"] >= most for rd in rounds), name


def test_dspark_runs_truncate_sometimes():
    rounds = [rd for run in _runs("deepspec-dspark-b7") if run["threshold"] > 0 for rd in run["rounds"]]
    kept = {rd["kept"] for rd in rounds}
    assert 0 in kept or 1 in kept
    assert len(kept) >= 4


def test_every_fixture_has_a_generator_entry():
    names = {os.path.basename(p)[:-6] for p in glob.glob(os.path.join(FIX, "*.jsonl"))}
    assert names == set(mtd.DRAFTERS)
