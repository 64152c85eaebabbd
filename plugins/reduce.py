"""``reduce`` components: per-token loss ``[B, T]`` -> the scalar of one micro-batch.

Every reduce divides by :class:`~policyzoo.hookspecs.StepTotals` (counts over the whole optimizer
step: all micro-batches, all ranks), never by the micro-batch's own counts or by the padded width.
So the sum of the micro-batch results is the full-batch loss exactly, for any split and any amount
of right padding. ``loss`` must already be 0 on masked positions (the step guarantees it); the
reduces mask again anyway. With totals of 0 (nothing to train on) the result is 0 x sum, which
keeps the graph and gives zero gradients instead of NaN.

The four conventions (l_it the per-token loss, |y_i| row i's token count, N = totals.sequences):

* ``token_mean``:           sum_it l_it / sum_i |y_i|                    (DAPO eq. 12, PPO)
* ``seq_mean_token_mean``:  1/N sum_i (1/|y_i|) sum_t l_it               (GRPO eq. 3, GSPO)
* ``seq_mean_token_sum``:   1/N sum_i sum_t l_it                         (REINFORCE / RLOO)
* ``token_sum_norm``:       1/(N x C) sum_it l_it, C a configured constant (Dr. GRPO)

Under ``seq_mean_token_mean`` a token of a short answer weighs more than one of a long answer
(1/|y_i|): with the same advantage, a 4-token and an 18-token answer weigh 18/4 = 4.5 to 1 per
token; under ``token_mean`` and ``token_sum_norm`` every token weighs the same (Dr. GRPO Sec. 3.1).
"""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.slots import Reduce
from policyzoo.errors import ConfigError
from policyzoo.hookspecs import hookimpl


def _safe_div(x: torch.Tensor, d: float) -> torch.Tensor:
    return x / d if d > 0 else x * 0.0


class _Reduce(Reduce):

    def check(self, run) -> None:
        ratio = run.ratio
        if ratio.level == "sequence" and not self.averages_per_sequence:
            raise ConfigError(
                f"algorithm.reduce ({self.name})",
                f"the sequence-level ratio {ratio.name!r} (GSPO) gives every token of a response the same "
                f"ratio s_i; '{self.name}' sums the loss over the response's tokens, so each response's "
                "term is multiplied by its length |y_i|: long responses dominate the gradient and GSPO's "
                "per-sequence objective (eq. 5: 1/G sum_i min(s_i A_i, clip(s_i) A_i)) is lost",
                "use `reduce: seq_mean_token_mean` (GSPO's choice) with a sequence ratio, or `ratio: token`")


class TokenMean(_Reduce):
    """sum over every masked token of the step / ``totals.tokens``. Scalar, units of the loss.
    Each token weighs the same regardless of its response's length. Source: DAPO (Yu et al. 2025,
    arXiv:2503.14476) eq. 12 ("token-level policy gradient loss")."""

    name = "token_mean"

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        return _safe_div(torch.where(response_mask, loss, torch.zeros_like(loss)).sum(), totals.tokens)


class SeqMeanTokenMean(_Reduce):
    """Mean over each row's masked tokens, then summed over rows / ``totals.sequences``.
    Rows with no token contribute 0 (and are not counted in ``totals.sequences``).
    Source: GRPO, Shao et al. 2024 (arXiv:2402.03300) eq. 3: 1/G sum_i 1/|o_i| sum_t."""

    name = "seq_mean_token_mean"

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        per_row = torch.where(response_mask, loss, torch.zeros_like(loss)).sum(-1)
        n = response_mask.sum(-1).clamp(min=1).to(per_row.dtype)
        return _safe_div((per_row / n).sum(), totals.sequences)


class SeqMeanTokenSum(_Reduce):
    """Sum over each row's masked tokens (the sequence log-prob term), summed over rows /
    ``totals.sequences``. Source: RLOO, Ahmadian et al. 2024 (arXiv:2402.14740) eq. 6, where the
    REINFORCE term is A_i x grad log pi(y_i) = A_i x sum_t grad log pi(y_it)."""

    name = "seq_mean_token_sum"
    averages_per_sequence = False

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        return _safe_div(torch.where(response_mask, loss, torch.zeros_like(loss)).sum(), totals.sequences)


class TokenSumNorm(_Reduce):
    """sum over every masked token / (``constant`` x ``totals.sequences``).

    ``constant`` None -> the run's ``sample.max_tokens`` (resolved in ``check``), never the
    padded width of the batch (which changes with the longest response of each batch and would
    reintroduce a length-dependent scale). Source: Dr. GRPO, Liu et al. 2025 (arXiv:2503.20783)
    Sec. 3.2 (masked sum divided by the generation budget, then mean over responses).
    Errors: :class:`ConfigError` when ``constant`` is None and the sampler has no ``max_tokens``."""

    name = "token_sum_norm"
    averages_per_sequence = False

    class Params(Reduce.Params):
        constant: float | None = Field(None, gt=0, description="normalising constant C (> 0); None = the "
                                       "run's sample.max_tokens")

    def __init__(self, **params):
        super().__init__(**params)
        self.constant = self.params.constant

    def check(self, run) -> None:
        super().check(run)
        if self.params.constant is None:
            max_tokens = run.sample.params.max_tokens
            if not max_tokens:
                raise ConfigError("algorithm.reduce.constant",
                                  "constant is None and the sampler has no max_tokens to default to",
                                  "set `reduce: {use: token_sum_norm, constant: 1024}` (your response token limit)")
            self.constant = float(max_tokens)

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        if self.constant is None:
            raise ConfigError("algorithm.reduce.constant",
                              "constant is None and was not resolved (the run was not checked)",
                              "build the run with policyzoo.assemble(...) or set `constant`")
        total = torch.where(response_mask, loss, torch.zeros_like(loss)).sum()
        return _safe_div(total, self.constant * totals.sequences)


COMPONENTS = (TokenMean, SeqMeanTokenMean, SeqMeanTokenSum, TokenSumNorm)
