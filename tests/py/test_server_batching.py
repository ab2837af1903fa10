"""Continuous batching and the prefix cache, end to end through `dspark serve` (issue: batching).

- 16 concurrent mixed requests (chat and completions, streaming or not, greedy and seeded
  sampling, penalties, logprobs, stop strings, lookup on and off, one client that disconnects
  mid-stream): every result equals the same request run alone, byte for byte (text, logprobs,
  finish reason, token counts), and the server stays healthy.
- The prefix cache: a follow-up turn reports cached prompt tokens and gives the same answer as a
  server without the cache; eviction under a small --kv-memory never corrupts a running request.
- A request larger than the whole KV cache gets a 400 naming the limit.
- Many requests, some cancelled in prefill and in decode: every KV block comes back (/health).
The oracle for "batched" is the same engine running the request alone: batch invariance makes
them bit-identical (DESIGN.md §2)."""
import json
import socket
import threading
import time

import pytest

from srvutil import SANITIZED, Server, error_of, post

N = 12 if SANITIZED else 24
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "What is the capital of France?",
    "Repeat exactly: the cat sat on the mat, the cat sat on the mat.",
    "Write a haiku about autumn.",
    "Give me three tips for sleeping better.",
    "Copy the list: apples, bananas, cherries, dates, elderberries, figs.",
    "Why is the sky blue?",
    "Name a famous painting by Leonardo da Vinci.",
    "Explain what a CPU cache is in two sentences.",
]
PROMPTS = ["Once upon a time", "def fibonacci(n):", "The quick brown fox jumps over the lazy dog. The quick brown",
           "1, 2, 3, 4, 5,"]


def mixed_requests():
    """16 (path, body) pairs covering every kind of request (8 under a sanitizer: still every kind,
    i % 8, both paths and both stream settings)."""
    reqs = []
    for i in range(8 if SANITIZED else 16):
        chat = i % 2 == 0
        body = {"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": N - (i % 5), "stream": i % 3 == 0}
        if chat:
            body["messages"] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[(i // 2) % len(QUESTIONS)]}]
        else:
            body["prompt"] = PROMPTS[(i // 2) % len(PROMPTS)]
        kind = i % 8
        if kind in (0, 1, 5):
            body["temperature"] = 0
        else:
            body["temperature"] = 0.8
            body["seed"] = 100 + i
            body["top_p"] = 0.9
        if kind == 2:
            body["presence_penalty"] = 0.6
            body["frequency_penalty"] = 0.4
        if kind == 3:
            body["repetition_penalty"] = 1.2
        if kind in (1, 4, 6):
            if chat:
                body["logprobs"], body["top_logprobs"] = True, 3
            else:
                body["logprobs"] = 2
        if kind == 5:
            body["stop"] = ["\n\n", "."]
        body["dspark_mode"] = "lookup" if i % 4 in (1, 2) else "baseline"
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        reqs.append(("/v1/chat/completions" if chat else "/v1/completions", body))
    return reqs


def result_of(path, body, raw_body):
    """What must not depend on batching: text, logprobs, finish reason, token counts."""
    if body.get("stream"):
        text, lps, finish, usage = "", [], None, None
        for line in raw_body.decode().split("\n"):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                text += (ch.get("delta") or {}).get("content") or ch.get("text") or ""
                if ch.get("logprobs"):  # per token entries; chunk boundaries may differ between runs
                    lp = ch["logprobs"]
                    if "content" in lp:
                        lps.extend(json.dumps(x, sort_keys=True) for x in lp["content"] or [])
                    else:
                        lps.extend(json.dumps([t, l, o, tl], sort_keys=True) for t, l, o, tl in
                                   zip(lp["tokens"], lp["token_logprobs"], lp["text_offset"], lp["top_logprobs"] or [None] * len(lp["tokens"])))
                finish = ch.get("finish_reason") or finish
        assert raw_body.rstrip().endswith(b"data: [DONE]"), raw_body[-200:]
        return text, lps, finish, usage["completion_tokens"] if usage else None
    obj = json.loads(raw_body)
    ch = obj["choices"][0]
    text = ch["message"]["content"] if "message" in ch else ch["text"]
    lp, lps = ch.get("logprobs"), []
    if lp and "content" in lp:
        lps = [json.dumps(x, sort_keys=True) for x in lp["content"] or []]
    elif lp:
        lps = [json.dumps([t, l, o, tl], sort_keys=True) for t, l, o, tl in
               zip(lp["tokens"], lp["token_logprobs"], lp["text_offset"], lp["top_logprobs"] or [None] * len(lp["tokens"]))]
    return text, lps, ch["finish_reason"], obj["usage"]["completion_tokens"]


def same(a, b):
    """text, the per-token logprob entries, the finish reason and the token count"""
    return a[0] == b[0] and a[1] == b[1] and a[2] == b[2] and a[3] == b[3]


def health(port):
    st, _, body = post_get(port, "/health")
    assert st == 200, body
    return json.loads(body)


def post_get(port, path):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        from srvutil import read_response
        return read_response(s)
    finally:
        s.close()


@pytest.fixture(scope="module")
def srv():
    s = Server("--max-batch", "8", "--mode", "baseline")
    yield s
    s.close()


def test_concurrent_mixed_equals_solo(srv):
    reqs = mixed_requests()
    solo = []
    for path, body in reqs:
        try:
            st, _, raw_body = post(srv.port, path, body)
        except OSError as e:  # a timeout: show what the server did meanwhile
            raise AssertionError("%s %s: %r\nserver log (tail):\n%s" % (path, json.dumps(body), e, srv.log()[-6000:])) from e
        assert st == 200, raw_body
        solo.append(result_of(path, body, raw_body))
    results = [None] * len(reqs)
    errors = []

    def worker(i):
        try:
            st, _, raw_body = post(srv.port, *reqs[i])
            assert st == 200, raw_body
            results[i] = result_of(reqs[i][0], reqs[i][1], raw_body)
        except Exception as e:  # reported below
            errors.append((i, e))

    def quitter():  # starts a long stream and goes away after a few events
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        buf = b""
        while buf.count(b"data: ") < 3:
            buf += s.recv(65536)
        s.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(reqs))] + [threading.Thread(target=quitter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for i, (a, b) in enumerate(zip(solo, results)):
        assert same(a, b), "request %d (%s) differs in a batch:\n alone:   %r\n batched: %r" % (i, reqs[i][1], a, b)
    deadline = time.time() + 30
    while health(srv.port)["requests_running"] and time.time() < deadline:
        time.sleep(0.1)
    h = health(srv.port)
    assert h["status"] == "ok" and h["requests_running"] == 0 and h["kv_blocks_used"] == 0, h
    assert h["peak_batch"] >= 4, h  # the requests really shared rounds


def test_prefix_cache_follow_up(srv):
    turn1 = [{"role": "system", "content": SYSTEM + ". " + " ".join(QUESTIONS)}, {"role": "user", "content": "Name a color."}]
    body = {"messages": turn1, "temperature": 0, "max_tokens": 8}
    st, _, r1 = post(srv.port, "/v1/chat/completions", body)
    assert st == 200, r1
    r1 = json.loads(r1)
    turn2 = turn1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]}, {"role": "user", "content": "Another one."}]
    body2 = {"messages": turn2, "temperature": 0, "max_tokens": 8}
    st, _, r2 = post(srv.port, "/v1/chat/completions", body2)
    assert st == 200, r2
    r2 = json.loads(r2)
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= (r1["usage"]["prompt_tokens"] - 1) // 16 * 16 > 0, (cached, r1["usage"])
    nc = Server("--no-prefix-cache")
    try:
        st, _, r3 = post(nc.port, "/v1/chat/completions", body2)
        assert st == 200, r3
        r3 = json.loads(r3)
        assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert r3["choices"][0]["message"]["content"] == r2["choices"][0]["message"]["content"]
    finally:
        nc.close()


def test_small_kv_pool_eviction_and_limit():
    """A KV cache of 1 MiB (~22 tokens x 16-token blocks for this model): requests with different
    prompts evict each other's cached blocks; running ones are never touched, outputs stay exact."""
    s = Server("--kv-memory", "2M", "--max-batch", "4")
    try:
        prompts = PROMPTS[:4] if SANITIZED else PROMPTS
        bodies = [{"prompt": p + " " + q, "temperature": 0, "max_tokens": 6} for p in prompts for q in QUESTIONS[:3]]
        solo = [result_of("/v1/completions", b, post(s.port, "/v1/completions", b)[2]) for b in bodies]
        out = [None] * len(bodies)

        def w(i):
            out[i] = result_of("/v1/completions", bodies[i], post(s.port, "/v1/completions", bodies[i])[2])

        ts = [threading.Thread(target=w, args=(i,)) for i in range(len(bodies))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(900)
        for i in range(len(bodies)):
            assert same(solo[i], out[i]), (i, solo[i], out[i])
        # larger than the whole cache: a 400 that names the limit
        st, _, body = post(s.port, "/v1/completions", {"prompt": "Hello", "max_tokens": 2000, "temperature": 0})
        assert st == 400, body
        err = error_of(st, body)
        assert "the whole cache holds" in err["message"], err
        h = health(s.port)
        assert h["kv_blocks_used"] == 0 and h["kv_blocks_cached"] <= h["kv_blocks"], h
    finally:
        s.close()


def test_no_block_leaks_over_many_requests():
    """Many short requests, a third of them abandoned by their client mid-prefill or mid-decode."""
    n = 90 if SANITIZED else 1000
    s = Server("--max-batch", "8", "--batch-tokens", "64")
    try:
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 30
        done = [0]

        def client(k):
            for j in range(k, n, 8):
                if j % 3 == 0:  # go away without reading the answer
                    body = json.dumps({"prompt": long_prompt + str(j), "max_tokens": 40, "temperature": 0, "stream": True}).encode()
                    c = socket.create_connection(("127.0.0.1", s.port), timeout=60)
                    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    if j % 2:
                        c.recv(100)
                    c.close()
                else:
                    st, _, body = post(s.port, "/v1/completions", {"prompt": PROMPTS[j % 4] + " %d" % j, "max_tokens": 3, "temperature": 0})
                    assert st == 200, body
                done[0] += 1

        ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(900)
        assert done[0] == n
        deadline = time.time() + 60
        while time.time() < deadline:
            h = health(s.port)
            if h["requests_running"] == 0 and h["requests_waiting"] == 0:
                break
            time.sleep(0.2)
        assert h["kv_blocks_used"] == 0, h
    finally:
        s.close()
