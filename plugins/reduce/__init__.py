"""``reduce`` components: per-token loss ``[B, T]`` -> the scalar of one micro-batch.

Every reduce divides by :class:`~policyzoo.contract.StepTotals` (counts over the whole optimizer
step: all micro-batches, all ranks), never by the micro-batch's own counts or by the padded width.
So the sum of the micro-batch results is the full-batch loss exactly, for any split and any amount
of right padding. ``loss`` must already be 0 on masked positions (the step guarantees it); the
reduces mask again anyway. With totals of 0 (nothing to train on) the result is 0 x sum, which
keeps the graph and gives zero gradients instead of NaN.

The conventions (l_it the per-token loss, |y_i| row i's token count, N = totals.sequences, the rows
with at least one token; ``empty_rows: count`` makes N = totals.rows, every row, as TRL's 'grpo'
and 'dr_grpo' do -- a row whose tokens were all masked then still counts in the mean):

* ``token_mean``:           sum_it l_it / sum_i |y_i|                    (DAPO eq. 12, PPO)
* ``seq_mean_token_mean``:  1/N sum_i (1/|y_i|) sum_t l_it               (GRPO eq. 3, GSPO)
* ``seq_mean_token_sum``:   1/N sum_i sum_t l_it                         (REINFORCE / RLOO)
* ``token_sum_norm``:       1/(N x C) sum_it l_it, C a configured constant (Dr. GRPO)
* ``token_sum``:            sum_it l_it, no normaliser                   (verl ``token-sum``)

A sequence-level ratio (GSPO) with a reduce that sums tokens (``token_sum``, ``token_sum_norm``)
multiplies each response's term by its length: allowed, with a warning from ``check``.
``seq_mean_token_sum`` with a sequence ratio is LUSPO's rule (arXiv:2602.05261) and stays silent.

Under ``seq_mean_token_mean`` a token of a short answer weighs more than one of a long answer
(1/|y_i|): with the same advantage, a 4-token and an 18-token answer weigh 18/4 = 4.5 to 1 per
token; under ``token_mean`` and ``token_sum_norm`` every token weighs the same (Dr. GRPO Sec. 3.1).
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from pydantic import Field

from policyzoo.contract import Reduce, hookimpl
from policyzoo.errors import ConfigError


def _safe_div(x: torch.Tensor, d: float) -> torch.Tensor:
    return x / d if d > 0 else x * 0.0


class _Reduce(Reduce):
    #: warn when a sequence-level ratio meets this token-sum reduce (False: the pairing is a named rule)
    warns_with_sequence_ratio = True

    def check(self, run) -> None:
        ratio = run.ratio
        if ratio.level == "sequence" and not self.averages_per_sequence and self.warns_with_sequence_ratio:
            warnings.warn(
                f"algorithm.reduce ({self.name}): the sequence-level ratio {ratio.name!r} gives every token of a "
                f"response the same ratio s_i, and '{self.name}' sums the loss over the response's tokens, so each "
                "response's term is multiplied by its length |y_i| (long responses weigh more; `token_mean` "
                "weighs rows by length the same way). GSPO's per-sequence objective (arXiv:2507.18071 eq. 5) "
                "is `reduce: seq_mean_token_mean`; length weighting on purpose is LUSPO "
                "(`reduce: seq_mean_token_sum`, bundle `luspo`).", UserWarning, stacklevel=2)


class _PerRow(_Reduce):
    """A reduce that averages over rows: N = ``totals.sequences`` or, with ``empty_rows: count``,
    ``totals.rows`` (``sequences`` when a hand-built ``StepTotals`` did not count rows)."""

    class Params(Reduce.Params):
        empty_rows: Literal["skip", "count"] = Field(
            "skip", description="rows with no token: left out of the row count N ('skip') or counted "
                                "('count', TRL loss_type grpo/dr_grpo)")

    def rows(self, totals) -> int:
        if self.params.empty_rows == "count" and totals.rows is not None:
            return totals.rows
        return totals.sequences


class TokenMean(_Reduce):
    """sum over every masked token of the step / ``totals.tokens``. Scalar, units of the loss.
    Each token weighs the same regardless of its response's length. Source: DAPO (Yu et al. 2025,
    arXiv:2503.14476) eq. 12 ("token-level policy gradient loss")."""

    name = "token_mean"

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        return _safe_div(torch.where(response_mask, loss, torch.zeros_like(loss)).sum(), totals.tokens)


class SeqMeanTokenMean(_PerRow):
    """Mean over each row's masked tokens, then summed over rows / ``totals.sequences``.
    Rows with no token contribute 0 (and are not counted in ``totals.sequences``; with
    ``empty_rows: count`` they are, as TRL's ``loss_type="grpo"``).
    Source: GRPO, Shao et al. 2024 (arXiv:2402.03300) eq. 3: 1/G sum_i 1/|o_i| sum_t."""

    name = "seq_mean_token_mean"

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        per_row = torch.where(response_mask, loss, torch.zeros_like(loss)).sum(-1)
        n = response_mask.sum(-1).clamp(min=1).to(per_row.dtype)
        return _safe_div((per_row / n).sum(), self.rows(totals))


class SeqMeanTokenSum(_PerRow):
    """Sum over each row's masked tokens (the sequence log-prob term), summed over rows /
    ``totals.sequences``. Source: RLOO, Ahmadian et al. 2024 (arXiv:2402.14740) eq. 6, where the
    REINFORCE term is A_i x grad log pi(y_i) = A_i x sum_t grad log pi(y_it)."""

    name = "seq_mean_token_sum"
    averages_per_sequence = False
    warns_with_sequence_ratio = False  # with a sequence ratio this is LUSPO's rule (arXiv:2602.05261)

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        return _safe_div(torch.where(response_mask, loss, torch.zeros_like(loss)).sum(), self.rows(totals))


class TokenSumNorm(_PerRow):
    """sum over every masked token / (``constant`` x ``totals.sequences``).

    ``constant`` None -> the run's L_max (``sample.max_tokens``; with an env its
    ``max_total_tokens``), resolved in ``check``, never the padded width of the batch (which
    changes with the longest response of each batch and would reintroduce a length-dependent
    scale). Source: Dr. GRPO, Liu et al. 2025 (arXiv:2503.20783)
    Sec. 3.2 (masked sum divided by the generation budget, then mean over responses).
    Errors: :class:`ConfigError` when ``constant`` is None and the sampler has no ``max_tokens``."""

    name = "token_sum_norm"
    averages_per_sequence = False

    class Params(_PerRow.Params):
        constant: float | None = Field(None, gt=0, description="normalising constant C (> 0); None = the "
                                       "run's sample.max_tokens")

    def __init__(self, **params):
        super().__init__(**params)
        self.constant = self.params.constant

    def check(self, run) -> None:
        super().check(run)
        if self.params.constant is None:
            max_tokens = run.max_response_tokens
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
        return _safe_div(total, self.constant * self.rows(totals))


class TokenSum(_Reduce):
    """sum over every masked token of the step, no normaliser: the gradient grows with the number of
    tokens in the batch (scale the learning rate accordingly). Exact under micro-batching and
    across ranks by construction (a sum of sums). Source: verl ``loss_agg_mode: token-sum`` (which
    multiplies by the data-parallel size because DDP averages gradients; our engine scales every
    rank's loss the same way, so the value here is the plain sum)."""

    name = "token_sum"
    averages_per_sequence = False

    @hookimpl
    def reduce(self, loss, response_mask, totals):
        return torch.where(response_mask, loss, torch.zeros_like(loss)).sum()


COMPONENTS = (TokenMean, SeqMeanTokenMean, SeqMeanTokenSum, TokenSumNorm, TokenSum)
