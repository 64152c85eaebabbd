"""Batch baselines: per-token returns whitened over the whole batch (G may be 1)."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.hookspecs import Advantages, hookimpl
from policyzoo.slots import Baseline

from .common import reward_tokens, whiten


class BatchWhiten(Baseline):
    """REINFORCE++: token returns G_t = sum_{t' >= t} gamma^(t'-t) r_t', whitened over the batch.

    r_t = token_rewards_t (e.g. -beta x k1) plus the sequence reward on the row's last masked
    token, so with gamma = 1, G_t = R + sum_{t' >= t} token_rewards_t'. Discounting counts masked
    token positions only (a hole in the mask is not a step). A = (G - mean) / (std + eps), mean and
    population std over every masked token of valid rows in the batch (a constant batch gives 0).
    Rows with a NaN reward or no token get 0 and do not enter the statistics.
    Returns ``Advantages([B, T])``. Source: Hu 2025, REINFORCE++ (arXiv:2501.03262) Sec. 3."""

    name = "batch_whiten"

    class Params(Baseline.Params):
        gamma: float = Field(1.0, gt=0, le=1, description="discount per token, in (0, 1]")
        eps: float = Field(1e-6, ge=0, description="added to the batch std before dividing (>= 0)")

    @hookimpl
    def baseline(self, rewards, response_mask, token_rewards):
        mask = response_mask.to(torch.bool)
        valid = ~torch.isnan(rewards) & mask.any(-1)
        r = reward_tokens(torch.where(valid, rewards, torch.zeros_like(rewards)), mask, token_rewards)
        ret = torch.zeros_like(r)
        running = torch.zeros(r.shape[0], dtype=torch.float64)
        for t in range(r.shape[1] - 1, -1, -1):
            m = mask[:, t]
            running = torch.where(m, r[:, t] + self.params.gamma * running, running)
            ret[:, t] = torch.where(m, running, torch.zeros_like(running))
        where = mask & valid.unsqueeze(-1)
        adv = whiten(ret, where, self.params.eps)
        dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        return Advantages(adv.to(dtype))
