"""Truncated importance sampling (TIS), a ``ratio`` component.

    ratio_t = r_t * w,   r_t = exp(logprobs_t - old_logprobs_t)          (the PPO token ratio)

Sequence level (default): one weight per response, the trainer-vs-sampler likelihood ratio of the
whole response, capped at C:

    w_i = min(pi_old(y_i) / pi_rollout(y_i), C) = exp(min(sum_t (old_t - rollout_t), log C))

Note the SUM of the token log-ratios (a likelihood ratio of the sequence), unlike GSPO's ratio,
which takes their MEAN (a per-token geometric mean). Token level: w_t = min(exp(old_t -
rollout_t), C) per token (Yao et al.'s TIS). The weight is a constant (no gradient): it corrects
which distribution the samples came from, it is not optimised. It is computed in log space and
capped before ``exp``, so it is never inf; there is no lower bound (a response the sampler
over-sampled gets a small weight).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from policyzoo import Component, hookimpl


class TruncatedIS(Component):
    """Token ratio times the capped rollout-vs-trainer importance weight, ``[B, T]``.

    Args (hook): ``logprobs [B, T]`` (with grad), ``old_logprobs [B, T]`` (trainer at sampling
    time; on-policy the step passes ``logprobs.detach()``), ``rollout_logprobs [B, T]`` (the
    sampler's, nats), ``response_mask [B, T]`` (sums and weights use only True positions).
    Returns ``[B, T]`` float: r_t x w (w_i broadcast over the row at sequence level); 1 on masked
    positions. Gradient flows only through ``logprobs``; w is detached.

    ``level: sequence``: w_i = exp(min(sum_t (old_it - rollout_it), log cap)); a row with no
    token gets w = 1. ``level: token``: w_t = exp(min(old_t - rollout_t, log cap)).
    The token part is clamped to |log r_t| <= ``max_log_ratio`` before ``exp`` (as the built-in
    ``token`` ratio). Exactly 1 where logprobs == old_logprobs == rollout_logprobs.
    Errors: ``ConfigError`` for cap <= 0 or max_log_ratio <= 0, or an unknown level.
    Sources: Yao et al. 2025 (token TIS, C = 2); sequence-level TIS in Qi et al. 2025
    (arXiv:2510.26788) Sec. 4 and Liu, Li et al. 2025, "When Speed Kills Stability".
    """

    slot, name = "ratio", "tis"
    level = "token"  # the optimised ratio is per token; only the constant weight is per sequence

    class Params(Component.Params):
        cap: float = Field(2.0, gt=0, description="truncation C of the IS weight (> 0; w <= C)")
        level: Literal["sequence", "token"] = Field(
            "sequence", description="'sequence': one weight per response (sum of token log-ratios); "
                                    "'token': one weight per token")
        max_log_ratio: float = Field(20.0, gt=0, description="|log r_t| clamp of the token ratio before exp")

    @hookimpl
    def ratio(self, logprobs, old_logprobs, rollout_logprobs, response_mask):
        zero = torch.zeros_like(logprobs)
        m = self.params.max_log_ratio
        log_r = torch.where(response_mask, logprobs - old_logprobs, zero).clamp(-m, m)
        with torch.no_grad():
            log_w = torch.where(response_mask, old_logprobs.detach() - rollout_logprobs.to(logprobs.dtype), zero)
            if self.params.level == "sequence":
                log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
            w = torch.exp(log_w.clamp(max=math.log(self.params.cap)))
        out = torch.exp(log_r) * w
        return torch.where(response_mask, out, torch.ones_like(out))
