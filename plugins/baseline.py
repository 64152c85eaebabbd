"""``baseline`` components: rewards -> advantages ``[B, T]`` (0 on masked positions).

Conventions shared by the group baselines (``group_norm``, ``group_mean``, ``leave_one_out``):

* The score of row i is s_i = rewards_i + sum_t token_rewards_it (the KL penalty in reward
  placement enters here, as in RLOO / TRL's ``kl`` in reward).
* Rows are grouped by the explicit ``group_ids`` (never by position): shuffled rows and uneven
  group sizes give the same per-row advantages.
* A row with no trainable token or a NaN score is *invalid*: it enters no mean or std and gets
  advantage 0. A group with fewer than two valid rows gets 0 everywhere.
* Statistics are computed in float64 and cast back to the rewards' dtype.
* The per-row advantage is broadcast over the row's masked tokens.

``batch_whiten`` and ``gae`` work per token and whiten over the batch (G may be 1).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from policyzoo.errors import ConfigError
from policyzoo.hookspecs import Advantages, hookimpl
from policyzoo.slots import Baseline


def _valid_scores(rewards, response_mask, token_rewards):
    mask = response_mask.to(torch.bool)
    tr = torch.zeros(mask.shape, dtype=torch.float64) if token_rewards is None else token_rewards.double()
    s = rewards.double() + torch.where(mask, tr, torch.zeros_like(tr)).sum(-1)
    valid = ~torch.isnan(s) & mask.any(-1)
    return torch.where(valid, s, torch.zeros_like(s)), valid


def group_stats(scores, valid, group_ids):
    """Per-row (count, mean, sum of squared deviations) of the row's group over valid rows, float64."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if len(inv) else 0
    v = valid.double()
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, v)
    total = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, scores * v)
    mean = total / count.clamp(min=1.0)
    dev = (scores - mean[inv]) * v
    ssd = torch.zeros(k, dtype=torch.float64).index_add_(0, inv, dev * dev)
    return count[inv], mean[inv], ssd[inv]


def _broadcast(adv_row, rewards, response_mask):
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    a = adv_row.to(dtype).unsqueeze(-1).expand(response_mask.shape)
    return torch.where(response_mask.to(torch.bool), a, torch.zeros_like(a))


class _GroupBaseline(Baseline):

    def check(self, run) -> None:
        if run.sample.params.n == 1:
            raise ConfigError(
                f"algorithm.baseline ({self.name})",
                f"the group baseline '{self.name}' compares the G samples of a prompt with each other, but "
                "sample.n = 1: a group of one equals its own baseline, so every advantage would be 0 and "
                "nothing would be learned",
                "set `sample: {n: 8}` (G >= 2), or use a baseline for G = 1: `batch_whiten` or `gae`")


class GroupNorm(_GroupBaseline):
    """GRPO advantage A_i = (s_i - mean_g) / (std_g + eps) over the valid rows of i's group g.

    ``std``: "sample" (divide by G-1, as TRL's ``torch.std`` and verl) or "population" (divide by
    G, as the GRPO paper's formula is sometimes read). ``eps`` 1e-6 is added to the std (verl's
    value; TRL adds 1e-4, which shrinks advantages of low-variance groups slightly more).
    Groups with std <= ``zero_std_tol`` get exactly 0 (a constant group carries no signal; a
    float residue such as 0.1+0.2 vs 0.3 must not become a huge advantage). Any other group has
    |A| <= sqrt(G-1) (population) or (G-1)/sqrt(G) (sample), the largest possible z-score.
    Example, rewards [1,0,0,1,1,0,0,0]: mean 3/8, population std sqrt(15)/8 -> +1.291/-0.775;
    sample std sqrt(15/56) -> +1.208/-0.725.
    Returns ``Advantages([B, T])``. Source: Shao et al. 2024, DeepSeekMath (arXiv:2402.03300) Sec. 4.1.2.
    Errors: ``ConfigError`` from ``check`` when sample.n = 1."""

    name = "group_norm"

    class Params(Baseline.Params):
        std: Literal["sample", "population"] = Field("sample", description="'sample' (G-1, TRL/verl) or "
                                                     "'population' (G) standard deviation")
        eps: float = Field(1e-6, ge=0, description="added to the std before dividing (>= 0)")
        zero_std_tol: float = Field(1e-6, ge=0, description="groups with std <= this get advantage exactly 0")

    def __init__(self, **params):
        super().__init__(**params)
        self.std, self.zero_std_tol = self.params.std, self.params.zero_std_tol  # zero_std_frac counts alike

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = _valid_scores(rewards, response_mask, token_rewards)
        count, mean, ssd = group_stats(s, valid, group_ids)
        dof = count - 1.0 if self.params.std == "sample" else count
        std = (ssd / dof.clamp(min=1.0)).sqrt()
        flat = (count < 2) | (std <= self.params.zero_std_tol)
        adv = torch.where(valid & ~flat, (s - mean) / (std + self.params.eps), torch.zeros_like(s))
        return Advantages(_broadcast(adv, rewards, response_mask))


class GroupMean(_GroupBaseline):
    """Dr. GRPO advantage A_i = s_i - mean_g (no std division, so no difficulty re-weighting).
    Returns ``Advantages([B, T])``. Source: Liu et al. 2025 (arXiv:2503.20783) Sec. 3.2."""

    name = "group_mean"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = _valid_scores(rewards, response_mask, token_rewards)
        count, mean, _ = group_stats(s, valid, group_ids)
        adv = torch.where(valid & (count >= 2), s - mean, torch.zeros_like(s))
        return Advantages(_broadcast(adv, rewards, response_mask))


class LeaveOneOut(_GroupBaseline):
    """RLOO advantage A_i = s_i - 1/(G-1) sum_{j != i} s_j = G/(G-1) (s_i - mean_g), G = valid rows
    of the group. Returns ``Advantages([B, T])``. Source: Ahmadian et al. 2024 (arXiv:2402.14740)
    eq. 6; Kool et al. 2019."""

    name = "leave_one_out"

    @hookimpl
    def baseline(self, rewards, group_ids, response_mask, token_rewards):
        s, valid = _valid_scores(rewards, response_mask, token_rewards)
        count, mean, _ = group_stats(s, valid, group_ids)
        others = (mean * count - s) / (count - 1.0).clamp(min=1.0)
        adv = torch.where(valid & (count >= 2), s - others, torch.zeros_like(s))
        return Advantages(_broadcast(adv, rewards, response_mask))


def reward_tokens(rewards, response_mask, token_rewards):
    """Per-token rewards ``[B, T]`` (float64): token_rewards on masked tokens plus the sequence
    reward on each row's last masked token."""
    mask = response_mask.to(torch.bool)
    r = torch.zeros(mask.shape, dtype=torch.float64) if token_rewards is None else token_rewards.double()
    r = torch.where(mask, r, torch.zeros_like(r))
    pos = torch.arange(mask.shape[1]).expand(mask.shape)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(-1).values
    has = last >= 0
    rows = torch.arange(mask.shape[0])[has]
    r[rows, last[has]] += rewards.double()[has]
    return r


def whiten(x, where, eps):
    """(x - mean) / (std + eps) over the True entries of ``where`` (population std), 0 elsewhere;
    all 0 when that std is below 1e-12 x (1 + |mean|) (a constant batch)."""
    n = where.sum()
    if n == 0:
        return torch.zeros_like(x)
    mean = x[where].mean()
    std = x[where].std(unbiased=False)
    if std <= 1e-12 * (1 + mean.abs()):
        return torch.zeros_like(x)
    return torch.where(where, (x - mean) / (std + eps), torch.zeros_like(x))


class BatchWhiten(Baseline):
    """REINFORCE++: token returns G_t = sum_{t' >= t} gamma^(t'-t) r_t', whitened over the batch.

    r_t = token_rewards_t (e.g. -beta x k1) plus the sequence reward on the row's last masked
    token, so with gamma = 1, G_t = R + sum_{t' >= t} token_rewards_t'. Discounting counts masked
    token positions only (a hole in the mask is not a step). A = (G - mean) / (std + eps), mean and
    population std over every masked token of valid rows in the batch (a constant batch gives 0).
    Rows with a NaN reward or no token get 0 and do not enter the statistics.
    Returns ``Advantages([B, T])``. Source: Hu 2025, REINFORCE++ (arXiv:2501.03262) Sec. 3."""

    name = "batch_whiten"

    class Params(Baseline.Params):
        gamma: float = Field(1.0, gt=0, le=1, description="discount per token, in (0, 1]")
        eps: float = Field(1e-6, ge=0, description="added to the batch std before dividing (>= 0)")

    @hookimpl
    def baseline(self, rewards, response_mask, token_rewards):
        mask = response_mask.to(torch.bool)
        valid = ~torch.isnan(rewards) & mask.any(-1)
        r = reward_tokens(torch.where(valid, rewards, torch.zeros_like(rewards)), mask, token_rewards)
        ret = torch.zeros_like(r)
        running = torch.zeros(r.shape[0], dtype=torch.float64)
        for t in range(r.shape[1] - 1, -1, -1):
            m = mask[:, t]
            running = torch.where(m, r[:, t] + self.params.gamma * running, running)
            ret[:, t] = torch.where(m, running, torch.zeros_like(running))
        where = mask & valid.unsqueeze(-1)
        adv = whiten(ret, where, self.params.eps)
        dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        return Advantages(adv.to(dtype))


class GAE(Baseline):
    """PPO's generalised advantage estimation with a learned critic.

    Per-token reward r_t = token_rewards_t + the sequence reward on the last masked token;
    delta_t = r_t + gamma V_{t+1} - V_t (V after the last token = 0); A_t = delta_t + gamma lam
    A_{t+1}, over masked tokens only (masked positions are skipped, not steps). ``values [B, T]``:
    V_t is the critic's estimate at the position that predicts token t (aligned with logprobs).
    ``returns`` = A + V *before* whitening (the value targets); ``whiten`` then normalises A over
    every masked token of valid rows (population std). Rows with NaN reward: A = 0, returns = V
    (no target signal). Returns ``Advantages(advantages [B, T], returns [B, T])``.
    ``value_loss`` gives the critic's clipped loss. Sources: Schulman et al. 2016 (arXiv:1506.02438)
    eq. 16; PPO (arXiv:1707.06347) eq. 9; value clipping as in OpenAI baselines / TRL PPO."""

    name = "gae"
    needs_values = True

    class Params(Baseline.Params):
        gamma: float = Field(1.0, gt=0, le=1, description="discount per token, in (0, 1]")
        lam: float = Field(0.95, ge=0, le=1, description="GAE lambda in [0, 1]")
        whiten: bool = Field(True, description="whiten advantages over the batch's tokens")
        value_clip: float | None = Field(0.2, gt=0, description="clip the critic's change around the "
                                         "sampling-time values (> 0); None = no clipping")
        eps: float = Field(1e-6, ge=0, description="added to the std when whitening (>= 0)")

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
        if self.params.whiten:
            adv = whiten(adv, keep, self.params.eps)
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


COMPONENTS = (GroupNorm, GroupMean, LeaveOneOut, BatchWhiten, GAE)
