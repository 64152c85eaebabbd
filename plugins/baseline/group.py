"""Group baselines: each row is compared with the other samples of its prompt (G >= 2)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from policyzoo.contract import GroupBaseline, group_stats, hookimpl, moments, std_of, valid_scores


class GroupNorm(GroupBaseline):
    """GRPO advantage A_i = (s_i - mean_g) / (std_g + eps) over the valid rows of i's group g.

    ``std``: "sample" (divide by G-1, as TRL's ``torch.std`` and verl) or "population" (divide by
    G, as the GRPO paper's formula is sometimes read). ``eps`` 1e-6 is added to the std (verl's
    value; TRL adds 1e-4, which shrinks advantages of low-variance groups slightly more).
    Groups with std <= ``zero_std_tol`` get exactly 0 (a constant group carries no signal; a
    float residue such as 0.1+0.2 vs 0.3 must not become a huge advantage). Any other group has
    |A| <= sqrt(G-1) (population) or (G-1)/sqrt(G) (sample), the largest possible z-score.
    Example, rewards [1,0,0,1,1,0,0,0]: mean 3/8, population std sqrt(15)/8 -> +1.291/-0.775;
    sample std sqrt(15/56) -> +1.208/-0.725.
    ``scale: batch`` divides by one std over every valid score of the step (all ranks, through
    ``collective``; ``std`` convention; 0 everywhere when it is <= ``zero_std_tol``): TRL's
    ``scale_rewards="batch"`` (Hu et al., REINFORCE++ / "group mean, batch std"; TRL: eps 1e-4).
    Returns ``Advantages([B, T])``. Source: Shao et al. 2024, DeepSeekMath (arXiv:2402.03300) Sec. 4.1.2.
    Errors: ``ConfigError`` from ``check`` when sample.n = 1 (unless ``singleton: reward``)."""

    name = "group_norm"

    class Params(GroupBaseline.Params):
        std: Literal["sample", "population"] = Field("sample", description="'sample' (G-1, TRL/verl) or "
                                                     "'population' (G) standard deviation")
        eps: float = Field(1e-6, ge=0, description="added to the std before dividing (>= 0)")
        zero_std_tol: float = Field(1e-6, ge=0, description="groups with std <= this get advantage exactly 0")
        scale: Literal["group", "batch"] = Field(
            "group", description="divide by the group's std ('group') or by the std of every valid score "
                                 "of the whole step ('batch', TRL scale_rewards='batch')")

    def __init__(self, **params):
        super().__init__(**params)
        self.std, self.zero_std_tol = self.params.std, self.params.zero_std_tol  # zero_std_frac counts alike

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards, collective):
        p = self.params
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, mean, ssd = group_stats(s, valid, group_ids)
        if p.scale == "batch":  # one std for the whole step, every rank
            n, _, total_ssd = moments(s, valid, collective)
            sd = std_of(n, total_ssd, p.std)
            std = torch.full_like(s, sd)
            flat = torch.full_like(valid, sd <= p.zero_std_tol)
        else:
            dof = count - 1.0 if p.std == "sample" else count
            std = (ssd / dof.clamp(min=1.0)).sqrt()
            flat = std <= p.zero_std_tol
        adv = torch.where(flat, torch.zeros_like(s), (s - mean) / (std + p.eps))
        alone = s / ((std if p.scale == "batch" else 1.0) + p.eps)  # verl: a group of one has mean 0, std 1
        return self.finish(adv, alone, s, valid, count, rewards, response_mask)

    def zero_std_fraction(self, rewards, group_ids, response_mask) -> float:
        """``scale: group``: the fraction of groups with no spread (the base class). ``scale: batch``:
        TRL's ``frac_reward_zero_std`` under ``scale_rewards="batch"`` -- the std that divides is the
        batch's, so it is 1.0 when the std (``std`` convention) of this rank's valid rewards is <=
        ``zero_std_tol`` (or fewer than two: TRL's ``numel() > 1`` case), else 0.0."""
        if self.params.scale != "batch":
            return super().zero_std_fraction(rewards, group_ids, response_mask)
        r = rewards[~torch.isnan(rewards) & (response_mask.sum(-1) > 0)].double()
        if len(r) < 2:
            return 1.0
        return float(r.std(unbiased=self.std == "sample") <= self.zero_std_tol)


class GroupMean(GroupBaseline):
    """Dr. GRPO advantage A_i = s_i - mean_g (no std division, so no difficulty re-weighting).
    Returns ``Advantages([B, T])``. Source: Liu et al. 2025 (arXiv:2503.20783) Sec. 3.2."""

    name = "group_mean"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, mean, _ = group_stats(s, valid, group_ids)
        return self.finish(s - mean, s, s, valid, count, rewards, response_mask)


class LeaveOneOut(GroupBaseline):
    """RLOO advantage A_i = s_i - 1/(G-1) sum_{j != i} s_j = G/(G-1) (s_i - mean_g), G = valid rows
    of the group. Returns ``Advantages([B, T])``. Source: Ahmadian et al. 2024 (arXiv:2402.14740)
    eq. 6; Kool et al. 2019."""

    name = "leave_one_out"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, mean, _ = group_stats(s, valid, group_ids)
        others = (mean * count - s) / (count - 1.0).clamp(min=1.0)
        return self.finish(s - others, s, s, valid, count, rewards, response_mask)


class ReinforcePPBaseline(GroupMean):
    """REINFORCE++-baseline: A = whiten(s_i - mean_g) -- the group mean subtracted, then the result
    whitened over every trainable token of the whole step (all ranks). It is ``group_mean`` with
    ``whiten: true`` (the composition of :meth:`~policyzoo.contract.Baseline.chain`) and
    ``singleton: reward``, so G = 1 is allowed and reduces to whitened rewards, as verl's
    ``adv_estimator=reinforce_plus_plus_baseline`` (its group of one has mean 0). Whitening std:
    population + 1e-6 (verl: sample variance, (x - mean) rsqrt(var + 1e-8); ``whiten_std: sample``
    gives its variance). Returns ``Advantages([B, T])``.
    Source: Hu 2025, REINFORCE++ (arXiv:2501.03262), REINFORCE++-baseline."""

    name = "reinforce_pp_baseline"

    class Params(GroupMean.Params):
        whiten: bool = Field(True, description="whiten the group-centred advantages over the whole step")
        singleton: Literal["zero", "reward"] = Field("reward", description="a group of one: its reward "
                                                     "(verl, the default here) or 'zero'")


class OPO(GroupBaseline):
    """OPO's length-weighted group baseline: A_i = s_i - b_g, b_g = sum_j |y_j| s_j / sum_j |y_j| over
    the valid rows j of i's group, |y| = the row's trainable tokens (the optimal baseline when the
    gradient norm grows with length). verl ``adv_estimator=opo`` (same rule; a group of one: A = s,
    our ``singleton: reward``). Returns ``Advantages([B, T])``.
    Source: Hao et al. 2025, On-Policy RL with Optimal Reward Baseline (arXiv:2505.23585) Sec. 3."""

    name = "opo"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        length = response_mask.to(torch.float64).sum(-1)
        count, wmean, _ = group_stats(s, valid, group_ids, weights=length)
        return self.finish(s - wmean, s, s, valid, count, rewards, response_mask)


class GPG(GroupBaseline):
    """GPG advantage A_i = alpha (s_i - mean_g) / f_norm with a batch-level correction alpha.

    ``alpha: valid_rows`` (the paper's): alpha = B / (B - M) over the whole step (all
    ranks), B valid rows, M of them in groups whose valid scores are all equal (they carry no
    gradient, so the others are scaled up); ``nonzero_rewards`` (verl ``adv_estimator=gpg``'s code):
    alpha = B / #rows with a non-zero score. alpha = 1 when the divisor is 0. ``f_norm`` 1 (paper
    and verl default). Use with ``clip: none`` and ``reduce: token_mean`` (the paper's loss).
    Returns ``Advantages([B, T])``. Source: Chu et al. 2025, GPG (arXiv:2504.02546) Sec. 3."""

    name = "gpg"

    class Params(GroupBaseline.Params):
        alpha: Literal["valid_rows", "nonzero_rewards"] = Field(
            "valid_rows", description="'valid_rows': B / (B - rows of constant groups) (paper); "
                                      "'nonzero_rewards': B / rows with a non-zero score (verl)")
        f_norm: float = Field(1.0, gt=0, description="divide the advantage by this constant (> 0)")
        zero_std_tol: float = Field(1e-6, ge=0, description="a group with score std <= this counts as constant")

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards, collective):
        p = self.params
        s, valid = valid_scores(rewards, response_mask, token_rewards)
        count, mean, ssd = group_stats(s, valid, group_ids)
        spread = (ssd / count.clamp(min=1.0)).sqrt() > p.zero_std_tol
        useful = valid & (spread if p.alpha == "valid_rows" else (s != 0))
        n = collective.sum(torch.stack([valid.sum(), useful.sum()]).double())
        alpha = float(n[0] / n[1]) if n[1] > 0 else 1.0
        return self.finish(alpha * (s - mean) / p.f_norm, alpha * s / p.f_norm, s, valid, count, rewards,
                           response_mask)
