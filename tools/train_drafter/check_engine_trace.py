#!/usr/bin/env python3
"""Compare dspark's --trace-rounds with DeepSpec's rounds on a trained drafter.

    python3 tools/train_drafter/check_engine_trace.py --trace T.jsonl --target MODEL --drafter DIR [--tol 0.05]

T.jsonl is what `check_deepspec.py --trace` wrote (DeepSpec's own decoding loop on held-out chat
prompts, float32, the target dequantized by transformers). For each run, `dspark generate --chat
--precision f32 --mode dspark --max-draft <block> --dspark-threshold 0 --draft-vocab 0` decodes the
same prompt with --trace-rounds; per round: the anchor position, every draft slot whose DeepSpec
top-1/top-2 margin is at least --tol (a slot below it ends the round's comparison: the Markov chain
carries a near tie onwards), kept / accepted / next, and the committed tokens. The tolerance has
to cover the one known difference: the drafter's bf16 copies of the embedding and LM head, which
DeepSpec uses, next to the target's own Q8_0 tensors, which dspark shares instead (README, Block
drafters). Prints a JSON summary; exit status 1 on a mismatch above the tolerance.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--dspark", default=os.environ.get("DSPARK_BIN", "build/release/dspark"))
    ap.add_argument("--tol", type=float, default=0.05)
    a = ap.parse_args(argv)
    runs = [json.loads(line) for line in open(a.trace, encoding="utf-8")]
    cfg = json.load(open(os.path.join(a.drafter, "config.json"), encoding="utf-8"))
    tot = dict(prompts=0, rounds=0, rounds_equal=0, slots=0, slots_equal=0, slots_below_tol=0, max_abs_dlogit=0.0,
               max_abs_dconf=0.0, committed_equal=0, tol=a.tol)
    with tempfile.TemporaryDirectory() as tmp:
        tr = os.path.join(tmp, "rounds.jsonl")
        for run in runs:
            msgs = run["messages"]
            if len(msgs) != 1 or msgs[0]["role"] != "user":
                continue
            r = subprocess.run([a.dspark, "generate", "-m", a.target, "--chat", "-p", msgs[0]["content"], "-n", str(run["max_new_tokens"]),
                                "--draft-model", a.drafter, "--mode", "dspark", "--max-draft", str(cfg["block_size"]),
                                "--dspark-threshold", "0", "--precision", "f32", "--draft-vocab", "0", "--trace-rounds", tr, "-t", "2",
                                "--json"], capture_output=True, text=True)
            if r.returncode:
                print(r.stderr, file=sys.stderr)
                return 2
            out = json.loads(r.stdout)
            got = [json.loads(line) for line in open(tr, encoding="utf-8")]
            if out["n_prompt"] != len(run["prompt_ids"]):
                print(f"{run['prompt']}: prompt of {out['n_prompt']} tokens, DeepSpec's {len(run['prompt_ids'])}", file=sys.stderr)
                return 1
            tot["prompts"] += 1
            end = len(run["prompt_ids"]) + run["max_new_tokens"]
            for i, ref in enumerate(run["rounds"]):
                if ref["pos"] + len(ref["draft"]) + 2 > end or i >= len(got):
                    break  # the engine shrinks its last blocks to the token budget, DeepSpec's loop does not
                g, same = got[i], True
                tot["rounds"] += 1
                same = g["pos"] == ref["pos"]
                for k, (d, top) in enumerate(zip(ref["draft"], ref["top"])):
                    if not same:
                        break
                    if top["margin"] < a.tol:
                        tot["slots_below_tol"] += len(ref["draft"]) - k
                        break
                    tot["slots"] += 1
                    same = g["draft"][k] == d
                    tot["slots_equal"] += same
                    tot["max_abs_dlogit"] = max(tot["max_abs_dlogit"], max(abs(x - y) for x, y in zip(g["top"][k]["vals"], top["vals"])))
                    tot["max_abs_dconf"] = max(tot["max_abs_dconf"], abs(g["conf"][k] - ref["conf"][k]))
                tot["rounds_equal"] += same and (g["kept"], g["accepted"], g["next"]) == (ref["kept"], ref["accepted"], ref["next"])
            c = min(len(out["token_ids"]), len(run["output_ids"]))
            tot["committed_equal"] += out["token_ids"][:c] == run["output_ids"][:c]
    print(json.dumps(tot, indent=1))
    ok = tot["rounds_equal"] == tot["rounds"] and tot["committed_equal"] == tot["prompts"] and tot["prompts"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
