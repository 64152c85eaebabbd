"""ReMax: the reward of the greedy response is the baseline."""

from __future__ import annotations

import torch

from policyzoo.contract import Advantages, Baseline, hookimpl, token_returns
from policyzoo.errors import ConfigError


class ReMax(Baseline):
    """ReMax advantage A_t = G_t - r(x, y_greedy): the return-to-go of each token (the sequence
    reward plus the per-token rewards from t on, gamma 1) minus the reward of the greedy response to
    the same prompt (``greedy_rewards [B]``, given by the step when the sample component's
    ``greedy`` is set). Without per-token rewards every token of a row gets R - r_greedy.
    A row whose reward or greedy reward is NaN, or with no token, gets 0 and is left out of
    ``valid`` (so a chained whitening does not count it). No statistic of its own spans rows.
    verl ``adv_estimator=remax`` (same rule: ``returns - reward_baselines``). Returns
    ``Advantages([B, T])`` (advantages and the returns G). Errors: ``ConfigError`` from ``check``
    when the sample component does not draw the greedy response.
    Source: Li et al. 2023, ReMax (arXiv:2310.10505) Algorithm 1."""

    name = "remax"

    def check(self, run) -> None:
        if not run.sample.params.greedy:
            raise ConfigError("algorithm.baseline (remax)", "ReMax's baseline is the reward of a greedy "
                              "response per prompt, but the sample component draws none",
                              "set `sample: {greedy: true}` (the remax bundle does)")

    @hookimpl
    def baseline(self, rewards, response_mask, token_rewards, greedy_rewards):
        mask = response_mask.to(torch.bool)
        ok = ~torch.isnan(rewards) & ~torch.isnan(greedy_rewards) & mask.any(-1)
        ret = token_returns(rewards, mask, token_rewards)
        adv = ret - torch.nan_to_num(greedy_rewards.double(), nan=0.0).unsqueeze(-1)
        keep = mask & ok.unsqueeze(-1)
        dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        zero = torch.zeros_like(adv)
        return Advantages(torch.where(keep, adv, zero).to(dtype), torch.where(keep, ret, zero).to(dtype), ok)
