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
