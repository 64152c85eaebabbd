"""Optimal token baselines: a baseline per token position, weighted by the path's score variance."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from policyzoo.contract import Advantages, GroupBaseline, hookimpl, token_returns
from policyzoo.errors import ConfigError


def _group_baseline(ret, w, m, group_ids, rows, eps, zero_tail):
    """Per group of ``rows``: B_t = sum_i G_it W_it / (sum_i W_it + eps) over the group's rows with
    position t (``m``); with ``zero_tail`` the part of a group's unique longest row beyond the
    second longest gets baseline 0. ``[B, L]`` float64 (0 outside ``rows``)."""
    base = torch.zeros_like(ret)
    length = m.sum(-1)
    for g in group_ids[rows].unique():
        idx = (rows & (group_ids == g)).nonzero().flatten()
        if len(idx) < 2:
            continue
        mw = w[idx] * m[idx]
        base[idx] = ((ret[idx] * mw).sum(0) / (mw.sum(0) + eps)).expand(len(idx), -1)
        if zero_tail:
            lens, order = length[idx].sort(descending=True)
            if lens[0] > lens[1]:
                base[idx[order[0]], int(lens[1]):] = 0.0
    return base


class OptimalTokenBaseline(GroupBaseline):
    """Optimal token baseline (OTB): A_t = G_t - B_t, one baseline per position t of each group.

    G_t is the return-to-go (sequence reward plus per-token rewards from t on, gamma 1). With
    pi_t = exp(old_logprobs_t) and s_t = 1 - 2 pi_t + sum_v pi(v)^2 (``sum_pi_squared``, the squared
    norm of the score function's logit gradient), W_t = sum_{j <= t} s_j over the row's tokens, and
    B_t = sum_i G_it W_it / (sum_i W_it + eps) over the valid rows i of the group present at t: the
    variance-minimising baseline when the gradient variance of a path grows with W. Rows align by
    position (``align: position``) or by their k-th trainable token (``align: token``, for masks with
    holes such as tool outputs; ``tir_optimal_token_baseline``). ``zero_tail``: a group's unique
    longest row gets baseline 0 past the second longest (no other row to compare with there).
    A group of one valid row: 0 (``singleton: reward``: A = G, as verl). Sets ``needs_pi_squared``:
    the step scores the batch for ``old_logprobs`` and ``sum_pi_squared``. verl
    ``adv_estimator=optimal_token_baseline`` (eps 1e-8; its rollout-IS variant of W is not here).
    Returns ``Advantages([B, T])`` (advantages and the returns G). Errors: ``ConfigError`` when no
    ``sum_pi_squared`` is given (an engine without ``Policy.sum_pi_squared``).
    Source: verl's optimal token baseline (verl/trainer/ppo/core_algos.py), after the optimal
    baseline of Weaver & Tao 2001, "The Optimal Reward Baseline for Gradient-Based RL"."""

    name = "optimal_token_baseline"
    needs_pi_squared = True

    class Params(GroupBaseline.Params):
        eps: float = Field(1e-8, ge=0, description="added to the summed weights (>= 0; verl 1e-8)")
        zero_tail: bool = Field(False, description="baseline 0 past the second-longest row of a group")
        align: Literal["position", "token"] = Field(
            "position", description="'position' (absolute) or 'token' (k-th trainable token, multi-turn)")

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards, old_logprobs, sum_pi_squared):
        if sum_pi_squared is None:
            raise ConfigError(f"algorithm.baseline ({self.name})", "the optimal token baseline needs sum_pi_squared "
                              "but the engine gave none", "use an engine with Policy.sum_pi_squared")
        p, mask = self.params, response_mask.to(torch.bool)
        rows = ~torch.isnan(rewards) & mask.any(-1)
        ret = token_returns(rewards, mask, token_rewards)
        s = torch.where(mask, 1.0 - 2.0 * old_logprobs.detach().double().exp() + sum_pi_squared.double(), 0.0)
        w = s.cumsum(-1)
        if p.align == "token":  # compact each row's trainable tokens to the left, then scatter back
            k = mask.long().cumsum(-1) - 1
            width = int(mask.sum(-1).max()) if mask.any() else 0
            rr, cc = mask.nonzero(as_tuple=True)
            cr, cw = torch.zeros(len(rewards), width).double(), torch.zeros(len(rewards), width).double()
            cm = torch.zeros(len(rewards), width, dtype=torch.bool)
            cr[rr, k[rr, cc]], cw[rr, k[rr, cc]], cm[rr, k[rr, cc]] = ret[rr, cc], w[rr, cc], True
            cb = _group_baseline(cr, cw, cm, group_ids, rows, p.eps, p.zero_tail)
            base = torch.zeros_like(ret)
            base[rr, cc] = cb[rr, k[rr, cc]]
        else:
            base = _group_baseline(ret, w, mask, group_ids, rows, p.eps, p.zero_tail)
        count = torch.zeros(len(rewards), dtype=torch.float64)
        for g in group_ids[rows].unique():
            count[group_ids == g] = float((rows & (group_ids == g)).sum())
        alone = rows & (count == 1) & (p.singleton == "reward")
        keep = mask & (rows & (count >= 2) | alone).unsqueeze(-1)
        dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        zero = torch.zeros_like(ret)
        return Advantages(torch.where(keep, ret - base, zero).to(dtype), torch.where(keep, ret, zero).to(dtype))


class TIROptimalTokenBaseline(OptimalTokenBaseline):
    """The optimal token baseline for multi-turn, tool-integrated rollouts: rows align by their k-th
    trainable token (holes in the mask, e.g. tool outputs, are skipped) and ``zero_tail`` is on.
    verl ``adv_estimator=tir_optimal_token_baseline``. Returns ``Advantages([B, T])``.
    Source: verl's multi-turn optimal token baseline (verl/trainer/ppo/core_algos.py)."""

    name = "tir_optimal_token_baseline"

    class Params(OptimalTokenBaseline.Params):
        zero_tail: bool = Field(True, description="baseline 0 past the second-longest row of a group")
        align: Literal["position", "token"] = Field(
            "token", description="'token' (k-th trainable token, multi-turn) or 'position'")
