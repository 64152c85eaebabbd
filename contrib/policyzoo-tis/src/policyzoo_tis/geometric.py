"""Geometric-mean sequence TIS, a ``ratio`` component written against the public contract alone.

A worked example of a rollout/trainer mismatch correction as a plugin. The built-in ``tis``
weighs a response by its likelihood ratio pi_old(y) / pi_rollout(y), the *product* of its token
ratios, which grows or shrinks exponentially with the length. This variant uses their
*geometric mean*, a per-token quantity whatever the length (verl's "geometric" level, which verl
offers for rejection only, ``rollout_rs: seq_mean_k1``):

    w_i = min(exp(1/|y_i| sum_t (old_logprobs_it - rollout_logprobs_it)), cap)

The weight is a constant (no gradient), broadcast over the row. Like every mismatch correction it
returns :class:`policyzoo.Importance`: with ``placement: loss`` (default, the TRL/verl placement)
the step multiplies the clip's per-token loss by w; with ``placement: ratio`` the clip sees r x w.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from policyzoo.contract import Importance, Ratio


class GeometricTIS(Ratio):
    """Token ratio r_t and the capped geometric-mean weight w_i of the response, ``[B, T]``.

    Args (hook): ``logprobs [B, T]`` (with grad), ``old_logprobs [B, T]``, ``rollout_logprobs [B, T]``
    (nats), ``response_mask [B, T]``. Returns ``Importance``: ratio r_t = exp(clamp(logprobs_t -
    old_logprobs_t, +-max_log_ratio)) and weight w_i = exp(min(mean_t (old_it - rollout_it), log cap))
    (placement loss), or ratio r_t x w_i (placement ratio); ``truncated`` marks the rows whose weight
    was capped. A row with no token gets w = 1; exactly 1 where the three log-probs agree.
    Default cap 2.0: the geometric mean is on the token scale, so Yao et al.'s token cap applies.
    Errors: ``ConfigError`` for cap < 1 or max_log_ratio <= 0. Sources: Liu, Li et al. 2025, "When
    Speed Kills Stability", part 3 (geometric-level correction); Yao et al. 2025 (TIS, cap 2)."""

    name = "geo_tis"

    class Params(Ratio.Params):
        cap: float = Field(2.0, ge=1, description="truncation C of the geometric-mean weight (>= 1)")
        placement: Literal["loss", "ratio"] = Field("loss", description="'loss': w multiplies the clip's loss; "
                                                                        "'ratio': the clip sees r x w")
        max_log_ratio: float = Field(20.0, gt=0, description="|log r_t| clamp of the token ratio before exp")

    def ratio(self, logprobs, old_logprobs, rollout_logprobs, response_mask):
        zero, m = torch.zeros_like(logprobs), self.params.max_log_ratio
        r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, zero).clamp(-m, m))
        with torch.no_grad():
            d = torch.where(response_mask, old_logprobs.detach() - rollout_logprobs.to(logprobs.dtype), zero)
            log_w = (d.sum(-1, keepdim=True) / response_mask.sum(-1, keepdim=True).clamp(min=1)).expand_as(d)
            w = torch.exp(log_w.clamp(max=math.log(self.params.cap)))
        truncated = (log_w > math.log(self.params.cap)) & response_mask
        if self.params.placement == "ratio":
            return Importance(r * w, truncated=truncated)
        return Importance(r, w, truncated=truncated)
