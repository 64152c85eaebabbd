"""The PPO family: the clipped surrogate (with clip-higher and dual clip) and plain REINFORCE."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Clip, Surrogate, hookimpl


class PPOClip(Clip):
    """PPO's clipped surrogate with independent ``eps_low``/``eps_high`` and optional dual clip.

    loss_t = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); with ``dual_clip`` c, where A < 0:
    loss_t = min(that, -c A) (the loss of a negative-advantage token whose ratio exploded is capped,
    its gradient cut). Dual clip never acts where A >= 0. ``eps_high`` None = ``eps_low``
    (symmetric PPO); 0.28 is DAPO's clip-higher: a token with probability p can rise to at most
    p x (1 + eps_high) in one update with a positive advantage (0.01 -> 0.0128; at 0.2, 0.012).

    Shapes ``[B, T]``. Errors: ``ConfigError`` for eps_low outside [0, 1), eps_high < 0, c <= 1.
    Sources: Schulman et al. 2017 (arXiv:1707.06347) eq. 7; clip-higher: DAPO (arXiv:2503.14476)
    eq. 10; dual clip: Ye et al. 2020 (arXiv:1912.09729, "dual-clip PPO"). GSPO (arXiv:2507.18071 eq. 5) is this
    clip applied to the sequence ratio with eps 3e-4 / 4e-4."""

    name = "ppo_clip"

    class Params(Clip.Params):
        eps_low: float = Field(0.2, ge=0, lt=1, description="lower clip offset: ratio >= 1 - eps_low, in [0, 1)")
        eps_high: float | None = Field(None, ge=0, description="upper clip offset: ratio <= 1 + eps_high "
                                       "(>= 0); None = eps_low")
        dual_clip: float | None = Field(None, gt=1, description="dual-clip constant c (> 1) capping the "
                                        "loss at -c x A where A < 0; None = off")

    @hookimpl
    def clip(self, ratio, advantages, response_mask):
        lo = 1.0 - self.params.eps_low
        hi = 1.0 + (self.params.eps_high if self.params.eps_high is not None else self.params.eps_low)
        a = advantages
        unclipped = -a * ratio
        clipped = -a * ratio.clamp(lo, hi)
        loss = torch.maximum(unclipped, clipped)
        low = (ratio < lo) & (a < 0)
        high = (ratio > hi) & (a > 0)
        c = self.params.dual_clip
        if c is not None:
            neg = a < 0
            loss = torch.where(neg, torch.minimum(loss, -c * a), loss)
            high = high | (neg & (ratio > c))
        return Surrogate(loss, low & response_mask, high & response_mask)


class NoClip(Clip):
    """Plain REINFORCE: loss_t = -A_t x r_t, no clipping (``clipped_*`` are None, reported as 0).

    On-policy r = exp(logprobs - logprobs.detach()) = 1 with gradient grad log pi, so the gradient
    is -A grad log pi (Williams 1992); off-policy it is the unclipped importance-weighted surrogate.
    Source: RLOO, Ahmadian et al. 2024 (arXiv:2402.14740) eq. 6."""

    name = "none"

    @hookimpl
    def clip(self, ratio, advantages):
        return Surrogate(-advantages * ratio)


COMPONENTS = (PPOClip, NoClip)
