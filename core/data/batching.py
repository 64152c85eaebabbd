"""Prompt batches: P rows per step, forever, in a reproducible shuffled order with exact resume.

The rows are visited epoch by epoch; epoch ``e`` is a permutation of all rows drawn from
``random.Random(f"policyzoo-epoch:{seed}:{e}")`` (a string seed is hashed with SHA-512 by Python,
so the order is the same in every process and Python version >= 3.2, whatever PYTHONHASHSEED).
Batch ``s`` holds the rows at positions ``s*P .. s*P + P - 1`` of the concatenated epochs, so a
batch may span an epoch boundary (the tail of one epoch and the head of the next), and batch
``s`` depends on nothing but (rows, P, seed, s): resuming at step ``s`` is exact. The training
loop draws by position (:func:`rows_at`) and records the number of rows drawn, so a resume with
another P continues at the same row.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Iterator

from policyzoo.errors import DataError


@lru_cache(maxsize=4)
def epoch_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The permutation of ``range(n)`` used in ``epoch``."""
    order = list(range(n))
    random.Random(f"policyzoo-epoch:{seed}:{epoch}").shuffle(order)
    return tuple(order)


def batch_at(rows: list[dict], P: int, seed: int, step: int) -> list[dict]:
    """Batch number ``step`` (0-based): ``P`` shallow copies of rows (``rows_at(rows, seed, step * P, P)``)."""
    return rows_at(rows, seed, step * P, P)


def rows_at(rows: list[dict], seed: int, position: int, P: int) -> list[dict]:
    """``P`` shallow copies of the rows at positions ``position .. position + P - 1`` of the
    concatenated epochs. A run records the position (rows drawn so far), not a batch count, so
    that a resume with another P continues exactly where the stream stopped: no row of the epoch
    is skipped or drawn twice."""
    n = len(rows)
    if n == 0:
        raise DataError("data", "no training rows to draw prompts from",
                        "check data.path / data.limit / data.eval_size")
    if P < 1:
        raise DataError("data", f"prompts per step must be >= 1, got {P}",
                        "set the number of prompts per step to 1 or more")
    out: list[dict] = []
    pos = position
    while len(out) < P:
        epoch, offset = divmod(pos, n)
        order = epoch_order(n, seed, epoch)
        take = min(P - len(out), n - offset)
        out.extend(dict(rows[i]) for i in order[offset:offset + take])
        pos += take
    return out


def prompt_batches(rows: list[dict], P: int, seed: int, start: int = 0) -> Iterator[list[dict]]:
    """Yield batch ``start``, ``start + 1``, ... forever (see :func:`batch_at`).

    ``prompt_batches(rows, P, seed, start=s)`` yields exactly what the fresh iterator yields after
    ``s`` batches: pass the number of completed steps when resuming a run."""
    step = start
    while True:
        yield batch_at(rows, P, seed, step)
        step += 1
