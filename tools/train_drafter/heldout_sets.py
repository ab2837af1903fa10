#!/usr/bin/env python3
"""Write the held-out prompts of a training run as bench_spec prompt sets.

    python3 tools/train_drafter/heldout_sets.py WORK/prompts.jsonl bench/prompts [--per-set 12]

From the prompts the training never saw (split "eval"), one directory per kind, in the format of
bench/prompts/README.md: heldout-chat (the project's written prompts: chat, advice, stories),
heldout-code (Python standard library: explain or write code), heldout-explain (questions about
Debian packages). The first --per-set of each kind, in prompts.jsonl's (deterministic) order.
bench/prompts/heldout-* were made this way from scripts/train-default-drafter's prompts.
"""

from __future__ import annotations

import argparse
import json
import os

KINDS = {"written": "heldout-chat", "python": "heldout-code", "debian": "heldout-explain"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prompts")
    ap.add_argument("out")
    ap.add_argument("--per-set", type=int, default=12)
    a = ap.parse_args()
    with open(a.prompts, encoding="utf-8") as f:
        ps = [json.loads(line) for line in f]
    for source, name in KINDS.items():
        sel = [p for p in ps if p["split"] == "eval" and p["source"] == source][:a.per_set]
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        for p in sel:
            with open(os.path.join(d, f"{source}-{p['id']:05d}.json"), "w", encoding="utf-8") as f:
                json.dump({"messages": p["messages"], "add_generation_prompt": True}, f, indent=1, ensure_ascii=False)
                f.write("\n")
        print(f"{d}: {len(sel)} prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
