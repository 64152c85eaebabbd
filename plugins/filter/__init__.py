"""``filter`` components: which rows of a sampled batch enter the step.

Each returns :class:`~policyzoo.contract.Keep` with ``keep [B]`` bool (order never changes) and
``reasons`` {reason: rows dropped}. The step ANDs the masks of all filters. ``resample`` True
asks the step to sample again until the batch is full (DAPO's dynamic sampling), for at most the
filter's own ``max_sample_rounds`` rounds (3 by default, DAPO's setting here; both parameters
are declared by :class:`policyzoo.contract.Filter`), so the filter resamples in any bundle.
"""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Filter, Keep, hookimpl


class NonconstantGroups(Filter):
    """Drop whole groups whose valid rewards are all equal (max - min <= ``tolerance``).

    Such a group has zero advantage under every group baseline, so it only dilutes the batch.
    Valid = reward not NaN and at least one token in ``response_mask``; a group with fewer than two
    valid rows is constant too. Rows are grouped by ``rollout.group_ids`` (never by position).
    Args: ``rollout`` (``group_ids [B]``, ``response_mask [B, T]``), ``rewards [B]``.
    Returns ``Keep(keep [B], {"zero_std_group": rows dropped})``.
    Source: DAPO, Yu et al. 2025 (arXiv:2503.14476) eq. 11 (0 < |{correct}| < G), generalised to
    real-valued rewards."""

    name = "nonconstant_groups"

    class Params(Filter.Params):
        tolerance: float = Field(0.0, ge=0, description="rewards within this distance count as equal (>= 0)")
        resample: bool = Field(True, description="refill the batch by sampling again (dynamic sampling)")

    @hookimpl
    def filter(self, rollout, rewards):
        gid = rollout.group_ids
        valid = ~torch.isnan(rewards) & rollout.response_mask.any(-1)
        keep = torch.zeros(len(gid), dtype=torch.bool)
        for g in gid.unique():
            rows = gid == g
            r = rewards[rows & valid]
            if len(r) >= 2 and float(r.max() - r.min()) > self.params.tolerance:
                keep |= rows
        return Keep(keep, {"zero_std_group": int((~keep).sum())})


class DropTruncated(Filter):
    """Drop rows whose response hit the token limit without EOS (``rollout.truncated [B]``).

    A truncated answer's reward judges an unfinished text; dropping it is DAPO's "overlong
    filtering" alternative to the soft penalty. Returns ``Keep(~truncated, {"truncated": n})``.
    Source: DAPO, Yu et al. 2025 (arXiv:2503.14476) Sec. 3.4 (overlong filtering)."""

    name = "drop_truncated"

    @hookimpl
    def filter(self, rollout):
        keep = ~rollout.truncated.to(torch.bool)
        return Keep(keep, {"truncated": int((~keep).sum())})


COMPONENTS = (NonconstantGroups, DropTruncated)
