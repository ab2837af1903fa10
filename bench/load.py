#!/usr/bin/env python3
"""Load benchmark for `dspark serve` (not a test).

Phase 1: N sequential streaming chat requests. Phase 2: C concurrent clients, each sending R
requests back to back. Every request is greedy (temperature 0) over a fixed set of prompts, so
each response must equal the reference response for its prompt (taken from a non-streaming
request before timing starts) and must be complete: a finish_reason, a usage chunk whose
completion_tokens matches, and `data: [DONE]`. Reports latency and time-to-first-token
percentiles and token throughput per phase; --json prints one JSON object.

  python3 bench/load.py                      # starts build/release/dspark serve on a free port
  python3 bench/load.py --url http://127.0.0.1:8000   # an already running server

Standard library only."""
import argparse
import http.client
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
    "Give me a short tip for writing clean code.",
    "What does HTTP stand for?",
    "Translate 'good morning' into Spanish.",
    "Name a famous painting by Leonardo da Vinci.",
    "Why is the sky blue? Answer briefly.",
]


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    i = int(k)
    return xs[i] if i + 1 >= len(xs) else xs[i] + (xs[i + 1] - xs[i]) * (k - i)


class Client:
    def __init__(self, url, model, max_tokens, api_key=None):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        self.model, self.max_tokens, self.api_key = model, max_tokens, api_key
        self.conn = None

    def _conn(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        return self.conn

    def _headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def chat(self, prompt):
        """Non-streaming: the content."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": self.max_tokens}
        c = self._conn()
        c.request("POST", "/v1/chat/completions", json.dumps(body), self._headers())
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError("HTTP %d: %s" % (r.status, data[:300]))
        return json.loads(data)["choices"][0]["message"]["content"]

    def stream(self, prompt):
        """Streaming request: (content, completion_tokens, latency s, ttft s, problems)."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
                "max_tokens": self.max_tokens, "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        c = self._conn()
        c.request("POST", "/v1/chat/completions", json.dumps(body), self._headers())
        r = c.getresponse()
        if r.status != 200:
            data = r.read()
            return None, 0, time.perf_counter() - t0, None, ["HTTP %d: %s" % (r.status, data[:200])]
        text, ttft, usage, finish, done, problems = [], None, None, None, False, []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                continue
            ev = json.loads(payload)
            if "error" in ev:
                problems.append("error event: %s" % ev["error"])
                continue
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch["delta"].get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
        r.read()
        lat = time.perf_counter() - t0
        if not done:
            problems.append("no [DONE]")
        if finish not in ("stop", "length"):
            problems.append("finish_reason %r" % finish)
        if not usage:
            problems.append("no usage chunk")
        return "".join(text), (usage or {}).get("completion_tokens", 0), lat, ttft, problems


def run_phase(name, url, model, max_tokens, refs, n_clients, per_client, api_key):
    results, lock = [], threading.Lock()

    def worker(k):
        cl = Client(url, model, max_tokens, api_key)
        for j in range(per_client):
            i = (k * per_client + j) % len(PROMPTS)
            text, ntok, lat, ttft, problems = cl.stream(PROMPTS[i])
            if text is not None and text != refs[i]:
                problems.append("wrong output for prompt %d: %r != %r" % (i, text[:80], refs[i][:80]))
            with lock:
                results.append((ntok, lat, ttft, problems))

    t0 = time.perf_counter()
    ths = [threading.Thread(target=worker, args=(k,)) for k in range(n_clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    lats = [r[1] for r in results]
    ttfts = [r[2] for r in results if r[2] is not None]
    toks = sum(r[0] for r in results)
    problems = [p for r in results for p in r[3]]
    per_req_tps = [r[0] / r[1] for r in results if r[1] > 0]
    return {
        "phase": name, "clients": n_clients, "requests": len(results), "wall_s": round(wall, 2),
        "ok": sum(1 for r in results if not r[3]), "problems": problems[:20], "n_problems": len(problems),
        "completion_tokens": toks, "throughput_tok_s": round(toks / wall, 2), "requests_per_s": round(len(results) / wall, 3),
        "latency_s": {p: round(pct(lats, q), 3) for p, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
        "ttft_s": {p: round(pct(ttfts, q), 3) for p, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
        "per_request_tok_s_p50": round(pct(per_req_tps, 50), 2),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (default: start one)")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "release", "dspark"))
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--serve-args", default="", help="extra arguments for dspark serve (e.g. '--mode baseline')")
    ap.add_argument("--api-key")
    ap.add_argument("--sequential", type=int, default=200, help="requests in phase 1")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients in phase 2")
    ap.add_argument("--per-client", type=int, default=5, help="requests per client in phase 2")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    proc, logf = None, None
    url = a.url
    if not url:
        logf = tempfile.NamedTemporaryFile(prefix="dspark-load-", suffix=".log", delete=False)
        proc = subprocess.Popen([a.bin, "serve", "-m", a.model, "--port", "0", "--max-queue", "256", *a.serve_args.split()],
                                stdout=subprocess.DEVNULL, stderr=logf)
        deadline = time.time() + 120
        while not url:
            m = re.search(r"listening on (http://\S+)", open(logf.name, errors="replace").read())
            if m:
                url = m.group(1)
            elif proc.poll() is not None or time.time() > deadline:
                sys.exit("dspark serve did not start:\n" + open(logf.name, errors="replace").read())
            time.sleep(0.05)
    try:
        cl = Client(url, None, a.max_tokens, a.api_key)
        c = cl._conn()
        c.request("GET", "/v1/models", headers=cl._headers())
        model = json.loads(c.getresponse().read())["data"][0]["id"]
        cl.model = model
        refs = [cl.chat(p) for p in PROMPTS]  # reference outputs (non-streaming)
        phases = [run_phase("sequential", url, model, a.max_tokens, refs, 1, a.sequential, a.api_key),
                  run_phase("concurrent", url, model, a.max_tokens, refs, a.clients, a.per_client, a.api_key)]
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
    out = {"benchmark": "dspark serve load", "machine": {"cpu": platform.processor() or platform.machine(),
                                                          "cores": os.cpu_count(), "system": platform.platform()},
           "model": os.path.basename(a.model) if not a.url else model, "max_tokens": a.max_tokens, "phases": phases}
    try:
        out["machine"]["cpu"] = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print("dspark serve load: %s, %s (%d cores), max_tokens %d" % (out["model"], out["machine"]["cpu"], out["machine"]["cores"], a.max_tokens))
        for p in phases:
            print("  %-10s %2d clients %4d requests in %7.1f s: %d ok, %d problems; %.1f tok/s, %.2f req/s" % (
                p["phase"], p["clients"], p["requests"], p["wall_s"], p["ok"], p["n_problems"], p["throughput_tok_s"], p["requests_per_s"]))
            print("             latency p50/p90/p99/max %s s; TTFT p50/p90/p99/max %s s; per-request %.1f tok/s" % (
                "/".join("%.2f" % p["latency_s"][k] for k in ("p50", "p90", "p99", "max")),
                "/".join("%.2f" % p["ttft_s"][k] for k in ("p50", "p90", "p99", "max")), p["per_request_tok_s_p50"]))
            for msg in p["problems"]:
                print("             problem:", msg)
    sys.exit(1 if any(p["n_problems"] for p in phases) else 0)


if __name__ == "__main__":
    main()
