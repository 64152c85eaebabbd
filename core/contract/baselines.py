"""What a ``baseline`` component is built from: per-row scores, per-group statistics, the group
baseline's base class, and per-token rewards and returns. The built-in baselines
(``policyzoo.plugins.baseline``) use exactly these; a third-party baseline imports them from
:mod:`policyzoo.contract` (``docs/writing-a-plugin.md`` has a complete example).

Shapes: ``B`` rows (P prompts x G samples), ``T`` response positions. Every statistic is float64.
A row is *valid* when its score is not NaN and it has at least one trainable token; an invalid row
enters no statistic and gets advantage 0.

The std convention is the caller's: :func:`group_stats` returns each group's sum of squared
deviations ``ssd`` and its valid-row ``count``, so the group's std is ``sqrt(ssd / (count - 1))``
("sample", Bessel: TRL's ``torch.std``, verl, ``group_norm``'s default) or ``sqrt(ssd / count)``
("population", as the GRPO formula is sometimes read). A group whose std is at most a tolerance
(``Baseline.zero_std_tol``, 1e-6 by default) carries no signal and should get advantage exactly 0
(``group_norm`` does: a float residue such as 0.1 + 0.2 vs 0.3 must not become a huge advantage);
:meth:`GroupBaseline.finish` gives 0 to groups with fewer than two valid rows.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from policyzoo.errors import ConfigError

from .ground import Advantages
from .slots import Baseline


def valid_scores(rewards: Tensor, response_mask: Tensor, token_rewards: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(scores [B], valid [B])``: s_i = rewards_i + sum_t token_rewards_it over the row's masked
    tokens (the KL penalty in reward placement enters here, as RLOO and TRL's ``kl`` in reward),
    float64; ``valid`` (bool) is False for a NaN score or a row with no trainable token, and such a
    row's score is set to 0 so that it cannot poison a sum. ``rewards [B]``, ``response_mask [B, T]``,
    ``token_rewards [B, T]`` or None."""
    mask = response_mask.to(torch.bool)
    tr = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device) if token_rewards is None \
        else token_rewards.double()
    s = rewards.double() + torch.where(mask, tr, torch.zeros_like(tr)).sum(-1)
    valid = ~torch.isnan(s) & mask.any(-1)
    return torch.where(valid, s, torch.zeros_like(s)), valid


def group_stats(scores: Tensor, valid: Tensor, group_ids: Tensor,
                weights: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(count, mean, ssd)``, each ``[B]`` float64: for every row, its group's number of valid rows,
    their mean score and their sum of squared deviations from that mean (the std convention is the
    caller's, see the module docstring). Groups are the explicit ``group_ids [B]`` (never positions:
    shuffled rows and uneven group sizes give the same values). ``scores [B]`` and ``valid [B]`` as
    :func:`valid_scores` returns them. ``weights [B]``: the mean is the weighted mean
    sum w s / sum w over valid rows (OPO's length weighting); ``ssd`` stays unweighted. A group with
    no valid row has count 0, mean 0 and ssd 0.

    Each group is indexed by its first row (``[B, B]`` equality, first maximum of each row), not by
    ``torch.unique``, whose output size depends on the values: nothing is copied to the host, and the
    statistics stay on the scores' device. The sums run over the rows in row order."""
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


def broadcast_rows(adv_row: Tensor, rewards: Tensor, response_mask: Tensor) -> Tensor:
    """A per-row advantage ``[B]`` on every masked token of its row: ``[B, T]``, 0 elsewhere, in the
    rewards' dtype (float32 for integer rewards)."""
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    a = adv_row.to(dtype).unsqueeze(-1).expand(response_mask.shape)
    return torch.where(response_mask.to(torch.bool), a, torch.zeros_like(a))


class GroupBaseline(Baseline):
    """Base of the group baselines: each row is compared with the other samples of its prompt.

    ``singleton``: the advantage of a valid row that is alone in its group (G = 1, or the others NaN /
    empty): "zero" (no signal; the default) or "reward" -- its score against a baseline of 0, as
    verl's estimators give it (their group of one has mean 0, std 1). With "zero", :meth:`check`
    raises :class:`~policyzoo.errors.ConfigError` for sample.n = 1. Subclasses compute a per-row
    advantage and return :meth:`finish`."""

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

    def finish(self, adv: Tensor, alone: Tensor, s: Tensor, valid: Tensor, count: Tensor, rewards: Tensor,
               response_mask: Tensor) -> Advantages:
        """The hook's result from per-row values (each ``[B]``): ``adv`` where the row is valid and its
        group has >= 2 valid rows (``count`` from :func:`group_stats`); ``alone`` (the singleton
        advantage, e.g. ``s``) for a valid row alone in its group with ``singleton: reward``; else 0.
        Broadcast over the row's masked tokens (:func:`broadcast_rows`): ``Advantages([B, T])`` in the
        rewards' dtype."""
        zero = torch.zeros_like(s)
        single = valid & (count == 1) & (self.params.singleton == "reward")
        out = torch.where(valid & (count >= 2), adv, torch.where(single, alone, zero))
        return Advantages(broadcast_rows(out, rewards, response_mask))


def reward_tokens(rewards: Tensor, response_mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """Per-token rewards ``[B, T]`` (float64): ``token_rewards`` on masked tokens plus the sequence
    reward ``rewards [B]`` on each row's last masked token (a row with no masked token gets none)."""
    mask = response_mask.to(torch.bool)
    r = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device) if token_rewards is None \
        else token_rewards.double()
    r = torch.where(mask, r, torch.zeros_like(r))
    pos = torch.arange(mask.shape[1], device=mask.device).expand(mask.shape)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(-1).values
    has = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has]
    r[rows, last[has]] += rewards.double()[has]
    return r


def token_returns(rewards: Tensor, response_mask: Tensor, token_rewards: Tensor | None,
                  gamma: float = 1.0) -> Tensor:
    """Returns-to-go ``[B, T]`` (float64): G_t = sum_{t' >= t} gamma^(t'-t) r_t' over masked tokens
    (a hole in the mask is not a step), r from :func:`reward_tokens`; NaN rewards count as 0 and
    masked positions are 0. Source: Sutton and Barto 2018, eq. 3.8 (the discounted return)."""
    mask = response_mask.to(torch.bool)
    r = reward_tokens(torch.nan_to_num(rewards.double(), nan=0.0), mask, token_rewards)
    ret = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=torch.float64, device=r.device)
    for t in range(r.shape[1] - 1, -1, -1):
        m = mask[:, t]
        running = torch.where(m, r[:, t] + gamma * running, running)
        ret[:, t] = torch.where(m, running, torch.zeros_like(running))
    return ret
