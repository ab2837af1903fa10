"""Helpers for the `dspark serve` tests: start the real binary on a free loopback port, talk raw
HTTP over sockets, run `dspark generate` for reference output."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

BIN = os.environ.get("DSPARK_BIN", "build/release/dspark")
# the test-only twin whose requests may carry "dspark_test_output" (CMakeLists.txt)
SCRIPTED_BIN = os.environ.get("DSPARK_SCRIPTED_BIN", os.path.join(os.path.dirname(BIN), "dspark_scripted"))
MODELS = os.environ.get("DSP_MODELS", "models")
MODEL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
# sanitizer builds (ASan, TSan: ctest sets DSP_SANITIZED) are slower: tests keep generations short
SANITIZED = os.environ.get("DSP_SANITIZED") == "1" or "asan" in BIN or "tsan" in BIN
# how long a client waits for a response: a sanitized server with a full batch is 10-50x slower; a
# release server's short answers take a second or two, but CI runs tests two at a time on two cores
# (one release-stage run timed out at 30 s on a solo request while another build shared the machine)
IO_TIMEOUT = 600 if SANITIZED else 120


class Server:
    """A running `dspark serve`; its stderr goes to a file (self.log())."""

    def __init__(self, *extra, ctx=512, binary=None, model=None):
        self.logf = tempfile.NamedTemporaryFile(prefix="dspark-serve-", suffix=".log", delete=False)
        args = [binary or BIN, "serve", "-m", model or MODEL, "--host", "127.0.0.1", "--port", "0", "--ctx", str(ctx), "--max-batch", "4",
                "--timeout", "3", "--request-timeout", "3", "--shutdown-timeout", "5", *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.logf)
        self.port = None
        deadline = time.time() + (600 if SANITIZED else 120)  # the start measures the cost profile (cached after)
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("dspark serve exited with %d:\n%s" % (self.proc.returncode, self.log()))
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
                break
            time.sleep(0.05)
        assert self.port, "dspark serve did not start:\n" + self.log()
        self.url = "http://127.0.0.1:%d" % self.port
        while True:  # wait for /health
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert time.time() < deadline, self.log()
                time.sleep(0.05)

    def log(self):
        with open(self.logf.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def client(self, api_key="none", **kw):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signal the server and return its exit code (ASan reports leaks at exit: nonzero)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("dspark serve did not exit within %d s after %s:\n%s" % (timeout, sig, self.log()))
        return self.proc.returncode

    def close(self):
        rc = self.stop()
        log = self.log()
        os.unlink(self.logf.name)
        assert rc == 0, "dspark serve exited with %d:\n%s" % (rc, log[-20000:])
        assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log, log[-20000:]


def raw(port, data, timeout=IO_TIMEOUT, shut_wr=False):
    """Send raw bytes, read until the server closes or a full response arrived; returns
    (status, headers dict, body bytes) or (None, {}, bytes received)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if shut_wr:
            s.shutdown(socket.SHUT_WR)
        return read_response(s, timeout)
    finally:
        s.close()


def read_response(s, timeout=IO_TIMEOUT):
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return None, {}, buf
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        body = dechunk(body)
    return status, headers, body


def dechunk(b):
    out = b""
    while b:
        line, b = b.split(b"\r\n", 1)
        n = int(line.split(b";")[0], 16)
        if n == 0:
            break
        out += b[:n]
        b = b[n + 2:]
    return out


def post(port, path, body, extra_headers=b""):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    req = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n" +
           extra_headers + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return raw(port, req)


def error_of(status, body):
    """The OpenAI error object of a reply, checked for its shape."""
    obj = json.loads(body)
    err = obj["error"]
    assert set(err) == {"message", "type", "param", "code"}, obj
    assert isinstance(err["message"], str) and err["message"], obj
    return err


def generate(*args):
    """`dspark generate ... --json` -> parsed JSON."""
    p = subprocess.run([BIN, "generate", "-m", MODEL, "--ctx", "512", "--json", *args], capture_output=True)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return json.loads(p.stdout)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
