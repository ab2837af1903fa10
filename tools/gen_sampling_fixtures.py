#!/usr/bin/env python3
"""Write tests/fixtures/sampling/*.json: processed sampling distributions from Hugging Face
transformers' logits processors, the oracle for src/sample (tests/test_sample.c reads them).

Needs torch + transformers (requirements-tools.txt; e.g. /tmp/toolvenv/bin/python). Deterministic:
every random draw comes from numpy's Generator with a fixed seed.

Pipeline reproduced per case, all in float32 as HF generate() runs it:
  logit bias (added by hand: HF has no additive per-token bias processor)
  -> RepetitionPenaltyLogitsProcessor(input_ids = the last N history tokens, or all for N = -1)
  -> frequency / presence penalties over the generated tokens (by hand, OpenAI formula; HF has none)
  -> TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper -> MinPLogitsWarper
  -> softmax.
Also torch.log_softmax of the raw row (the default logprobs).

Known, intentional differences from HF, avoided by construction here and documented in
src/sample/sample.h: we compute exp/sums in double (HF: float32), and ties at the top-p boundary
are all kept (HF's unstable sort keeps an arbitrary subset). So the generator checks, in float64,
that no case lies within a relative margin of 2e-5 of a top-p or min-p boundary (nudging the
parameter until it does not) and that no logits tie at a top-k boundary; on the remaining cases
the kept sets must agree exactly.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

V = 1000
MARGIN = 2e-5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "sampling")


def f32_list(a):
    # repr of a float32 widened to double: exact, so C's double -> float cast is exact too
    return [float(x) for x in np.asarray(a, dtype=np.float32)]


def make_rows(seed):
    rng = np.random.default_rng(seed)
    flat = rng.normal(0.0, 2.0, V)                      # broad distribution
    peaked = rng.normal(0.0, 1.5, V)                    # LLM-like: a few clear favourites
    peaked[rng.choice(V, 8, replace=False)] += rng.uniform(4.0, 9.0, 8)
    return [flat.astype(np.float32), peaked.astype(np.float32)]


def penalized(row, case):
    """bias -> repetition -> frequency -> presence, float32 torch, HF processor for repetition."""
    s = torch.tensor(row, dtype=torch.float32).unsqueeze(0).clone()
    for tok, b in case.get("logit_bias", []):
        s[0, tok] = s[0, tok] + torch.tensor(b, dtype=torch.float32)
    hist = case.get("prompt", []) + case.get("generated", [])
    rp = case.get("repetition_penalty", 1.0)
    n = case.get("repetition_last_n", 64)
    if rp != 1.0 and n != 0 and hist:
        window = hist if n < 0 else hist[-n:]
        ids = torch.tensor([window], dtype=torch.long)
        s = RepetitionPenaltyLogitsProcessor(penalty=float(rp))(ids, s)
    fp = case.get("frequency_penalty", 0.0)
    pp = case.get("presence_penalty", 0.0)
    if fp or pp:
        counts = np.bincount(np.array(case.get("generated", []), dtype=np.int64), minlength=V)
        for t in np.nonzero(counts)[0]:
            x = s[0, t]
            x = x - torch.tensor(np.float32(counts[t]) * np.float32(fp))
            x = x - torch.tensor(np.float32(pp))
            s[0, t] = x
    return s


def hf_probs(s, case):
    ids = torch.zeros((1, 1), dtype=torch.long)  # the warpers ignore input_ids
    T = case.get("temperature", 1.0)
    s = TemperatureLogitsWarper(float(T))(ids, s.clone())
    if case.get("top_k", 0) > 0:
        s = TopKLogitsWarper(top_k=int(case["top_k"]))(ids, s)
    if case.get("top_p", 1.0) < 1.0:
        s = TopPLogitsWarper(top_p=float(case["top_p"]))(ids, s)
    if case.get("min_p", 0.0) > 0.0:
        s = MinPLogitsWarper(min_p=float(case["min_p"]))(ids, s)
    return torch.softmax(s, dim=-1)[0].numpy()


def boundary_trouble(z, case):
    """float64 re-derivation of our rules; returns a reason string if a boundary is too close."""
    z = z.astype(np.float64)
    T = case.get("temperature", 1.0)
    order = np.lexsort((np.arange(V), -z))      # z desc, id asc
    keep = np.ones(V, dtype=bool)
    k = case.get("top_k", 0)
    if 0 < k < V:
        if z[order[k - 1]] == z[order[k]]:
            return "tie at the top-k boundary"
        keep[order[k:]] = False
    w = np.exp((z - z.max()) / T)
    w[~keep] = 0.0
    p = case.get("top_p", 1.0)
    if p < 1.0:
        ws = w[order]
        cum = np.cumsum(ws)
        target = p * cum[-1]
        i = int(np.searchsorted(cum, target))   # first with cum >= target
        before = cum[i - 1] if i > 0 else 0.0
        if target - before < MARGIN * cum[-1] or cum[i] - target < MARGIN * cum[-1]:
            return "near the top-p boundary"
        keep[order[i + 1:]] = False
        w[~keep] = 0.0
    mp = case.get("min_p", 0.0)
    if mp > 0.0:
        live = w[keep]
        if np.any(np.abs(live - mp) < MARGIN * mp):
            return "near the min-p boundary"
    return None


def build(name, rows, cases):
    out_cases = []
    for case in cases:
        row = rows[case["row"]]
        while True:
            s = penalized(row, case)
            reason = boundary_trouble(s[0].numpy(), case)
            if reason is None:
                break
            # nudge the parameter that is too close to a boundary
            if "top-p" in reason:
                case["top_p"] = float(np.float32(case["top_p"] * 0.997))
            elif "min-p" in reason:
                case["min_p"] = float(np.float32(case["min_p"] * 0.997))
            else:
                sys.exit(f"{name}/{case['name']}: {reason}; pick another seed")
        probs = hf_probs(s, case)
        kept = [int(i) for i in np.nonzero(probs > 0)[0]]
        raw_lp = torch.log_softmax(torch.tensor(row, dtype=torch.float32), dim=-1).numpy()
        top = np.lexsort((np.arange(V), -raw_lp))[:5]
        c = dict(case)
        c["kept"] = kept
        c["p"] = [float(f"{probs[i]:.9g}") for i in kept]
        c["raw_logprobs"] = [[int(i), float(f"{raw_lp[i]:.9g}")] for i in top]
        out_cases.append(c)
    doc = {
        "about": "HF transformers logits processors as the oracle for src/sample; "
                 "written by tools/gen_sampling_fixtures.py, do not edit",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "n_vocab": V,
        "rows": [f32_list(r) for r in rows],
        "cases": out_cases,
    }
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name + ".json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {len(out_cases)} cases, {os.path.getsize(path)} bytes")


def history(rng, row, n_prompt, n_gen):
    # draw from the likely tokens so that the penalties matter for the kept set
    fav = np.argsort(-row)[:40]
    prompt = [int(t) for t in rng.choice(V, n_prompt)]
    gen = [int(t) for t in rng.choice(fav, n_gen)]
    return prompt, gen


def main():
    rows = make_rows(1234)
    warpers = [
        dict(name="temperature_1", row=0, temperature=1.0),
        dict(name="temperature_0.7", row=1, temperature=0.7),
        dict(name="temperature_1.5_top_k_50", row=0, temperature=1.5, top_k=50),
        dict(name="top_k_1", row=1, temperature=1.0, top_k=1),
        dict(name="top_k_999", row=0, temperature=1.0, top_k=999),
        dict(name="top_p_0.9_t0.8", row=1, temperature=0.8, top_p=0.9),
        dict(name="top_p_0.5", row=0, temperature=1.0, top_p=0.5),
        dict(name="top_p_long_tail", row=0, temperature=1.0, top_p=0.99),
        dict(name="top_p_tiny", row=1, temperature=1.0, top_p=1e-4),
        dict(name="min_p_0.05", row=1, temperature=1.0, min_p=0.05),
        dict(name="min_p_0.2_t2", row=0, temperature=2.0, min_p=0.2),
        dict(name="k100_p0.95_minp0.02_t0.9", row=1, temperature=0.9, top_k=100, top_p=0.95, min_p=0.02),
        dict(name="k40_p0.7_t1.3", row=0, temperature=1.3, top_k=40, top_p=0.7),
    ]
    build("warpers", rows, warpers)

    rows = make_rows(99)
    rng = np.random.default_rng(7)
    p0, g0 = history(rng, rows[0], 30, 20)
    p1, g1 = history(rng, rows[1], 50, 40)
    bias_ids = [int(t) for t in rng.choice(V, 4, replace=False)]
    fav1 = int(np.argmax(rows[1]))
    penalties = [
        dict(name="repetition_1.3_whole", row=0, temperature=1.0, repetition_penalty=1.3,
             repetition_last_n=-1, prompt=p0, generated=g0),
        dict(name="repetition_1.3_last_16", row=0, temperature=1.0, repetition_penalty=1.3,
             repetition_last_n=16, prompt=p0, generated=g0),
        dict(name="repetition_1.2_last_64_prompt_counts", row=1, temperature=0.8, top_k=200,
             repetition_penalty=1.2, repetition_last_n=64, prompt=p1, generated=g1),
        dict(name="repetition_0.8", row=1, temperature=1.0, repetition_penalty=0.8,
             repetition_last_n=-1, prompt=p1, generated=g1),
        dict(name="presence_frequency", row=1, temperature=1.0, top_p=0.95,
             presence_penalty=0.5, frequency_penalty=0.3, prompt=p1, generated=g1),
        dict(name="presence_frequency_negative_rep", row=0, temperature=0.9,
             presence_penalty=-0.7, frequency_penalty=-0.25, repetition_penalty=1.1,
             repetition_last_n=32, prompt=p0, generated=g0),
        dict(name="logit_bias", row=1, temperature=1.0, top_k=20,
             logit_bias=[[bias_ids[0], 100.0], [bias_ids[1], -100.0], [bias_ids[2], 5.5],
                         [fav1, -100.0], [bias_ids[3], -2.25]]),
        dict(name="everything", row=1, temperature=0.7, top_k=64, top_p=0.9, min_p=0.01,
             repetition_penalty=1.15, repetition_last_n=48, presence_penalty=0.4,
             frequency_penalty=0.2, logit_bias=[[bias_ids[2], 3.0], [fav1, -1.5]],
             prompt=p1, generated=g1),
    ]
    build("penalties", rows, penalties)


if __name__ == "__main__":
    main()
