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
