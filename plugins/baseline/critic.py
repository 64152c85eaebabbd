"""Critic baselines: a learned value model (PPO's GAE)."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Advantages, Baseline, hookimpl, reward_tokens
from policyzoo.errors import ConfigError


class GAE(Baseline):
    """PPO's generalised advantage estimation with a learned critic.

    Per-token reward r_t = token_rewards_t + the sequence reward on the last masked token;
    delta_t = r_t + gamma V_{t+1} - V_t (V after the last token = 0); A_t = delta_t + gamma lam
    A_{t+1}, over masked tokens only (masked positions are skipped, not steps). ``values [B, T]``:
    V_t is the critic's estimate at the position that predicts token t (aligned with logprobs).
    ``returns`` = A + V *before* whitening (the value targets); ``whiten`` (default True here)
    makes the step normalise A over every masked token of valid rows of the whole step, on every
    rank (:meth:`~policyzoo.contract.Baseline.chain`; population std unless ``whiten_std: sample``,
    + ``whiten_eps``). Rows with NaN reward: A = 0, returns = V
    (no target signal). Returns ``Advantages(advantages [B, T], returns [B, T])``.
    ``value_loss`` gives the critic's clipped loss. Sources: Schulman et al. 2016 (arXiv:1506.02438)
    eq. 16; PPO (arXiv:1707.06347) eq. 9; value clipping as in OpenAI baselines / TRL PPO."""

    name = "gae"
    needs_values = True

    class Params(Baseline.Params):
        gamma: float = Field(1.0, gt=0, le=1, description="discount per token, in (0, 1]")
        lam: float = Field(0.95, ge=0, le=1, description="GAE lambda in [0, 1]")
        whiten: bool = Field(True, description="whiten advantages over the whole step's tokens")
        value_clip: float | None = Field(0.2, gt=0, description="clip the critic's change around the "
                                         "sampling-time values (> 0); None = no clipping")

    @hookimpl
    def baseline(self, rewards, response_mask, token_rewards, values):
        if values is None:
            raise ConfigError("algorithm.baseline (gae)", "GAE needs critic values but none were given",
                              "run gae with an engine that provides a value model (Policy.values)")
        mask = response_mask.to(torch.bool)
        valid = ~torch.isnan(rewards) & mask.any(-1)
        r = reward_tokens(torch.where(valid, rewards, torch.zeros_like(rewards)), mask, token_rewards)
        v = torch.where(mask, values.detach().double(), torch.zeros_like(r))
        adv = torch.zeros_like(r)
        next_v = torch.zeros(r.shape[0], dtype=torch.float64)
        next_a = torch.zeros_like(next_v)
        g, lam = self.params.gamma, self.params.lam
        for t in range(r.shape[1] - 1, -1, -1):
            m = mask[:, t]
            a = r[:, t] + g * next_v - v[:, t] + g * lam * next_a
            adv[:, t] = torch.where(m, a, torch.zeros_like(a))
            next_v = torch.where(m, v[:, t], next_v)
            next_a = torch.where(m, a, next_a)
        keep = mask & valid.unsqueeze(-1)
        adv = torch.where(keep, adv, torch.zeros_like(adv))
        returns = torch.where(keep, adv + v, v)
        dtype = values.dtype
        return Advantages(adv.to(dtype), returns.to(dtype))

    def value_loss(self, values, old_values, returns, response_mask, totals):
        """Critic loss: 0.5 x max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2) per masked token,
        summed and divided by ``totals.tokens`` (exact under micro-batching like ``token_mean``).
        ``values`` ``[B, T]`` with grad; ``old_values``, ``returns`` ``[B, T]`` constants. Scalar."""
        mask = response_mask.to(torch.bool)
        err = (values - returns) ** 2
        c = self.params.value_clip
        if c is not None:
            clipped = old_values + (values - old_values).clamp(-c, c)
            err = torch.maximum(err, (clipped - returns) ** 2)
        total = torch.where(mask, 0.5 * err, torch.zeros_like(err)).sum()
        return total / totals.tokens if totals.tokens > 0 else total * 0.0
