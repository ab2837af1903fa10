#!/usr/bin/env python3
"""dspark next to llama.cpp on the same GGUF files, the same threads, in the same run.

    bench/build_llamacpp.sh                      # once: llama-bench from the llama-cpp-python sdist
    python3 bench/compare_llamacpp.py -t 2 -r 5 models/SmolLM2-135M-Instruct.Q4_1.gguf build/models/qwen3-0.6b-q8_0.gguf
    python3 bench/compare_llamacpp.py ... --json --out bench/results/compare-<machine>.json

Per file, each round runs llama-bench (pp512 and tg128, one repetition after its warm-up) and
`dspark benchmark` (prefill of 512 tokens and decode of 128, one repetition after its warm-up,
--no-verify --bw-mb 0) back to back, alternating which goes first, so that a drift in the load
of a shared machine hits both alike. Reported per file: each engine's median tok/s with its
spread (min..max over the rounds), and the median of the per-round ratios dspark / llama.cpp
(with their spread) for decode (tg128) and prefill (pp512). The CPU variant of each engine is
recorded: llama.cpp's build variant (bench/.llamacpp/.../CPU_VARIANT) and the ggml CPU features
llama-bench reports; dspark's kernel table and activation precision.

Thread scaling: `-t 1,2,4,8,16` runs every listed thread count (rounds alternate inside each);
`--llama-threads 8,16` limits llama.cpp to some of them (to save time), `--decode-only` skips the
prefill figure and `--n-gen N` shortens decode (tgN for both engines).

GPU: `--backend cuda` runs both engines on the GPU (llama-bench `-ngl 99 -fa 1`, flash attention on
as in issue 12's figures; dspark `--backend cuda`) with a llama.cpp built by
`LLAMACPP_CUDA=1 bench/build_llamacpp.sh` (pass its bin/ with --llama-bin on the GPU machine);
`--batched 1,2,4,8,16,32` adds llama.cpp's batched-bench (independent sequences, prompt 128,
32 tokens each, as dspark's figure) next to dspark benchmark's batched decode at the same counts.

llama-bench decodes without sampling; dspark's decode includes greedy sampling (a few us per
token), so the comparison favours llama.cpp slightly. Nothing here is a dependency of dspark.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_llama_bin(arg: str | None) -> str:
    if arg:
        return arg
    cands = sorted(glob.glob(os.path.join(ROOT, "bench", ".llamacpp", "build-*", "bin", "llama-bench")), key=os.path.getmtime)
    if not cands:
        sys.exit("compare_llamacpp: no llama-bench under bench/.llamacpp (run bench/build_llamacpp.sh, or pass --llama-bin)")
    return os.path.dirname(cands[-1])


def run_llama(bindir: str, model: str, threads: int, timeout: int, n_gen: int, prefill: bool, backend: str = "cpu") -> dict:
    cmd = [os.path.join(bindir, "llama-bench"), "-m", model, "-t", str(threads), "-p", "512" if prefill else "0", "-n", str(n_gen),
           "-r", "1", "-o", "json"]
    if backend == "cuda":
        cmd += ["-ngl", "99", "-fa", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}): {r.stderr[-2000:]}")
    out = {"pp512": None, "tg": None, "info": {}}
    for e in json.loads(r.stdout):
        if e.get("n_prompt") == 512 and e.get("n_gen") == 0:
            out["pp512"] = e["avg_ts"]
        elif e.get("n_gen") == n_gen and e.get("n_prompt") == 0:
            out["tg"] = e["avg_ts"]
        out["info"] = {k: e.get(k) for k in ("build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_type", "model_size",
                                              "n_threads", "n_gpu_layers", "type_k", "flash_attn") if k in e}
    if (prefill and out["pp512"] is None) or out["tg"] is None:
        raise RuntimeError("llama-bench: pp512 / tg missing from its JSON")
    return out


def run_dspark(exe: str, model: str, threads: int, precision: str, timeout: int, n_gen: int, prefill: bool, backend: str = "cpu") -> dict:
    cmd = [exe, "benchmark", "-m", model, "-t", str(threads), "-r", "1", "--json", "--bw-mb", "0", "--no-verify", "--no-batched",
           "--decode-tokens", str(n_gen), "--backend", backend]
    if backend == "cpu":
        cmd += ["--precision", precision]
    if not prefill:
        cmd.append("--no-prefill")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"dspark benchmark failed ({r.returncode}): {r.stderr[-2000:]}")
    j = json.loads(r.stdout)
    return {"pp512": j["prefill"]["tok_s"] if prefill else None, "tg": j["decode"]["tok_s"], "info": j["machine"]}


def run_llama_batched(bindir: str, model: str, counts: list[int], timeout: int) -> dict:
    """llama.cpp's batched-bench: independent sequences (-pps off), prompt 128, 32 generated each (dspark benchmark's batched figure: 128-token prefixes, 32 steps);
    returns {count: generated tok/s (S_TG)}."""
    npl = ",".join(str(c) for c in counts)
    cmd = [os.path.join(bindir, "llama-batched-bench"), "-m", model, "-ngl", "99", "-fa", "on", "-c", str(max(counts) * 256 + 256),
           "-b", "2048", "-ub", "512", "-npp", "128", "-ntg", "32", "-npl", npl, "--output-format", "jsonl"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed ({r.returncode}): {r.stderr[-2000:]}")
    out = {}
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            e = json.loads(line)
            if "pl" in e and "speed_tg" in e:
                out[int(e["pl"])] = e["speed_tg"]
    if not out:
        raise RuntimeError("llama-batched-bench: no jsonl lines: " + r.stdout[-1000:])
    return out


def run_dspark_batched(exe: str, model: str, counts: list[int], timeout: int, backend: str) -> dict:
    """dspark benchmark's batched decode (1, 2, 4, ... 32 sequences, 128-token prefixes, one token
    each per forward): {count: tok/s} for the counts asked for."""
    cmd = [exe, "benchmark", "-m", model, "-r", "1", "--json", "--bw-mb", "0", "--no-verify", "--no-prefill", "--backend", backend]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"dspark benchmark --batched failed ({r.returncode}): {r.stderr[-2000:]}")
    j = json.loads(r.stdout)
    got = dict(zip(j["batched"]["seqs"], j["batched"]["tok_s"]))
    return {c: got[c] for c in counts if c in got}


def write_json(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, indent=1) + "\n")


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="GGUF files")
    ap.add_argument("-t", "--threads", default="2", help="thread count, or a comma list (scaling)")
    ap.add_argument("--llama-threads", help="run llama.cpp only at these thread counts (default: all of --threads)")
    ap.add_argument("--decode-only", action="store_true", help="skip prefill (pp512)")
    ap.add_argument("--n-gen", type=int, default=128, help="decode tokens (tgN) for both engines")
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--llama-bin", help="directory with llama-bench (default: the newest under bench/.llamacpp)")
    ap.add_argument("--dspark", default=os.path.join(ROOT, "build", "release", "dspark"))
    ap.add_argument("--precision", default="q8", choices=["q8", "f32"], help="dspark's --precision")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per engine run")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"], help="where both engines run (cuda: llama.cpp built with LLAMACPP_CUDA=1)")
    ap.add_argument("--batched", help="also batched decode at these sequence counts (e.g. 1,2,4,8,16,32; GPU)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--out", help="also write the JSON object to this file (e.g. bench/results/...)")
    a = ap.parse_args()
    threads = [int(x) for x in a.threads.split(",")]
    llama_threads = [int(x) for x in a.llama_threads.split(",")] if a.llama_threads else threads
    if a.rounds < 1 or min(threads) < 1 or a.n_gen < 1:
        sys.exit("compare_llamacpp: --rounds, --threads and --n-gen must be >= 1")
    prefill = not a.decode_only
    tg = f"tg{a.n_gen}"
    bindir = find_llama_bin(a.llama_bin)
    variant_file = os.path.join(bindir, "CPU_VARIANT")
    variant = open(variant_file, encoding="utf-8").read().strip() if os.path.exists(variant_file) else "unknown"
    gpu = None
    if a.backend == "cuda":
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], capture_output=True, text=True)
        gpu = r.stdout.strip() or None
    result = {"schema": "dspark.compare_llamacpp/1", "backend": a.backend, "gpu": gpu, "cpu": cpu_name(), "nproc": os.cpu_count(), "threads": threads, "rounds": a.rounds,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "llama_bin": bindir, "llama_cpu_variant": variant,
              "dspark_precision": a.precision, "loadavg_before": os.getloadavg()[0], "files": []}
    for model in a.models:
        if not os.path.exists(model):
            sys.exit(f"compare_llamacpp: {model}: no such file")
        for t in threads:
            rounds = []
            with_llama = t in llama_threads
            for r in range(a.rounds):
                pair = {}
                order = ("llama", "dspark") if r % 2 == 0 else ("dspark", "llama")
                for eng in order:
                    if eng == "llama" and with_llama:
                        pair[eng] = run_llama(bindir, model, t, a.timeout, a.n_gen, prefill, a.backend)
                    elif eng == "dspark":
                        pair[eng] = run_dspark(a.dspark, model, t, a.precision, a.timeout, a.n_gen, prefill, a.backend)
                rounds.append(pair)
                if not a.json:
                    msg = f"  {os.path.basename(model)} t={t} round {r + 1}: {tg} dspark {pair['dspark']['tg']:.1f}"
                    if with_llama:
                        msg += f" llama.cpp {pair['llama']['tg']:.1f}"
                    print(msg, file=sys.stderr)
            f = {"model": model, "threads": t, "size_bytes": os.path.getsize(model), "dspark_info": rounds[-1]["dspark"]["info"],
                 "llama_info": rounds[-1]["llama"]["info"] if with_llama else None}
            for m, key in ((tg, "tg"), ("pp512", "pp512")):
                if key == "pp512" and not prefill:
                    continue
                d = [x["dspark"][key] for x in rounds]
                f[m] = {"dspark": summary(d)}
                if with_llama:
                    lv = [x["llama"][key] for x in rounds]
                    f[m]["llama"] = summary(lv)
                    f[m]["ratio"] = summary([x / y for x, y in zip(d, lv)])
            if a.batched:
                counts = [int(x) for x in a.batched.split(",")]
                f["batched"] = {"counts": counts, "llama": run_llama_batched(bindir, model, counts, a.timeout),
                                "dspark": run_dspark_batched(a.dspark, model, counts, a.timeout, a.backend)}
            result["files"].append(f)
            if a.out:  # after every entry: a run cut short keeps what it measured
                write_json(a.out, result)
    result["loadavg_after"] = os.getloadavg()[0]
    if a.out:
        write_json(a.out, result)
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['cpu']}, {a.rounds} alternating rounds; llama.cpp variant {variant}, dspark "
          f"{result['files'][0]['dspark_info'].get('isa', '?')} {a.precision}; load {result['loadavg_before']:.1f} -> {result['loadavg_after']:.1f}")
    print(f"{'file':30s} {'thr':>3s} {'':7s} {'dspark tok/s':>22s} {'llama.cpp tok/s':>22s} {'ratio (median, range)':>24s}")
    for f in result["files"]:
        for m, name in ((tg, "decode"), ("pp512", "prefill")):
            if m not in f:
                continue
            d = f[m]["dspark"]
            line = f"{os.path.basename(f['model'])[:30]:30s} {f['threads']:3d} {name:7s} {d['median']:8.1f} ({d['min']:.1f}..{d['max']:.1f})"
            if "llama" in f[m]:
                lv, q = f[m]["llama"], f[m]["ratio"]
                line += f" {lv['median']:8.1f} ({lv['min']:.1f}..{lv['max']:.1f}) {q['median']:7.2f}x ({q['min']:.2f}..{q['max']:.2f})"
            print(line)
        if "batched" in f:
            b = f["batched"]
            print("  batched decode tok/s (sequences: dspark / llama.cpp): " +
                  ", ".join(f"{c}: {b['dspark'].get(c, 0):.0f} / {b['llama'].get(c, 0):.0f}" for c in b["counts"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
