#!/usr/bin/env python3
"""Where a drafter training step's time goes, for variants of the trainer's switches, on synthetic
batches (random tokens; only the shapes matter for the time).

    python tools/train_drafter/profile_step.py --random smollm2-135m --layers 5 --taps 1,8,15,22,28 \\
        --variant base: --variant fast:"--flex 1 --fused-head 1 --target-dtype bfloat16" [--table 30]

Each variant is a name and train_drafter.py options (they override the common ones given here). It
runs --warmup steps (compiling), then --steps steps timed by phase with the device synchronized
(train_drafter.PhaseTimer), and prints one JSON line per variant: ms per step by phase, steps/s,
peak memory. --table N adds torch.profiler's N most expensive kernels of two steps. A target is
--target (GGUF or HF directory, as train_drafter.py) or --random SHAPE (a random-weight Llama of that
shape: nothing to load). Needs a GPU for meaningful figures; runs on the CPU (slowly) for tests.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import train_drafter as T  # noqa: E402

SHAPES = {  # Llama-family shapes (random weights): name -> transformers LlamaConfig fields
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                 max_position_embeddings=1024, tie_word_embeddings=True),
}


def random_target(shape: str, device, dtype: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(**SHAPES[shape]))
    m.requires_grad_(False)
    return m.to(device=device, dtype=getattr(torch, dtype)).eval()


def synthetic_batch(n: int, lo: int, hi: int, width: int, vocab: int, rng: random.Random):
    """n records of like lengths (a window of `width` around a centre drawn in [lo, hi], as
    --bucket draws them), the first ~third of each the prompt."""
    c = rng.randint(lo, hi)
    recs = []
    for _ in range(n):
        L = max(8, min(hi, c + rng.randint(-width // 2, width // 2)))
        recs.append({"ids": [rng.randrange(vocab) for _ in range(L)], "prompt_len": max(1, L // 3)})
    return recs


def run_variant(name: str, argv: list[str], target_cache: dict, a) -> dict:
    import torch
    args = T.parse_args(["--target", a.target or "random"] + a.common + argv)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    key = (a.target, a.random, args.target_dtype)
    if key not in target_cache:
        target_cache.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        target_cache[key] = (random_target(a.random, device, args.target_dtype) if a.random
                             else T.load_target(a.target, device, args.target_dtype)[0])
    target = target_cache[key]
    cfg = T.drafter_config(target, args, 0)
    drafter = T.build_drafter(cfg, target, device, args.seed, args)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    weights = T.loss_weights(args, cfg, target, device)
    cuda = device.type == "cuda"
    autocast = T.train_autocast(args, device)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timer = T.PhaseTimer(cuda, a.warmup, a.warmup + a.steps)

    def step(i, tm):
        recs = synthetic_batch(args.batch, a.min_seq, a.max_seq, a.width, cfg["vocab_size"], rng)
        if args.cache_taps:  # made before the step (untimed), as the trainer makes them before its loop
            T.cache_features(target, recs, cfg["target_layer_ids"], 0, args.max_len, device, verbose=False)
        tm.start(i)
        ids, att, lm = T.make_batch(recs, 0, args.max_len, device)
        anchors, keep = T.sample_anchors(lm, args.anchors, gen)
        feats = T.batch_features(recs, ids.shape[1], device) if args.cache_taps else None
        tm.mark("batch")
        T.train_step(drafter, target, opt, params, (ids, att, lm), anchors, keep, weights, autocast, args.lr, tm, feats)
        return tm.end()

    t0 = time.time()
    phases, t_warm = None, 0.0
    for i in range(a.warmup + a.steps):
        phases = step(i, timer) or phases
        if i == a.warmup - 1:
            t_warm = time.time() - t0
    total = sum(v for k, v in (phases or {}).items())
    row = {"variant": name, "options": " ".join(argv), "warmup_s": round(t_warm, 1), "ms_per_step": round(total, 1),
           "steps_per_s": round(1e3 / total, 3) if total else None, "phase_ms": phases, "peak_memory": T.peak_gib(device)}
    if a.table:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            for i in range(2):
                step(10**9, T.NO_TIMER)
            if cuda:
                torch.cuda.synchronize()
        print(f"--- {name}: torch.profiler, 2 steps", flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=a.table,
                                        max_name_column_width=70), flush=True)
    del drafter, opt, params
    return row


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="GGUF file or HF directory (else --random)")
    ap.add_argument("--random", default=None, choices=sorted(SHAPES), help="a random-weight target of this shape")
    ap.add_argument("--variant", action="append", default=[], help="NAME:OPTIONS (train_drafter.py options)")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--min-seq", type=int, default=200)
    ap.add_argument("--max-seq", type=int, default=640)
    ap.add_argument("--width", type=int, default=64, help="length spread within a batch")
    ap.add_argument("--table", type=int, default=0, help="torch.profiler's top N kernels per variant")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, help="also write the rows here")
    a, common = ap.parse_known_args(argv)
    a.common = common
    if not (a.target or a.random):
        ap.error("--target or --random")
    import torch
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    rows, cache = [], {}
    for v in a.variant or ["base:"]:
        name, _, opts = v.partition(":")
        try:
            row = run_variant(name, shlex.split(opts), cache, a)
        except Exception as e:  # noqa: BLE001 - one variant failing (a compile error) must not lose the others
            row = {"variant": name, "options": opts, "error": f"{type(e).__name__}: {str(e)[:500]}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
