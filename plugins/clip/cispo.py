"""CISPO: a stop-gradient, capped importance weight on the log-probability."""

from __future__ import annotations

from pydantic import Field, model_validator

from policyzoo.contract import Clip, Surrogate, hookimpl


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


COMPONENTS = (CISPO,)
