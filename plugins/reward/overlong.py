"""DAPO's soft overlong penalty (a ``reward`` component)."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Reward, hookimpl
from policyzoo.errors import ConfigError


class OverlongPenalty(Reward):
    """DAPO's soft overlong punishment (eq. 13), ``[B]`` float in [-1, 0].

    With |y| the response's token count (``response_mask`` sum), L_max = ``max_tokens`` and
    L_cache = ``cache``: 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache if
    L_max - L_cache < |y| <= L_max; -1 if |y| > L_max. ``max_tokens`` None -> the run's
    ``sample.max_tokens``, with an env its ``max_total_tokens`` (resolved in ``check``; the
    rollout's ``max_tokens`` if unchecked);
    ``cache`` None -> 20% of L_max (the paper's ratio, 4096 of 20480), so short budgets do not
    penalise every response; a ``cache`` larger than L_max is clipped to L_max (the ramp then
    starts at length 0).
    Source: Yu et al. 2025, DAPO (arXiv:2503.14476) eq. 13 (L_cache 4096 of 20480 there).
    Errors: ``ConfigError`` when no L_max can be found."""

    name = "overlong_penalty"

    class Params(Reward.Params):
        max_tokens: int | None = Field(None, ge=1, description="L_max (>= 1); None = the run's sample.max_tokens")
        cache: int | None = Field(None, ge=1, description="L_cache (>= 1): length of the linear penalty ramp "
                                  "before L_max; None = 20% of L_max (DAPO's 4096 of 20480)")

    def __init__(self, **params):
        super().__init__(**params)
        self.max_tokens = self.params.max_tokens

    def check(self, run) -> None:
        if self.params.max_tokens is None:
            self.max_tokens = run.max_response_tokens

    @hookimpl
    def reward(self, rollout):
        l_max = self.max_tokens or rollout.max_tokens
        if not l_max:
            raise ConfigError("reward (overlong_penalty).max_tokens", "no L_max: max_tokens is None and "
                              "neither the sampler nor the rollout states a token limit",
                              "set `{use: overlong_penalty, max_tokens: 1024}`")
        cache = min(self.params.cache or max(1, round(0.2 * l_max)), l_max)
        length = rollout.response_mask.sum(-1).double()
        start = l_max - cache
        ramp = (start - length) / cache
        out = torch.where(length <= start, torch.zeros_like(length),
                          torch.where(length <= l_max, ramp, torch.full_like(length, -1.0)))
        return out.float()
