"""The divergence family: DPPO's trust region by a divergence of the sampled token's probability,
not by the probability ratio (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
Learning", arXiv:2602.04879, DPPO-Binary-TV and DPPO-Binary-KL).

Both: loss_t = -A_t x sg(min(r_t, max_weight)) x logprobs_t x v_t, with v_t = 1 when the token is
inside the trust region (or moving back towards the old policy) and 0 when the update would push it
further out. The weight is detached and truncated (truncated IS, the paper's Sec. 5.4, in place of
dual clip), so the gradient is -A min(r, max_weight) grad log pi on tokens with v = 1; the loss
*value* is not a surrogate value. p = exp(logprobs), p_old = exp(old_logprobs): probabilities of
the sampled token (the "binary" approximation: the sampled token against the rest of the vocabulary).

Clip masks: ``clipped_high`` = v = 0 where A > 0, ``clipped_low`` = v = 0 where A < 0 (verl reports
their union as ``pg_clipfrac``). Shapes ``[B, T]``. verl names: ``policy_loss.loss_mode: dppo_tv`` /
``dppo_kl`` with the thresholds in ``clip_ratio_low`` / ``clip_ratio_high`` and the truncation in
``clip_ratio_c``.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
from pydantic import Field

from policyzoo.contract import Clip, Surrogate, hookimpl


class _DPPO(Clip):

    @abstractmethod
    def inside(self, lp, lp_old, positive):
        """``[B, T]`` bool v_t from the log-probs (no grad): the update keeps token t (``positive``: A > 0)."""

    @hookimpl
    def clip(self, ratio, advantages, logprobs, old_logprobs, response_mask):
        keep = self.inside(logprobs.detach(), old_logprobs, advantages > 0) & response_mask
        w = ratio.detach().clamp(max=self.params.max_weight)
        loss = torch.where(keep, -advantages * w * logprobs, torch.zeros_like(logprobs))
        out = ~keep & response_mask
        return Surrogate(loss, out & (advantages < 0), out & (advantages > 0))


class DPPOTV(_DPPO):
    """DPPO-Binary-TV: v_t = 1 iff p - p_old <= delta_high (A > 0) or p - p_old >= -delta_low
    (A <= 0): the change of the sampled token's probability, in probability units, is bounded
    (the total-variation distance of the binary distributions {p, 1 - p} is |p - p_old|).
    Defaults: 0.15 both (the paper's and verl's example). Errors: ``ConfigError`` for delta <= 0 or
    max_weight <= 0. Source: Qi et al. 2026 (arXiv:2602.04879), DPPO-Binary-TV."""

    name = "dppo_tv"

    class Params(Clip.Params):
        delta_low: float = Field(0.15, gt=0, le=1, description="TV bound for A <= 0: p - p_old >= -delta_low")
        delta_high: float | None = Field(None, gt=0, le=1, description="TV bound for A > 0: p - p_old <= "
                                         "delta_high; None = delta_low")
        max_weight: float = Field(20.0, gt=0, description="truncation of the detached IS weight (verl clip_ratio_c)")

    def inside(self, lp, lp_old, positive):
        hi = self.params.delta_high if self.params.delta_high is not None else self.params.delta_low
        d = lp.exp() - lp_old.exp()
        return torch.where(positive, d <= hi, d >= -self.params.delta_low)


class DPPOKL(_DPPO):
    """DPPO-Binary-KL: v_t = 1 iff the binary KL(p_old || p) = p_old log(p_old / p) +
    (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)) is <= delta_high (A > 0; or p <= p_old)
    or <= delta_low (A <= 0; or p >= p_old): outside the region only moves back towards p_old keep
    their gradient. The 1e-8 keeps p = 1 finite (verl's constant). Defaults: 0.05 both (verl's
    example). Errors: ``ConfigError`` for delta <= 0 or max_weight <= 0.
    Source: Qi et al. 2026 (arXiv:2602.04879), DPPO-Binary-KL."""

    name = "dppo_kl"

    class Params(Clip.Params):
        delta_low: float = Field(0.05, gt=0, description="binary-KL bound for A <= 0 (nats)")
        delta_high: float | None = Field(None, gt=0, description="binary-KL bound for A > 0 (nats); None = delta_low")
        max_weight: float = Field(20.0, gt=0, description="truncation of the detached IS weight (verl clip_ratio_c)")

    def inside(self, lp, lp_old, positive):
        hi = self.params.delta_high if self.params.delta_high is not None else self.params.delta_low
        p, p_old = lp.exp(), lp_old.exp()
        kl = p_old * (lp_old - lp) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        return torch.where(positive, (kl <= hi) | (p <= p_old), (kl <= self.params.delta_low) | (p >= p_old))


COMPONENTS = (DPPOTV, DPPOKL)
