"""Rollout/trainer mismatch correction: ``ratio`` components that also weigh each token by how far
the sampler's probabilities are from the trainer's.

The sampler (vLLM) and the trainer compute slightly different probabilities for the same weights
(kernels, precision, MoE routing), so "on-policy" samples come from pi_rollout, not pi_old. Each
component returns the PPO token ratio r_t = exp(clamp(logprobs_t - old_logprobs_t, +-max_log_ratio))
with a constant weight w (computed without grad) built from the per-token log-ratio

    delta_t = old_logprobs_t - rollout_logprobs_t        (log pi_old / pi_rollout, nats)

per token (``level: token``: w_t from delta_t) or per response (``level: sequence``: w_i from
sum_t delta_it, the likelihood ratio of the whole response, broadcast over the row).

Placement (parameter ``placement`` of every component), both returning
:class:`~policyzoo.contract.Importance`:

* ``loss`` (default; TRL ``vllm_importance_sampling_correction``, verl ``rollout_is``): ratio r,
  weight w. The clip sees r alone; the step multiplies the clip's per-token loss by w before the
  KL term. A token with w = 0 adds no loss but stays in the reduce's normalisers (TRL's
  convention; verl's rejection sampling, ``rollout_rs``, also removes it from ``response_mask``,
  so verl's token mean divides by the kept tokens only).
* ``ratio``: ratio r x w, no weight: the clip measures its trust region from the sampler's
  policy (as verl's bypass mode, ``old_log_prob = rollout_log_prob``), with the mismatch part
  truncated or masked. Same gradient as ``loss`` with ``clip: none`` and with CISPO below its
  cap; with PPO's clip a token with w > 1 + eps_high and A > 0 gets no gradient (``check`` warns
  when the weight's bound allows that).

Metrics (every step): ``mismatch/log_ratio_abs_mean`` (mean |delta_t| over tokens, from the step),
``mismatch/truncated_frac`` and ``mismatch/masked_frac`` (tokens whose weight was capped / zeroed).
"""

from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from policyzoo.contract import Importance, Ratio

#: |log w| bound before exp where no cap applies (exp(20) ~ 4.9e8), verl's SAFETY_BOUND.
SAFE = 20.0
LEVEL = Field("sequence", description="'sequence': one weight per response (sum of token log-ratios); "
                                      "'token': one weight per token")


def log_weight(old_logprobs: Tensor, rollout_logprobs: Tensor, response_mask: Tensor, level: str) -> Tensor:
    """log(pi_old / pi_rollout) ``[B, T]``: per token, or summed over each row's valid tokens and
    broadcast over T (``sequence``); 0 on masked positions of a token-level weight."""
    zero = torch.zeros_like(old_logprobs)
    d = torch.where(response_mask, old_logprobs - rollout_logprobs.to(old_logprobs.dtype), zero)
    return d if level == "token" else d.sum(-1, keepdim=True).expand_as(d)


class Mismatch(Ratio):
    """Common part of the mismatch corrections (not registered itself): the token ratio, the weight
    of :meth:`correction` and its placement (see the module docstring). Source: Yao et al. 2025,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"."""

    class Params(Ratio.Params):
        placement: Literal["loss", "ratio"] = Field(
            "loss", description="'loss': w multiplies the clip's per-token loss (TRL, verl); "
                                "'ratio': the clip sees r x w")
        max_log_ratio: float = Field(20.0, gt=0, description="|log r_t| clamp of the token ratio before exp (> 0)")

    @abstractmethod
    def correction(self, logprobs: Tensor, old_logprobs: Tensor, rollout_logprobs: Tensor, response_mask: Tensor,
                   advantages: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``(w, truncated, masked)``: weight ``[B, T]`` >= 0 and bool ``[B, T]`` flags (or None);
        called without grad, ``logprobs`` detached."""

    def bound(self) -> float | None:
        """The largest weight the rule lets through (None: unbounded), for :meth:`check`."""
        return None

    def check(self, run) -> None:
        """Warn when, in ``ratio`` placement, the run's clip bounds r x w tighter than the weight."""
        p = getattr(getattr(run, "clip", None), "params", None)
        eps_high, bound = getattr(p, "eps_high", None), self.bound()
        if self.params.placement == "ratio" and eps_high is not None and getattr(p, "eps_low", None) is not None \
                and (bound is None or bound > 1 + eps_high):
            warnings.warn(
                f"ratio: {self.name} (placement ratio, weights up to {bound or 'any size'}) with clip: "
                f"{run.clip.name} (eps_high {eps_high}): the clip acts on r x w, so on-policy a token whose "
                f"weight w exceeds {1 + eps_high:g} gets no gradient on a positive advantage. Use placement: "
                f"loss (TRL/verl), clip: none or cispo, or bound the weight by {1 + eps_high:g}.", stacklevel=2)

    def ratio(self, logprobs, old_logprobs, rollout_logprobs, response_mask, advantages):
        m = self.params.max_log_ratio
        r = torch.exp(torch.where(response_mask, logprobs - old_logprobs, torch.zeros_like(logprobs)).clamp(-m, m))
        with torch.no_grad():
            w, truncated, masked = self.correction(logprobs.detach(), old_logprobs.detach(), rollout_logprobs,
                                                   response_mask, advantages)
            w = torch.where(response_mask, w.to(logprobs.dtype), torch.ones_like(r))
        truncated, masked = (x & response_mask if x is not None else None for x in (truncated, masked))
        if self.params.placement == "ratio":
            return Importance(r * w, None, truncated, masked)
        return Importance(r, w, truncated, masked)


class TIS(Mismatch):
    """Truncated importance sampling: w = exp(clamp(delta, log floor, log cap)), per token or response.

    ``level: sequence`` (default): w_i = min(pi_old(y_i) / pi_rollout(y_i), cap) with the sum of
    the token log-ratios (a likelihood ratio, unlike GSPO's mean); ``level: token``:
    w_t = min(pi_old(y_t) / pi_rollout(y_t), cap). ``floor`` (default None) bounds w from below.
    ``truncated``: tokens whose weight was capped or floored. Shapes ``[B, T]``; a row with no
    token has w = 1. Agrees with TRL ``vllm_importance_sampling_mode: sequence_truncate`` /
    ``token_truncate`` (``vllm_importance_sampling_clip_max`` = cap, ``_clip_min`` = floor) and
    verl ``rollout_is: sequence`` / ``token`` (``rollout_is_threshold`` = cap), both on the loss.
    Errors: ``ConfigError`` for cap < 1, floor outside (0, 1], an unknown level or placement.
    Sources: Yao et al. 2025 (token TIS, cap 2); Liu, Li et al. 2025, "When Speed Kills
    Stability"; Qi et al. 2025 (arXiv:2510.26788), sequence-level TIS."""

    name = "tis"

    class Params(Mismatch.Params):
        cap: float = Field(2.0, ge=1, description="truncation C of the IS weight (>= 1; w <= C)")
        floor: float | None = Field(None, gt=0, le=1, description="lower truncation of w (in (0, 1]); None = none")
        level: Literal["sequence", "token"] = LEVEL

    def bound(self) -> float:
        return self.params.cap

    def correction(self, logprobs, old_logprobs, rollout_logprobs, response_mask, advantages):
        lw = log_weight(old_logprobs, rollout_logprobs, response_mask, self.params.level)
        hi, lo = math.log(self.params.cap), (math.log(self.params.floor) if self.params.floor else None)
        truncated = (lw > hi) | ((lw < lo) if lo is not None else torch.zeros_like(response_mask))
        return torch.exp(lw.clamp(min=lo, max=hi)), truncated, None


class MIS(Mismatch):
    """Masked importance sampling: w = pi_old / pi_rollout where low <= w <= high, else 0.

    Per response (``level: sequence``, default; the sum of token log-ratios) or per token. Tokens
    of a response outside the band get weight 0 (``masked``): they add no loss, but stay in the
    reduce's normalisers. Default band [0, 2] (Liu, Li et al.; verl's ``rollout_is_threshold``
    default); TRL's default is ``vllm_importance_sampling_mode: sequence_mask`` with
    ``vllm_importance_sampling_clip_max: 3.0`` (set ``high: 3.0``). Agrees with TRL
    ``sequence_mask`` / ``token_mask`` (clip_min = low, clip_max = high; the band is inclusive in
    both). Shapes ``[B, T]``. Errors: ``ConfigError`` for high < 1, low outside (0, 1], neither
    bound given. Sources: Liu, Li et al. 2025, "When Speed Kills Stability" (MIS); Qi et al. 2025
    (arXiv:2510.26788)."""

    name = "mis"

    class Params(Mismatch.Params):
        high: float | None = Field(2.0, ge=1, description="upper bound of the kept band (>= 1); None = none")
        low: float | None = Field(None, gt=0, le=1, description="lower bound of the kept band (in (0, 1]); None = none")
        level: Literal["sequence", "token"] = LEVEL

        @model_validator(mode="after")
        def _some_bound(self):
            if self.high is None and self.low is None:
                raise ValueError("give high, low or both: without a bound nothing is masked")
            return self

    def bound(self) -> float | None:
        return self.params.high

    def correction(self, logprobs, old_logprobs, rollout_logprobs, response_mask, advantages):
        lw = log_weight(old_logprobs, rollout_logprobs, response_mask, self.params.level)
        keep = torch.ones_like(response_mask)
        if self.params.high is not None:
            keep &= lw <= math.log(self.params.high)
        if self.params.low is not None:
            keep &= lw >= math.log(self.params.low)
        return torch.where(keep, torch.exp(lw.clamp(max=SAFE)), torch.zeros_like(lw)), None, ~keep


class IcePop(MIS):
    """IcePop: token-level masked IS, w_t = pi_old(y_t) / pi_rollout(y_t) inside [0.5, 5], else 0.

    The paper's double-sided mask M(k) = k for k in [alpha, beta], 0 otherwise, applied to each
    token's clipped surrogate (alpha = 0.5, beta = 5). It is :class:`MIS` at ``level: token`` with
    that band; TRL: ``vllm_importance_sampling_mode: token_mask`` with ``_clip_min: 0.5``,
    ``_clip_max: 5.0``. Shapes ``[B, T]``. Errors: as ``mis``. Source: Ling Team 2025, Ring-1T,
    "Every Step Evolves" (arXiv:2510.18855), IcePop."""

    name = "icepop"

    class Params(MIS.Params):
        high: float | None = Field(5.0, ge=1, description="beta, upper bound of the kept band (>= 1)")
        low: float | None = Field(0.5, gt=0, le=1, description="alpha, lower bound of the kept band (in (0, 1])")
        level: Literal["token"] = Field("token", description="IcePop masks per token")


class OPSM(Mismatch):
    """Off-policy sequence masking: zero the tokens with A_t < 0 of a response that drifted too far.

        KL_i = 1/|y_i| sum_t (rollout_logprobs_it - logprobs_it)    (logprobs detached)
        w_it = 0 where A_it < 0 and KL_i > threshold, else 1

    The KL estimate is the mean over the row's tokens, between the sampler and the *current*
    policy (so it covers both the engine mismatch and the drift of later updates); equality keeps
    the token, a row with no token has KL 0. ``masked``: the zeroed tokens. Agrees with TRL
    ``off_policy_mask_threshold`` (with vLLM its sampling log-probs are our ``rollout_logprobs``).
    Default threshold 0.5, the example TRL's documentation gives. Shapes ``[B, T]``.
    Errors: ``ConfigError`` for threshold < 0. Source: DeepSeek-AI 2025, DeepSeek-V3.2
    (arXiv:2512.02556) eq. 9."""

    name = "opsm"

    class Params(Mismatch.Params):
        threshold: float = Field(0.5, ge=0, description="delta: largest mean per-token KL (nats) kept for A < 0")

    def correction(self, logprobs, old_logprobs, rollout_logprobs, response_mask, advantages):
        kl = torch.where(response_mask, rollout_logprobs.to(logprobs.dtype) - logprobs, torch.zeros_like(logprobs))
        seq = kl.sum(-1, keepdim=True) / response_mask.sum(-1, keepdim=True).clamp(min=1)
        drop = (advantages < 0) & (seq > self.params.threshold) & response_mask
        return (~drop).to(logprobs.dtype), None, drop


COMPONENTS = (TIS, MIS, IcePop, OPSM)
