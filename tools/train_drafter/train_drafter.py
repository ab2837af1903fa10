#!/usr/bin/env python3
"""Train a DSpark (or DeepSpec-DFlash) block drafter for a target model, by self-distillation.

    python tools/train_drafter/train_drafter.py --target models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --work build/train-drafter --out models/drafters/smollm2-dspark [--arch dspark|dflash]

runs every step in order; `--steps prompts,data,train,eval,export` runs some of them. Each step
is resumable: it skips work whose output exists (data shards, the training checkpoint) and
continues where it stopped.

  prompts  WORK/prompts.jsonl: chat, code and explanation prompts from material on this machine
           (Debian package descriptions, the Python standard library, prompts written for the
           project), ~3% held out, plus bench/prompts' chat and copy-heavy sets (eval only).
  magpie   (with --n-magpie N) chat prompts written by the target itself: N requests of the chat
           template's text up to a user message's content, sampled (--magpie-temp) by `dspark
           batch`; the messages that end (end-of-turn token) and pass a filter (length, no
           duplicates) join WORK/prompts.jsonl as source "magpie", ~3% held out like the others
           (the Magpie method, Xu et al. 2024: more varied chat than the written templates).
  data     WORK/data/*.pt: the target's own answers (self-distillation): greedy for every prompt,
           plus sampled ones (--sample-temp) for a share of the training prompts; eval prompts get
           greedy answers only. --data-seconds bounds the time. --data-engine dspark has `dspark batch`
           write the greedy ones (5x transformers' speed on an H100; the sampled ones stay with
           transformers: dspark samples on the host, one row after another).
  train    WORK/ckpt/: DeepSpec's objective (DRAFTERS.md 2.7): block prediction from injected tap
           features at random anchors, Markov head, confidence head trained on 1 - TV(draft,
           target); loss 0.1 CE + 0.9 L1 + 1.0 BCE, slot weights exp(-k/4); AdamW, bf16 autocast
           on CUDA, fixed seed, a progress bar, logged loss and per-slot acceptance (1 - TV) on
           held-out data, checkpoints (--train-seconds bounds the time; --stop-after ends a run
           early, checkpointed, and a later run resumes: the schedule spans the runs).
  eval     WORK/metrics.json: greedy speculative decoding simulated on the held-out answers:
           per-slot acceptance and mean accepted length per round (bonus token included), per
           prompt source; confidence-threshold trade-off.
  export   OUT/: config.json + model.safetensors (+ draft_vocab.json: the answers' tokens by frequency,
           for dspark --draft-vocab) in DeepSpec's published layout (Qwen3DSparkModel,
           top-level keys, embed_tokens/lm_head copies of the target's), loadable by DeepSpec's
           Qwen3DSparkModel.from_pretrained and by `dspark --draft-model`. --core-only writes the
           trained tensors without the embed/lm_head copies, in shards <= 15 MiB (for moving off
           a GPU machine); `export --core DIR` assembles the full drafter from such a folder.

A target is a GGUF file (transformers dequantizes it, gguf_file=) or a Hugging Face directory.
Needs requirements-drafters.txt (torch, transformers, safetensors, gguf for GGUF targets).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

STEPS = ("prompts", "magpie", "data", "train", "eval", "export")


def log(msg: str) -> None:
    print(f"[train_drafter {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# target

def load_target(path: str, device, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dt = getattr(torch, dtype)
    if path.endswith(".gguf"):
        d, f = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dt)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt)
        tok = AutoTokenizer.from_pretrained(path)
    model.requires_grad_(False)
    return model.to(device).eval(), tok


def stop_ids(model, tok) -> list[int]:
    e = getattr(model.generation_config, "eos_token_id", None)
    if e is None:
        e = tok.eos_token_id
    e = [e] if isinstance(e, int) else list(e or [])
    if tok.eos_token_id is not None:
        e.append(tok.eos_token_id)
    for t in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):  # chat-turn ends (SmolLM2's GGUF says EOS = 1)
        tid = tok.convert_tokens_to_ids(t)
        if isinstance(tid, int) and tid != tok.unk_token_id and tid >= 0:
            e.append(tid)
    return sorted({int(x) for x in e})


def default_taps(n_layers: int, n: int) -> list[int]:
    """n tap layers spread from 1 to n_layers-3 (z-lab's build_target_layer_ids rule)."""
    if n == 1:
        return [n_layers // 2]
    return sorted({round(1 + i * (n_layers - 4) / (n - 1)) for i in range(n)})


def pick_mask_token(tok, vocab: int, eos: list[int]) -> int:
    """An id the tokenizer never produces from text: an added special token that is not BOS/EOS/
    PAD or a chat-template marker (SmolLM2: <empty_output>, 16)."""
    skip = set(eos) | {tok.bos_token_id, tok.pad_token_id, tok.unk_token_id}
    cand = []
    for tid, t in getattr(tok, "added_tokens_decoder", {}).items():
        s = str(t)
        if tid in skip or tid >= vocab or "im_start" in s or "im_end" in s:
            continue
        cand.append(tid)
    if not cand:
        raise SystemExit("no unused special token to use as the mask token: pass --mask-token-id")
    return max(cand)


def drafter_config(target, args, mask_id: int) -> dict:
    tc = target.config
    nl = int(tc.num_hidden_layers)
    taps = [int(x) for x in args.taps.split(",")] if args.taps else default_taps(nl, args.n_taps)
    if max(taps) >= nl - 1 or min(taps) < -1:
        raise SystemExit(f"tap layers {taps} must be in -1..{nl - 2} (the last layer is refused, as DeepSpec does)")
    rope = getattr(tc, "rope_parameters", None) or {"rope_theta": getattr(tc, "rope_theta", 10000.0),
                                                    "rope_type": "default"}
    if rope.get("rope_type", "default") != "default":
        raise SystemExit(f"target rope type {rope.get('rope_type')!r}: only default RoPE is supported")
    hd = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    dspark = args.arch == "dspark"
    c = {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "vocab_size": int(tc.vocab_size),
        "hidden_size": int(tc.hidden_size),
        "intermediate_size": int(args.ffn or tc.intermediate_size),
        "num_hidden_layers": int(args.layers),
        "num_attention_heads": int(tc.num_attention_heads),
        "num_key_value_heads": int(tc.num_key_value_heads),
        "head_dim": int(hd),
        "hidden_act": "silu",
        "max_position_embeddings": int(tc.max_position_embeddings),
        "rms_norm_eps": float(tc.rms_norm_eps),
        "rope_parameters": {"rope_theta": float(rope["rope_theta"]), "rope_type": "default"},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * int(args.layers),
        "tie_word_embeddings": False,
        "bos_token_id": getattr(tc, "bos_token_id", None),
        "eos_token_id": getattr(tc, "eos_token_id", None),
        "pad_token_id": getattr(tc, "pad_token_id", None),
        "num_target_layers": nl,
        "block_size": int(args.block),
        "mask_token_id": int(mask_id),
        "target_layer_ids": taps,
        "num_anchors": int(args.anchors),
        "enable_confidence_head": dspark,
        "markov_rank": int(args.markov_rank) if dspark else 0,
    }
    if dspark:
        c["confidence_head_with_markov"] = True
        c["markov_head_type"] = "vanilla"
    return c


def target_forward(target, ids, attn, taps: list[int]):
    """(taps [b, T, nT*H], the final normed hidden states [b, T, H]) - DeepSpec's tap convention:
    layer L's output is hidden_states[L + 1], -1 the embedding output. The logits are left to the
    caller (target_logits), for the positions it needs."""
    import torch
    out = target.base_model(input_ids=ids, attention_mask=attn, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    return torch.cat([hs[0 if t == -1 else t + 1] for t in taps], dim=-1), out.last_hidden_state


def target_logits(target, h):
    """The target's logits [..., V] (float32) of final hidden states h [..., H], as its causal-LM
    head makes them (with Gemma 2's final soft-capping where the config has it)."""
    import torch
    import torch.nn.functional as F
    w = target.get_output_embeddings().weight
    z = F.linear(h.float(), w.float())  # float32 whatever the target's dtype (--target-dtype)
    cfg = getattr(target.config, "text_config", None) or target.config
    cap = getattr(cfg, "final_logit_softcapping", None)
    return torch.tanh(z / cap) * cap if cap else z


# --------------------------------------------------------------------------------------------
# steps

def step_prompts(args) -> None:
    import prompts as P
    path = os.path.join(args.work, "prompts.jsonl")
    if os.path.exists(path):
        log(f"prompts: {path} exists, kept")
        return
    ps = P.build(ROOT, args.n_debian, args.n_python, args.eval_pct, args.seed)
    write_prompts(args, ps)
    counts = {}
    for p in ps:
        k = f"{p['split']}/{p['source']}"
        counts[k] = counts.get(k, 0) + 1
    log(f"prompts: {len(ps)} -> {path} {json.dumps(counts, sort_keys=True)}")


def write_prompts(args, ps: list[dict]) -> None:
    """WORK/prompts.jsonl, replaced whole (a new file renamed over it)."""
    path = os.path.join(args.work, "prompts.jsonl")
    os.makedirs(args.work, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for p in ps:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    os.replace(path + ".tmp", path)


def read_prompts(args) -> list[dict]:
    with open(os.path.join(args.work, "prompts.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def generate_rows(target, ids, att, device, kw, mem: dict) -> list[list[int]]:
    """target.generate over a left-padded batch, as lists of token ids (prompt + answer, without
    trailing pad). A batch the GPU has no memory for is split in halves and generated in turn, and
    mem["tokens"] (kept by the caller across batches) becomes the half's rows x (prompt length +
    max_new_tokens): later batches start at that many tokens instead of running out of memory
    again (an 80 GB H100 did at 2,048 rows, the recipe's batch, three times in one run, each time
    costing ~45 s)."""
    import torch
    n, width = ids.shape[0], ids.shape[1] + kw["max_new_tokens"]
    rows = max(1, mem["tokens"] // width) if "tokens" in mem else n
    if n > rows:
        return [row for i in range(0, n, rows) for row in
                generate_rows(target, ids[i:i + rows], att[i:i + rows], device, kw, mem)]
    try:
        with torch.inference_mode():
            out = target.generate(input_ids=ids.to(device), attention_mask=att.to(device), **kw)
        return out.tolist()
    except torch.OutOfMemoryError:
        if n < 2:
            raise
        torch.cuda.empty_cache()
        mem["tokens"] = (n // 2) * width
        log(f"data: out of GPU memory at {n} rows x {width} tokens: at most {mem['tokens']} tokens per generate from now on")
        return generate_rows(target, ids, att, device, kw, mem)


def dspark_batch(args, reqs: list[dict]) -> list:
    """`dspark batch` over requests (--dspark, --dspark-args): its answer objects in request order,
    None where it could not answer (logged)."""
    import shlex
    import subprocess
    cmd = [args.dspark, "batch", "-m", args.target, "--mode", "baseline", *shlex.split(args.dspark_args)]
    p = subprocess.run(cmd, input="".join(json.dumps(q) + "\n" for q in reqs).encode(), capture_output=True)
    if p.returncode not in (0, 3):  # 3: some requests failed (their lines say why)
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode()[-2000:]}")
    tail = p.stderr.decode().strip().splitlines()
    if tail:
        log(f"dspark batch: {tail[-1]}")  # its requests, tokens and tokens per second
    out = [None] * len(reqs)
    for line in p.stdout.decode().splitlines():
        a = json.loads(line)
        if "error" in a:
            log(f"dspark batch could not answer request {a['index']}: {a['error']['message']}")
        else:
            out[a["index"]] = a
    return out


MAGPIE_MARK = "\x00MAGPIE\x00"


def magpie_prefix(tok) -> str:
    """The chat template's text before a user message's content (system prompt included, as the
    template writes it for a conversation without one)."""
    t = tok.apply_chat_template([{"role": "user", "content": MAGPIE_MARK}], add_generation_prompt=False, tokenize=False)
    if MAGPIE_MARK not in t:
        raise SystemExit("magpie: the chat template does not show a user message's content")
    return t[:t.index(MAGPIE_MARK)]


def magpie_key(text: str) -> str:
    """A message as the magpie step compares them: case and spacing ignored."""
    return " ".join(text.split()).lower()


def magpie_keep(text: str, seen: set) -> str | None:
    """A generated user message worth asking: 3 to 120 words, no template markup, not seen before
    (magpie_key); the stripped text or None."""
    t = text.strip()
    key = magpie_key(t)
    if not 3 <= len(t.split()) <= 120 or "<|" in t or "|>" in t or key in seen:
        return None
    seen.add(key)
    return t


def step_magpie(args, tok) -> None:
    import prompts as P
    path = os.path.join(args.work, "prompts.jsonl")
    ps = read_prompts(args)
    if args.n_magpie <= 0 or any(p["source"] == "magpie" for p in ps):
        log("magpie: nothing to do" if args.n_magpie <= 0 else f"magpie: {path} has them, kept")
        return
    t0 = time.time()
    pre = tok(magpie_prefix(tok), add_special_tokens=False)["input_ids"]
    reqs = [{"prompt_ids": pre, "max_tokens": args.magpie_max, "temperature": args.magpie_temp, "top_p": 0.95,
             "top_k": 0, "seed": args.seed * 7919 + i} for i in range(args.n_magpie)]
    seen = {magpie_key(m["content"]) for p in ps for m in p["messages"] if m["role"] == "user"}
    new, n_open, id0 = [], 0, max((p["id"] for p in ps), default=-1) + 1
    for a in dspark_batch(args, reqs):
        if a is None:
            continue
        if a["finish_reason"] != "stop":  # cut at --magpie-max: not a whole message
            n_open += 1
            continue
        t = magpie_keep(a["text"], seen)
        if t is not None:
            new.append({"source": "magpie", "messages": [{"role": "user", "content": t}],
                        "split": P.split_of(t, args.eval_pct), "id": id0 + len(new)})
    write_prompts(args, ps + new)
    n_ev = sum(p["split"] == "eval" for p in new)
    log(f"magpie: {len(new)} of {args.n_magpie} generated messages kept ({n_ev} held out; {n_open} cut at "
        f"--magpie-max, the rest empty, marked up or repeated) in {time.time() - t0:.0f} s")


def dspark_answers(args, encs: list[list[int]], mode: str, seed0: int) -> list:
    """The target's answers to prompt token lists from `dspark batch` (--data-engine dspark): the
    engine's own tokens, many sequences at a time (--dspark-args, e.g. "--backend cuda --max-batch
    128"), each what `dspark generate` gives for it alone. Lists of answer ids, an end-of-generation
    token included as the transformers path keeps it; None where dspark could not answer."""
    reqs = []
    for r, e in enumerate(encs):
        q = {"prompt_ids": e, "max_tokens": args.max_new, "temperature": 0}
        if mode != "greedy":
            q.update(temperature=args.sample_temp, top_p=0.95, top_k=0, seed=seed0 + r)
        reqs.append(q)
    return [a and a["token_ids"] for a in dspark_batch(args, reqs)]


def step_data(args, target, tok, device) -> None:
    import torch
    from tqdm import tqdm
    ddir = os.path.join(args.work, "data")
    os.makedirs(ddir, exist_ok=True)
    ps = read_prompts(args)
    eos = stop_ids(target, tok)
    rng = random.Random(args.seed)
    per_src = {}
    for kv in filter(None, args.samples_by_source.split(",")):
        k, v = kv.split("=")
        per_src[k.strip()] = int(v)
    # (prompt, mode): eval prompts first (greedy), then every training prompt's greedy answer, then
    # the sampled answers (each list in batches of like prompt lengths, the batches shuffled), so
    # that a time budget cuts sampled answers first
    ev = [(p, "greedy") for p in ps if p["split"] == "eval"]
    train = [p for p in ps if p["split"] == "train"]
    greedy = [(p, "greedy") for p in train]
    sampled = []
    for p in train:
        n = per_src.get(p["source"])
        if n is None:  # --sample-frac: its whole part always, its fraction by chance
            f = args.sample_frac
            n = int(f) + (rng.random() < f - int(f))
        sampled += [(p, "sampled")] * n
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    bs = args.gen_batch
    penc = {}  # each prompt's tokens (chat template applied, its last --max-prompt), once
    for p in ps:
        t = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=False)
        penc[p["id"]] = tok(t, add_special_tokens=False)["input_ids"][-args.max_prompt:]

    def batched(lst):
        """Batches of like prompt lengths (left padding to a batch's longest prompt cost 6x in
        attention on mixed batches: mean 60 tokens padded to 384), in a seeded random order, so that
        a time budget still cuts a random subset."""
        lst = sorted(lst, key=lambda j: (len(penc[j[0]["id"]]), j[0]["id"]))
        bl = [lst[i:i + bs] for i in range(0, len(lst), bs)]
        rng.shuffle(bl)
        return [j for b in bl for j in b] + [None] * (-len(lst) % bs)  # None: padding to a whole batch

    jobs = batched(ev) + batched(greedy) + batched(sampled)
    done = {os.path.basename(f) for f in glob.glob(os.path.join(ddir, "shard-*.pt"))}
    t0 = time.time()
    n_batches = (len(jobs) + bs - 1) // bs
    log(f"data: {len(ev) + len(greedy) + len(sampled)} jobs ({len(ev)} held out, {len(greedy)} greedy, {len(sampled)} sampled) "
        f"in {n_batches} batches of {bs}")
    bar = tqdm(range(n_batches), desc="data", unit="batch", mininterval=5)
    n_run = 0
    gen_mem = {}  # generate_rows' memory limit, learnt from the first batch that ran out
    for bi in bar:
        name = f"shard-{bi:05d}.pt"
        if name in done:
            continue
        spent = time.time() - t0
        # stop before a batch that would not finish inside the budget (by the mean batch time so far)
        if args.data_seconds and (spent > args.data_seconds or
                                  (n_run and spent + spent / n_run > args.data_seconds)):
            log(f"data: time budget reached after {bi} of {n_batches} batches")
            break
        n_run += 1
        batch = [j for j in jobs[bi * bs:(bi + 1) * bs] if j is not None]
        enc = [penc[p["id"]] for p, _ in batch]
        records = []
        for mode in ("greedy", "sampled"):
            idx = [i for i, (_, m) in enumerate(batch) if m == mode]
            if not idx:
                continue
            # dspark writes the greedy answers only: on an H100 at --max-batch 128 it gave 34-40 k
            # generated tok/s (transformers' generate 7.4-8.6 k), but a sampled batch (T 0.8, top-p
            # 0.95) made no shard in 230 s: dspark sampled on the host, ~0.5 ms a token for this
            # vocabulary, one request after another (bench_sample), which a GPU round of 128 rows
            # turned into ~100x its forward. The engine now spreads that over the host's threads
            # (engine.c verify_all; 16 on the lent machines) and step 6 runs in vector kernels: on
            # an H200 with a random-weight model of this shape, 8-9 k sampled tok/s against 17-23 k
            # greedy (bench/results/batch-sampled-gpu-h200-sampler-exp.json), about transformers'
            # rate; with the trained model's (more peaked) distributions it is not measured yet, so
            # sampled answers stay with transformers
            if args.data_engine == "dspark" and mode == "greedy":
                answers = dspark_answers(args, [enc[i] for i in idx], mode, (args.seed * 1000003 + bi) * 4096)
            else:  # a left-padded batch for transformers' generate
                L = max(len(enc[i]) for i in idx)
                ids = torch.full((len(idx), L), tok.pad_token_id, dtype=torch.long)
                att = torch.zeros((len(idx), L), dtype=torch.long)
                for r, i in enumerate(idx):
                    ids[r, L - len(enc[i]):] = torch.tensor(enc[i])
                    att[r, L - len(enc[i]):] = 1
                kw = dict(do_sample=False) if mode == "greedy" else dict(
                    do_sample=True, temperature=args.sample_temp, top_p=0.95, top_k=0)
                torch.manual_seed(args.seed * 1000003 + bi)
                out = generate_rows(target, ids, att, device, dict(
                    max_new_tokens=args.max_new, eos_token_id=eos, pad_token_id=tok.pad_token_id, **kw), gen_mem)
                answers = [row[L:] for row in out]
            for r, i in enumerate(idx):
                ans = answers[r]
                if ans is None:
                    continue
                cut = next((j + 1 for j, t in enumerate(ans) if t in eos), len(ans))
                p = batch[i][0]
                records.append({"id": p["id"], "split": p["split"], "source": p["source"],
                                "mode": mode, "prompt_len": len(enc[i]), "ids": enc[i] + ans[:cut]})
        torch.save(records, os.path.join(ddir, name + ".tmp"))
        os.replace(os.path.join(ddir, name + ".tmp"), os.path.join(ddir, name))
    n = len(glob.glob(os.path.join(ddir, "shard-*.pt")))
    log(f"data: {n} shards in {ddir} ({time.time() - t0:.0f} s this run)")


def read_data(args) -> tuple[list[dict], list[dict]]:
    import torch
    recs = []
    for f in sorted(glob.glob(os.path.join(args.work, "data", "shard-*.pt"))):
        recs += torch.load(f)
    tr = [r for r in recs if r["split"] == "train" and len(r["ids"]) - r["prompt_len"] >= 2]
    ev = [r for r in recs if r["split"] == "eval" and len(r["ids"]) - r["prompt_len"] >= 2]
    # held-out records in the prompt file's order, whatever order the data step made them in: the
    # first --eval-seqs / --eval-max are then a mix of sources, the same set from run to run
    pp = os.path.join(args.work, "prompts.jsonl")
    order = {p["id"]: i for i, p in enumerate(read_prompts(args))} if os.path.exists(pp) else {}
    ev.sort(key=lambda r: (order.get(r["id"], len(order)), r["id"], r["mode"]))
    return tr, ev


def make_batch(recs, pad: int, max_len: int, device):
    import torch
    L = min(max(len(r["ids"]) for r in recs), max_len)
    ids = torch.full((len(recs), L), pad, dtype=torch.long)
    att = torch.zeros((len(recs), L), dtype=torch.long)
    lm = torch.zeros((len(recs), L), dtype=torch.float32)
    for i, r in enumerate(recs):
        x = r["ids"][:L]
        ids[i, :len(x)] = torch.tensor(x)
        att[i, :len(x)] = 1
        lm[i, r["prompt_len"]:len(x)] = 1.0
    return ids.to(device), att.to(device), lm.to(device)


def sample_anchors(lm, n: int, gen):
    """Up to n anchors per row among positions a with loss_mask[a] and loss_mask[a+1] (the first
    label is an answer token), sorted; keep marks real ones (DeepSpec's sample_anchor_positions)."""
    import torch
    b, T = lm.shape
    valid = (lm[:, :-1] > 0.5) & (lm[:, 1:] > 0.5)
    r = torch.rand(valid.shape, generator=gen, device="cpu").to(lm.device)
    r = torch.where(valid, r, torch.full_like(r, 2.0))
    order = r.argsort(dim=1)[:, :n]
    cnt = valid.sum(1, keepdim=True).clamp(max=n)
    keep = torch.arange(order.shape[1], device=lm.device)[None] < cnt
    anchors = torch.where(keep, order, torch.zeros_like(order))
    anchors, perm = anchors.sort(dim=1)
    keep = torch.gather(keep, 1, perm)
    if anchors.shape[1] < n:
        pad = n - anchors.shape[1]
        anchors = torch.cat([anchors, anchors.new_zeros(b, pad)], 1)
        keep = torch.cat([keep, keep.new_zeros(b, pad)], 1)
    return anchors, keep


class PhaseTimer:
    """Where a training step's time goes: between steps `first` and `last` (after the warm-up), each
    phase is timed with the device synchronized at its ends; otherwise a no-op (no syncs)."""

    def __init__(self, cuda: bool, first: int = 10, last: int = 40):
        self.cuda, self.first, self.last = cuda, first, last
        self.on, self.t, self.ms, self.n = False, 0.0, {}, 0

    def start(self, step: int) -> None:
        self.on = self.first <= step < self.last
        if self.on:
            self._sync()
            self.t = time.perf_counter()

    def _sync(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()

    def mark(self, phase: str) -> None:
        if self.on:
            self._sync()
            t = time.perf_counter()
            self.ms[phase] = self.ms.get(phase, 0.0) + 1e3 * (t - self.t)
            self.t = t

    def end(self) -> dict | None:
        """After a timed step: the per-step means once the window is full (once), else None."""
        if not self.on:
            return None
        self.n += 1
        if self.n < self.last - self.first:
            return None
        return {k: round(v / self.n, 2) for k, v in self.ms.items()}


NO_TIMER = PhaseTimer(False, 0, 0)


def block_terms(drafter, target, ids, att, lm, anchors, keep, autocast, timer=NO_TIMER, feats=None):
    """For sampled anchors, the rows that count (emask [b, N, g]: the valid prefix of each block, labels
    inside the answer): draft logits zp [M, V], confidence logits [M] or None, labels [M], slots [M],
    the target's logits at each label's position zq [M, V], and emask. Vocabulary-wide tensors are
    made for those M rows only (not every slot, nor every position of the target). feats: the
    target's taps and final hidden states [b, T, nT*H + H] from the cache (--cache-taps) instead of
    its forward."""
    import torch
    if feats is not None:
        H = target.config.hidden_size
        taps, th = feats[..., :-H], feats[..., -H:]
    else:
        with torch.no_grad():
            taps, th = target_forward(target, ids, att, drafter.c["target_layer_ids"])
    timer.mark("target_forward")
    g = drafter.block_size
    b, T = ids.shape
    lab_idx = anchors[:, :, None] + torch.arange(g, device=ids.device) + 1
    in_answer = torch.gather(lm[:, None, :].expand(-1, anchors.shape[1], -1), 2, lab_idx.clamp(max=T - 1)) > 0.5
    emask = ((lab_idx < T) & in_answer & keep[:, :, None]).int().cumprod(-1).bool()
    with autocast:
        h, prev, labels, _ = drafter.train_forward(ids, taps, anchors, keep)
        hs, ps = h[emask], prev[emask]
        zp = drafter.logits(hs, ps)
        conf = drafter.confidence(hs, ps) if drafter.confidence_head is not None else None
    rows = torch.arange(b, device=ids.device)[:, None, None].expand_as(emask)[emask]
    with torch.no_grad():
        zq = target_logits(target, th[rows, (lab_idx - 1)[emask]])  # the target's distribution for each label
    slot = torch.arange(g, device=ids.device).expand_as(emask)[emask]
    timer.mark("drafter_forward")
    return zp, conf, labels[emask], slot, zq, emask


def train_step(drafter, target, opt, params, batch, anchors, keep, weights, autocast, lr, timer=NO_TIMER, feats=None):
    """One optimizer step on a batch (ids, att, lm) at sampled anchors; (stats, gradient norm)."""
    import torch
    from model import dspark_loss
    ids, att, lm = batch
    zp, conf, labels, slot, zq, _ = block_terms(drafter, target, ids, att, lm, anchors, keep, autocast, timer, feats)
    loss, s, _ = dspark_loss(zp, zq, conf, labels, slot, drafter.block_size, **weights)
    timer.mark("loss")
    for gr in opt.param_groups:
        gr["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    timer.mark("backward")
    gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    timer.mark("optimizer")
    return s, gn


def cache_features(target, recs, taps: list[int], pad: int, max_len: int, device, batch: int = 64,
                   verbose: bool = True) -> None:
    """--cache-taps: the target's tap features and final hidden states of every record, computed once
    (batches of like lengths) and kept on the host in bf16 as r["_feat"] [min(len, max_len), nT*H + H]:
    training then reads them instead of running the target each step (the data is seen ~6 times in
    the recipe's 440 s). Host memory: tokens x (nT + 1) x H x 2 bytes (the default model's 8.3 M
    tokens: ~58 GB)."""
    import torch
    t0 = time.time()
    order = sorted(range(len(recs)), key=lambda i: len(recs[i]["ids"]))
    n_tok = 0
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        ids, att, _ = make_batch([recs[i] for i in idx], pad, max_len, device)
        with torch.no_grad():
            tp, th = target_forward(target, ids, att, taps)
            f = torch.cat([tp, th.to(tp.dtype)], dim=-1).to(torch.bfloat16).cpu()
        for j, i in enumerate(idx):
            L = min(len(recs[i]["ids"]), max_len)
            recs[i]["_feat"] = f[j, :L].clone()
            n_tok += L
    if verbose:
        log(f"train: cached the target's features of {len(recs)} sequences ({n_tok} tokens, "
            f"{n_tok * f.shape[-1] * 2 / 2**30:.1f} GiB on the host) in {time.time() - t0:.1f} s")


_PINNED = {}  # batch_features' pinned host buffer and the event of its last copy to the GPU


def batch_features(recs, L: int, device):
    """The cached features of a batch's records, right-padded with zeros to L positions, on device.
    On CUDA they go through one pinned buffer, reused (a fresh pinned allocation of a batch's ~100-300
    MB each step costs more than the copy): the fill waits for the previous batch's copy to end."""
    import torch
    f0 = recs[0]["_feat"]
    shape = (len(recs), L, f0.shape[1])
    n = shape[0] * shape[1] * shape[2]
    if device.type == "cuda":
        if "buf" not in _PINNED or _PINNED["buf"].numel() < n:
            _PINNED["buf"] = torch.empty(n, dtype=f0.dtype, pin_memory=True)
        if "ev" in _PINNED:
            _PINNED["ev"].synchronize()
        out = _PINNED["buf"][:n].view(shape)
    else:
        out = torch.empty(shape, dtype=f0.dtype)
    for i, r in enumerate(recs):
        x = r["_feat"][:L]
        out[i, :x.shape[0]] = x
        out[i, x.shape[0]:] = 0
    if device.type != "cuda":
        return out
    d = out.to(device, non_blocking=True)
    _PINNED["ev"] = torch.cuda.Event()
    _PINNED["ev"].record()
    return d


def train_autocast(args, device):
    """The drafter's autocast context: bf16 on CUDA unless --amp 0, none on the CPU unless --amp 1."""
    import contextlib
    import torch
    amp = args.amp if args.amp is not None else device.type == "cuda"
    return torch.autocast(device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext()


def loss_weights(args, cfg, target, device) -> dict:
    """dspark_loss's keyword arguments: the objective's weights and its vocabulary-wide terms
    (compiled on CUDA unless --compile 0)."""
    from model import compiled_row_terms, row_terms
    weights = dict(decay=args.loss_decay, ce_w=args.ce_w, tv_w=args.tv_w, conf_w=args.conf_w)
    compile_loss = args.compile if args.compile is not None else device.type == "cuda"
    weights["terms"] = compiled_row_terms(target.config.vocab_size, device, log) if compile_loss else row_terms
    log(f"train: loss terms {'compiled' if weights['terms'] is not row_terms else 'eager'}")
    if cfg["markov_rank"] == 0:
        weights.update(ce_w=1.0, tv_w=0.0, conf_w=0.0)  # DeepSpec's DFlash recipe: CE only
    return weights


def peak_gib(device) -> str:
    import torch
    return f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else "n/a"


def core_state(drafter) -> dict:
    return {k: v for k, v in drafter.state_dict().items() if k not in ("embed_tokens.weight", "lm_head.weight")}


def read_trained(path: str) -> tuple[dict, dict]:
    """(config, float32 tensors) of a trained drafter: a --core-only folder (core-*.safetensors) or
    an exported one (model.safetensors)."""
    import torch
    from safetensors.torch import load_file
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg.pop("torch_dtype", None)
    files = sorted(glob.glob(os.path.join(path, "core-*.safetensors"))) or \
        sorted(glob.glob(os.path.join(path, "model*.safetensors")))
    if not files:
        raise SystemExit(f"train: --init-from {path}: no core-*.safetensors or model.safetensors")
    sd = {}
    for p in files:
        sd.update({k: v.to(torch.float32) for k, v in load_file(p).items()})
    return cfg, sd


def build_drafter(cfg, target, device, seed: int, args=None):
    """The drafter, initialized (seed; embed/lm_head copied from the target) on device; args sets
    its training-time switches (--flex, --fused-head)."""
    from model import Drafter
    d = Drafter(cfg)
    emb = target.get_input_embeddings().weight.detach().float().cpu()
    head = target.get_output_embeddings().weight.detach().float().cpu()
    d.init_weights(seed, emb, head)
    if args is not None:
        d.flex, d.fused_head = bool(args.flex), bool(args.fused_head)
    return d.to(device)


def step_train(args, target, tok, device) -> bool:
    """Train (or resume) until the schedule ends; False when --stop-after ended this run first."""
    import torch
    from tqdm import tqdm
    from model import dspark_loss
    cdir = os.path.join(args.work, "ckpt")
    os.makedirs(cdir, exist_ok=True)
    cfg_path = os.path.join(cdir, "config.json")
    init = None
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    elif args.init_from:
        cfg, init = read_trained(args.init_from)
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
    else:
        eos = stop_ids(target, tok)
        mask = args.mask_token_id if args.mask_token_id is not None else pick_mask_token(tok, target.config.vocab_size, eos)
        cfg = drafter_config(target, args, mask)
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
    torch.manual_seed(args.seed)
    drafter = build_drafter(cfg, target, device, args.seed, args)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    state_path = os.path.join(cdir, "state.pt")
    step, elapsed = 0, 0.0
    gen = torch.Generator().manual_seed(args.seed)
    if init is not None and not os.path.exists(state_path):
        want = set(core_state(drafter))
        miss = sorted(want - set(init))
        if miss:
            raise SystemExit(f"train: --init-from {args.init_from} lacks {len(miss)} of the drafter's tensors ({miss[:3]})")
        drafter.load_state_dict({k: init[k] for k in want}, strict=False)
        log(f"train: initialized from {args.init_from} ({len(want)} tensors); a fresh optimizer and schedule")
    if os.path.exists(state_path):
        st = torch.load(state_path, map_location=device, weights_only=False)
        drafter.load_state_dict(st["model"], strict=False)
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        gen.set_state(st["gen"])
        random.setstate(st["py_rng"])
        log(f"train: resumed at step {step} ({elapsed:.0f} s trained)")
    else:
        random.seed(args.seed)
    tr, ev = read_data(args)
    if not tr:
        raise SystemExit("train: no training data (run the data step)")
    if args.bucket > 0:
        tr.sort(key=lambda r: min(len(r["ids"]), args.max_len))
    n_params = sum(p.numel() for p in params)
    log(f"train: {len(tr)} training sequences, {len(ev)} held out, {n_params / 1e6:.2f}M trainable parameters")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    if args.cache_taps:  # counted in the training time (--train-seconds): it is part of the call
        t_c = time.time()
        cache_features(target, tr, cfg["target_layer_ids"], pad, args.max_len, device)
        elapsed += time.time() - t_c
    autocast = train_autocast(args, device)
    weights = loss_weights(args, cfg, target, device)
    logf = open(os.path.join(args.work, "train_log.jsonl"), "a", encoding="utf-8")
    ev_batches = [ev[i:i + args.batch] for i in range(0, min(len(ev), args.eval_seqs), args.batch)]

    def held_out():
        drafter.eval()
        egen = torch.Generator().manual_seed(1234)
        acc_sum, n_sum, tau = 0, 0, []
        with torch.no_grad():
            for eb in ev_batches:
                ids, att, lm = make_batch(eb, pad, args.max_len, device)
                anchors, keep = sample_anchors(lm, args.anchors, egen)
                zp, conf, labels, slot, zq, emask = block_terms(drafter, target, ids, att, lm, anchors, keep, autocast)
                _, s, acc_r = dspark_loss(zp, zq, conf, labels, slot, drafter.block_size, **weights)
                acc = torch.zeros(emask.shape, device=device)
                acc[emask] = acc_r
                acc_sum = acc_sum + acc.sum((0, 1))
                n_sum = n_sum + emask.float().sum((0, 1))
                blocks = keep & emask[:, :, 0]
                tau.append(((acc.cumprod(-1).sum(-1) + 1)[blocks]).cpu())
        drafter.train()
        return {"heldout_accept_by_slot": [round(float(x), 4) for x in (acc_sum / n_sum.clamp_min(1))],
                "heldout_expected_accept_len": round(float(torch.cat(tau).mean()), 4)}

    bar = tqdm(total=args.train_steps, initial=step, desc="train", unit="step", mininterval=5)
    t_run = time.time()
    t_start = t_run - elapsed  # the training time of earlier runs counts (checkpoint's "elapsed")

    def progress() -> float:
        """Share of the run done: by steps, or by time under --train-seconds (whichever is further);
        the learning-rate schedule follows it, so a time-bounded run still decays to the end."""
        p = step / args.train_steps
        if args.train_seconds:
            p = max(p, (time.time() - t_start) / args.train_seconds)
        return min(p, 1.0)

    warm = min(100, args.train_steps // 10 + 1)
    timer = PhaseTimer(device.type == "cuda")
    drafter.train()
    done = progress() >= 1.0
    while not done:
        timer.start(step)
        if args.bucket > 0:  # a random window of like lengths: less right padding in the target's forward
            w = min(len(tr), args.batch * args.bucket)
            i = random.randrange(len(tr) - w + 1)
            recs = random.sample(tr[i:i + w], min(args.batch, w))
        else:
            recs = random.sample(tr, min(args.batch, len(tr)))
        ids, att, lm = make_batch(recs, pad, args.max_len, device)
        anchors, keep = sample_anchors(lm, args.anchors, gen)
        timer.mark("batch")
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress())))
        feats = batch_features(recs, ids.shape[1], device) if args.cache_taps else None
        s, gn = train_step(drafter, target, opt, params, (ids, att, lm), anchors, keep, weights, autocast, lr, timer, feats)
        phases = timer.end()
        if phases:
            log(f"train: ms per step by phase (steps {timer.first}-{timer.last - 1}, synchronized): "
                + ", ".join(f"{k} {v}" for k, v in phases.items()) + f"; peak memory {peak_gib(device)}")
            logf.write(json.dumps({"step": step + 1, "phase_ms": phases}) + "\n")
        step += 1
        bar.update(1)
        done = progress() >= 1.0
        stop = not done and args.stop_after > 0 and time.time() - t_run >= args.stop_after
        if step % args.log_every == 0 or done:
            row = {"step": step, "lr": lr, "grad_norm": float(gn), "elapsed_s": round(time.time() - t_start, 1)}
            row.update({k: (round(float(v), 5) if v.ndim == 0 else [round(float(x), 4) for x in v]) for k, v in s.items()})
            if step % args.eval_every == 0 or done:
                row.update(held_out())
            logf.write(json.dumps(row) + "\n")
            logf.flush()
            bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['accept_rate_by_slot'][0]:.2f}")
        if step % args.ckpt_every == 0 or done or stop:
            torch.save({"model": core_state(drafter), "opt": opt.state_dict(), "step": step,
                        "elapsed": time.time() - t_start, "gen": gen.get_state(), "py_rng": random.getstate()},
                       state_path + ".tmp")
            os.replace(state_path + ".tmp", state_path)
        if stop:
            break
    bar.close()
    logf.close()
    if not done:
        log(f"train: stopped by --stop-after at step {step}, {time.time() - t_start:.0f} s trained "
            f"({100 * progress():.0f}% of the schedule); run train again to resume")
        return False
    log(f"train: done, {step} steps in {time.time() - t_start:.0f} s")
    return True


def load_trained(args, target, device, bf16_round: bool = True):
    import torch
    cdir = os.path.join(args.work, "ckpt")
    with open(os.path.join(cdir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    d = build_drafter(cfg, target, device, args.seed)
    sd = torch.load(os.path.join(cdir, "state.pt"), map_location=device, weights_only=False)["model"]
    if bf16_round:  # evaluate what is exported
        sd = {k: v.to(torch.bfloat16).float() for k, v in sd.items()}
    d.load_state_dict(sd, strict=False)
    return d.eval(), cfg


def eval_subset(recs: list[dict], n: int) -> list[dict]:
    """n held-out records taken in turn from each source (by id within a source), so that every
    source is in the eval however the data step ordered them (it writes the held-out answers in
    batches sorted by prompt length: the first n were the shortest prompts, and stop 48's 64 held
    none of the magpie ones)."""
    by: dict = {}
    for r in sorted(recs, key=lambda r: r["id"]):
        by.setdefault(r["source"], []).append(r)
    out, k = [], 0
    while len(out) < n and any(k < len(v) for v in by.values()):
        out += [by[s][k] for s in sorted(by) if k < len(by[s])][:n - len(out)]
        k += 1
    return out


def step_eval(args, target, tok, device) -> dict:
    """Greedy speculative decoding simulated on the held-out greedy answers: the target's greedy
    continuation is fixed, so one target forward gives every round's context taps."""
    import torch
    drafter, cfg = load_trained(args, target, device, bf16_round=args.export_dtype == "bfloat16")
    _, ev = read_data(args)
    ev = [r for r in ev if r["mode"] == "greedy"]
    ev = [r for r in ev if r["source"].startswith("bench-")] + \
        eval_subset([r for r in ev if not r["source"].startswith("bench-")], args.eval_max)
    g = drafter.block_size
    thresholds = [0.0, 0.3, 0.5, 0.7, 0.9]
    per: dict = {}
    with torch.no_grad():
        for r in ev:
            ids = torch.tensor(r["ids"], device=device)
            taps, _ = target_forward(target, ids[None], torch.ones_like(ids)[None], cfg["target_layer_ids"])
            taps = taps[0]
            st = per.setdefault(r["source"], {"rounds": 0, "committed": 0, "acc_at": [0] * g,
                                              "cond_num": [0] * g, "cond_den": [0] * g,
                                              "conf_sum": [0.0] * g, "hist": [0] * (g + 2),
                                              "thr": {t: [0, 0] for t in thresholds}})
            start, n = r["prompt_len"], len(r["ids"])
            while start < n - 1:
                drafts, _, conf = drafter.draft(ids, taps, start)
                avail = min(g, n - 1 - start)
                ref = ids[start + 1:start + 1 + avail]
                m = (drafts[:avail] == ref).int().cumprod(0)
                a = int(m.sum())
                st["rounds"] += 1
                st["committed"] += a + 1
                st["hist"][a + 1] += 1
                for k in range(avail):
                    if k < a:
                        st["acc_at"][k] += 1
                    if k <= a:
                        st["cond_den"][k] += 1
                        st["cond_num"][k] += int(k < a)
                if conf is not None:
                    sig = torch.sigmoid(conf).tolist()
                    for k in range(g):
                        st["conf_sum"][k] += sig[k]
                    for t in thresholds:
                        K = next((k for k in range(g) if sig[k] < t), g) if t > 0 else g
                        st["thr"][t][0] += min(K, avail)
                        st["thr"][t][1] += min(a, K)
                start += a + 1
    out = {"per_source": {}, "block_size": g, "arch": "dspark" if cfg["markov_rank"] else "dflash"}
    allr = {"rounds": 0, "committed": 0}
    for src, st in sorted(per.items()):
        R = max(st["rounds"], 1)
        o = {"rounds": st["rounds"], "mean_accepted_len": round(st["committed"] / R, 4),
             "accept_rate_by_slot": [round(x / R, 4) for x in st["acc_at"]],
             "cond_accept_by_slot": [round(nm / max(dn, 1), 4) for nm, dn in zip(st["cond_num"], st["cond_den"])],
             "accepted_len_hist": st["hist"]}
        if cfg.get("enable_confidence_head"):
            o["mean_confidence_by_slot"] = [round(x / R, 4) for x in st["conf_sum"]]
            o["threshold_tradeoff"] = {str(t): {"mean_kept": round(v[0] / R, 3),
                                                 "mean_accepted_len": round(1 + v[1] / R, 3)}
                                       for t, v in st["thr"].items()}
        out["per_source"][src] = o
        allr["rounds"] += st["rounds"]
        allr["committed"] += st["committed"]
    held = [s for s in per if not s.startswith("bench-")]
    hr = sum(per[s]["rounds"] for s in held)
    out["heldout_mean_accepted_len"] = round(sum(per[s]["committed"] for s in held) / max(hr, 1), 4)
    acc = [sum(per[s]["acc_at"][k] for s in held) / max(hr, 1) for k in range(g)]
    out["heldout_accept_rate_by_slot"] = [round(x, 4) for x in acc]
    out["sequences"] = len(ev)
    with open(os.path.join(args.work, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    log(f"eval: held-out mean accepted length {out['heldout_mean_accepted_len']} "
        f"(per slot {out['heldout_accept_rate_by_slot']}); " +
        ", ".join(f"{s}: {o['mean_accepted_len']}" for s, o in out["per_source"].items()))
    return out


def write_safetensors(path: str, tensors: dict, meta: dict | None = None) -> None:
    from safetensors.torch import save_file
    save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, path, metadata=dict({"format": "pt"}, **(meta or {})))


def write_draft_vocab(args) -> None:
    """OUT/draft_vocab.json: the token ids of the target's answers in the training split (WORK/data),
    most frequent first (ties: lower id first), for dspark's --draft-vocab (README "Draft
    vocabulary"): the first N are the subset, tokens never seen follow in id order. Skipped without
    the data (an export assembled from --core shards elsewhere)."""
    import collections

    if not glob.glob(os.path.join(args.work, "data", "shard-*.pt")):
        log("export: no WORK/data here: draft_vocab.json not written")
        return
    tr, _ = read_data(args)
    count = collections.Counter(t for r in tr for t in r["ids"][r["prompt_len"]:])
    ids = sorted(count, key=lambda t: (-count[t], t))
    with open(os.path.join(args.out, "draft_vocab.json"), "w", encoding="utf-8") as f:
        json.dump({"token_ids": ids, "answer_tokens": sum(count.values()), "answers": len(tr)}, f)
        f.write("\n")
    log(f"export: draft_vocab.json ({len(ids)} distinct tokens of {sum(count.values())} in {len(tr)} training answers)")


def step_export(args, target, device) -> None:
    import torch
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.export_dtype]
    os.makedirs(args.out, exist_ok=True)
    if args.core:  # assemble from a --core-only export
        with open(os.path.join(args.core, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        from safetensors.torch import load_file
        sd = {}
        for p in sorted(glob.glob(os.path.join(args.core, "core-*.safetensors"))):
            sd.update(load_file(p))
    else:
        with open(os.path.join(args.work, "ckpt", "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        sd = torch.load(os.path.join(args.work, "ckpt", "state.pt"), map_location="cpu", weights_only=False)["model"]
    sd = {k: v.to(dt) for k, v in sd.items()}
    cfg = dict(cfg, torch_dtype=args.export_dtype)
    if args.core_only:
        shards, cur, size = [], {}, 0
        for k in sorted(sd):
            nb = sd[k].numel() * sd[k].element_size()
            if cur and size + nb > 15 * 2**20:
                shards.append(cur)
                cur, size = {}, 0
            cur[k] = sd[k]
            size += nb
        shards.append(cur)
        for i, s in enumerate(shards):
            write_safetensors(os.path.join(args.out, f"core-{i:02d}.safetensors"), s)
        with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
        write_draft_vocab(args)
        log(f"export: {len(shards)} core shards -> {args.out}")
        return
    emb = target.get_input_embeddings().weight.detach().to("cpu", dt)
    head = target.get_output_embeddings().weight.detach().to("cpu", dt)
    if tuple(emb.shape) != (cfg["vocab_size"], cfg["hidden_size"]):
        raise SystemExit(f"target embedding {tuple(emb.shape)} does not fit the drafter config")
    sd["embed_tokens.weight"] = emb.clone()
    sd["lm_head.weight"] = head.clone()
    write_safetensors(os.path.join(args.out, "model.safetensors"), sd)
    core_vocab = os.path.join(args.core, "draft_vocab.json") if args.core else ""
    if core_vocab and os.path.exists(core_vocab):  # written next to the core shards, where the data was
        shutil.copyfile(core_vocab, os.path.join(args.out, "draft_vocab.json"))
    else:
        write_draft_vocab(args)
    with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    log(f"export: {args.out} ({sum(v.numel() for v in sd.values()) / 1e6:.1f}M parameters, {args.export_dtype})")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", required=True, help="GGUF file or Hugging Face model directory")
    ap.add_argument("--work", default="build/train-drafter", help="working directory (resumable state)")
    ap.add_argument("--out", default=None, help="drafter directory to export (default WORK/drafter)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--arch", choices=("dspark", "dflash"), default="dspark")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=1234)
    g = ap.add_argument_group("drafter")
    g.add_argument("--layers", type=int, default=3)
    g.add_argument("--ffn", type=int, default=0, help="drafter FFN width (default: the target's)")
    g.add_argument("--block", type=int, default=7)
    g.add_argument("--n-taps", type=int, default=4)
    g.add_argument("--taps", default="", help="explicit tap layers, e.g. 1,10,18,27")
    g.add_argument("--markov-rank", type=int, default=64)
    g.add_argument("--mask-token-id", type=int, default=None)
    g = ap.add_argument_group("prompts and data")
    g.add_argument("--n-debian", type=int, default=6000)
    g.add_argument("--n-python", type=int, default=3000)
    g.add_argument("--eval-pct", type=float, default=3.0)
    g.add_argument("--max-prompt", type=int, default=384)
    g.add_argument("--max-new", type=int, default=256)
    g.add_argument("--gen-batch", type=int, default=256)
    g.add_argument("--sample-frac", type=float, default=0.5, help="sampled answers per training prompt: its whole part for every prompt, its fraction by chance")
    g.add_argument("--samples-by-source", default="",
                   help="sampled answers per training prompt by source, e.g. written=3,python=2 (others: --sample-frac)")
    g.add_argument("--sample-temp", type=float, default=0.8)
    g.add_argument("--n-magpie", type=int, default=0, help="magpie step: chat prompts the target writes itself (requests)")
    g.add_argument("--magpie-temp", type=float, default=1.0, help="magpie step: sampling temperature (top-p 0.95)")
    g.add_argument("--magpie-max", type=int, default=96, help="magpie step: tokens per generated message at most")
    g.add_argument("--data-seconds", type=float, default=0, help="stop generating after this long (0: no limit)")
    g.add_argument("--data-engine", choices=("transformers", "dspark"), default="transformers",
                   help="who writes the greedy answers: transformers' generate on the training device, or `dspark batch` "
                        "(the engine's own tokens, batched; see --dspark, --dspark-args); sampled answers are transformers'")
    g.add_argument("--dspark", default=os.path.join(ROOT, "build", "release", "dspark"), help="the dspark binary (--data-engine dspark)")
    g.add_argument("--dspark-args", default="", help='extra `dspark batch` options, e.g. "--backend cuda --max-batch 128"')
    g = ap.add_argument_group("training")
    g.add_argument("--train-steps", type=int, default=4000, help="training steps (the learning-rate schedule's length)")
    g.add_argument("--train-seconds", type=float, default=0,
                   help="also stop after this much training time, summed over resumed runs; the schedule then "
                        "follows the time (0: no limit)")
    g.add_argument("--stop-after", type=float, default=0,
                   help="end this run's training after this many seconds, checkpointed, before the schedule's "
                        "end (for time-limited machines); the later steps wait for a run that finishes it")
    g.add_argument("--batch", type=int, default=16)
    g.add_argument("--bucket", type=int, default=0,
                   help="draw each batch from a random window of BUCKET x batch sequences of like lengths (0: from all)")
    g.add_argument("--anchors", type=int, default=64)
    g.add_argument("--max-len", type=int, default=640)
    g.add_argument("--lr", type=float, default=6e-4)
    g.add_argument("--amp", type=int, choices=(0, 1), default=None,
                   help="bf16 autocast for the drafter (default: on for CUDA, off on the CPU)")
    g.add_argument("--compile", type=int, choices=(0, 1), default=None,
                   help="torch.compile the vocabulary-wide loss terms (default: on for CUDA; eager if compiling fails)")
    g.add_argument("--flex", type=int, choices=(0, 1), default=0,
                   help="the training forward's attention through flex_attention with a block-sparse mask "
                        "(compiled on CUDA) instead of scaled_dot_product_attention with a dense one")
    g.add_argument("--fused-head", type=int, choices=(0, 1), default=0,
                   help="draft logits as one matmul of [h, W1[prev]] by [lm_head | W2] in bf16 (under autocast)")
    g.add_argument("--target-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the target's weights and forward in the trainer (its logits are float32 either way)")
    g.add_argument("--cache-taps", type=int, choices=(0, 1), default=0,
                   help="compute the target's tap features and final hidden states of the training data once "
                        "(kept on the host in bf16; its time counts as training time) instead of every step")
    g.add_argument("--init-from", default=None,
                   help="start from a trained drafter's core (a --core-only folder or an exported drafter): its "
                        "config and weights, a fresh optimizer and schedule (training continued over several runs)")
    g.add_argument("--loss-decay", type=float, default=4.0)
    g.add_argument("--ce-w", type=float, default=0.1)
    g.add_argument("--tv-w", type=float, default=0.9)
    g.add_argument("--conf-w", type=float, default=1.0)
    g.add_argument("--log-every", type=int, default=50)
    g.add_argument("--eval-every", type=int, default=500)
    g.add_argument("--eval-seqs", type=int, default=128)
    g.add_argument("--ckpt-every", type=int, default=500)
    g.add_argument("--eval-max", type=int, default=96, help="held-out sequences the eval step decodes (+ the bench sets)")
    g = ap.add_argument_group("export")
    g.add_argument("--export-dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    g.add_argument("--core-only", action="store_true", help="trained tensors only, in shards <= 15 MiB")
    g.add_argument("--core", default=None, help="assemble the export from a --core-only folder")
    a = ap.parse_args(argv)
    a.out = a.out or os.path.join(a.work, "drafter")
    steps = [s for s in a.steps.split(",") if s]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        ap.error(f"unknown step(s) {bad}; known: {STEPS}")
    a.steps = steps
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    if "prompts" in args.steps:
        step_prompts(args)  # needs no torch
    rest = [s for s in args.steps if s != "prompts"]
    if not rest:
        return 0
    import torch
    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    t0 = time.time()
    target, tok = load_target(args.target, device, args.target_dtype)
    log(f"target {args.target}: {type(target).__name__}, {target.config.num_hidden_layers} layers, "
        f"loaded in {time.time() - t0:.1f} s on {device}")
    if "magpie" in rest:
        step_magpie(args, tok)
    if "data" in rest:
        step_data(args, target, tok, device)
    if "train" in rest and not step_train(args, target, tok, device):
        return 0  # --stop-after: eval and export wait for the run that finishes the schedule
    if "eval" in rest:
        step_eval(args, target, tok, device)
    if "export" in rest:
        step_export(args, target, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
