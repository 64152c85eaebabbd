"""``ratio`` components: the importance ratio between the current and the sampling policy.

Both return ``[B, T]`` float with gradient through ``logprobs`` (``old_logprobs`` are constants),
exactly 1 where ``logprobs == old_logprobs`` and 1 on masked positions. The log-ratio is clamped
*before* ``exp`` so no ratio is ever inf; where the clamp is active the gradient is 0 (such a
token is far outside any clip range anyway).
"""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Ratio, hookimpl


class Token(Ratio):
    """Per-token ratio r_t = exp(clamp(logprobs - old_logprobs, -20, 20)), ``[B, T]``.

    The clamp (exp(20) ~ 4.9e8) only guards against inf; any clip range acts long before.
    Source: Schulman et al. 2017, PPO (arXiv:1707.06347) eq. 6."""

    name = "token"

    class Params(Ratio.Params):
        max_log_ratio: float = Field(20.0, gt=0, description="|log r| clamp before exp (> 0)")

    @hookimpl
    def ratio(self, logprobs, old_logprobs, response_mask):
        m = self.params.max_log_ratio
        log_r = torch.where(response_mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
        return torch.exp(log_r.clamp(-m, m))


class Sequence(Ratio):
    """GSPO sequence ratio s_i = exp(clamp(mean_t log r_it, +-max_log_ratio)), broadcast to ``[B, T]``.

    The mean is over row i's masked tokens (|y_i| of them): s_i is the geometric mean of the token
    ratios, i.e. (pi(y_i)/pi_old(y_i))^(1/|y_i|). Clamped before exp (default +-10, exp(10) ~ 2.2e4)
    so log-ratios of +-50 give a finite loss and gradient. Rows with no masked token get s = 1.
    Gradient flows to every token of the row through the mean (each token receives
    s_i x A_i / |y_i| x grad log pi, as in GSPO's gradient analysis); where the clamp is active
    the row gets no gradient. Pair it with a reduce that averages per sequence
    (``seq_mean_token_mean``); token-sum reduces warn in their ``check`` (``seq_mean_token_sum`` is
    LUSPO's rule and stays silent).
    Source: Zheng et al. 2025, GSPO (arXiv:2507.18071) eq. 7."""

    name = "sequence"
    level = "sequence"

    class Params(Ratio.Params):
        max_log_ratio: float = Field(10.0, gt=0, description="|mean log r| clamp before exp (> 0)")

    @hookimpl
    def ratio(self, logprobs, old_logprobs, response_mask):
        m = self.params.max_log_ratio
        maskf = response_mask.to(logprobs.dtype)
        log_r = torch.where(response_mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
        n = maskf.sum(-1).clamp(min=1.0)
        seq = (log_r.sum(-1) / n).clamp(-m, m)  # rows with no token: 0 / 1 = 0 -> ratio 1
        return torch.exp(seq).unsqueeze(-1).expand_as(logprobs)


class GSPOToken(Sequence):
    """GSPO-token: s_it = sg(s_i) x pi(y_it) / sg(pi(y_it)), ``[B, T]``; s_i the ``sequence`` ratio.

    In log space log s_it = sg(clamp(mean_t log r_it, +-max_log_ratio)) + logprobs_t - sg(logprobs_t):
    every token's *value* is the sequence ratio s_i (so a clip acts on whole responses, as GSPO),
    but token t's gradient is s_i x grad log pi_t alone, not s_i / |y_i| x sum_t' grad log pi_t'.
    With an advantage constant over the response and ``seq_mean_token_mean`` both ratios give the
    same gradient; when advantages vary per token (a critic, a per-token KL in the reward) GSPO-token
    weights each token by its own A_it while ``sequence`` spreads the row's mean advantage over all
    its tokens. Where the clamp is active the row gets no gradient (as ``sequence``); rows with no
    token get 1. Source: Zheng et al. 2025, GSPO (arXiv:2507.18071) eq. 13-14; verl
    ``policy_loss.loss_mode: gspo`` (which clamps only from above, after adding the token term)."""

    name = "gspo_token"  # level and Params (max_log_ratio, default 10) are the sequence ratio's

    @hookimpl
    def ratio(self, logprobs, old_logprobs, response_mask):
        m = self.params.max_log_ratio
        zero = torch.zeros_like(logprobs)
        log_r = torch.where(response_mask, logprobs - old_logprobs, zero).detach()
        seq = (log_r.sum(-1) / response_mask.sum(-1).clamp(min=1)).unsqueeze(-1)
        inside = seq.abs() <= m
        token = torch.where(response_mask & inside, logprobs - logprobs.detach(), zero)
        return torch.exp(seq.clamp(-m, m) + token)


COMPONENTS = (Token, Sequence, GSPOToken)
