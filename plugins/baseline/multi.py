"""Multi-reward baselines: each reward component normalised in its group before the sum."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from policyzoo.contract import GroupBaseline, group_stats, hookimpl


class GDPO(GroupBaseline):
    """GDPO: A_i = whiten_rows( sum_k w_k (r_ik - mean_gk) / (std_gk + eps) ).

    Each of the K reward components (``reward_components [B, K]``, its own values before its
    ``weight`` w_k) is normalised within the group over the rows it scored (not NaN), then the
    weighted sum is whitened over the rows of the whole step, all ranks (``whiten: true``,
    ``whiten_over: rows``, ``whiten_std: sample`` by default: the declared composition). A component
    whose group std is <= ``zero_std_tol`` adds 0 for that group; a component's NaN adds 0 for the
    row (TRL's ``nansum``); a row whose summed ``rewards`` are NaN, or with no token, gets 0.
    Per-token rewards (a KL in reward placement) enter as one more component of weight 1.
    TRL: ``multi_objective_aggregation="normalize_then_sum"`` (eps 1e-4 in both normalisations: set
    ``eps`` and ``whiten_eps`` to 1e-4). With one reward this is ``group_norm`` then whitening.
    Returns ``Advantages([B, T])``. Source: Liu et al. 2026, GDPO (arXiv:2601.05242) Sec. 3."""

    name = "gdpo"

    class Params(GroupBaseline.Params):
        std: Literal["sample", "population"] = Field("sample", description="group std per component: "
                                                     "'sample' (G-1, TRL) or 'population' (G)")
        eps: float = Field(1e-6, ge=0, description="added to each component's group std (>= 0; TRL 1e-4)")
        zero_std_tol: float = Field(1e-6, ge=0, description="a component with group std <= this adds 0")
        whiten: bool = Field(True, description="whiten the summed advantages over the step's rows (GDPO)")
        whiten_over: Literal["tokens", "rows"] = Field("rows", description="whiten once per row (GDPO, TRL)")
        whiten_std: Literal["population", "sample"] = Field("sample", description="batch std (TRL: sample)")

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards, reward_components, reward_weights):
        p = self.params
        mask = response_mask.to(torch.bool)
        row_ok = ~torch.isnan(rewards) & mask.any(-1)
        parts = reward_components.double()
        weights = reward_weights.double()
        kl = torch.where(mask, token_rewards.double(), torch.zeros(mask.shape, dtype=torch.float64)).sum(-1)
        if bool((kl != 0).any()):
            parts, weights = torch.cat([parts, kl.unsqueeze(-1)], 1), torch.cat([weights, torch.ones(1).double()])
        total = torch.zeros(len(rewards), dtype=torch.float64)
        for k in range(parts.shape[1]):
            ok = row_ok & ~torch.isnan(parts[:, k])
            x = torch.where(ok, parts[:, k], torch.zeros_like(total))
            count, mean, ssd = group_stats(x, ok, group_ids)
            std = (ssd / (count - 1.0 if p.std == "sample" else count).clamp(min=1.0)).sqrt()
            keep = ok & (count >= 2) & (std > p.zero_std_tol)
            total += torch.where(keep, weights[k] * (x - mean) / (std + p.eps), torch.zeros_like(total))
        count, _, _ = group_stats(total, row_ok, group_ids)
        alone = torch.nansum(parts * weights, -1)  # singleton: reward -- the weighted reward itself
        return self.finish(total, alone, total, row_ok, count, rewards, response_mask)
