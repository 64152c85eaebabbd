"""prompt_batches: P rows per call, forever, epochs reshuffled by seed, exact resume."""

import itertools
import subprocess
import sys

import pytest

from policyzoo.data import batch_at, prompt_batches
from policyzoo.data.batching import epoch_order
from policyzoo.errors import DataError

ROWS = [{"i": i} for i in range(10)]


def ids(batch):
    return [r["i"] for r in batch]


def test_batches_walk_the_epochs_in_order_across_boundaries():
    rows = ROWS[:4]
    e0, e1, e2 = (list(epoch_order(4, 7, e)) for e in range(3))
    got = [ids(b) for b in itertools.islice(prompt_batches(rows, 3, seed=7), 4)]
    # positions 0..11 of the concatenated epochs, three at a time:
    # batch 0 = e0[0:3]; batch 1 = e0[3] + e1[0:2]; batch 2 = e1[2:4] + e2[0]; batch 3 = e2[1:4]
    assert got == [e0[0:3], e0[3:] + e1[0:2], e1[2:] + e2[0:1], e2[1:4]]


def test_each_epoch_is_a_permutation_and_epochs_are_reshuffled():
    flat = [i for b in itertools.islice(prompt_batches(ROWS, 5, seed=0), 6) for i in ids(b)]
    epochs = [flat[0:10], flat[10:20], flat[20:30]]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # three different orders
    other = [i for b in itertools.islice(prompt_batches(ROWS, 5, seed=1), 2) for i in ids(b)]
    assert other != epochs[0]


def test_resume_from_step_is_exact():
    fresh = prompt_batches(ROWS, 3, seed=5)
    expected = [ids(b) for b in itertools.islice(fresh, 12)]
    for start in (0, 1, 3, 7, 11):
        resumed = prompt_batches(ROWS, 3, seed=5, start=start)
        assert [ids(b) for b in itertools.islice(resumed, 12 - start)] == expected[start:]
    assert ids(batch_at(ROWS, 3, 5, 7)) == expected[7]


def test_more_prompts_than_rows_spans_several_epochs():
    batch = ids(batch_at(ROWS[:3], 7, seed=2, step=0))
    # 7 = 3 + 3 + 1 rows: epochs 0 and 1 whole, then the first row of epoch 2
    assert batch == list(epoch_order(3, 2, 0)) + list(epoch_order(3, 2, 1)) + list(epoch_order(3, 2, 2))[:1]


def test_rows_are_copies():
    batch = batch_at(ROWS, 2, seed=0, step=0)
    batch[0]["i"] = -1
    assert all(r["i"] >= 0 for r in ROWS)


def test_order_is_the_same_in_another_process_with_another_hash_seed():
    code = "from policyzoo.data.batching import epoch_order; print(list(epoch_order(10, 3, 2)))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": h, "PATH": "/usr/bin:/bin"}).stdout for h in ("1", "2")}
    assert outs == {str(list(epoch_order(10, 3, 2))) + "\n"}


def test_errors():
    with pytest.raises(DataError, match="no training rows"):
        next(prompt_batches([], 2, seed=0))
    with pytest.raises(DataError, match=">= 1"):
        next(prompt_batches(ROWS, 0, seed=0))
