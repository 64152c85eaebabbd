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

Where the weight meets the clip (a stated convention): as a ``ratio`` component, TIS hands the
clip the product r_t x w, so a clipped surrogate measures its trust region from the *sampler's*
policy (as when the sampler's log-probs are used as old log-probs), with the mismatch part
truncated at C. Yao et al. and TRL (``vllm_importance_sampling_correction``) instead multiply the
already clipped surrogate by w, so their clip sees r_t alone. The two agree for unclipped
surrogates (``clip: none``, REINFORCE/RLOO) and for CISPO below its cap; with PPO's clip they
differ where w leaves [1 - eps_low, 1 + eps_high]: on-policy, a row with w > 1 + eps_high and a
positive advantage gets no gradient here. ``check`` warns when the cap allows that.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch
from pydantic import Field

from policyzoo import hookimpl
from policyzoo.slots import Ratio


class TruncatedIS(Ratio):
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

    name = "tis"
    level = "token"  # the optimised ratio is per token; only the constant weight is per sequence

    class Params(Ratio.Params):
        cap: float = Field(2.0, gt=0, description="truncation C of the IS weight (> 0; w <= C)")
        level: Literal["sequence", "token"] = Field(
            "sequence", description="'sequence': one weight per response (sum of token log-ratios); "
                                    "'token': one weight per token")
        max_log_ratio: float = Field(20.0, gt=0, description="|log r_t| clamp of the token ratio before exp")

    def check(self, run) -> None:
        """Warn when the run's clip bounds the ratio tighter than the cap (see the module doc)."""
        p = getattr(getattr(run, "clip", None), "params", None)
        eps_high = getattr(p, "eps_high", None)
        if eps_high is not None and getattr(p, "eps_low", None) is not None and self.params.cap > 1 + eps_high:
            warnings.warn(
                f"ratio: tis (cap {self.params.cap}) with clip: {run.clip.name} (eps_high {eps_high}): the clip "
                f"acts on r x w, so on-policy a response whose sampler/trainer weight w exceeds {1 + eps_high:g} "
                "gets no gradient on a positive advantage. Use clip: none or cispo for Yao et al.'s TIS "
                f"gradient, or cap <= {1 + eps_high:g} to keep every weight inside the clip range.",
                stacklevel=2)

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
