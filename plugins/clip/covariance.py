"""The covariance family (Cui et al. 2025, arXiv:2505.22617, Sec. 5): PPO's surrogate, with the
tokens of highest covariance between advantage and log-probability singled out.

Per valid token, cov_t = (A_t - mean A) x (logprobs_t - mean logprobs), the means over every
valid token of the statistic's span (the paper's eq. 10, the centred cross-product whose mean is
the covariance that drives entropy collapse). Tokens of large positive cov are confident tokens
with a high advantage (or unlikely ones with a low advantage); updating them sharpens the policy.

Span of the statistic -- exact across ranks, per micro-batch: the means, the selection count and
the selection itself are taken over the tokens of the micro-batch on *every* data-parallel rank
(``collective``: sums for the means, a gather for the selection, ``rank`` to find one's own
tokens), so N ranks equal one rank holding their rows. The clip hook sees one micro-batch at a
time, so with ``micro_batches: k > 1`` each micro-batch is selected from its own tokens, a
different set from one selection over the step; with ``micro_batches: 1`` (the default) it is the
whole step. verl selects per micro-batch *and per rank* (its means and counts are local).
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from policyzoo.contract import Clip, Surrogate, hookimpl
from policyzoo.plugins.clip.ppo import PPOClip


def covariance(advantages, logprobs, mask, collective) -> tuple[torch.Tensor, int]:
    """``cov [B, T]`` float64 (0 where masked, no grad) and the token count over every rank."""
    a, lp = advantages.detach().double(), logprobs.detach().double()
    zero = torch.zeros_like(a)
    stats = torch.stack([torch.where(mask, a, zero).sum(), torch.where(mask, lp, zero).sum(), mask.sum().double()])
    sa, slp, n = collective.sum(stats).tolist()
    if n == 0:
        return zero, 0
    return torch.where(mask, (a - sa / n) * (lp - slp / n), zero), int(n)


def selected(chosen: torch.Tensor, local: torch.Tensor, counts: torch.Tensor, rank: int, mask) -> torch.Tensor:
    """``[B, T]`` bool: True at this rank's ``local [c, 2]`` (row, column) positions whose index in
    the rank-ordered gather of every rank's positions (``counts [world]`` per rank) is in ``chosen``."""
    start = int(counts[:rank].sum())
    mine = chosen[(chosen >= start) & (chosen < start + len(local))] - start
    sel = torch.zeros_like(mask)
    sel[local[mine, 0], local[mine, 1]] = True
    return sel


class ClipCov(PPOClip):
    """Clip-Cov: PPO's clip, plus the gradient cut on a random ``select_frac`` share of the tokens
    whose covariance lies in (``cov_low``, ``cov_high``) (Cui et al. 2025, arXiv:2505.22617, eq. 11).

    loss_t = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) x (1 - s_t), with s_t = 1 on
    max(1, floor(select_frac x N)) tokens (N: valid tokens of the span, see the module docstring)
    drawn uniformly, without replacement, among the valid tokens that PPO's clip leaves intact and
    whose cov is inside the band (all of them if fewer). The draw uses a generator seeded with
    ``seed``, N and the number of band tokens -- integers every rank agrees on, so the draw is the
    same on every rank and reproducible for the same batch (it varies from step to step with them).
    The clip masks hold the selected tokens only (``clipped_low`` where A < 0, ``clipped_high``
    elsewhere), so ``clip_frac_low + clip_frac_high`` is verl's ``pg_clipfrac`` for ``clip_cov``
    (``masked_mean(corr == 0)``: the covariance cut alone, not PPO's clip); they lose their
    gradient even on-policy, the method's purpose. PPO's own clipped tokens lose theirs too but are
    not counted, as in verl.

    Shapes ``[B, T]``; cov is unitless x nats. Defaults are verl's (``clip_cov_ratio`` 2e-4,
    ``clip_cov_lb`` 1, ``clip_cov_ub`` 5, ``clip_ratio`` 0.2). Errors: ``ConfigError`` for
    select_frac outside (0, 1] or cov_low >= cov_high. Source: verl ``policy_loss.loss_mode: clip_cov``."""

    name = "clip_cov"

    class Params(PPOClip.Params):
        select_frac: float = Field(2e-4, gt=0, le=1, description="share of valid tokens whose gradient is "
                                   "cut, in (0, 1] (verl clip_cov_ratio)")
        cov_low: float = Field(1.0, description="covariance band, lower bound (exclusive; verl clip_cov_lb)")
        cov_high: float = Field(5.0, description="covariance band, upper bound (exclusive; verl clip_cov_ub)")
        seed: int = Field(0, ge=0, description="seed of the random draw among the band's tokens")

        @model_validator(mode="after")
        def _band(self):
            if self.cov_low >= self.cov_high:
                raise ValueError(f"cov_low ({self.cov_low}) must be below cov_high ({self.cov_high})")
            return self

    @hookimpl
    def clip(self, ratio, advantages, logprobs, response_mask, collective):
        sur = super().clip(ratio, advantages, response_mask)
        cov, n = covariance(advantages, logprobs, response_mask, collective)
        p = self.params
        band = (response_mask & ~sur.clipped_low & ~sur.clipped_high & (cov > p.cov_low) & (cov < p.cov_high))
        local = band.nonzero()
        counts = collective.gather(torch.tensor([len(local)]))
        total = int(counts.sum())
        gen = torch.Generator().manual_seed(p.seed + 1_000_003 * n + total)  # integers every rank agrees on
        chosen = torch.randperm(total, generator=gen)[:max(1, int(p.select_frac * n))]
        sel = selected(chosen, local, counts, collective.rank, response_mask)
        loss = torch.where(sel, torch.zeros_like(sur.loss), sur.loss)
        a = advantages
        return Surrogate(loss, sel & (a < 0), sel & ~(a < 0))  # verl's pg_clipfrac: the selection only


class KLCov(Clip):
    """KL-Cov: the unclipped surrogate -A r, plus ``kl_coef`` x |logprobs - old_logprobs| on the
    max(1, floor(``select_frac`` x N)) valid tokens of largest covariance (Cui et al. 2025,
    arXiv:2505.22617, eq. 12; ties broken by position, the top-k of the rank-ordered gather).

    loss_t = -A_t r_t + kl_coef x |log pi_t - log pi_old,t| x s_t. On the first update after
    sampling |log r| = 0 and its gradient is 0 (the penalty acts from the second update of a batch
    on). No token is cut, so ``clipped_low`` / ``clipped_high`` are None (reported as 0).

    Shapes ``[B, T]``, nats. Defaults are verl's (``kl_cov_ratio`` 2e-4, ``ppo_kl_coef`` 1).
    Errors: ``ConfigError`` for select_frac outside (0, 1] or kl_coef < 0.
    Source: verl ``policy_loss.loss_mode: kl_cov``."""

    name = "kl_cov"

    class Params(Clip.Params):
        select_frac: float = Field(2e-4, gt=0, le=1, description="share of valid tokens penalised, in (0, 1] "
                                   "(verl kl_cov_ratio)")
        kl_coef: float = Field(1.0, ge=0, description="coefficient of |log r| on selected tokens (verl ppo_kl_coef)")

    @hookimpl
    def clip(self, ratio, advantages, logprobs, old_logprobs, response_mask, collective):
        cov, n = covariance(advantages, logprobs, response_mask, collective)
        local = response_mask.nonzero()
        counts = collective.gather(torch.tensor([len(local)]))
        every = collective.gather(cov[response_mask])
        chosen = torch.topk(every, min(len(every), max(1, int(self.params.select_frac * n)))).indices
        sel = selected(chosen, local, counts, collective.rank, response_mask)
        log_r = torch.where(response_mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
        loss = -advantages * ratio + torch.where(sel, self.params.kl_coef * log_r.abs(), torch.zeros_like(log_r))
        return Surrogate(loss)


COMPONENTS = (ClipCov, KLCov)
