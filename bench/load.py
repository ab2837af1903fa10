#!/usr/bin/env python3
"""Load benchmark for `dspark serve` (not a test). Scenarios (all by default, or --scenario):

  sweep      1, 2, 4, 8, 16 concurrent clients (--levels), each sending --per-client streaming
             chat requests of --max-tokens greedy tokens (ignore_eos, so every request decodes the
             same length), and more until the level has run --min-seconds. Per level: aggregate
             output tok/s and its ratio to 1 client, time to first token p50/p99, inter-token
             latency p50/p99 (gaps between content chunks of one stream), and the CPU seconds the
             server and this client used (on a small machine the Python client competes with the
             server for the cores: client_cpu_share says how much). --repeat N runs the whole sweep
             N times on one server and reports each level's median throughput; the engine's
             /metrics say where its time went per round (rows, forward ms, host ms outside the
             forward). --vs-serve-args ARGS starts a second server and runs each level on both,
             alternately (the first server first in odd repeats, the second in even ones), reporting
             the ratio of the two per level (median over the repeats): on a shared machine this
             compares like with like; use an even --repeat. A pair in which either server got less
             than 90% of the cores the level's runs usually get (server_cores: CPU s / wall s) was
             disturbed by another process and is left out of ratio_median_undisturbed. Every response is checked against the
             same request run alone first.
  multiturn  a ~2,000-token conversation: the first turn cold, then follow-up turns that reuse
             its KV from the prefix cache; the follow-up's TTFT against the same request on a
             server started with --no-prefix-cache (cold). Both outputs must be equal.
  longprompt --long-streams streams are decoding when a ~2,000-token prompt arrives; the
             inter-token latency of the running streams while it is prefilled (p99) against their
             idle median (and idle p99) before it arrived; --repeat runs on one server, each with
             its own long prompt (no prefix-cache hit), medians of the per-run ratios.
  memory     server RSS after 100 and after --memory-requests mixed requests (some abandoned).

  python3 bench/load.py --json > bench/results/load-$(date +%F).json
  python3 bench/load.py --scenario sweep --serve-args "--max-batch 16 --threads 2 --mode baseline"
  python3 bench/load.py --scenario sweep --levels 1,8 --min-seconds 10 --repeat 3 \
      --serve-args "--max-batch 16 --threads 2" --vs-serve-args "--max-batch 16 --threads 2 --mode baseline"

--serve-args replaces the default arguments (--max-batch 16 --threads 2): repeat them.

It starts build/release/dspark serve itself (a fresh one per scenario). Standard library only."""
import argparse
import http.client
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

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
HERE = os.path.dirname(os.path.abspath(__file__))
PARAGRAPH = ("The history of computing is a story of ideas meeting machines. Early mechanical calculators gave way to "
             "electronic computers, which in turn shrank from rooms to desks to pockets. Along the way, programmers "
             "invented languages, operating systems and networks, and each layer made the next one possible. ")


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    i = int(k)
    return xs[i] if i + 1 >= len(xs) else xs[i] + (xs[i + 1] - xs[i]) * (k - i)


def stats(xs):
    return {"p50": round(pct(xs, 50), 4), "p90": round(pct(xs, 90), 4), "p99": round(pct(xs, 99), 4), "max": round(pct(xs, 100), 4),
            "n": len(xs)}


class Server:
    def __init__(self, bin_, model, args):
        self.logf = tempfile.NamedTemporaryFile(prefix="dspark-load-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([bin_, "serve", "-m", model, "--port", "0", "--max-queue", "1024", *args],
                                     stdout=subprocess.DEVNULL, stderr=self.logf)
        deadline, self.url = time.time() + 180, None
        while not self.url:
            m = re.search(r"listening on http://([\d.]+):(\d+)", open(self.logf.name, errors="replace").read())
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
                self.url = "http://%s:%d" % (self.host, self.port)
            elif self.proc.poll() is not None or time.time() > deadline:
                sys.exit("dspark serve did not start:\n" + open(self.logf.name, errors="replace").read())
            time.sleep(0.05)

    def cpu_s(self):
        """CPU seconds (user + system) the server process has used so far."""
        f = open("/proc/%d/stat" % self.proc.pid).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self):
        """The engine's round counters from /metrics (zeros for a server without them)."""
        names = ("dspark_rounds_total", "dspark_forward_rows_total", "dspark_forward_seconds_total", "dspark_round_host_seconds_total",
                 "dspark_spec_rounds_total", "dspark_spec_drafted_tokens_total", "dspark_spec_accepted_tokens_total")
        c = http.client.HTTPConnection(self.host, self.port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        out = dict.fromkeys(names, 0.0)
        for ln in text.splitlines():
            parts = ln.split()
            if len(parts) == 2 and parts[0] in out:
                out[parts[0]] = float(parts[1])
        return out

    def rss_mb(self):
        for ln in open("/proc/%d/status" % self.proc.pid):
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) / 1024.0
        return float("nan")

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)
        if os.environ.get("DSP_LOAD_KEEP_LOG"):
            print("server log: " + self.logf.name, file=sys.stderr)
        else:
            os.unlink(self.logf.name)


def request(srv, messages, max_tokens, stream, extra=None):
    """One chat request. Returns (text, completion_tokens, cached_tokens, t_start, [chunk arrival times])."""
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra or {})
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    if not stream:
        obj = json.loads(r.read())
        u = obj["usage"]
        return obj["choices"][0]["message"]["content"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"], t0, [time.perf_counter()]
    text, times, usage, done = [], [], {}, False
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            done = True
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            piece = ch["delta"].get("content")
            if piece:
                times.append(time.perf_counter())
                text.append(piece)
    c.close()
    if not done:
        raise RuntimeError("stream without [DONE]")
    return "".join(text), usage.get("completion_tokens", 0), (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0), t0, times


def chat(q, system=None):
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]


def sweep_level(a, srv, refs, n_cl):
    """n_cl clients, each sending at least --per-client requests, until --min-seconds have passed."""
    res, problems, lock = [], [], threading.Lock()
    t_end = [None]

    def worker(k):
        j = 0
        while j < a.per_client or time.perf_counter() < t_end[0]:
            i = (k * a.per_client + j) % len(PROMPTS)
            j += 1
            try:
                text, ntok, _, t0, times = request(srv, chat(PROMPTS[i]), a.max_tokens, not a.no_stream)
            except Exception as e:  # reported
                with lock:
                    problems.append(str(e))
                continue
            with lock:
                if text != refs[i]:
                    problems.append("wrong output for prompt %d" % i)
                res.append((ntok, t0, times))

    load0 = os.getloadavg()[0]
    m0 = srv.metrics()
    cpu_cl0, cpu_srv0 = time.process_time(), srv.cpu_s()
    t0 = time.perf_counter()
    t_end[0] = t0 + a.min_seconds
    ths = [threading.Thread(target=worker, args=(k,)) for k in range(n_cl)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    cpu_cl, cpu_srv = time.process_time() - cpu_cl0, srv.cpu_s() - cpu_srv0
    m1 = srv.metrics()
    d = {k: m1[k] - m0[k] for k in m0}
    rounds = d["dspark_rounds_total"]
    # where the engine thread's time went: forwards, the rest of its rounds, and neither (waiting for
    # requests, handing events to connections)
    engine = {"rounds": int(rounds), "rows_per_round": round(d["dspark_forward_rows_total"] / rounds, 2) if rounds else None,
              "forward_ms_per_round": round(1e3 * d["dspark_forward_seconds_total"] / rounds, 3) if rounds else None,
              "host_ms_per_round": round(1e3 * d["dspark_round_host_seconds_total"] / rounds, 3) if rounds else None,
              "forward_share": round(d["dspark_forward_seconds_total"] / wall, 3),
              "host_share": round(d["dspark_round_host_seconds_total"] / wall, 3),
              # speculation, counted when a request ends: its decoding rounds, drafts verified, drafts accepted
              "request_rounds": int(d["dspark_spec_rounds_total"]), "drafted": int(d["dspark_spec_drafted_tokens_total"]),
              "accepted": int(d["dspark_spec_accepted_tokens_total"])}
    toks = sum(r[0] for r in res)
    ttft = [r[2][0] - r[1] for r in res if r[2]]
    itl = [b - a_ for r in res for a_, b in zip(r[2], r[2][1:])]
    lv = {"clients": n_cl, "requests": len(res), "wall_s": round(wall, 2), "completion_tokens": toks,
          "throughput_tok_s": round(toks / wall, 2), "ttft_s": stats(ttft), "itl_s": stats(itl),
          "server_cpu_s": round(cpu_srv, 2), "server_cores": round(cpu_srv / wall, 2), "tok_per_server_cpu_s": round(toks / cpu_srv, 2) if cpu_srv > 0 else None, "client_cpu_s": round(cpu_cl, 2), "client_cpu_share": round(cpu_cl / wall, 3),
          "engine": engine, "loadavg_before": round(load0, 2), "loadavg_after": round(os.getloadavg()[0], 2),
          "n_problems": len(problems), "problems": problems[:10]}
    print("  sweep: %2d clients: %.1f tok/s aggregate, TTFT p50 %.3f p99 %.3f s, ITL p50 %.4f p99 %.4f s, CPU s server %.1f client %.1f "
          "(wall %.1f s), rounds: %s rows, %s ms forward + %s ms host (%.0f%% + %.0f%% of wall), load %.1f, %d problems" % (
              n_cl, toks / wall, pct(ttft, 50), pct(ttft, 99), pct(itl, 50), pct(itl, 99), cpu_srv, cpu_cl, wall, engine["rows_per_round"],
              engine["forward_ms_per_round"], engine["host_ms_per_round"], 100 * engine["forward_share"], 100 * engine["host_share"], load0,
              len(problems)), file=sys.stderr)
    return lv


def median_level(lvs):
    """The level whose throughput is the median of the repeats, with every repeat's throughput."""
    order = sorted(lvs, key=lambda lv: lv["throughput_tok_s"])
    med = dict(order[(len(order) - 1) // 2])
    med["throughput_runs_tok_s"] = [lv["throughput_tok_s"] for lv in lvs]
    med["throughput_tok_s"] = round(pct([lv["throughput_tok_s"] for lv in lvs], 50), 2)
    return med


def sweep(a):
    """The sweep on one server, or with --vs-serve-args on two at once, level by level alternately
    (on a shared machine the neighbours' load drifts; alternating puts both sides under the same)."""
    srvs = [Server(a.bin, a.model, a.serve_args.split())]
    try:
        if a.vs_serve_args is not None:
            srvs.append(Server(a.vs_bin or a.bin, a.model, a.vs_serve_args.split()))
        refs = [request(srvs[0], chat(p), a.max_tokens, False)[0] for p in PROMPTS]
        for other in srvs[1:]:  # both sides must give the same answers (lossless), or the comparison is void
            if [request(other, chat(p), a.max_tokens, False)[0] for p in PROMPTS] != refs:
                sys.exit("--vs-serve-args: the two servers answer differently")
        runs = [[] for _ in srvs]
        for rep in range(a.repeat):
            levels = [[] for _ in srvs]
            # which server goes first alternates by repeat (A B, then B A): a fixed order puts any effect
            # of the position (and the machine's drift) on one side; baseline against itself with the
            # fixed order gave the first server median ratios of 0.978 (4 clients) and 0.982 (8), 3 repeats
            order = list(range(len(srvs))) if rep % 2 == 0 else list(reversed(range(len(srvs))))
            for n_cl in [int(x) for x in a.levels.split(",")]:
                for k in order:
                    levels[k].append(sweep_level(a, srvs[k], refs, n_cl))
            for k in range(len(srvs)):
                runs[k].append(levels[k])
        outs = []
        for k, args in enumerate([a.serve_args, a.vs_serve_args][:len(srvs)]):
            rk = runs[k]
            levels = rk[0] if a.repeat == 1 else [median_level([run[i] for run in rk]) for i in range(len(rk[0]))]
            base = levels[0]["throughput_tok_s"] or float("nan")
            for lv in levels:
                lv["speedup_vs_1_client"] = round(lv["throughput_tok_s"] / base, 3)
            out = {"scenario": "sweep", "max_tokens": a.max_tokens, "per_client": a.per_client, "min_seconds": a.min_seconds,
                   "repeat": a.repeat, "serve_args": args, "levels": levels}
            if a.repeat > 1:
                out["runs"] = rk
            outs.append(out)
        if len(outs) == 1:
            return outs[0]
        # per level: the first server's throughput over the second's, repeat by repeat (run back to back)
        ratios = []
        for i, lv in enumerate(outs[0]["levels"]):
            rs = [runs[0][r][i]["throughput_tok_s"] / runs[1][r][i]["throughput_tok_s"] for r in range(a.repeat)]
            # a run whose server got less than 90% of the cores the level's runs usually get shared the
            # machine with something else (the server's threads spin, so it uses every core it gets):
            # its pair is reported, and left out of ratio_median_undisturbed
            cores = [runs[k][r][i]["server_cores"] for k in range(2) for r in range(a.repeat)]
            ok = [min(runs[0][r][i]["server_cores"], runs[1][r][i]["server_cores"]) >= 0.9 * pct(cores, 50) for r in range(a.repeat)]
            ru = [x for x, o in zip(rs, ok) if o]
            ratios.append({"clients": lv["clients"], "ratio_median": round(pct(rs, 50), 3), "ratios": [round(x, 3) for x in rs],
                           "disturbed": [r for r in range(a.repeat) if not ok[r]],
                           "ratio_median_undisturbed": round(pct(ru, 50), 3) if ru else None})
            print("  sweep: %2d clients: '%s' / '%s' = %.3f (median of %s); without disturbed runs %s" % (
                lv["clients"], a.serve_args, a.vs_serve_args, pct(rs, 50), ", ".join("%.3f" % x for x in rs),
                "%.3f (%d of %d)" % (pct(ru, 50), len(ru), len(rs)) if ru else "none left"), file=sys.stderr)
        return {"scenario": "sweep_vs", "a": outs[0], "b": outs[1], "b_bin": a.vs_bin or a.bin, "a_over_b": ratios}
    finally:
        for srv in srvs:
            srv.close()


def multiturn(a):
    system = PARAGRAPH * 24  # ~2,000 tokens
    srv = Server(a.bin, a.model, a.serve_args.split())
    cold_srv = None
    try:
        msgs = chat("Summarize the text above in one sentence.", system)
        turns = []
        for t in range(3):
            text, ntok, cached, t0, times = request(srv, msgs, 24, True)
            turns.append({"turn": t + 1, "ttft_s": round(times[0] - t0, 4), "cached_tokens": cached})
            msgs = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": ["Say more.", "And then?", "Thanks."][t]}]
            last_follow = (msgs[:-2], text)
        # the last follow-up request again, cold: on a server without the prefix cache
        prev = turns[-1]
        cold_srv = Server(a.bin, a.model, a.serve_args.split() + ["--no-prefix-cache"])
        req = last_follow[0]
        text_cold, _, cached_cold, t0, times = request(cold_srv, req, 24, True)
        cold = times[0] - t0
        return {"scenario": "multiturn", "system_chars": len(system), "turns": turns, "follow_up_ttft_s": prev["ttft_s"],
                "cold_ttft_s": round(cold, 4), "cold_cached_tokens": cached_cold, "speedup": round(cold / prev["ttft_s"], 2),
                "outputs_equal": text_cold == last_follow[1]}
    finally:
        srv.close()
        if cold_srv:
            cold_srv.close()


def longprompt_once(a, srv, run):
    """One arrival of a ~2,000-token prompt while --long-streams streams decode: their chunk gaps
    before it (idle) and while it is prefilled. Each run's long prompt starts with its own number,
    so no run finds the last one in the prefix cache."""
    res = [None] * a.long_streams
    t_arrive = [None, None]

    def stream(k):
        res[k] = request(srv, chat(PROMPTS[(k + run) % len(PROMPTS)] + " (%d)" % run), a.long_tokens, True)

    ths = [threading.Thread(target=stream, args=(k,)) for k in range(a.long_streams)]
    for t in ths:
        t.start()
    time.sleep(a.long_idle)
    t_arrive[0] = time.perf_counter()
    text, _, _, t0, times = request(srv, chat("Summarize the text above in one sentence.", "Document %d.\n" % run + PARAGRAPH * 24), 4, True)
    t_arrive[1] = t0 + (times[0] - t0) if times else time.perf_counter()  # its first token: the prefill is over
    for t in ths:
        t.join()
    idle, during = [], []
    for r in res:
        for x, y in zip(r[4], r[4][1:]):
            if y < t_arrive[0]:
                idle.append(y - x)
            elif x < t_arrive[1] and y > t_arrive[0]:
                during.append(y - x)
    ok = idle and during
    return {"prefill_window_s": round(t_arrive[1] - t_arrive[0], 3), "idle_itl_s": stats(idle), "during_prefill_itl_s": stats(during),
            "p99_over_idle_median": round(pct(during, 99) / pct(idle, 50), 2) if ok else None,
            "p99_over_idle_p99": round(pct(during, 99) / pct(idle, 99), 2) if ok else None}


def longprompt(a):
    """--repeat runs on one server; the medians of the per-run figures."""
    srv = Server(a.bin, a.model, a.serve_args.split())
    try:
        runs = [longprompt_once(a, srv, k) for k in range(a.repeat)]
        med = lambda key: statistics.median(r[key] for r in runs) if all(r[key] is not None for r in runs) else None  # noqa: E731
        return {"scenario": "longprompt", "streams": a.long_streams, "serve_args": a.serve_args, "runs": runs,
                "prefill_window_s": med("prefill_window_s"), "p99_over_idle_median": med("p99_over_idle_median"),
                "p99_over_idle_p99": med("p99_over_idle_p99")}
    finally:
        srv.close()


def memory(a):
    srv = Server(a.bin, a.model, a.serve_args.split())
    try:
        rss, lock, count = {}, threading.Lock(), [0]

        def client(k):
            for j in range(k, a.memory_requests, 8):
                i = j % len(PROMPTS)
                if j % 5 == 0:  # abandoned mid-stream
                    body = json.dumps({"messages": chat(PROMPTS[i] + " " * (j % 7)), "max_tokens": 32, "stream": True}).encode()
                    s = socket.create_connection((srv.host, srv.port), timeout=60)
                    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    s.recv(64)
                    s.close()
                else:
                    request(srv, chat(PROMPTS[i] + " %d" % j), 8, j % 2 == 0, {"temperature": 0.7, "seed": j})
                with lock:
                    count[0] += 1
                    if count[0] in (100, a.memory_requests):
                        rss[count[0]] = srv.rss_mb()

        ths = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        time.sleep(1)
        end = srv.rss_mb()
        return {"scenario": "memory", "requests": a.memory_requests, "rss_mb_after_100": round(rss.get(100, float("nan")), 1),
                "rss_mb_after_all": round(end, 1), "ratio": round(end / rss.get(100, float("nan")), 4)}
    finally:
        srv.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "release", "dspark"))
    ap.add_argument("--model", default=os.path.join(HERE, "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--serve-args", default="--max-batch 16 --threads 2", help="extra arguments for dspark serve")
    ap.add_argument("--scenario", default="sweep,multiturn,longprompt,memory")
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--min-seconds", type=float, default=0, help="sweep: each level keeps sending requests until it has run this long")
    ap.add_argument("--repeat", type=int, default=1, help="sweep: run the levels this many times; each level reports the median")
    ap.add_argument("--vs-serve-args", default=None, help="sweep: a second server with these arguments, run level by level "
                    "alternately with the first; reports each side and the ratio first / second per level")
    ap.add_argument("--vs-bin", default=None, help="the second server's binary (default: --bin), e.g. a build of the previous commit")
    ap.add_argument("--no-stream", action="store_true", help="sweep: non-streaming requests (less client work; no ITL)")
    ap.add_argument("--long-streams", type=int, default=4)
    ap.add_argument("--long-tokens", type=int, default=400)
    ap.add_argument("--long-idle", type=float, default=3.0, help="seconds of idle streaming before the long prompt arrives")
    ap.add_argument("--memory-requests", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cpu = platform.machine()
    try:
        cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"benchmark": "dspark serve load", "commit": commit, "machine": {"cpu": cpu, "cores": os.cpu_count(),
           "loadavg": os.getloadavg()[0]}, "model": os.path.basename(a.model), "scenarios": []}
    funcs = {"sweep": sweep, "multiturn": multiturn, "longprompt": longprompt, "memory": memory}
    for name in a.scenario.split(","):
        r = funcs[name](a)
        out["scenarios"].append(r)
        if not a.json:
            print(json.dumps(r))
    if a.json:
        print(json.dumps(out, indent=1))
    sweeps = [s for s in out["scenarios"] if s["scenario"] == "sweep"] + [x for s in out["scenarios"] if s["scenario"] == "sweep_vs"
                                                                        for x in (s["a"], s["b"])]
    bad = any(lv["n_problems"] for s in sweeps for run in s.get("runs", [s["levels"]]) for lv in run)
    bad |= any(not s["outputs_equal"] for s in out["scenarios"] if s["scenario"] == "multiturn")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
