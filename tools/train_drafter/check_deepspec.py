#!/usr/bin/env python3
"""Load an exported drafter with DeepSpec's own code, unchanged, and run DeepSpec's speculative
decoding loop with it; compare with this tool's implementation (tools/train_drafter/model.py).

    python tools/train_drafter/check_deepspec.py --target T --drafter DIR --work WORK [-n 4]

For the first n held-out prompts of WORK/prompts.jsonl (chat template applied): DeepSpec's
Qwen3DSparkModel.from_pretrained(DIR) + generate_decoding_sample (greedy, confidence threshold 0)
must be lossless (its tokens equal the target's greedy answer), and every round's proposed block
and accepted count must equal what model.Drafter.draft gives on the same context, except where a
draft slot's top-1/top-2 margin is below --tol (a near tie between two float32 implementations).
Prints the comparison and DeepSpec's mean accepted length. Needs a DeepSpec copy (see
tools/gen_drafter_fixtures.py) and requirements-drafters.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="exported drafter directory")
    ap.add_argument("--work", required=True, help="train_drafter working directory (its prompts.jsonl)")
    ap.add_argument("-n", type=int, default=4, help="held-out prompts to run")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--deepspec", default=os.path.join(os.path.dirname(HERE), ".cache", "deepspec"))
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--trace", default=None,
                    help="write DeepSpec's rounds here, one run per line, in tests/fixtures/drafters' format")
    a = ap.parse_args(argv)

    import torch
    from safetensors.torch import load_file
    import gen_drafter_fixtures as gdf
    import train_drafter as td
    from model import Drafter

    torch.manual_seed(0)
    torch.set_num_threads(1)  # a CPU check: one thread, no spinning against other loads
    ds = gdf._install_deepspec(a.deepspec)
    target, tok = td.load_target(a.target, torch.device("cpu"))
    ref = ds.Qwen3DSparkModel.from_pretrained(a.drafter, dtype=torch.float32, attn_implementation="sdpa").eval()
    with open(os.path.join(a.drafter, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    mine = Drafter(cfg)
    mine.load_state_dict({k: v.float() for k, v in load_file(os.path.join(a.drafter, "model.safetensors")).items()})
    mine.eval()
    stop = td.stop_ids(target, tok)

    with open(os.path.join(a.work, "prompts.jsonl"), encoding="utf-8") as f:
        ps = [json.loads(line) for line in f]
    ps = [p for p in ps if p["split"] == "eval" and not p["source"].startswith("bench")][:a.n]
    rounds = same = skipped = 0
    acc_ref = []
    lossless = True
    traces = []
    for p in ps:
        pids = tok(tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            run = gdf.run_deepspec(ds, target, ref, pids, 0.0, None, max_new=a.max_new, stop=stop)
            ids = torch.tensor(pids + run["output_ids"])
            greedy = target.generate(torch.tensor([pids]), max_new_tokens=a.max_new, do_sample=False,
                                     eos_token_id=stop, pad_token_id=stop[0])[0, len(pids):].tolist()
            n = min(len(greedy), len(run["output_ids"]))
            lossless &= greedy[:n] == run["output_ids"][:n]
            traces.append({"format": gdf.FORMAT, "drafter": os.path.basename(os.path.normpath(a.drafter)),
                           "prompt": f"heldout-{p['id']}", "messages": p["messages"], "prompt_ids": pids,
                           "threshold": 0.0, "max_draft": None, "max_new_tokens": a.max_new, "stop_ids": stop,
                           "output_ids": run["output_ids"], "greedy_ids": greedy, "rounds": run["rounds"]})
            taps, _ = td.target_forward(target, ids[None], torch.ones_like(ids)[None], cfg["target_layer_ids"])
            for rd in run["rounds"]:
                if rd["pos"] >= len(ids):
                    break
                drafts, _, _ = mine.draft(ids, taps[0], rd["pos"])
                rounds += 1
                acc_ref.append(rd["accepted"] + 1)
                low = [i for i, t in enumerate(rd["top"]) if t["margin"] < a.tol]
                upto = min(low) if low else len(drafts)
                if [int(x) for x in drafts[:upto]] == rd["draft"][:upto]:
                    same += 1
                    skipped += bool(low)
    out = {"prompts": len(ps), "rounds": rounds, "rounds_equal": same, "rounds_with_near_ties": skipped,
           "deepspec_lossless": bool(lossless),
           "deepspec_mean_accepted_len": round(sum(acc_ref) / max(len(acc_ref), 1), 4)}
    print(json.dumps(out))
    if a.trace:
        with open(a.trace, "w", encoding="utf-8") as f:
            for t in traces:
                f.write(json.dumps(t, ensure_ascii=False, separators=(",", ":")) + "\n")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0 if (same == rounds and lossless and rounds > 0) else 1


if __name__ == "__main__":
    sys.exit(main())
