"""Statistics over the whole optimizer step: every data-parallel rank's rows, through a
:class:`~policyzoo.contract.Collective`, so that N ranks give exactly what one rank gives with the
whole batch (up to float64 summation order).

Every rank must call these functions the same number of times in the same order (each one makes
two ``collective.sum`` calls, whatever the local row count, an empty rank included).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from .ground import LOCAL, Collective


def moments(x: Tensor, where: Tensor, collective: Collective = LOCAL) -> tuple[float, float, float]:
    """``(n, mean, ssd)`` of ``x`` over the True entries of ``where`` (same shape, bool) on every
    rank: count, mean and sum of squared deviations from that mean, in float64 (two passes, so a
    large mean does not cancel the spread). ``n`` = 0 gives ``(0, 0.0, 0.0)``."""
    xd = torch.where(where, x.detach().double(), torch.zeros((), dtype=torch.float64, device=x.device))
    first = collective.sum(torch.stack([where.sum().double(), xd.sum()]))
    n, total = float(first[0]), float(first[1])
    mean = total / n if n > 0 else 0.0
    dev = torch.where(where, xd - mean, torch.zeros_like(xd))
    ssd = float(collective.sum((dev * dev).sum().reshape(1))[0])
    return n, mean, ssd


def std_of(n: float, ssd: float, std: Literal["population", "sample"]) -> float:
    """sqrt(ssd / n) ("population") or sqrt(ssd / (n - 1)) ("sample", Bessel); 0.0 when the divisor
    is not positive (no entry, or a single one with "sample")."""
    dof = n - 1.0 if std == "sample" else n
    return math.sqrt(ssd / dof) if dof > 0 else 0.0


def whiten(x: Tensor, where: Tensor, collective: Collective = LOCAL,
           std: Literal["population", "sample"] = "population", eps: float = 1e-6,
           of: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """``(x - mean) / (std + eps)`` over the True entries of ``where`` on every rank, 0 elsewhere
    (float64, shape of ``x``). All 0 when no entry is True anywhere or the std is at most
    1e-12 x (1 + |mean|) (a constant batch carries no signal; a float residue must not become a
    huge advantage). ``std``: "population" (divide by n) or "sample" (by n - 1, verl's
    ``masked_whiten``, TRL's ``nanstd``). ``of = (values, mask)``: take mean and std from these
    instead (e.g. one value per row, applied to every token of the row)."""
    n, mean, ssd = moments(*(of if of is not None else (x, where)), collective)
    sd = std_of(n, ssd, std)
    zero = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    if n == 0 or sd <= 1e-12 * (1.0 + abs(mean)):
        return zero
    return torch.where(where, (x.double() - mean) / (sd + eps), zero)


def rank_mean(value: float, weight: float, collective: Collective = LOCAL) -> tuple[float, float]:
    """``(mean, total weight)`` of a per-rank mean ``value`` with ``weight`` (its rows or tokens) over
    every rank, in float64: sum(value x weight) / sum(weight), the same on each rank; ``(0.0, 0.0)``
    when no rank has any weight. One ``collective.sum`` call on every rank."""
    if collective.world_size == 1:
        return (value, weight) if weight > 0 else (0.0, 0.0)
    tot = collective.sum(torch.tensor([value * weight, weight], dtype=torch.float64))
    total = float(tot[1])
    return (float(tot[0]) / total if total > 0 else 0.0), total
