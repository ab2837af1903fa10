"""The block drafters against their reference implementations: `dspark generate --trace-rounds`
on the tiny target with every published drafter layout must reproduce the reference round traces
of tests/fixtures/drafters/ (z-lab's `dflash` package and DeepSpec's code on the same weights; the
format and the comparison rules are in that directory's README.md):

* pos, ctx_rows, kept, accepted and next equal in every round;
* every draft slot whose reference top-1/top-2 margin is at least TOL: the draft, the top-3 ids
  and their logits (DSpark: Markov-corrected) within TOL; DSpark's confidence logits within TOL;
* the committed tokens equal the reference's (and plain greedy decoding) on their common length.

TOL = 1e-3 logit units: the engine's float32 forward differs from PyTorch's only in summation
order (the golden forward fixtures agree within 5e-4), so an argmax can only differ where the
reference margin is below twice that. Rounds whose draft block and bonus token would run past max_new_tokens are
not compared (the engine shrinks its cap there, the reference loops never do).

Also: bad drafter directories (another target's, truncated weights, tap layers out of range, a mask
token outside the vocabulary) are refused with a message that says what is wrong.

Needs numpy (the test venv) to regenerate the models with tools/make_tiny_drafters.py.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
FIX = os.path.join(ROOT, "tests", "fixtures", "drafters")
BUILD = os.environ.get("DSP_BUILD_DIR", os.path.join(ROOT, "build", "release"))
DSPARK = os.environ.get("DSPARK_BIN", os.path.join(BUILD, "dspark"))
TOL = 1e-3

import make_tiny_drafters as mtd  # noqa: E402

DRAFTERS = ["zlab-dflash-b16", "deepspec-dflash-b7", "deepspec-dspark-b7", "modelopt-dspark-b7", "deepspec-dspark-gated-b7",
            "deepspec-dspark-rnn-b7"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tiny-drafters"))
    mtd.make_all(out)
    return out


def runs(name):
    with open(os.path.join(FIX, name + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def dspark(*args, ok=True):
    r = subprocess.run([DSPARK, *args], capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def logit(p):
    return -math.inf if p <= 0 else math.inf if p >= 1 else math.log(p / (1 - p))


def compare_run(run, got, out_ids):
    """Returns (rounds compared, slots compared, slots skipped); asserts on a mismatch."""
    name = f"{run['drafter']}/{run['prompt']}/tau={run['threshold']}/cap={run['max_draft']}"
    end = len(run["prompt_ids"]) + run["max_new_tokens"]
    dspark_ = "dspark" in run["drafter"]
    n_rounds = n_slots = n_skip = 0
    for i, ref in enumerate(run["rounds"]):
        # the drafts sit at pos+1..pos+len(draft), the bonus at pos+len(draft)+1, which must be a
        # position below prompt + max_new_tokens for the engine to verify the whole block (the
        # fixtures' README says "+ 1 <=", one short: the bonus needs a position too)
        if ref["pos"] + len(ref["draft"]) + 2 > end:
            break
        assert i < len(got), f"{name}: the engine ran {len(got)} rounds, the reference more"
        g = got[i]
        where = f"{name} round {i} (pos {ref['pos']})"
        assert g["pos"] == ref["pos"] and g["ctx_rows"] == ref["ctx_rows"], (where, g["pos"], g["ctx_rows"])
        assert len(g["draft"]) == len(ref["draft"]), where
        for k, (d, top) in enumerate(zip(ref["draft"], ref["top"])):
            if top["margin"] < TOL:
                n_skip += len(ref["draft"]) - k if dspark_ else 1
                if dspark_:
                    break  # the Markov chain carries the tie onwards
                continue
            gt = g["top"][k]
            assert g["draft"][k] == d, (where, "slot", k, g["draft"][k], d)
            assert gt["ids"][0] == top["ids"][0], (where, k)
            for j in (1, 2):
                if abs(top["vals"][j] - top["vals"][j - 1]) >= TOL and (j == 2 or abs(top["vals"][2] - top["vals"][1]) >= TOL):
                    assert gt["ids"][j] == top["ids"][j], (where, k, gt["ids"], top["ids"])
            assert set(gt["ids"]) == set(top["ids"]) or abs(top["vals"][2] - top["vals"][1]) < TOL, (where, k)
            for a, b in zip(gt["vals"], top["vals"]):
                assert abs(a - b) <= TOL, (where, k, gt["vals"], top["vals"])
            if dspark_:
                assert abs(g["conf"][k] - ref["conf"][k]) <= TOL, (where, "conf", k, g["conf"][k], ref["conf"][k])
            n_slots += 1
        if dspark_ and run["threshold"] > 0:
            lt = logit(run["threshold"])
            assert all(abs(c - lt) >= TOL for c in ref["conf"][:ref["kept"] + 1]), f"{where}: a confidence is at the threshold"
        assert all(m >= TOL for m in ref["target_margin"][:ref["accepted"] + 1]), f"{where}: a deciding target margin is a tie"
        assert (g["kept"], g["accepted"], g["next"]) == (ref["kept"], ref["accepted"], ref["next"]), (
            where, (g["kept"], g["accepted"], g["next"]), (ref["kept"], ref["accepted"], ref["next"]))
        n_rounds += 1
    common = min(len(out_ids), len(run["output_ids"]))
    assert out_ids[:common] == run["output_ids"][:common], f"{name}: committed tokens differ"
    assert common >= min(run["max_new_tokens"], len(run["output_ids"])) - 1 or 2 in out_ids, name
    return n_rounds, n_slots, n_skip


@pytest.mark.parametrize("name", DRAFTERS)
def test_traces_match_reference(models, tmp_path, name):
    total_rounds = total_slots = total_skip = 0
    for run in runs(name):
        trace = str(tmp_path / "trace.jsonl")
        n_draft = 15 if name.startswith("zlab") else 7
        cap = run["max_draft"] if run["max_draft"] is not None else n_draft
        r = dspark("generate", "-m", os.path.join(models, "target"), "-p", run["text"], "-n", str(run["max_new_tokens"]),
                   "--draft-model", os.path.join(models, name), "--mode", "dspark" if "dspark" in name else "dflash",
                   "--dspark-threshold", str(run["threshold"]), "--max-draft", str(cap), "--trace-rounds", trace,
                   "-t", "1", "--kv-type", "f32", "--json")  # f32 K/V: the reference's arithmetic within 5e-4
        out = json.loads(r.stdout)
        with open(trace, encoding="utf-8") as f:
            got = [json.loads(line) for line in f]
        assert out["n_prompt"] == len(run["prompt_ids"]), (out["n_prompt"], run["prompt_ids"])
        n, s, k = compare_run(run, got, out["token_ids"])
        total_rounds += n
        total_slots += s
        total_skip += k
    print(f"{name}: {total_rounds} rounds (kept/accepted/next), {total_slots} draft slots matched, "
          f"{total_skip} slots below the margin tolerance skipped")
    assert total_rounds > 50 and total_slots > 100


# ---- bad input ----------------------------------------------------------------------------------

def _copy(models, tmp_path, name, as_name):
    d = str(tmp_path / as_name)
    shutil.copytree(os.path.join(models, name), d)
    return d


def _edit_config(d, fn):
    p = os.path.join(d, "config.json")
    with open(p, encoding="utf-8") as f:
        c = json.load(f)
    fn(c)
    with open(p, "w", encoding="utf-8") as f:
        json.dump(c, f)


def _refused(models, d, *words):
    r = dspark("generate", "-m", os.path.join(models, "target"), "-p", "hi", "-n", "4", "--draft-model", d, ok=False)
    assert r.returncode != 0, r.stdout
    msg = r.stderr
    assert "Sanitizer" not in msg and "Assert" not in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_bad_drafters(models, tmp_path):
    # tap layers outside the target (4 layers), or its last layer
    d = _copy(models, tmp_path, "deepspec-dspark-b7", "taps")
    _edit_config(d, lambda c: c.update(target_layer_ids=[0, 1, 7]))
    _refused(models, d, "target_layer_ids[2] = 7", "outside the target's layers 0..3")
    _edit_config(d, lambda c: c.update(target_layer_ids=[0, 1, 3]))
    _refused(models, d, "last layer")
    _edit_config(d, lambda c: c.update(target_layer_ids=[-2, 1, 2]))  # -1 is the embedding output; -2 is nothing
    _refused(models, d, "\"target_layer_ids\"[0] is not a layer index")
    # Markov head variants: an unknown one, and a config that names a head whose tensors are not there
    g = _copy(models, tmp_path, "deepspec-dspark-gated-b7", "variant")
    _edit_config(g, lambda c: c.update(markov_head_type="lstm"))
    _refused(models, g, "markov_head_type 'lstm' is not supported")
    _edit_config(g, lambda c: c.update(markov_head_type="rnn"))
    _refused(models, g, "markov_head.joint_proj.weight")
    # mask token outside the vocabulary (z-lab keeps it in dflash_config)
    z = _copy(models, tmp_path, "zlab-dflash-b16", "mask")
    _edit_config(z, lambda c: c["dflash_config"].update(mask_token_id=512))
    _refused(models, z, "mask_token_id 512 is outside the vocabulary")
    # a drafter for another target: wider hidden size / other layer count / other embedding values
    z = _copy(models, tmp_path, "zlab-dflash-b16", "layers36")
    _edit_config(z, lambda c: c.update(num_target_layers=36))
    _refused(models, z, "target of 36 layers")
    z2 = _copy(models, tmp_path, "zlab-dflash-b16", "wide")
    _edit_config(z2, lambda c: c.update(hidden_size=128))
    _refused(models, z2, "hidden_size 128 differs from the target's 64")
    o = _copy(models, tmp_path, "deepspec-dflash-b7", "other-embedding")
    path = os.path.join(o, "model.safetensors")
    raw = bytearray(open(path, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    a, _ = hdr["embed_tokens.weight"]["data_offsets"]
    raw[8 + n + a + 4 * 100] ^= 0x40  # one value of the embedding copy changes
    open(path, "wb").write(bytes(raw))
    _refused(models, o, "embed_tokens.weight", "differs from the target's")
    # truncated weights
    t = _copy(models, tmp_path, "deepspec-dspark-b7", "truncated")
    path = os.path.join(t, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    _refused(models, t, "model.safetensors")
    # not a drafter at all: the target itself
    _refused(models, os.path.join(models, "target"), "not a block drafter")
    # a mode that needs a drafter without one
    r = dspark("generate", "-m", os.path.join(models, "target"), "-p", "hi", "-n", "4", "--mode", "dspark", ok=False)
    assert r.returncode != 0 and "--draft-model" in r.stderr, r.stderr
    r = dspark("generate", "-m", os.path.join(models, "target"), "-p", "hi", "-n", "4", "--mode", "dspark",
               "--draft-model", os.path.join(models, "zlab-dflash-b16"), ok=False)
    assert r.returncode != 0 and "use mode dflash" in r.stderr, r.stderr


# ---- copies of the target's embedding / LM head in another type ---------------------------------

def _gen_ids(models, *extra):
    r = dspark("generate", "-m", os.path.join(models, "target"), "-p", "The numbers 0 1 2 3 4 5 6 7 8 9 10",
               "-n", "40", "--json", "--quantize", "q8_0", *extra)
    return json.loads(r.stdout), r.stderr


def _rewrite_tensor(d, name, fn):
    """Apply fn to the float32 values of one tensor of d/model.safetensors, in place."""
    import numpy as np
    path = os.path.join(d, "model.safetensors")
    raw = bytearray(open(path, "rb").read())
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    assert hdr[name]["dtype"] == "F32"
    a, b = hdr[name]["data_offsets"]
    v = np.frombuffer(bytes(raw[8 + n + a:8 + n + b]), dtype=np.float32).copy()
    v = np.ascontiguousarray(fn(v), dtype=np.float32)
    raw[8 + n + a:8 + n + b] = v.tobytes()
    open(path, "wb").write(bytes(raw))


def test_copies_in_another_type(models, tmp_path):
    """DeepSpec's drafters carry float32 copies of the target's embedding and LM head. Next to a target
    quantized at load (Q8_0) they are the same values in another type: the drafter must use the
    target's tensors (one matrix read per round instead of two) and stay lossless. A copy with other
    values must not be taken for the target's: in another type the drafter keeps its own copy, in the
    target's type it is refused (test_bad_drafters)."""
    import numpy as np
    base, _ = _gen_ids(models, "--mode", "baseline")
    out, err = _gen_ids(models, "--draft-model", os.path.join(models, "deepspec-dspark-b7"), "--mode", "dspark")
    assert "'embed_tokens.weight' is a F32 copy of the target's Q8_0 token embedding: using the target's" in err, err
    assert "'lm_head.weight' is a F32 copy of the target's Q8_0 output layer: using the target's" in err, err
    assert out["token_ids"] == base["token_ids"] and out["text"] == base["text"]
    assert out["spec"]["accepted"] > 0, out["spec"]  # the shared head still drafts what the target says
    # next to a quantized target the CPU runs the drafter's float layers as Q4_0 (--draft-quant q8_0:
    # Q8_0), lossless either way; --precision f32 keeps them
    assert "block drafter: its float matrices quantized to Q4_0" in err, err
    out8, err8 = _gen_ids(models, "--draft-model", os.path.join(models, "deepspec-dspark-b7"), "--mode", "dspark", "--draft-quant", "q8_0")
    assert "block drafter: its float matrices quantized to Q8_0" in err8, err8
    assert out8["token_ids"] == base["token_ids"] and out8["spec"]["accepted"] > 0, out8["spec"]
    out32, err32 = _gen_ids(models, "--draft-model", os.path.join(models, "deepspec-dspark-b7"), "--mode", "dspark", "--precision", "f32")
    assert "quantized to" not in err32, err32
    assert out32["spec"]["accepted"] > 0, out32["spec"]
    r = dspark("generate", "-m", os.path.join(models, "target"), "-p", "hi", "-n", "4", "--draft-quant", "q4_1", ok=False)
    assert r.returncode == 2 and "--draft-quant: 'q4_1' is not q4_0 or q8_0" in r.stderr, r.stderr

    # a copy that differs by one low mantissa bit is still the same values
    near = _copy(models, tmp_path, "deepspec-dspark-b7", "near")
    _rewrite_tensor(near, "embed_tokens.weight", lambda v: np.where(np.arange(v.size) == 100, np.nextafter(v, np.inf), v))
    _, err = _gen_ids(models, "--draft-model", near, "--mode", "dspark")
    assert "'embed_tokens.weight' is a F32 copy of the target's Q8_0 token embedding: using the target's" in err, err

    # another model's matrices (the same rows in another order; same scale, other values)
    other = _copy(models, tmp_path, "deepspec-dspark-b7", "other")
    rng = np.random.default_rng(7)
    for name in ("embed_tokens.weight", "lm_head.weight"):
        _rewrite_tensor(other, name, lambda v: v.reshape(-1, 64)[rng.permutation(v.size // 64)].ravel())
    out, err = _gen_ids(models, "--draft-model", other, "--mode", "dspark")
    assert "'embed_tokens.weight' is F32, the target's is Q8_0: using the drafter's own copy" in err, err
    assert "'lm_head.weight' is F32, the target's is Q8_0: using the drafter's own copy" in err, err
    assert out["token_ids"] == base["token_ids"] and out["text"] == base["text"]
    # in the target's own type (no --quantize) the same drafter is refused
    _refused(models, other, "embed_tokens.weight", "differs from the target's")
