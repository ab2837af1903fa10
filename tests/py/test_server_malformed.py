"""`dspark serve` against bad input on real sockets: invalid JSON, wrong types, huge numbers,
bad messages, invalid UTF-8, oversized and truncated bodies, broken HTTP, disconnects mid-stream,
100 connections opened and dropped, a full queue, and shutdown with a request in flight. Each gets
the right error (the OpenAI error object with the right status and param), and afterwards the
server still answers a normal request correctly."""
import json
import os
import re
import signal
import socket
import threading
import time

import pytest

from srvutil import MODEL, SANITIZED, Server, error_of, post, raw, read_response

pytestmark = pytest.mark.skipif(not os.path.exists(MODEL), reason=MODEL + " absent (scripts/fetch-models)")

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
OK_BODY = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}


@pytest.fixture(scope="module")
def srv():
    s = Server()
    s.expected = None
    yield s
    s.close()


def healthy(srv, retry_429_s=0.0):
    """A normal request still gets the right answer (greedy: the same as the first time). With
    retry_429_s, a 429 ("retry later": this address still at --max-connections-per-client) is
    retried for that long, as a client would."""
    t0 = time.time()
    while True:
        st, _, body = post(srv.port, COMP, OK_BODY)
        if st != 429 or time.time() - t0 >= retry_429_s:
            break
        time.sleep(0.05)
    assert st == 200, body
    text = json.loads(body)["choices"][0]["text"]
    if srv.expected is None:
        srv.expected = text
    assert text == srv.expected


def expect_error(srv, status, param, path, body, code=None, extra_headers=b""):
    st, hdr, resp = post(srv.port, path, body, extra_headers)
    assert st == status, (body[:200] if isinstance(body, bytes) else body, st, resp)
    assert hdr.get("content-type") == "application/json"
    err = error_of(st, resp)
    assert err["param"] == param, err
    if code:
        assert err["code"] == code, err
    return err


def test_normal_first(srv):
    healthy(srv)


BAD_BODIES = [
    # (body, param, code)
    (b'{"messages": [', None, "invalid_json"),
    (b'', None, "invalid_json"),
    (b'not json at all', None, "invalid_json"),
    (b'{"messages": []} trailing', None, "invalid_json"),
    (b'[1, 2, 3]', None, None),
    (b'"just a string"', None, None),
    (b'{"messages": "hello"}', "messages", None),
    (b'{"messages": []}', "messages", None),
    (b'{}', "messages", None),
    (b'{"messages": [null]}', "messages[0]", None),
    (b'{"messages": [{"content": "hi"}]}', "messages[0].role", None),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role", None),
    (b'{"messages": [{"role": 7, "content": "hi"}]}', "messages[0].role", None),
    (b'{"messages": [{"role": "user"}]}', "messages[0].content", None),
    (b'{"messages": [{"role": "user", "content": 42}]}', "messages[0].content", None),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', "messages[0].content", None),
    (b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', "messages[0].content", None),
    (b'{"messages": [{"role": "tool", "content": "x"}]}', "messages[0].tool_call_id", None),
    (b'{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": 1}]}]}', "messages[0].tool_calls", None),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}', "tools", None),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe bad utf-8"}]}', None, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "\xc0\xaf overlong"}]}', None, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "nul \\u0000 inside"}]}', None, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "lone \\ud800 surrogate"}]}', None, "invalid_json"),
    (b'[' * 100000 + b']' * 100000, None, "invalid_json"),
]

U = b'"messages": [{"role": "user", "content": "hi"}]'
BAD_FIELDS = [
    (b'{' + U + b', "max_tokens": "10"}', "max_tokens"),
    (b'{' + U + b', "max_tokens": -5}', "max_tokens"),
    (b'{' + U + b', "max_tokens": 0}', "max_tokens"),
    (b'{' + U + b', "max_tokens": 2.5}', "max_tokens"),
    (b'{' + U + b', "max_tokens": 1e400}', None),                    # overflows a double: not valid JSON for us
    (b'{' + U + b', "max_tokens": 99999999999999999999999}', None),  # overflows int64
    (b'{' + U + b', "max_tokens": 9223372036854775807}', "max_tokens"),
    (b'{' + U + b', "temperature": "hot"}', "temperature"),
    (b'{' + U + b', "temperature": 1e300}', "temperature"),
    (b'{' + U + b', "temperature": -0.1}', "temperature"),
    (b'{' + U + b', "top_p": 1.5}', "top_p"),
    (b'{' + U + b', "top_k": -2}', "top_k"),
    (b'{' + U + b', "top_k": 1e10}', "top_k"),
    (b'{' + U + b', "min_p": 2}', "min_p"),
    (b'{' + U + b', "frequency_penalty": 2.01}', "frequency_penalty"),
    (b'{' + U + b', "repetition_penalty": 0}', "repetition_penalty"),
    (b'{' + U + b', "seed": "abc"}', "seed"),
    (b'{' + U + b', "seed": 1.5}', "seed"),
    (b'{' + U + b', "stream": "yes"}', "stream"),
    (b'{' + U + b', "stream": true, "stream_options": 3}', "stream_options"),
    (b'{' + U + b', "stop": 5}', "stop"),
    (b'{' + U + b', "stop": [1]}', "stop"),
    (b'{' + U + b', "stop": "' + b'x' * 5000 + b'"}', "stop"),
    (b'{' + U + b', "logit_bias": []}', "logit_bias"),
    (b'{' + U + b', "logit_bias": {"abc": 1}}', "logit_bias"),
    (b'{' + U + b', "logit_bias": {"-1": 1}}', "logit_bias"),
    (b'{' + U + b', "logit_bias": {"5": "x"}}', "logit_bias"),
    (b'{' + U + b', "logit_bias": {' + b','.join(b'"%d": 1' % i for i in range(2000)) + b'}}', "logit_bias"),
    (b'{' + U + b', "logprobs": 3}', "logprobs"),
    (b'{' + U + b', "logprobs": true, "top_logprobs": -1}', "top_logprobs"),
    (b'{' + U + b', "n": 0}', "n"),
    (b'{' + U + b', "n": 3}', "n"),
    (b'{' + U + b', "model": 12}', "model"),
    (b'{' + U + b', "user": 12}', "user"),
]

BAD_COMPLETIONS = [
    (b'{"prompt": 5}', "prompt"),
    (b'{"prompt": []}', "prompt"),
    (b'{"prompt": [1, -1]}', "prompt"),
    (b'{"prompt": [1, 99999999]}', "prompt"),
    (b'{"prompt": [1, "a"]}', "prompt"),
    (b'{"prompt": ["a", "b"]}', "prompt"),
    (b'{"prompt": "hi", "logprobs": true}', "logprobs"),
    (b'{"prompt": "hi", "logprobs": 21}', "logprobs"),
    (b'{"prompt": "hi", "echo": "yes"}', "echo"),
    (b'{"prompt": "hi", "best_of": 2}', "best_of"),
    (b'{"prompt": "hi", "suffix": "x"}', "suffix"),
    (b'{"max_tokens": 3}', "prompt"),
]


def test_invalid_bodies(srv):
    for body, param, code in BAD_BODIES:
        expect_error(srv, 400, param, CHAT, body, code)
    healthy(srv)


def test_wrong_types_and_ranges(srv):
    for body, param in BAD_FIELDS:
        err = expect_error(srv, 400, param, CHAT, body)
        if param:
            assert param.split("[")[0] in err["message"], err
    for body, param in BAD_COMPLETIONS:
        expect_error(srv, 400, param, COMP, body)
    # range messages name the bounds that apply: max_tokens up to --max-tokens-cap, n exactly 1
    for v in (0, 40000, 9223372036854775807):
        err = expect_error(srv, 400, "max_tokens", COMP, {"prompt": "hi", "max_tokens": v})
        assert "between 1 and 32768 (got %d)" % v in err["message"] and "--max-tokens-cap" in err["message"], err
    for v in (0, 2, -1):
        err = expect_error(srv, 400, "n", COMP, {"prompt": "hi", "n": v})
        assert "'n' must be 1" in err["message"] and "(got %d)" % v in err["message"], err
    err = expect_error(srv, 400, "best_of", COMP, {"prompt": "hi", "best_of": 0})
    assert "must be 1" in err["message"], err
    healthy(srv)


def test_routes_methods_models(srv):
    st, _, body = raw(srv.port, b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert st == 404 and error_of(st, body)["code"] == "not_found"
    st, hdr, body = raw(srv.port, b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert st == 405 and hdr.get("allow") == "POST" and error_of(st, body)["code"] == "method_not_allowed"
    st, hdr, body = raw(srv.port, b"DELETE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert st == 405 and hdr.get("allow") == "GET"
    st, _, body = raw(srv.port, b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert st == 405
    st, _, body = raw(srv.port, b"GET /v1/models/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert st == 404 and error_of(st, body)["code"] == "model_not_found"
    expect_error(srv, 404, "model", CHAT, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, "model_not_found")
    # a prompt over the context
    expect_error(srv, 400, "prompt", COMP, {"prompt": "word " * 5000, "max_tokens": 1}, "context_length_exceeded")
    # one request per connection: every request passes the front door's checks, so a keep-alive
    # client gets "Connection: close" and reconnects (http clients do this on their own)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    try:
        body = json.dumps(OK_BODY).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        st, hdr, resp = read_response(s)
        assert st == 200 and hdr.get("connection") == "close", resp
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{bad")
        assert read_response(s)[0] is None
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        s.close()
    healthy(srv)


BROKEN_HTTP = [
    # (raw request, status, code): every one answered with the error object, never HTML or silence
    (b"HELLO\r\n\r\n", 400, "invalid_http_request"),
    (b"\x00\x01\x02\x03\r\n\r\n", 400, "invalid_http_request"),
    (b"GET /health\r\n\r\n", 400, "invalid_http_request"),
    (b"GET health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_http_request"),
    (b"GET / HTTP/9.9\r\n\r\n", 505, "http_version_not_supported"),
    (b"GET /health HTTP/1.1\r\n\r\n", 400, "invalid_http_request"),  # HTTP/1.1 without Host
    (b"GET /health HTTP/1.1\r\nHost: x\r\n folded: header\r\n\r\n", 400, "invalid_http_request"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n", 400, "invalid_http_request"),
    (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
    (b"GET /" + b"a" * 200000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 200000 + b"\r\n\r\n", 431, "headers_too_large"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431, "headers_too_large"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400, "invalid_http_request"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n", 400, "invalid_http_request"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\n", 400, "invalid_http_request"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400, "invalid_http_request"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", 400, "invalid_http_request"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello", 400, "invalid_http_request"),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "invalid_http_request"),
]


def test_broken_http(srv):
    for junk, status, code in BROKEN_HTTP:
        st, hdr, body = raw(srv.port, junk, timeout=10)
        assert st == status, (junk[:60], st, body[:200])
        assert hdr.get("content-type") == "application/json" and hdr.get("connection") == "close", hdr
        assert error_of(st, body)["code"] == code, (junk[:60], body)
    # a malformed chunked body is past the head, where libmicrohttpd decides: a 4xx, never a crash
    try:
        st, _, _ = raw(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", timeout=10)
    except (ConnectionResetError, BrokenPipeError):
        st = None
    assert st is None or 400 <= st < 500
    # HTTP/1.0 needs no Host; HEAD /health has no body
    st, _, body = raw(srv.port, b"GET /health HTTP/1.0\r\n\r\n")
    assert st == 200 and json.loads(body)["status"] == "ok"
    healthy(srv)


def test_body_limits(srv):
    # 50 MB announced: the 413 comes before the body is read (no 50 MB is ever allocated)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    try:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 52428800\r\n\r\n")
        st, _, body = read_response(s)
        assert st == 413 and error_of(st, body)["code"] == "request_too_large"
        try:  # then try to push the body anyway
            for _ in range(50):
                s.sendall(b"x" * (1 << 20))
        except OSError:
            pass
    finally:
        s.close()
    # 50 MB without a length (chunked): buffered up to --max-body, the rest dropped, then 413
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    try:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * (1 << 20)
        for _ in range(50):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        s.sendall(b"0\r\n\r\n")
        st, _, body = read_response(s, timeout=60)
        assert st == 413, body
    finally:
        s.close()
    # just under the limit is read (and is bad JSON)
    st, _, body = post(srv.port, CHAT, b"[" + b" " * (8 * 1024 * 1024 - 2) + b"]")
    assert st == 400
    healthy(srv)


def test_truncated_requests(srv):
    # the body stops half way and the client closes: nothing to answer, nothing breaks
    body = json.dumps(OK_BODY).encode()
    for cut in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body[:10])):
        st, _, _ = raw(srv.port, cut, timeout=10, shut_wr=True)
        assert st is None
    # the head or the body stops half way and the client waits: after --request-timeout (3 s) the
    # server answers 408 with the error object and closes
    for cut in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body[:10])):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        try:
            s.sendall(cut)
            t0 = time.time()
            st, hdr, resp = read_response(s)
            assert st == 408 and error_of(st, resp)["code"] == "request_timeout", resp
            assert hdr["content-type"] == "application/json"
            assert time.time() - t0 < 20
        finally:
            s.close()
    healthy(srv)


def log_lines(srv, rid):
    return [ln for ln in srv.log().splitlines() if rid in ln]


def test_disconnect_mid_stream(srv):
    """A client that goes away mid-stream has its generation cancelled within a token or two."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True,
                       "extra": "ignored", "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    buf = b""
    while buf.count(b"data: ") < 3:
        buf += s.recv(65536)
    rid = re.search(rb'"id":"(cmpl-[0-9a-f]+)"', buf).group(1).decode()
    s.close()
    deadline = time.time() + 60
    while not any("completion tokens" in ln for ln in log_lines(srv, rid)):
        assert time.time() < deadline, srv.log()[-3000:]
        time.sleep(0.1)
    line = [ln for ln in log_lines(srv, rid) if "completion tokens" in ln][0]
    assert "cancelled" in line, line
    # a client going away is normal: no libmicrohttpd error lines about it
    assert "error generating response" not in srv.log() and "internal error" not in srv.log().lower(), srv.log()[-3000:]
    n = int(re.search(r"\+ (\d+) completion tokens", line).group(1))
    assert n < 40, line
    healthy(srv)


def test_hundred_dropped_connections(srv):
    """100 connections opened and dropped at every stage (connected, partial headers, full
    requests waiting in the queue) leave the server answering promptly."""
    full = json.dumps({"prompt": "Tell me a long story", "max_tokens": 50, "temperature": 0}).encode()
    socks = []
    for i in range(100):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        if i % 3 == 1:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        elif i % 3 == 2:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(full), full))
        socks.append(s)
    time.sleep(0.5)
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        s.close()
    t0 = time.time()
    # the server learns of the 100 resets asynchronously: until its event loop has seen them, this
    # address can still hold its 32 connections (--max-connections-per-client) and a new one gets a
    # 429 (CI's release run, 2 cores busy with other tests: stop 47)
    healthy(srv, retry_429_s=10)
    # nowhere near 33 generations of 50 tokens: the dropped ones were cancelled
    assert time.time() - t0 < (120 if SANITIZED else 20)
    st, _, body = raw(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert st == 200


def test_idle_and_slow_connections(srv):
    """500 idle sockets (250 from one address, over its --max-connections-per-client of 32, and 250
    from ten other loopback addresses, over --max-connections 256) plus a client that trickles its
    request head a byte at a time: a normal request and /health still answer at once, because the
    oldest connections still waiting for a head make room; the trickler gets a 408 after
    --request-timeout (3 s)."""
    socks = []
    slow = None
    try:
        for i in range(500):
            c = socket.socket()
            c.bind(("127.0.0.1" if i < 250 else "127.0.0.%d" % (2 + i % 10), 0))
            c.settimeout(10)
            c.connect(("127.0.0.1", srv.port))
            socks.append(c)
        slow = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        stop = threading.Event()

        def trickle():
            for b in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 1000:
                if stop.wait(0.05):
                    return
                try:
                    slow.send(bytes([b]))
                except OSError:
                    return
        t = threading.Thread(target=trickle)
        t.start()
        time.sleep(0.5)
        # the issue's bound: a normal request answers in under 1 s (one that needs no generation, so
        # that a loaded CI machine measures the connection handling, not the model)
        limit = 10 if SANITIZED else 1.0
        for req in (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"):
            t0 = time.time()
            st, _, body = raw(srv.port, req)
            assert st == 200 and time.time() - t0 < limit, (req, st, time.time() - t0)
        healthy(srv)  # and a generation is served too
        st, _, body = read_response(slow, timeout=30)
        stop.set()
        t.join()
        assert st == 408 and error_of(st, body)["code"] == "request_timeout", body
    finally:
        for c in socks:
            c.close()
        if slow:
            slow.close()
    healthy(srv)


def test_queue_full_and_shutdown():
    """--max-queue 1: one request runs, one waits, the next gets a 503. Then SIGTERM with a stream
    in flight: the stream ends properly ([DONE]), the server exits 0 within the shutdown timeout."""
    s = Server("--max-queue", "1", "--shutdown-timeout", "2", "--max-batch", "1")
    try:
        # long enough to still run after the 0.5 s below on a fast machine (SIGTERM ends it after 2 s)
        long_body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0, "stream": True,
                                "ignore_eos": True}).encode()
        running = socket.create_connection(("127.0.0.1", s.port), timeout=120)
        running.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(long_body), long_body))
        buf = b""
        while buf.count(b"data: ") < 2:  # it is running
            buf += running.recv(65536)
        waiting = socket.create_connection(("127.0.0.1", s.port), timeout=120)
        wb = json.dumps(OK_BODY).encode()
        waiting.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(wb), wb))
        time.sleep(0.5)
        st, _, body = post(s.port, COMP, OK_BODY)
        assert st == 503 and error_of(st, body)["type"] == "server_error", body
        # shutdown: the waiting request is answered (finished or 503), the stream ends with [DONE]
        s.proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        # while draining, new requests get a 503 with the error object and Retry-After
        deadline = time.time() + 30
        while True:
            st, hdr, body = post(s.port, COMP, OK_BODY)
            if (st == 503 and b"shutting down" in body) or time.time() > deadline:
                break
            time.sleep(0.05)
        assert st == 503 and error_of(st, body)["type"] == "server_error" and "shutting down" in error_of(st, body)["message"], body
        assert int(hdr["retry-after"]) > 0
        st, hdr, body = raw(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert st == 503 and json.loads(body)["status"] == "shutting down" and "retry-after" in hdr
        st, _, body = read_response(waiting, timeout=120)
        assert st in (200, 503), body
        running.settimeout(120)
        while not buf.endswith(b"0\r\n\r\n"):
            chunk = running.recv(65536)
            if not chunk:
                break
            buf += chunk
        assert b"data: [DONE]" in buf
        assert s.proc.wait(timeout=120) == 0
        assert time.time() - t0 < (90 if SANITIZED else 15)
        assert "SIGTERM" in s.log()
        running.close()
        waiting.close()
    finally:
        s.close()


def test_keepalive_comments_and_new_routes():
    """A stream waiting behind another request (--max-batch 1) gets SSE comments (--keepalive 1),
    which clients ignore; GET-only and POST-only routes answer other methods with a 405 error object.
    The busy request must outlast several keep-alive periods even on a fast machine: CI's release run
    once decoded its 300 tokens in 0.44 s, under a 1 s period."""
    s = Server("--keepalive", "0.2", "--max-batch", "1")
    try:
        long_body = json.dumps({"prompt": "Once upon a time", "max_tokens": 60 if SANITIZED else 600, "temperature": 0, "ignore_eos": True}).encode()
        busy = socket.create_connection(("127.0.0.1", s.port), timeout=300)
        busy.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(long_body), long_body))
        time.sleep(0.3)
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, "stream": True}).encode()
        st = socket.create_connection(("127.0.0.1", s.port), timeout=300)
        st.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        status, _, stream = read_response(st, timeout=300)
        assert status == 200 and b": keep-alive\n\n" in stream and stream.rstrip().endswith(b"data: [DONE]"), stream[:500]
        assert read_response(busy, timeout=300)[0] == 200
        busy.close()
        st.close()
        for req, want in ((b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
                          (b"GET /v1/responses HTTP/1.1\r\nHost: x\r\n\r\n", 405),
                          (b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
                          (b"GET /v1/messages/nope HTTP/1.1\r\nHost: x\r\n\r\n", 404)):
            code, hdr, resp = raw(s.port, req)
            assert code == want and hdr["content-type"] == "application/json", (req, code, resp)
        code, hdr, resp = raw(s.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert code == 200 and b"dspark_requests_total" in resp
    finally:
        s.close()
