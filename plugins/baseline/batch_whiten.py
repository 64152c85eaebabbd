"""Batch baselines: per-token returns whitened over the whole step, every rank (G may be 1)."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Advantages, Baseline, hookimpl, token_returns


class BatchWhiten(Baseline):
    """REINFORCE++: token returns G_t = sum_{t' >= t} gamma^(t'-t) r_t', whitened over the batch.

    r_t = token_rewards_t (e.g. -beta x k1) plus the sequence reward on the row's last masked
    token, so with gamma = 1, G_t = R + sum_{t' >= t} token_rewards_t'. Discounting counts masked
    token positions only (a hole in the mask is not a step). The hook returns the returns G
    ``[B, T]`` (float64 math, the rewards' dtype); ``whiten`` (default True here) makes the step
    whiten them: A = (G - mean) / (std + whiten_eps), mean and std (``whiten_std``, population by
    default; verl's ``masked_whiten`` uses the sample std) over every masked token of valid rows
    of the whole step on every rank (:meth:`~policyzoo.contract.Baseline.chain`; a constant batch
    gives 0). Rows with a NaN reward or no token get 0 and do not enter the statistics.
    verl: ``adv_estimator=reinforce_plus_plus``. Returns ``Advantages([B, T])``.
    Source: Hu 2025, REINFORCE++ (arXiv:2501.03262) Sec. 3."""

    name = "batch_whiten"

    class Params(Baseline.Params):
        gamma: float = Field(1.0, gt=0, le=1, description="discount per token, in (0, 1]")
        whiten: bool = Field(True, description="whiten the returns over the whole step (REINFORCE++)")

    @hookimpl
    def baseline(self, rewards, response_mask, token_rewards):
        mask = response_mask.to(torch.bool)
        valid = ~torch.isnan(rewards) & mask.any(-1)
        ret = token_returns(rewards, mask, token_rewards, self.params.gamma)
        dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        return Advantages(torch.where(mask & valid.unsqueeze(-1), ret, torch.zeros_like(ret)).to(dtype))
