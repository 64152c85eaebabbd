"""``clip`` components: the per-token surrogate loss (to minimise) from ratio and advantages.

Inputs: ``ratio [B, T]`` (with grad), ``advantages [B, T]`` (constants, higher is better),
``logprobs [B, T]`` (with grad, nats). Output: :class:`~policyzoo.hookspecs.Surrogate` with
``loss [B, T]`` and bool masks ``clipped_low`` / ``clipped_high`` of the tokens whose gradient the
clip cut or capped (counted over ``response_mask`` by the step for the clip-fraction metrics).

Clip-fraction convention (TRL's; verl counts ``clipped loss > unclipped loss`` instead, which is
the same set except for ties): a token counts only where the clip actually removes its gradient,
i.e. low = ratio < 1 - eps_low and A < 0, high = ratio > 1 + eps_high and A > 0 (plus, with dual
clip, ratio > c and A < 0). On the first update after sampling every ratio is 1, so both are 0.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from policyzoo.slots import Clip
from policyzoo.hookspecs import Surrogate, hookimpl


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


class CISPO(Clip):
    """CISPO: loss_t = -sg(w_t) x A_t x logprobs_t with the IS weight w_t = min(r_t, eps_high).

    ``eps_high`` (default 5.0) is a bound on the IS weight *itself* (w <= eps_high), not a PPO
    offset (it is not 1 + eps_high). ``eps_low`` None = no lower bound (MiniMax-M1 sets it so large
    that it never acts); a number is likewise a bound on the weight itself (w >= eps_low).
    The weight is detached (stop-gradient), so every token keeps a gradient -w A grad log pi,
    capped in size where r > eps_high -- where PPO's clip would pass none. The loss *value* is
    not a surrogate value (it is -w A log pi, of arbitrary sign); only its gradient matters.
    ``clipped_high`` = r > eps_high (capped tokens), ``clipped_low`` = r < eps_low.

    Shapes ``[B, T]``. Errors: ``ConfigError`` for eps_high <= 0 or eps_low >= eps_high.
    Source: MiniMax 2025, MiniMax-M1 (arXiv:2506.13585) eq. 4-5; ScaleRL (arXiv:2510.13786) eps_max."""

    name = "cispo"

    class Params(Clip.Params):
        eps_high: float = Field(5.0, gt=0, description="upper bound on the IS weight itself (w <= eps_high, > 0)")
        eps_low: float | None = Field(None, ge=0, description="lower bound on the IS weight itself "
                                      "(w >= eps_low, < eps_high); None = no lower bound")

        @model_validator(mode="after")
        def _order(self):
            if self.eps_low is not None and self.eps_low >= self.eps_high:
                raise ValueError(f"eps_low ({self.eps_low}) must be below eps_high ({self.eps_high}); "
                                 "both bound the IS weight itself")
            return self

    @hookimpl
    def clip(self, ratio, advantages, logprobs, response_mask):
        w = ratio.detach().clamp(max=self.params.eps_high)
        if self.params.eps_low is not None:
            w = w.clamp(min=self.params.eps_low)
        loss = -w * advantages * logprobs
        high = (ratio.detach() > self.params.eps_high) & response_mask
        low = ((ratio.detach() < self.params.eps_low) & response_mask) if self.params.eps_low is not None else None
        return Surrogate(loss, low, high)


COMPONENTS = (PPOClip, NoClip, CISPO)
