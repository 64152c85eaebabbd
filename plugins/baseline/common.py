"""Helpers shared by the baseline families: valid scores, per-group statistics, broadcasting
a per-row advantage over tokens, per-token rewards and whitening (float64 throughout)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from policyzoo.contract import Advantages, Baseline
from policyzoo.errors import ConfigError


def valid_scores(rewards, response_mask, token_rewards):
    mask = response_mask.to(torch.bool)
    tr = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device) if token_rewards is None \
        else token_rewards.double()
    s = rewards.double() + torch.where(mask, tr, torch.zeros_like(tr)).sum(-1)
    valid = ~torch.isnan(s) & mask.any(-1)
    return torch.where(valid, s, torch.zeros_like(s)), valid


def group_stats(scores, valid, group_ids, weights=None):
    """Per-row (count, mean, sum of squared deviations) of the row's group over valid rows, float64.
    ``weights [B]``: the mean is the weighted mean sum w s / sum w (ssd stays unweighted).

    Each group is indexed by its first row (``[B, B]`` equality, first maximum of each row), not by
    ``torch.unique``, whose output size depends on the values: nothing is copied to the host, and the
    statistics stay where the scores are. The sums run over the rows in row order, as before."""
    same = group_ids[:, None] == group_ids[None, :]
    inv = same.to(torch.uint8).argmax(-1)  # the first row of each row's group (argmax keeps the first maximum)
    k = len(group_ids)

    def per_group(x):
        return torch.zeros(k, dtype=torch.float64, device=scores.device).index_add_(0, inv, x)

    v = valid.double()
    w = v if weights is None else v * weights.double()
    count, wsum, total = per_group(v), per_group(w), per_group(scores * w)
    mean = total / torch.where(wsum > 0, wsum, torch.ones_like(wsum))
    dev = (scores - mean[inv]) * v
    ssd = per_group(dev * dev)
    return count[inv], mean[inv], ssd[inv]


def broadcast(adv_row, rewards, response_mask):
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    a = adv_row.to(dtype).unsqueeze(-1).expand(response_mask.shape)
    return torch.where(response_mask.to(torch.bool), a, torch.zeros_like(a))


class GroupBaseline(Baseline):
    """Base of the group baselines. ``singleton``: the advantage of a valid row that is alone in
    its group (G = 1, or the others NaN / empty): "zero" (no signal; the default) or "reward" --
    its score against a baseline of 0, as verl's estimators give it (their group of one has mean 0,
    std 1). With "zero", ``check`` refuses sample.n = 1."""

    class Params(Baseline.Params):
        singleton: Literal["zero", "reward"] = Field(
            "zero", description="a group with one valid row: advantage 'zero', or 'reward' (its score "
                                "against a baseline of 0, as verl)")

    def check(self, run) -> None:
        if run.sample.params.n == 1 and self.params.singleton == "zero":
            raise ConfigError(
                f"algorithm.baseline ({self.name})",
                f"the group baseline '{self.name}' compares the G samples of a prompt with each other, but "
                "sample.n = 1: a group of one equals its own baseline, so every advantage would be 0 and "
                "nothing would be learned",
                "set `sample: {n: 8}` (G >= 2), use a baseline for G = 1 (`batch_whiten`, `gae`, "
                "`reinforce_pp_baseline`), or set `singleton: reward`")

    def finish(self, adv, alone, s, valid, count, rewards, response_mask):
        """Per-row ``adv`` where the row is valid and its group has >= 2 valid rows; ``alone``
        (the singleton advantage, e.g. s) for a valid row alone with ``singleton: reward``; else
        0. Broadcast over the row's masked tokens: ``[B, T]`` in the rewards' dtype."""
        zero = torch.zeros_like(s)
        single = valid & (count == 1) & (self.params.singleton == "reward")
        out = torch.where(valid & (count >= 2), adv, torch.where(single, alone, zero))
        return Advantages(broadcast(out, rewards, response_mask))


def reward_tokens(rewards, response_mask, token_rewards):
    """Per-token rewards ``[B, T]`` (float64): token_rewards on masked tokens plus the sequence
    reward on each row's last masked token."""
    mask = response_mask.to(torch.bool)
    r = torch.zeros(mask.shape, dtype=torch.float64) if token_rewards is None else token_rewards.double()
    r = torch.where(mask, r, torch.zeros_like(r))
    pos = torch.arange(mask.shape[1]).expand(mask.shape)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(-1).values
    has = last >= 0
    rows = torch.arange(mask.shape[0])[has]
    r[rows, last[has]] += rewards.double()[has]
    return r


def token_returns(rewards, response_mask, token_rewards, gamma=1.0):
    """Returns-to-go ``[B, T]`` (float64): G_t = sum_{t' >= t} gamma^(t'-t) r_t' over masked tokens
    (a hole in the mask is not a step), r from :func:`reward_tokens`; NaN rewards count as 0 and
    masked positions are 0."""
    mask = response_mask.to(torch.bool)
    r = reward_tokens(torch.nan_to_num(rewards.double(), nan=0.0), mask, token_rewards)
    ret = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=torch.float64)
    for t in range(r.shape[1] - 1, -1, -1):
        m = mask[:, t]
        running = torch.where(m, r[:, t] + gamma * running, running)
        ret[:, t] = torch.where(m, running, torch.zeros_like(running))
    return ret
