"""Agreement over data-parallel ranks before the step's collectives, so no rank waits for another.

Under ZeRO 3 every forward and backward gathers or reduces weights with all ranks, and the
``clip`` collectives (``clip_cov``, ``kl_cov``) run once per micro-batch: ranks must run the same
number of them, whatever the data did on each rank. The step therefore agrees, through the
:class:`~policyzoo.contract.Collective` it already holds (the identity on one rank), on:

* **rows kept** (:func:`row_counts`): a rank whose filters kept no row (dynamic sampling with
  ``train_on_fewer``) makes every rank skip the update (``skip_reason`` names the ranks);
* **micro-batches** (:func:`equal_micro_batches`): every rank runs as many as the rank that runs
  most; a rank with fewer rows runs padding micro-batches (a copy of one row with an empty
  ``response_mask``: the forward, the loss's collectives and a backward of exactly zero gradient);
* **faults** (:func:`any_fault`): a non-finite reward, log-prob or loss on any rank stops every
  rank at the same micro-batch, before its backward.

What can still wait (a rank stuck or dead) is bounded by the engine's collective timeout.
"""

from __future__ import annotations

import contextlib

import torch

from policyzoo.contract import StepBatch


def phase(collective, name: str):
    """``collective.phase(name)`` (names the step's phase in a collective timeout), or a no-op for a
    collective without one."""
    fn = getattr(collective, "phase", None)
    return fn(name) if fn is not None else contextlib.nullcontext()


def row_counts(collective, rows: int) -> list[int]:
    """The number of rows each rank kept, in rank order (``[rows]`` on one rank)."""
    if collective.world_size == 1:
        return [rows]
    return [int(x) for x in collective.gather(torch.tensor([rows], dtype=torch.long)).tolist()]


def any_fault(collective, fault: bool) -> list[int]:
    """The ranks (in order) that found a fault; ``[]`` when none did. Every rank gets the same list
    (a sum of one-hot flags over ranks)."""
    if collective.world_size == 1:
        return [0] if fault else []
    flags = torch.zeros(collective.world_size, dtype=torch.float64)
    flags[collective.rank] = 1.0 if fault else 0.0
    return [r for r, f in enumerate(collective.sum(flags).tolist()) if f > 0]


def padding(batch: StepBatch) -> StepBatch:
    """A micro-batch of one row of ``batch`` (its first) with an empty ``response_mask``: it runs the
    model like any micro-batch and contributes nothing (its backward is of ``0 * log-probs``)."""
    keep = torch.zeros(len(batch), dtype=torch.bool)
    keep[0] = True
    pad = batch.select(keep)
    pad.rollout.response_mask = torch.zeros_like(pad.rollout.response_mask)
    if pad.rollout.host_mask is not None:
        pad.rollout.host_mask = torch.zeros_like(pad.rollout.host_mask)
    return pad


def equal_micro_batches(micro: list[StepBatch], batch: StepBatch, collective) -> tuple[list[StepBatch], int]:
    """``micro`` made as long as the longest list of any rank: re-split into that many micro-batches
    where the rows allow it, then padded at the end with :func:`padding` micro-batches. Returns the
    list and the number of real (non-padding) micro-batches at its front."""
    if collective.world_size == 1:
        return micro, len(micro)
    most = max(row_counts(collective, len(micro)))
    if most > len(micro):
        micro = batch.split(min(most, len(batch)))
    return micro + [padding(batch) for _ in range(most - len(micro))], len(micro)


def fault_record(ranks: list[int], own: dict | None, what: str) -> dict:
    """The skip record of a fault agreed over ranks: this rank's own record if it found one, else
    one naming the ranks that did."""
    if own is not None:
        return own
    return {"skip_reason": f"non-finite {what} on rank {', '.join(map(str, ranks))}", "skip_groups": []}
