"""Pass@k advantage: only the best sample of a group is credited."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import GroupBaseline, group_stats, hookimpl, valid_scores


class GRPOPassK(GroupBaseline):
    """Pass@k advantage: the best valid row of each group gets A = (s_max - s_second) / (std_g + eps),
    every other row 0 (a group is credited for its best answer, as pass@k scores it).

    s_second is the second-largest valid score of the group (a tie at the top gives 0). Ties for the
    maximum are broken by the lowest row index (the advantage is 0 then anyway). ``norm_by_std``:
    divide by the group's sample std + ``eps`` (verl ``norm_adv_by_std_in_grpo``, default True);
    a group whose std is <= ``zero_std_tol`` gets 0. verl ``adv_estimator=grpo_passk`` (same rule;
    verl raises for a group of fewer than 2 rows, ours gives 0, or the score with ``singleton:
    reward``). Returns ``Advantages([B, T])``.
    Source: the pass@k objective verl cites (arXiv:2503.19595), as verl core_algos.py implements it."""

    name = "grpo_passk"

    class Params(GroupBaseline.Params):
        norm_by_std: bool = Field(True, description="divide by the group's sample std + eps (verl default)")
        eps: float = Field(1e-6, ge=0, description="added to the std before dividing (>= 0)")
        zero_std_tol: float = Field(1e-6, ge=0, description="groups with std <= this get advantage exactly 0")

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        p = self.params
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, _, ssd = group_stats(s, valid, group_ids)
        masked = torch.where(valid, s, torch.full_like(s, -torch.inf))
        adv = torch.zeros_like(s)
        for g in group_ids[valid].unique():
            rows = (group_ids == g).nonzero().flatten()
            top = torch.topk(masked[rows], min(2, len(rows)))  # one row: no second
            if len(rows) >= 2 and torch.isfinite(top.values[1]):
                best = rows[masked[rows] == top.values[0]][0]  # lowest index among ties
                adv[best] = top.values[0] - top.values[1]
        std = (ssd / (count - 1.0).clamp(min=1.0)).sqrt()
        if p.norm_by_std:
            adv = torch.where(std <= p.zero_std_tol, torch.zeros_like(adv), adv / (std + p.eps))
        return self.finish(adv, s, s, valid, count, rewards, response_mask)
