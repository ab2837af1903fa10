"""Tests of the training tool's host-side logic (needs requirements-drafters.txt; not run by CI):

    .venv-drafters/bin/python -m pytest tools/train_drafter/test_train_drafter.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_drafter as T  # noqa: E402


class FakeTarget:
    """generate() that runs out of memory above `limit` tokens (rows x (prompt + new)) and appends
    each row's first token max_new_tokens times otherwise"""

    def __init__(self, limit):
        self.limit, self.calls = limit, []

    def generate(self, input_ids, attention_mask, **kw):
        n, w = input_ids.shape
        self.calls.append(n)
        if n * (w + kw["max_new_tokens"]) > self.limit:
            raise torch.OutOfMemoryError("fake")
        return torch.cat([input_ids, input_ids[:, :1].repeat(1, kw["max_new_tokens"])], 1)


def test_generate_rows_splits_and_remembers():
    t = FakeTarget(100 * 40)
    ids = torch.arange(300 * 8).reshape(300, 8)
    mem = {}
    out = T.generate_rows(t, ids, torch.ones_like(ids), "cpu", {"max_new_tokens": 32}, mem)
    assert out == torch.cat([ids, ids[:, :1].repeat(1, 32)], 1).tolist()  # every row, in order
    assert t.calls == [300, 150, 75, 75, 75, 75] and mem == {"tokens": 75 * 40}
    t.calls = []  # the next batch starts at the learnt size: no second out-of-memory
    T.generate_rows(t, ids[:200], torch.ones_like(ids[:200]), "cpu", {"max_new_tokens": 32}, mem)
    assert t.calls == [75, 75, 50]
    t.calls = []  # longer prompts: fewer rows for the same tokens
    wide = torch.zeros((100, 48), dtype=torch.long)
    T.generate_rows(t, wide, torch.ones_like(wide), "cpu", {"max_new_tokens": 32}, mem)
    assert t.calls == [37, 37, 26]


def test_generate_rows_one_row_that_does_not_fit_raises():
    t = FakeTarget(10)
    ids = torch.zeros((1, 8), dtype=torch.long)
    try:
        T.generate_rows(t, ids, torch.ones_like(ids), "cpu", {"max_new_tokens": 32}, {})
    except torch.OutOfMemoryError:
        return
    raise AssertionError("expected OutOfMemoryError")


def test_dspark_answers_requests_and_errors(tmp_path):
    """--data-engine dspark: one `dspark batch` request per prompt (greedy: temperature 0; sampled:
    its own seed), answers placed by index whatever order they come in, a failed request None"""
    import json
    import types
    fake = tmp_path / "dspark"
    fake.write_text("#!/usr/bin/env python3\n"
                    "import json, sys\n"
                    "reqs = [json.loads(l) for l in sys.stdin if l.strip()]\n"
                    "json.dump(sys.argv[1:], open(sys.argv[0] + '.argv', 'w'))\n"
                    "json.dump(reqs, open(sys.argv[0] + '.reqs', 'w'))\n"
                    "for i in reversed(range(len(reqs))):\n"
                    "    r = reqs[i]\n"
                    "    if r['prompt_ids'][0] < 0: print(json.dumps({'index': i, 'error': {'message': 'bad'}}))\n"
                    "    else: print(json.dumps({'index': i, 'token_ids': [r['prompt_ids'][-1] + 1, 2]}))\n"
                    "print('dspark batch: done', file=sys.stderr)\n"
                    "sys.exit(3)\n")
    fake.chmod(0o755)
    args = types.SimpleNamespace(dspark=str(fake), target="m.gguf", dspark_args="--backend cuda --max-batch 64",
                                 max_new=16, sample_temp=0.8)
    out = T.dspark_answers(args, [[1, 5], [-1], [7]], "sampled", 1000)
    assert out == [[6, 2], None, [8, 2]]
    reqs = json.loads((tmp_path / "dspark.reqs").read_text())
    assert [r["seed"] for r in reqs] == [1000, 1001, 1002] and all(r["temperature"] == 0.8 for r in reqs)
    argv = json.loads((tmp_path / "dspark.argv").read_text())
    assert argv[:5] == ["batch", "-m", "m.gguf", "--mode", "baseline"] and argv[-2:] == ["--max-batch", "64"]
    T.dspark_answers(args, [[3]], "greedy", 0)
    r = json.loads((tmp_path / "dspark.reqs").read_text())[0]
    assert r["temperature"] == 0 and "seed" not in r and r["max_tokens"] == 16


def test_magpie_step_appends_filtered_messages(tmp_path):
    """magpie: every request is the template's text before a user message's content, sampled with
    its own seed; messages cut at the token limit, empty, marked up or already present are dropped;
    the kept ones join prompts.jsonl (source magpie, a hash split, ids after the others); a second
    run keeps the file as it is"""
    import json
    import types
    fake = tmp_path / "dspark"
    answers = [("How do I bake bread at home?", "stop"), ("Tell me about the", "length"), ("  ", "stop"),
               ("Write a poem <|im_end|> about cats", "stop"), ("how do I  bake bread at home?", "stop"),
               ("Explain photosynthesis to a ten-year-old.", "stop"), ("What is a good name for a cat?", "stop")]
    fake.write_text("#!/usr/bin/env python3\n"
                    "import json, sys\n"
                    "reqs = [json.loads(l) for l in sys.stdin if l.strip()]\n"
                    "json.dump(reqs, open(sys.argv[0] + '.reqs', 'w'))\n"
                    f"ans = {answers!r}\n"
                    "for i in range(len(reqs)):\n"
                    "    print(json.dumps({'index': i, 'text': ans[i][0], 'finish_reason': ans[i][1], 'token_ids': []}))\n")
    fake.chmod(0o755)

    class Tok:
        def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
            return "<s>system\nBe kind.</s>\n<s>user\n" + msgs[0]["content"] + "</s>\n"

        def __call__(self, text, add_special_tokens):
            return {"input_ids": [ord(c) for c in text]}

    old = [{"source": "written", "messages": [{"role": "user", "content": "Explain photosynthesis to a ten-year-old."}],
            "split": "train", "id": 0}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in old))
    args = types.SimpleNamespace(dspark=str(fake), target="m.gguf", dspark_args="", work=str(tmp_path), n_magpie=len(answers),
                                 magpie_max=40, magpie_temp=1.0, seed=3, eval_pct=50.0)
    T.step_magpie(args, Tok())
    reqs = json.loads((tmp_path / "dspark.reqs").read_text())
    assert all(r["prompt_ids"] == [ord(c) for c in "<s>system\nBe kind.</s>\n<s>user\n"] for r in reqs)
    assert len({r["seed"] for r in reqs}) == len(reqs) and all(r["max_tokens"] == 40 for r in reqs)
    ps = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert ps[0] == old[0]
    assert [p["messages"][0]["content"] for p in ps[1:]] == ["How do I bake bread at home?", "What is a good name for a cat?"]
    assert [p["id"] for p in ps] == [0, 1, 2] and all(p["source"] == "magpie" for p in ps[1:])
    import prompts as P
    assert all(p["split"] == P.split_of(p["messages"][0]["content"], 50.0) for p in ps[1:])
    before = (tmp_path / "prompts.jsonl").read_text()
    (tmp_path / "dspark.reqs").unlink()
    T.step_magpie(args, Tok())
    assert (tmp_path / "prompts.jsonl").read_text() == before and not (tmp_path / "dspark.reqs").exists()


def test_eval_subset_takes_every_source_in_turn():
    recs = [{"id": i, "source": s} for i, s in enumerate(["debian"] * 10 + ["python"] * 2 + ["magpie"] * 5 + ["written"] * 4)]
    got = T.eval_subset(list(reversed(recs)), 9)
    assert [r["source"] for r in got] == ["debian", "magpie", "python", "written"] * 2 + ["debian"]
    assert [r["id"] for r in got if r["source"] == "debian"] == [0, 1, 2]
    assert len(T.eval_subset(recs, 100)) == len(recs) and T.eval_subset(recs, 0) == []


def tiny_pair(arch="dspark"):
    """A random 4-layer Llama target and a 1-layer drafter for it (vocabulary 96)."""
    import types
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    tc = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    target = LlamaForCausalLM(tc).eval().requires_grad_(False)
    args = types.SimpleNamespace(taps="0,2", n_taps=2, arch=arch, ffn=0, layers=1, block=5, anchors=6, markov_rank=8)
    cfg = T.drafter_config(target, args, 3)
    drafter = T.build_drafter(cfg, target, torch.device("cpu"), 7)
    with torch.no_grad():  # a Markov head that is not zero, so that its term is tested
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape))
    return target, drafter


def dense_reference(drafter, target, ids, att, lm, anchors, keep, decay, ce_w, tv_w, conf_w):
    """The objective written over every slot and every target position (the form it had before the
    rows that count were selected), for comparison."""
    import torch.nn.functional as F
    out = target(input_ids=ids, attention_mask=att, output_hidden_states=True, use_cache=False)
    taps = torch.cat([out.hidden_states[t + 1] for t in drafter.c["target_layer_ids"]], -1)
    h, prev, labels, valid = drafter.train_forward(ids, taps, anchors, keep)
    logits = drafter.logits(h, prev)
    conf = drafter.confidence(h, prev)
    g, T = drafter.block_size, ids.shape[1]
    lab_idx = (anchors[:, :, None] + torch.arange(g) + 1).clamp(max=T - 1)
    in_answer = torch.gather(lm[:, None, :].expand(-1, anchors.shape[1], -1), 2, lab_idx) > 0.5
    emask = (valid & in_answer & keep[:, :, None]).int().cumprod(-1).bool()
    tl = out.logits[torch.arange(ids.shape[0])[:, None, None], lab_idx - 1].float()
    w = emask.float() * torch.exp(-torch.arange(g).float() / decay)
    den = w.sum()
    ce = (F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(w) * w).sum() / den
    l1 = (torch.softmax(logits, -1) - torch.softmax(tl, -1)).abs().sum(-1)
    acc = (1 - 0.5 * l1).clamp(0, 1)
    bce = (F.binary_cross_entropy_with_logits(conf, acc.detach(), reduction="none") * w).sum() / den
    return ce_w * ce + tv_w * (l1 * w).sum() / den + conf_w * bce, emask, acc


def test_row_selected_loss_equals_dense():
    """block_terms + dspark_loss (vocabulary-wide terms for the rows that count only, the target's
    logits from its final hidden states) give the dense objective's loss, gradients and acceptance"""
    import contextlib
    from model import dspark_loss
    target, drafter = tiny_pair()
    ids = torch.randint(4, 96, (3, 20))
    att = torch.ones_like(ids)
    att[2, 15:] = 0  # a padded row
    lm = torch.zeros(3, 20)
    lm[0, 5:] = 1
    lm[1, 12:] = 1
    lm[2, 8:15] = 1
    anchors, keep = T.sample_anchors(lm, 6, torch.Generator().manual_seed(3))
    w = dict(decay=4.0, ce_w=0.1, tv_w=0.9, conf_w=1.0)
    zp, conf, labels, slot, zq, emask = T.block_terms(drafter, target, ids, att, lm, anchors, keep, contextlib.nullcontext())
    loss, st, acc_r = dspark_loss(zp, zq, conf, labels, slot, drafter.block_size, **w)
    params = [p for p in drafter.parameters() if p.requires_grad]
    g1 = torch.autograd.grad(loss, params)
    ref, emask_ref, acc = dense_reference(drafter, target, ids, att, lm, anchors, keep, **w)
    g2 = torch.autograd.grad(ref, params)
    assert torch.equal(emask, emask_ref) and 0 < int(emask.sum()) < emask.numel()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(acc_r, acc[emask].detach(), rtol=1e-5, atol=1e-6)
    per_slot = (acc * emask).sum((0, 1)) / emask.sum((0, 1)).clamp_min(1)
    torch.testing.assert_close(st["accept_rate_by_slot"], per_slot.detach(), rtol=1e-5, atol=1e-6)


def test_compiled_row_terms_match_eager():
    """torch.compile'd loss terms (or the eager fallback) give row_terms' values and gradients"""
    from model import compiled_row_terms, row_terms
    fn = compiled_row_terms(50, torch.device("cpu"), log=lambda m: None)
    for m in (7, 13):
        zp = (3 * torch.randn(m, 50)).requires_grad_(True)
        zq, lab = 3 * torch.randn(m, 50), torch.randint(0, 50, (m,))
        a = fn(zp, zq, lab)
        ga = torch.autograd.grad(a[0].sum() + 2 * a[1].sum(), zp)[0]
        b = row_terms(zp, zq, lab)
        gb = torch.autograd.grad(b[0].sum() + 2 * b[1].sum(), zp)[0]
        for x, y in zip(a + (ga,), b + (gb,)):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_init_from_core(tmp_path):
    """read_trained takes a --core-only folder's config and tensors (float32, torch_dtype dropped)"""
    import json
    from safetensors.torch import save_file
    _, drafter = tiny_pair()
    sd = {k: v.to(torch.bfloat16) for k, v in T.core_state(drafter).items()}
    keys = sorted(sd)
    save_file({k: sd[k].contiguous() for k in keys[:3]}, str(tmp_path / "core-00.safetensors"))
    save_file({k: sd[k].contiguous() for k in keys[3:]}, str(tmp_path / "core-01.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(dict(drafter.c, torch_dtype="bfloat16")))
    cfg, got = T.read_trained(str(tmp_path))
    assert "torch_dtype" not in cfg and cfg["target_layer_ids"] == drafter.c["target_layer_ids"]
    assert sorted(got) == keys and all(v.dtype == torch.float32 for v in got.values())
    assert torch.equal(got[keys[0]], sd[keys[0]].float())
    # an exported drafter (model.safetensors, with the target's embedding copy beside the core) too:
    # scripts/train-default-drafter's continuations start from the folder the run before exported
    exp = tmp_path / "exported"
    exp.mkdir()
    save_file(dict(sd, **{"embed_tokens.weight": torch.zeros(4, 2, dtype=torch.bfloat16)}),
              str(exp / "model.safetensors"))
    (exp / "config.json").write_text(json.dumps(dict(drafter.c, torch_dtype="bfloat16")))
    cfg2, got2 = T.read_trained(str(exp))
    assert cfg2 == cfg and set(keys) <= set(got2)
    assert all(torch.equal(got2[k], got[k]) for k in keys)


def test_flex_mask_forward_equals_dense():
    """The training forward through flex_attention's block-sparse mask (--flex 1; context padded to
    128) gives the dense mask's block states on every kept anchor's rows (forward only: torch has no
    flex_attention backward on the CPU)"""
    target, drafter = tiny_pair()
    ids = torch.randint(4, 96, (3, 40))
    lm = torch.zeros(3, 40)
    lm[0, 5:] = 1
    lm[1, 36:] = 1  # few anchors: dropped (keep false) ones too
    lm[2, 10:36] = 1
    anchors, keep = T.sample_anchors(lm, 6, torch.Generator().manual_seed(5))
    assert not bool(keep.all())
    with torch.no_grad():
        taps, _ = T.target_forward(target, ids, torch.ones_like(ids), drafter.c["target_layer_ids"])
        h0, p0, l0, v0 = drafter.train_forward(ids, taps, anchors, keep)
        drafter.flex = True
        try:
            h1, p1, l1, v1 = drafter.train_forward(ids, taps, anchors, keep)
        finally:
            drafter.flex = False
    assert torch.equal(p0, p1) and torch.equal(l0, l1) and torch.equal(v0, v1)
    torch.testing.assert_close(h1[keep], h0[keep], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(h0[0, 0], h0[0, -1])  # the states differ by anchor: the mask matters


def test_fused_head_equals_two_products():
    """--fused-head's one product of [h, W1[prev]] by [lm_head | W2] gives the two products' sum, and
    the same gradients"""
    _, drafter = tiny_pair()
    h = torch.randn(11, 32, requires_grad=True)
    prev = torch.randint(0, 96, (11,))
    params = [h, drafter.markov_head.markov_w1.weight, drafter.markov_head.markov_w2.weight]
    z0 = drafter.logits(h, prev)
    g0 = torch.autograd.grad((z0 * torch.linspace(-1, 1, 96)).sum(), params)
    drafter.fused_head = True
    z1 = drafter.logits(h, prev)
    g1 = torch.autograd.grad((z1 * torch.linspace(-1, 1, 96)).sum(), params)
    torch.testing.assert_close(z1, z0, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_cached_features_give_the_forwards_terms():
    """--cache-taps: block_terms on the cached (bf16) features of a batch gives what the target's
    forward gives, to bf16's precision, and the cache covers each record's tokens up to max_len"""
    import contextlib
    target, drafter = tiny_pair()
    g = torch.Generator().manual_seed(11)
    recs = [{"ids": torch.randint(4, 96, (n,), generator=g).tolist(), "prompt_len": 5} for n in (12, 30, 19, 25)]
    T.cache_features(target, recs, drafter.c["target_layer_ids"], 0, 24, torch.device("cpu"), batch=3, verbose=False)
    assert [r["_feat"].shape[0] for r in recs] == [12, 24, 19, 24]
    ids, att, lm = T.make_batch(recs, 0, 24, torch.device("cpu"))
    feats = T.batch_features(recs, ids.shape[1], torch.device("cpu"))
    anchors, keep = T.sample_anchors(lm, 6, torch.Generator().manual_seed(3))
    live = T.block_terms(drafter, target, ids, att, lm, anchors, keep, contextlib.nullcontext())
    cached = T.block_terms(drafter, target, ids, att, lm, anchors, keep, contextlib.nullcontext(), feats=feats)
    assert torch.equal(live[5], cached[5]) and int(live[5].sum()) > 0  # the same rows count
    for a, b in zip(live[:2] + live[4:5], cached[:2] + cached[4:5]):  # zp, conf, zq
        torch.testing.assert_close(b, a, rtol=0.05, atol=0.05)
    taps, th = T.target_forward(target, ids, att, drafter.c["target_layer_ids"])
    ref = torch.cat([taps, th], -1)
    for i, r in enumerate(recs):  # each record's own positions, padding excluded
        n = r["_feat"].shape[0]
        torch.testing.assert_close(feats[i, :n].float(), ref[i, :n], rtol=0.02, atol=0.02)
        assert not feats[i, n:].any()
