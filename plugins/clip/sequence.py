"""Sequence-weighted surrogates: one weight per response, built from its token log-ratios.

Both take log r_t = log(``ratio``) per token, so they need a token-level ratio (``ratio: token``,
or a token ratio that also corrects the sampler mismatch); ``check`` refuses a sequence ratio,
whose tokens all carry the same, already averaged value. Rows with no token get loss 0.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from policyzoo.contract import Clip, Surrogate, hookimpl
from policyzoo.errors import ConfigError


class _PerSequence(Clip):

    def check(self, run) -> None:
        if run.ratio.level != "token":
            raise ConfigError(f"algorithm.clip ({self.name})",
                              f"'{self.name}' builds its own per-response weight from the token log-ratios; "
                              f"the sequence-level ratio {run.ratio.name!r} has already averaged them",
                              "use `ratio: token` with this clip")


def log_ratio(ratio, mask):
    """log r ``[B, T]`` (0 where masked), with the ratio's gradient."""
    return torch.where(mask, ratio.clamp(min=1e-30).log(), torch.zeros_like(ratio))


class GMPO(_PerSequence):
    """GMPO: the geometric mean of the clipped token ratios, times the response's mean advantage.

    With s = sign(A_t) and log r_t clipped pessimistically in log space (where A > 0 at most
    eps_high, where A < 0 at least -eps_low; the other side unbounded, as PPO's min):
    c_t = s min(s log r_t, s clamp(log r_t, -eps_low, eps_high)), R_i = exp(mean_t c_t),
    Abar_i = mean_t A_t, and loss_t = -Abar_i x R_i on every token of row i. With the
    ``seq_mean_token_mean`` reduce this is the paper's 1/G sum_i -Abar_i R_i; each token gets the
    gradient -Abar_i R_i / |y_i| grad log pi while its log-ratio is inside the clip, 0 outside.
    Clip masks as verl counts them (``geo_mean``'s ``pg_clipfrac`` / ``pg_clipfrac_lower``): tokens
    whose log r_t lies outside [-eps_low, eps_high], where A > 0 (high) / A < 0 (low) -- on either
    side of the range, so they include tokens the pessimistic min leaves unclipped (A > 0 with
    log r_t < -eps_low still gets its gradient).

    Shapes ``[B, T]``; eps in nats of log-ratio. Defaults: the paper's (e^-0.4, e^0.4) range,
    eps 0.4 both. Errors: ``ConfigError`` for eps <= 0 or a sequence ratio.
    Source: Zhao et al. 2025, GMPO (arXiv:2507.20673) eq. 4; verl ``policy_loss.loss_mode: geo_mean``."""

    name = "gmpo"

    class Params(Clip.Params):
        eps_low: float = Field(0.4, gt=0, description="log-ratio clip below: log r >= -eps_low where A < 0")
        eps_high: float | None = Field(None, gt=0, description="log-ratio clip above: log r <= eps_high where "
                                       "A > 0; None = eps_low")

    @hookimpl
    def clip(self, ratio, advantages, response_mask):
        m = response_mask
        lo = -self.params.eps_low
        hi = self.params.eps_high if self.params.eps_high is not None else self.params.eps_low
        lr, s = log_ratio(ratio, m), advantages.sign()
        c = s * torch.minimum(s * lr, s * lr.clamp(lo, hi))
        n = m.sum(-1, keepdim=True).clamp(min=1)
        row = -torch.where(m, advantages, 0.0).sum(-1, keepdim=True) / n * torch.exp(c.sum(-1, keepdim=True) / n)
        loss = torch.where(m, row.expand_as(lr), torch.zeros_like(lr))
        out = m & ((lr < lo) | (lr > hi))  # verl: log r != clamp(log r, -eps_low, eps_high)
        return Surrogate(loss, out & (advantages < 0), out & (advantages > 0))


class VESPO(_PerSequence):
    """VESPO: a detached Gamma-shaped weight of the sequence importance weight, on the log-prob.

    w_i = exp(clamp(sum_t clamp(log r_t, -20, 20), log 1e-8, 20)) (a *product* of the token ratios,
    not their geometric mean), phi = exp(lambda + k log w - lambda w) = e^lambda w^k e^(-lambda w)
    (phi(1) = 1; k, lambda from the sign of A: A >= 0 takes the ``_pos`` pair), and
    loss_t = -sg(phi_i) A_t logprobs_t: the gradient is -phi A grad log pi, smoothly shrinking
    responses whose weight strays from 1 in either direction (no hard clip, no clip masks).

    Shapes ``[B, T]``. Defaults are TRL's (k 2 / lambda 3 for A >= 0, k 3 / lambda 2 for A < 0); the
    reduce of TRL's ``loss_type: vespo`` is ours ``token_mean``. Errors: ``ConfigError`` for k < 0,
    lambda <= 0 or a sequence ratio. Source: VESPO (arXiv:2602.10693); TRL ``loss_type: vespo``."""

    name = "vespo"

    class Params(Clip.Params):
        k_pos: float = Field(2.0, ge=0, description="power k for A >= 0 (TRL vespo_k_pos)")
        lambda_pos: float = Field(3.0, gt=0, description="decay lambda for A >= 0 (TRL vespo_lambda_pos)")
        k_neg: float = Field(3.0, ge=0, description="power k for A < 0 (TRL vespo_k_neg)")
        lambda_neg: float = Field(2.0, gt=0, description="decay lambda for A < 0 (TRL vespo_lambda_neg)")

    @hookimpl
    def clip(self, ratio, advantages, logprobs, response_mask):
        p = self.params
        with torch.no_grad():
            lr = log_ratio(ratio.detach(), response_mask).clamp(-20.0, 20.0)
            log_w = lr.sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)
            pos = advantages >= 0
            k, lam = torch.where(pos, p.k_pos, p.k_neg), torch.where(pos, p.lambda_pos, p.lambda_neg)
            phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(0.0, 0.0, 0.0)
        loss = torch.where(response_mask, -phi * advantages * logprobs, torch.zeros_like(logprobs))
        return Surrogate(loss)


COMPONENTS = (GMPO, VESPO)
