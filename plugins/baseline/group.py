"""Group baselines: each row is compared with the other samples of its prompt (G >= 2)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from policyzoo.hookspecs import Advantages, hookimpl
from policyzoo.slots import Baseline

from .common import GroupBaseline, broadcast, group_stats, valid_scores


class GroupNorm(GroupBaseline):
    """GRPO advantage A_i = (s_i - mean_g) / (std_g + eps) over the valid rows of i's group g.

    ``std``: "sample" (divide by G-1, as TRL's ``torch.std`` and verl) or "population" (divide by
    G, as the GRPO paper's formula is sometimes read). ``eps`` 1e-6 is added to the std (verl's
    value; TRL adds 1e-4, which shrinks advantages of low-variance groups slightly more).
    Groups with std <= ``zero_std_tol`` get exactly 0 (a constant group carries no signal; a
    float residue such as 0.1+0.2 vs 0.3 must not become a huge advantage). Any other group has
    |A| <= sqrt(G-1) (population) or (G-1)/sqrt(G) (sample), the largest possible z-score.
    Example, rewards [1,0,0,1,1,0,0,0]: mean 3/8, population std sqrt(15)/8 -> +1.291/-0.775;
    sample std sqrt(15/56) -> +1.208/-0.725.
    Returns ``Advantages([B, T])``. Source: Shao et al. 2024, DeepSeekMath (arXiv:2402.03300) Sec. 4.1.2.
    Errors: ``ConfigError`` from ``check`` when sample.n = 1."""

    name = "group_norm"

    class Params(Baseline.Params):
        std: Literal["sample", "population"] = Field("sample", description="'sample' (G-1, TRL/verl) or "
                                                     "'population' (G) standard deviation")
        eps: float = Field(1e-6, ge=0, description="added to the std before dividing (>= 0)")
        zero_std_tol: float = Field(1e-6, ge=0, description="groups with std <= this get advantage exactly 0")

    def __init__(self, **params):
        super().__init__(**params)
        self.std, self.zero_std_tol = self.params.std, self.params.zero_std_tol  # zero_std_frac counts alike

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, mean, ssd = group_stats(s, valid, group_ids)
        dof = count - 1.0 if self.params.std == "sample" else count
        std = (ssd / dof.clamp(min=1.0)).sqrt()
        flat = (count < 2) | (std <= self.params.zero_std_tol)
        adv = torch.where(valid & ~flat, (s - mean) / (std + self.params.eps), torch.zeros_like(s))
        return Advantages(broadcast(adv, rewards, response_mask))


class GroupMean(GroupBaseline):
    """Dr. GRPO advantage A_i = s_i - mean_g (no std division, so no difficulty re-weighting).
    Returns ``Advantages([B, T])``. Source: Liu et al. 2025 (arXiv:2503.20783) Sec. 3.2."""

    name = "group_mean"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, mean, _ = group_stats(s, valid, group_ids)
        adv = torch.where(valid & (count >= 2), s - mean, torch.zeros_like(s))
        return Advantages(broadcast(adv, rewards, response_mask))


class LeaveOneOut(GroupBaseline):
    """RLOO advantage A_i = s_i - 1/(G-1) sum_{j != i} s_j = G/(G-1) (s_i - mean_g), G = valid rows
    of the group. Returns ``Advantages([B, T])``. Source: Ahmadian et al. 2024 (arXiv:2402.14740)
    eq. 6; Kool et al. 2019."""

    name = "leave_one_out"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, mean, _ = group_stats(s, valid, group_ids)
        others = (mean * count - s) / (count - 1.0).clamp(min=1.0)
        adv = torch.where(valid & (count >= 2), s - others, torch.zeros_like(s))
        return Advantages(broadcast(adv, rewards, response_mask))
