"""`dspark batch`: a file of requests through the batched engine. Every answer equals `dspark
generate` run on that request alone (greedy and seeded sampling, lookup speculation on or off), bad
lines get error lines naming the problem while the others are answered, and the exit status says
that some failed."""
import json
import os
import subprocess

import pytest

from srvutil import BIN, MODEL

pytestmark = pytest.mark.skipif(not os.path.exists(MODEL), reason=MODEL + " absent (scripts/fetch-models)")

QUESTIONS = ["What is the capital of France?", "Write a poem about rain.", "Give me three tips for sleeping well.",
             "Explain photosynthesis to a child.", "What is 12 times 7?"]


def requests():
    reqs = []
    for i, q in enumerate(QUESTIONS):
        reqs.append({"id": f"g{i}", "messages": [{"role": "user", "content": q}], "max_tokens": 16 + 4 * i})
        reqs.append({"id": f"s{i}", "messages": [{"role": "user", "content": q}], "max_tokens": 20,
                     "temperature": 0.8, "top_p": 0.95, "seed": 100 + i})
    reqs.append({"id": "plain", "prompt": "The quick brown fox", "max_tokens": 12})
    return reqs


def solo(req, mode):
    args = [BIN, "generate", "-m", MODEL, "-t", "2", "--json", "--mode", mode, "-n", str(req["max_tokens"])]
    if "messages" in req:
        args += ["--chat", "-p", req["messages"][0]["content"]]
    else:
        args += ["-p", req["prompt"]]
    if "temperature" in req:
        args += ["--temperature", str(req["temperature"]), "--top-p", str(req["top_p"]), "--seed", str(req["seed"])]
    else:
        args += ["--temperature", "0"]
    p = subprocess.run(args, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def batch(lines, *args):
    p = subprocess.run([BIN, "batch", "-m", MODEL, "-t", "2", "--temperature", "0", *args],
                       input="\n".join(lines).encode() + b"\n", capture_output=True, timeout=300)
    out = [json.loads(x) for x in p.stdout.decode().splitlines()]
    return p, {o["index"]: o for o in out}, len(out)


@pytest.mark.parametrize("mode", ["lookup", "baseline"])
def test_answers_equal_solo_runs(mode):
    reqs = requests()
    p, got, n = batch([json.dumps(r) for r in reqs], "--max-batch", "4", "--mode", mode, "--prompt-ids")
    assert p.returncode == 0, p.stderr
    assert n == len(reqs) and sorted(got) == list(range(len(reqs)))
    assert "11 requests (11 answered, 0 failed)" in p.stderr.decode()
    for i, r in enumerate(reqs):
        a, s = got[i], solo(r, mode)
        assert a["id"] == r["id"]
        assert a["token_ids"] == s["token_ids"], (r, a, s)
        assert a["text"] == s["text"] and a["finish_reason"] == s["finish_reason"]
        assert a["n_generated"] == len(a["token_ids"]) == s["n_generated"]
        assert a["n_prompt"] == len(a["prompt_token_ids"]) == s["n_prompt"]


def test_bad_lines_are_answered_with_errors():
    good = {"id": "ok", "prompt": "Hello", "max_tokens": 4}
    lines = ["not json", json.dumps(good), "", json.dumps({"id": 5, "prompt_ids": [1, 99999999]}),
             json.dumps({"messages": "x"}), json.dumps({"prompt": "Hi", "temperature": -1}),
             json.dumps({"prompt": "Hi", "prompt_ids": [1]}), json.dumps({"prompt": "word " * 200}), "[1, 2]"]
    p, got, n = batch(lines, "--ctx", "64")
    assert p.returncode == 3, p.stderr
    assert n == 8 and sorted(got) == list(range(8))  # the blank line is not a request
    assert "malformed JSON" in got[0]["error"]["message"]
    assert got[1]["id"] == "ok" and got[1]["n_generated"] == 4 and "error" not in got[1]
    assert got[2]["id"] == 5 and "out of range" in got[2]["error"]["message"]
    assert "messages" in got[3]["error"]["message"]
    assert "temperature" in got[4]["error"]["message"]
    assert "exactly one of" in got[5]["error"]["message"]
    assert "64" in got[6]["error"]["message"]  # longer than the context: the limit is named
    assert "JSON object" in got[7]["error"]["message"]
    assert "8 requests (1 answered, 7 failed)" in p.stderr.decode()


def test_missing_input_file():
    p = subprocess.run([BIN, "batch", "-m", MODEL, "-i", "/nonexistent/requests.jsonl"], capture_output=True, timeout=60)
    assert p.returncode == 1 and b"/nonexistent/requests.jsonl" in p.stderr


def test_log_level_from_environment():
    """DSPARK_LOG: debug adds --max-draft auto's per-round lines; a bad value is named, and ignored."""
    args = [BIN, "generate", "-m", MODEL, "-t", "2", "-p", "one two three one two three one two", "-n", "8",
            "--temperature", "0", "--mode", "lookup", "--max-draft", "auto"]
    env = dict(os.environ)
    base = subprocess.run(args, capture_output=True, timeout=120, env=env)
    assert base.returncode == 0 and b"dspark debug:" not in base.stderr
    env["DSPARK_LOG"] = "debug"
    dbg = subprocess.run(args, capture_output=True, timeout=120, env=env)
    assert dbg.returncode == 0 and b"dspark debug: round kind" in dbg.stderr, dbg.stderr
    assert dbg.stdout == base.stdout  # logging changes nothing else
    env["DSPARK_LOG"] = "loud"
    bad = subprocess.run(args, capture_output=True, timeout=120, env=env)
    assert bad.returncode == 0 and b"DSPARK_LOG=loud is not one of" in bad.stderr and bad.stdout == base.stdout
