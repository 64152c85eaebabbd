"""Helpers shared by the baseline families: valid scores, per-group statistics, broadcasting
a per-row advantage over tokens, per-token rewards and whitening (float64 throughout)."""

from __future__ import annotations

import torch

from policyzoo.errors import ConfigError
from policyzoo.slots import Baseline


def valid_scores(rewards, response_mask, token_rewards):
    mask = response_mask.to(torch.bool)
    tr = torch.zeros(mask.shape, dtype=torch.float64) if token_rewards is None else token_rewards.double()
    s = rewards.double() + torch.where(mask, tr, torch.zeros_like(tr)).sum(-1)
    valid = ~torch.isnan(s) & mask.any(-1)
    return torch.where(valid, s, torch.zeros_like(s)), valid


def group_stats(scores, valid, group_ids):
    """Per-row (count, mean, sum of squared deviations) of the row's group over valid rows, float64."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if len(inv) else 0
    v = valid.double()
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, v)
    total = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, scores * v)
    mean = total / count.clamp(min=1.0)
    dev = (scores - mean[inv]) * v
    ssd = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, dev * dev)
    return count[inv], mean[inv], ssd[inv]


def broadcast(adv_row, rewards, response_mask):
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    a = adv_row.to(dtype).unsqueeze(-1).expand(response_mask.shape)
    return torch.where(response_mask.to(torch.bool), a, torch.zeros_like(a))


class GroupBaseline(Baseline):

    def check(self, run) -> None:
        if run.sample.params.n == 1:
            raise ConfigError(
                f"algorithm.baseline ({self.name})",
                f"the group baseline '{self.name}' compares the G samples of a prompt with each other, but "
                "sample.n = 1: a group of one equals its own baseline, so every advantage would be 0 and "
                "nothing would be learned",
                "set `sample: {n: 8}` (G >= 2), or use a baseline for G = 1: `batch_whiten` or `gae`")


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


def whiten(x, where, eps):
    """(x - mean) / (std + eps) over the True entries of ``where`` (population std), 0 elsewhere;
    all 0 when that std is below 1e-12 x (1 + |mean|) (a constant batch)."""
    n = where.sum()
    if n == 0:
        return torch.zeros_like(x)
    mean = x[where].mean()
    std = x[where].std(unbiased=False)
    if std <= 1e-12 * (1 + mean.abs()):
        return torch.zeros_like(x)
    return torch.where(where, (x - mean) / (std + eps), torch.zeros_like(x))
