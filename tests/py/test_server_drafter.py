"""`dspark serve --draft-model`: the block drafters through the OpenAI server, lossless.

On the tiny Qwen3 target and its random-weight drafters (tools/make_tiny_drafters.py: DeepSpec's
DSpark layout and z-lab's DFlash layout), a server with a drafter and a baseline server answer the
same greedy requests (completions and chat, streamed or not, with logprobs, with a frequency
penalty): the text, the tokens and their logprobs must be identical, while the drafter server's
per-response "dspark" block shows that its drafter drafted. /v1/models and /health name the mode
and the drafter; a request for a mode the loaded drafter cannot do gets OpenAI's error shape.

Needs numpy (the test venv) to make the models, and the openai client.
"""

import json
import os
import sys
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))

from srvutil import SANITIZED, Server  # noqa: E402

import make_tiny_drafters as mtd  # noqa: E402

PROMPTS = ["The capital of France is", "def add(a, b):\n    return a + b\n\nfor i in range(10):",
           "The numbers 0 1 2 3 4 5 6 7 8 9 10 42 100"]
N = 12 if SANITIZED else 32


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tiny-drafters"))
    mtd.make_all(out)
    return out


def servers(models, drafter, mode):
    t = os.path.join(models, "target")
    spec = Server("--draft-model", os.path.join(models, drafter), "--mode", mode, "--max-draft", "4", model=t)
    try:
        base = Server("--mode", "baseline", model=t)
    except Exception:
        spec.close()
        raise
    return spec, base


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def completion(srv, prompt, stream=False, **kw):
    c = srv.client()
    args = dict(model="target", prompt=prompt, max_tokens=N, temperature=0, logprobs=2, **kw)
    if not stream:
        r = c.completions.create(**args).model_dump()
        ch = r["choices"][0]
        return ch["text"], ch["logprobs"]["tokens"], ch["logprobs"]["token_logprobs"], r["dspark"]
    text, toks, lps, stats = "", [], [], None
    for ev in c.completions.create(stream=True, **args):
        d = ev.model_dump()
        if d.get("dspark"):
            stats = d["dspark"]
        for ch in d["choices"]:
            text += ch["text"]
            if ch.get("logprobs"):
                toks += ch["logprobs"]["tokens"]
                lps += ch["logprobs"]["token_logprobs"]
    return text, toks, lps, stats


@pytest.mark.parametrize("drafter,mode,kind", [("deepspec-dspark-b7", "dspark", "dspark"),
                                               ("zlab-dflash-b16", "dflash", "dflash")])
def test_drafter_server_lossless(models, drafter, mode, kind):
    spec, base = servers(models, drafter, mode)
    try:
        m = get_json(spec.url + "/v1/models")["data"][0]["speculation"]
        assert m["mode"] == mode and m["drafter"]["kind"] == kind, m
        assert m["drafter"]["path"].endswith(drafter), m
        assert get_json(base.url + "/v1/models")["data"][0]["speculation"]["drafter"] is None
        drafted = accepted = 0
        for p in PROMPTS:
            for stream in (False, True):
                for pen in ({}, {"frequency_penalty": 0.7}):
                    a = completion(spec, p, stream, **pen)
                    b = completion(base, p, stream, **pen)
                    where = (p, stream, pen)
                    assert a[0] == b[0], where
                    assert a[1] == b[1] and a[2] == b[2], where  # the same tokens and bit-identical logprobs
                    assert a[3]["mode"] == mode and a[3]["drafter"] == kind, a[3]
                    assert b[3]["mode"] == "baseline" and b[3]["drafter"] == "none" and b[3]["drafted"] == 0, b[3]
                    drafted += a[3]["drafted"]
                    accepted += a[3]["accepted"]
        assert drafted > 0 and accepted > 0, ("the drafter never drafted, or nothing was accepted", drafted, accepted)
        print(f"{drafter}: {drafted} drafted, {accepted} accepted over {len(PROMPTS) * 4} requests")
        # chat through the template, the anthropic-style extension field off
        msgs = [{"role": "user", "content": "Count from one to ten."}]
        ra = spec.client().chat.completions.create(model="target", messages=msgs, max_tokens=N, temperature=0).model_dump()
        rb = base.client().chat.completions.create(model="target", messages=msgs, max_tokens=N, temperature=0).model_dump()
        assert ra["choices"][0]["message"]["content"] == rb["choices"][0]["message"]["content"]
        health = get_json(spec.url + "/health")
        assert health["speculation"]["mode"] == mode, health
    finally:
        spec.close()
        base.close()


def test_drafter_server_modes(models):
    """Per request (dspark_mode): a DSpark drafter also drafts as DFlash (its backbone alone) and
    auto resolves to hybrid; a DFlash drafter cannot do dspark: 400 in OpenAI's shape."""
    import openai
    t = os.path.join(models, "target")
    srv = Server("--draft-model", os.path.join(models, "deepspec-dspark-b7"), model=t)
    try:
        m = get_json(srv.url + "/v1/models")["data"][0]["speculation"]
        assert m["mode"] == "hybrid" and m["drafter"]["kind"] == "dspark", m  # the default mode, auto
        c = srv.client()
        outs = {}
        for mode in ("baseline", "dflash", "dspark", "lookup", "auto"):
            r = c.completions.create(model="target", prompt=PROMPTS[1], max_tokens=N, temperature=0,
                                     extra_body={"dspark_mode": mode}).model_dump()
            outs[mode] = r["choices"][0]["text"]
            want = {"auto": "hybrid"}.get(mode, mode)
            assert r["dspark"]["mode"] == want, (mode, r["dspark"])
        assert len(set(outs.values())) == 1, outs
    finally:
        srv.close()
    srv = Server("--draft-model", os.path.join(models, "zlab-dflash-b16"), model=t)
    try:
        with pytest.raises(openai.BadRequestError) as ei:
            srv.client().completions.create(model="target", prompt="hi", max_tokens=4, extra_body={"dspark_mode": "dspark"})
        err = ei.value.body
        assert err["type"] == "invalid_request_error" and "DFlash" in err["message"], err
    finally:
        srv.close()
