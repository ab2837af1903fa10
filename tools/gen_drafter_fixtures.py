#!/usr/bin/env python3
"""Reference round traces of the block drafters (DFlash, DSpark) on the tiny target.

The oracles are the public reference implementations, run unchanged, float32 on the CPU:

* z-lab DFlash: the PyPI package `dflash` (requirements-tools.txt): `DFlashDraftModel` loads the
  drafter, its `forward` + `compute_logits` draft each block. The round loop below follows
  `dflash.model.dflash_generate` (greedy branch) statement by statement, adding only the trace and
  a max-draft cap; with no cap its per-round acceptance lengths are checked against
  `dflash_generate(..., return_stats=True)` itself.
* DeepSpec DSpark / DFlash: `deepseek-ai/DeepSpec` is not on PyPI. The script imports it from
  tools/.cache/deepspec/ (ignored by git, never committed). Make that copy from the public
  repository:
      git clone https://github.com/deepseek-ai/DeepSpec tools/.cache/deepspec
  (any checkout with the files below works; --deepspec PATH points elsewhere). Used, unchanged:
  deepspec/modeling/dspark/{common,markov_head}.py, deepspec/modeling/dspark/qwen3/modeling.py,
  deepspec/eval/dspark/draft_ops.py (forward_dspark_draft_block, build_dspark_proposal),
  deepspec/eval/base_evaluator.py (generate_decoding_sample, verify_draft_tokens),
  deepspec/utils/sampling.py. The package __init__ files and four modules the code paths used here
  never call into (deepspec.utils: init_dist/seed_all, deepspec.utils.metrics: add_metric (training
  statistics), deepspec.data.parser, deepspec.modeling.dspark.gemma4) are replaced by stubs in
  sys.modules, so the copy may hold just those six files. The round loop is DeepSpec's own
  generate_decoding_sample; the init/propose/update callbacks are those of
  deepspec/eval/dspark/evaluator.py (Qwen3DSparkEvaluator), with the trace recorded by wrapping the
  drafter's sample_draft_tokens / predict_confidence_step (return values observed, not changed)
  and the max-draft cap applied to the returned proposal.
* ModelOpt DSpark layout: there is no public reference loader; its tensors are those of
  deepspec-dspark-b7 renamed, so its expected trace is DeepSpec's on the equivalent weights. The
  script rebuilds a Qwen3DSparkModel from the ModelOpt files (renaming back, embed/lm_head from the
  target) and checks that this reproduces the deepspec-dspark-b7 trace exactly.

Every run is also checked to be lossless: its committed tokens equal plain greedy decoding of the
target (transformers generate).

    .venv-tools/bin/python tools/gen_drafter_fixtures.py [--out tests/fixtures/drafters]

Writes <out>/<drafter>.jsonl (one run per line) and <out>/manifest.json (sha256 of every model
file, so tests can check tools/make_tiny_drafters.py regenerates them bit for bit). The format is
in <out>/README.md. Needs requirements-tools.txt (torch, transformers, dflash); CI never runs this.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import make_tiny_drafters as mtd  # noqa: E402

FORMAT = "dspark-drafter-trace-v1"
TOPK = 3
MAX_NEW = 48
STOP_IDS = [mtd.mtm.EOS_ID]

# (name, text) prompts: plain text, no chat template, no added special tokens
PROMPTS = [
    ("france", "The capital of France is"),
    ("code", "def add(a, b):\n    return a + b\n\nfor i in range(10):"),
    ("hello", "Hello, world! How are you today? I am fine, thank you."),
    ("numbers", "The numbers 0 1 2 3 4 5 6 7 8 9 10 42 100"),
]

# per drafter: list of (confidence threshold, max-draft cap); cap = None means the whole block
SETTINGS = {
    "zlab-dflash-b16": [(0.0, None), (0.0, 4)],
    "deepspec-dflash-b7": [(0.0, None), (0.0, 3)],
    "deepspec-dspark-b7": [(0.0, None), (0.5, None), (0.7, 4)],
    "modelopt-dspark-b7": [(0.0, None), (0.5, None), (0.7, 4)],
    "deepspec-dspark-gated-b7": [(0.0, None), (0.5, None)],
    "deepspec-dspark-rnn-b7": [(0.0, None), (0.5, None)],
}


# --------------------------------------------------------------------------------------------
# helpers

def _r(x: float) -> float:
    """A float32 value as the shortest decimal that round-trips to it."""
    import numpy as np
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def _top(logits) -> dict:
    """Top-k ids and values and the top-1/top-2 margin of a [V] float32 tensor."""
    import torch
    v, i = torch.topk(logits.float(), TOPK)
    return {"ids": [int(t) for t in i], "vals": [_r(t) for t in v], "margin": _r(v[0] - v[1])}


def _margins(logits) -> list[float]:
    import torch
    v, _ = torch.topk(logits.float(), 2, dim=-1)
    return [_r(m) for m in (v[..., 0] - v[..., 1]).reshape(-1)]


def _install_deepspec(path: str):
    """Import DeepSpec from a local copy, with stubs for the modules this script never calls."""
    if not os.path.isfile(os.path.join(path, "deepspec", "modeling", "dspark", "qwen3", "modeling.py")):
        sys.exit(f"DeepSpec sources not found under {path!r}: see this script's docstring "
                 "(git clone the public repository there, or pass --deepspec)")
    pkgs = ["deepspec", "deepspec.utils", "deepspec.data", "deepspec.eval", "deepspec.eval.dspark",
            "deepspec.modeling", "deepspec.modeling.dspark", "deepspec.modeling.dspark.qwen3",
            "deepspec.modeling.dspark.gemma4"]
    for name in pkgs:
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(path, *name.split("."))]
        sys.modules[name] = m

    def unused(*_a, **_k):
        raise RuntimeError("stubbed DeepSpec function called")

    stubs = {
        "deepspec.utils.metrics": {"add_metric": lambda *a, **k: None},
        "deepspec.data.parser": {"encode_chat_messages": unused},
    }
    for name, attrs in stubs.items():
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
    sys.modules["deepspec.utils"].init_dist = unused
    sys.modules["deepspec.utils"].seed_all = unused
    sys.modules["deepspec.modeling.dspark.gemma4"].Gemma4DSparkModel = type("Gemma4DSparkModel", (), {})
    import importlib
    modeling = importlib.import_module("deepspec.modeling.dspark.qwen3.modeling")
    sys.modules["deepspec.modeling.dspark.qwen3"].Qwen3DSparkModel = modeling.Qwen3DSparkModel
    ns = types.SimpleNamespace(
        Qwen3DSparkModel=modeling.Qwen3DSparkModel,
        common=importlib.import_module("deepspec.modeling.dspark.common"),
        draft_ops=importlib.import_module("deepspec.eval.dspark.draft_ops"),
        base=importlib.import_module("deepspec.eval.base_evaluator"),
    )
    return ns


# --------------------------------------------------------------------------------------------
# z-lab DFlash

def run_zlab(target, drafter, prompt_ids: list[int], cap: int | None) -> dict:
    """dflash.model.dflash_generate, greedy branch, with a max-draft cap and a trace."""
    import torch
    from dflash.model import _crop_to, _make_cache, _output_head, _raw_input_embeddings, \
        _draft_value, extract_context_feature, sample
    B = drafter.block_size
    inp = torch.tensor([prompt_ids])
    n_in = inp.shape[1]
    max_length = n_in + MAX_NEW
    out_ids = torch.full((1, max_length + B + 1), drafter.mask_token_id, dtype=torch.long)
    pos_ids = torch.arange(out_ids.shape[1]).unsqueeze(0)
    pkv_t, pkv_d = _make_cache(target.config), _make_cache(drafter.config)
    out = target(inp, position_ids=pos_ids[:, :n_in], past_key_values=pkv_t, use_cache=True,
                 logits_to_keep=1, output_hidden_states=True)
    out_ids[:, :n_in] = inp
    out_ids[:, n_in:n_in + 1] = sample(out.logits, 0.0)
    target_hidden = extract_context_feature(out.hidden_states, drafter.target_layer_ids)
    _crop_to(pkv_t, n_in)
    start, rounds, stopped = n_in, [], False
    while start < max_length and not stopped:
        block = out_ids[:, start:start + B].clone()
        noise = _raw_input_embeddings(target, block,
                                      float(_draft_value(drafter.config, "input_embedding_scale", 1.0)))
        ctx_rows = target_hidden.shape[1]
        hid = drafter(target_hidden=target_hidden, noise_embedding=noise,
                      position_ids=pos_ids[:, start - ctx_rows:start + B],
                      past_key_values=pkv_d, use_cache=True)[:, 1 - B:, :]
        _crop_to(pkv_d, start)
        dlogits = drafter.compute_logits(hid, _output_head(target))
        block[:, 1:] = torch.argmax(dlogits, dim=-1)
        draft = [int(t) for t in block[0, 1:]]
        kept = B - 1 if cap is None else min(cap, B - 1)
        vin = block[:, :kept + 1]
        o = target(vin, position_ids=pos_ids[:, start:start + kept + 1], past_key_values=pkv_t,
                   use_cache=True, output_hidden_states=True)
        post = torch.argmax(o.logits, dim=-1)
        acc = int((vin[:, 1:] == post[:, :-1]).cumprod(dim=1).sum(dim=1)[0])
        nxt = int(post[0, acc])
        out_ids[:, start:start + acc + 1] = vin[:, :acc + 1]
        out_ids[:, start + acc + 1] = nxt
        rounds.append({
            "pos": start, "draft": draft, "kept": kept, "accepted": acc, "next": nxt,
            "ctx_rows": ctx_rows,
            "top": [_top(dlogits[0, s]) for s in range(B - 1)],
            "target_margin": _margins(o.logits[0]),
        })
        produced = acc + 1
        new = out_ids[0, start + 1:start + produced + 1].tolist()
        if any(t in STOP_IDS for t in new):
            produced = next(j for j, t in enumerate(new) if t in STOP_IDS) + 1
            stopped = True
        start += produced
        _crop_to(pkv_t, start)
        target_hidden = extract_context_feature(o.hidden_states, drafter.target_layer_ids)[:, :produced, :]
    return {"rounds": rounds, "output_ids": out_ids[0, n_in:start + 1].tolist()}


def check_zlab_against_generate(target, drafter, prompt_ids: list[int], rounds: list[dict]) -> None:
    """dflash_generate itself (no cap) must give the same acceptance lengths for every round whose
    block was full (it shrinks the block near max_new_tokens; this script never does)."""
    import torch
    import dflash.model as dm
    cuda_time, dm._cuda_time = dm._cuda_time, time.perf_counter  # it calls torch.cuda.synchronize()
    try:
        res = dm.dflash_generate(drafter, target, torch.tensor([prompt_ids]), MAX_NEW, STOP_IDS,
                                 return_stats=True)
    finally:
        dm._cuda_time = cuda_time
    n_in = len(prompt_ids)
    for i, (got, ref) in enumerate(zip(rounds, res.acceptance_lengths)):
        if got["pos"] + drafter.block_size > n_in + MAX_NEW:
            break
        if got["accepted"] + 1 != ref:
            raise SystemExit(f"z-lab harness differs from dflash_generate at round {i}: "
                             f"{got['accepted'] + 1} vs {ref}")


# --------------------------------------------------------------------------------------------
# DeepSpec DSpark / DFlash

def run_deepspec(ds, target, drafter, prompt_ids: list[int], threshold: float, cap: int | None,
                 max_new: int = MAX_NEW, stop: list[int] = STOP_IDS) -> dict:
    """DeepSpec's generate_decoding_sample with Qwen3DSparkEvaluator's callbacks."""
    import torch
    from transformers import DynamicCache
    rec: dict = {}
    rounds: list[dict] = []
    orig_sample, orig_conf = drafter.sample_draft_tokens, drafter.predict_confidence_step

    def sample_draft_tokens(base_logits, **kw):
        toks, logits = orig_sample(base_logits, **kw)
        rec["draft"], rec["logits"] = toks, logits
        return toks, logits

    def predict_confidence_step(hidden, prev_token_ids=None):
        c = orig_conf(hidden, prev_token_ids=prev_token_ids)
        rec["conf"] = c
        return c

    drafter.sample_draft_tokens = sample_draft_tokens
    drafter.predict_confidence_step = predict_confidence_step
    gamma = int(drafter.block_size)

    def init_context(*, initial_output, **_kw):
        return types.SimpleNamespace(
            past_key_values_draft=DynamicCache(),
            target_hidden_states=ds.common.extract_context_feature(
                initial_output.hidden_states, drafter.target_layer_ids))

    def propose(*, context, output_ids, position_ids, start, stop_token_ids=None):
        rec.clear()
        rec["pos"], rec["ctx_rows"] = start, int(context.target_hidden_states.shape[1])
        draft_input_ids = torch.full((output_ids.size(0), gamma), int(drafter.mask_token_id),
                                     dtype=torch.long, device=output_ids.device)
        draft_input_ids[:, 0] = output_ids[:, start]
        block_hidden = ds.draft_ops.forward_dspark_draft_block(
            drafter, draft_input_ids=draft_input_ids, position_ids=position_ids,
            past_key_values_draft=context.past_key_values_draft,
            target_hidden_states=context.target_hidden_states, start=start, block_size=gamma)
        p = ds.draft_ops.build_dspark_proposal(
            model=drafter, draft_input_ids=draft_input_ids, block_hidden=block_hidden,
            block_size=gamma, temperature=0.0, confidence_threshold=threshold)
        if cap is not None and p.draft_token_count > cap:
            p = dataclasses.replace(
                p, draft_token_count=cap, verify_input_ids=p.verify_input_ids[:, :cap + 1],
                draft_probs=p.draft_probs[:, :cap],
                confidence_logits=None if p.confidence_logits is None else p.confidence_logits[:, :cap])
        rec["kept"] = int(p.draft_token_count)
        return p

    def post_verify(_proposal, v):
        r = {"pos": rec["pos"], "draft": [int(t) for t in rec["draft"][0]], "kept": rec["kept"],
             "accepted": int(v.accepted_draft_tokens), "next": int(v.next_token[0]),
             "ctx_rows": rec["ctx_rows"],
             "top": [_top(rec["logits"][0, s]) for s in range(gamma)],
             "target_margin": _margins(v.target_output.logits[0])}
        if "conf" in rec:
            r["conf"] = [_r(c) for c in rec["conf"][0]]
        if v.terminated_by_stop_token:
            r["next"] = None  # DeepSpec commits no bonus token after an accepted stop token
        rounds.append(r)

    def update(context, v):
        hs = ds.common.extract_context_feature(v.target_output.hidden_states, drafter.target_layer_ids)
        context.target_hidden_states = hs[:, :v.accepted_draft_tokens + 1, :]

    try:
        res = ds.base.generate_decoding_sample(
            target_model=target, input_ids=torch.tensor([prompt_ids]), max_new_tokens=max_new,
            max_proposal_tokens=gamma, temperature=0.0, stop_token_ids=stop,
            init_context=init_context, propose=propose, update=update, post_verify=post_verify)
    finally:
        drafter.sample_draft_tokens, drafter.predict_confidence_step = orig_sample, orig_conf
    return {"rounds": rounds, "output_ids": res.output_ids[0, len(prompt_ids):].tolist()}


def deepspec_from_modelopt(ds, modelopt_dir: str, target) -> object:
    """A Qwen3DSparkModel holding the ModelOpt-layout weights (renamed back; embed/lm_head taken
    from the target), to show that layout carries exactly the deepspec-dspark-b7 drafter."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3Config
    with open(os.path.join(modelopt_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    dc = cfg.pop("dflash_config")
    assert dc["projector_type"] == "dspark" and dc["shift_label"] is True
    cfg.pop("auto_map")
    cfg.pop("rope_theta"), cfg.pop("rope_scaling")
    cfg.update(architectures=["Qwen3DSparkModel"], mask_token_id=dc["mask_token_id"],
               target_layer_ids=dc["target_layer_ids"], num_anchors=512,
               enable_confidence_head=bool(dc["use_confidence_head"]), confidence_head_with_markov=True,
               markov_rank=dc["markov_rank"], markov_head_type=dc["markov_head_type"],
               rope_parameters={"rope_theta": mtd.ROPE_THETA, "rope_type": "default"})
    config = Qwen3Config(**cfg)
    config._attn_implementation = "sdpa"
    model = ds.Qwen3DSparkModel(config)
    sd = load_file(os.path.join(modelopt_dir, "model.safetensors"))
    ren = {}
    for k, v in sd.items():
        if k.startswith("markov_w"):
            k = "markov_head." + k
        elif k.startswith("confidence_proj."):
            k = "confidence_head.proj." + k.split(".", 1)[1]
        ren[k] = v
    ren["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    ren["lm_head.weight"] = target.lm_head.weight.detach().clone()
    model.load_state_dict(ren, strict=True)
    return model.to(torch.float32).eval()


# --------------------------------------------------------------------------------------------

def same_trace(a: list[dict], b: list[dict]) -> None:
    """The ModelOpt-layout drafter must reproduce the DeepSpec one: every token field equal, every
    value within 1e-4 (the two load paths may differ in the last bit)."""
    for la, lb in zip(a, b, strict=True):
        for ra, rb in zip(la["rounds"], lb["rounds"], strict=True):
            for k in ("pos", "draft", "kept", "accepted", "next", "ctx_rows"):
                if ra[k] != rb[k]:
                    raise SystemExit(f"modelopt-dspark-b7 differs from deepspec-dspark-b7 ({la['prompt']}, {k})")
            for ta, tb in zip(ra["top"], rb["top"]):
                if ta["ids"] != tb["ids"] or max(abs(x - y) for x, y in zip(ta["vals"], tb["vals"])) > 1e-4:
                    raise SystemExit(f"modelopt-dspark-b7 logits differ from deepspec-dspark-b7 ({la['prompt']})")
            if max(abs(x - y) for x, y in zip(ra["conf"], rb["conf"])) > 1e-4:
                raise SystemExit(f"modelopt-dspark-b7 confidences differ ({la['prompt']})")


def greedy_ids(target, prompt_ids: list[int]) -> list[int]:
    import torch
    out = target.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_NEW, do_sample=False,
                          eos_token_id=STOP_IDS, pad_token_id=mtd.mtm.PAD_ID)
    return out[0, len(prompt_ids):].tolist()


def check_lossless(name: str, run: dict, greedy: list[int]) -> None:
    got = run["output_ids"][:len(greedy)]
    if got != greedy[:len(got)] or len(got) < min(len(greedy), MAX_NEW):
        raise SystemExit(f"{name}: speculative output differs from greedy decoding\n {got}\n {greedy}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "drafters"))
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "tiny-drafters"),
                    help="where tools/make_tiny_drafters.py writes the models")
    ap.add_argument("--deepspec", default=os.path.join(HERE, ".cache", "deepspec"),
                    help="local copy of github.com/deepseek-ai/DeepSpec")
    a = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import dflash
    from dflash.model import DFlashDraftModel
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one summation order, independent of the machine's core count

    hashes = mtd.make_all(a.models)
    ds = _install_deepspec(a.deepspec)
    md = lambda n: os.path.join(a.models, n)  # noqa: E731
    target = AutoModelForCausalLM.from_pretrained(md("target"), dtype=torch.float32,
                                                  attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(md("target"))
    drafters = {
        "zlab-dflash-b16": DFlashDraftModel.from_pretrained(md("zlab-dflash-b16"), dtype=torch.float32).eval(),
        "deepspec-dflash-b7": ds.Qwen3DSparkModel.from_pretrained(
            md("deepspec-dflash-b7"), dtype=torch.float32, attn_implementation="sdpa").eval(),
        "deepspec-dspark-b7": ds.Qwen3DSparkModel.from_pretrained(
            md("deepspec-dspark-b7"), dtype=torch.float32, attn_implementation="sdpa").eval(),
    }
    for n in ("deepspec-dspark-gated-b7", "deepspec-dspark-rnn-b7"):  # DeepSpec's gated / rnn Markov heads
        drafters[n] = ds.Qwen3DSparkModel.from_pretrained(md(n), dtype=torch.float32, attn_implementation="sdpa").eval()
    drafters["modelopt-dspark-b7"] = deepspec_from_modelopt(ds, md("modelopt-dspark-b7"), target)
    os.makedirs(a.out, exist_ok=True)
    prompts = [(n, t, tok(t, add_special_tokens=False)["input_ids"]) for n, t in PROMPTS]
    greedy = {n: greedy_ids(target, ids) for n, _, ids in prompts}
    summary = {}
    for dname, settings in SETTINGS.items():
        lines = []
        for threshold, cap in settings:
            for pname, text, ids in prompts:
                with torch.inference_mode():
                    if dname.startswith("zlab"):
                        run = run_zlab(target, drafters[dname], ids, cap)
                        if cap is None:
                            check_zlab_against_generate(target, drafters[dname], ids, run["rounds"])
                    else:
                        run = run_deepspec(ds, target, drafters[dname], ids, threshold, cap)
                check_lossless(f"{dname}/{pname}", run, greedy[pname])
                lines.append({"prompt": pname, "text": text, "prompt_ids": ids,
                              "threshold": threshold, "max_draft": cap, "max_new_tokens": MAX_NEW,
                              "stop_ids": STOP_IDS, "output_ids": run["output_ids"],
                              "greedy_ids": greedy[pname], "rounds": run["rounds"]})
        if dname == "modelopt-dspark-b7":
            same_trace(summary["deepspec-dspark-b7"]["lines"], lines)
        summary[dname] = {"lines": lines}
        with open(os.path.join(a.out, dname + ".jsonl"), "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(dict({"format": FORMAT, "drafter": dname}, **line),
                                   ensure_ascii=False, separators=(",", ":")) + "\n")
        rs = [r for l in lines for r in l["rounds"]]
        min_m = min(t["margin"] for r in rs for t in r["top"])
        print(f"{dname}: {len(lines)} runs, {len(rs)} rounds, mean committed/round "
              f"{sum(r['accepted'] + 1 for r in rs) / len(rs):.2f}, mean kept {sum(r['kept'] for r in rs) / len(rs):.2f}, "
              f"min draft margin {min_m:.2e}, min target margin "
              f"{min(min(r['target_margin']) for r in rs):.2e}")
    manifest = {
        "format": FORMAT,
        "generator": "tools/gen_drafter_fixtures.py",
        "models_generator": "tools/make_tiny_drafters.py",
        "sha256": hashes,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "dflash": getattr(dflash, "__version__", "0.1.0")},
        "mask_token_id": mtd.MASK_ID,
    }
    with open(os.path.join(a.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
