"""The slot bases of the loss side (``kl``, ``baseline``, ``ratio``, ``clip``, ``term``, ``reduce``): part of
:mod:`policyzoo.contract.slots`, which holds the sampling side, the table of what each base declares and
``BASES``, and re-exports these (import them from :mod:`policyzoo.contract`)."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from .components import Component
from .ground import LOCAL, Advantages, Collective, Importance, StepTotals, Surrogate
from .stats import whiten


class KL(Component):
    """Base of ``kl`` components: per-token KL estimate ``[B, T]`` (0 where masked).

    Declared parameters: ``beta`` (the initial coefficient, >= 0) and ``placement`` (``reward``:
    -beta x KL is added to the per-token rewards at sampling time, no gradient; ``loss``: +beta x
    KL is added to the per-token loss). The step reads the coefficient through the accessor
    :attr:`beta` (the parameter; a controller such as ``adaptive`` returns its state), so the hook
    returns the unscaled estimate and the ``kl_ref`` metric stays the KL itself."""

    slot = "kl"

    class Params(Component.Params):
        beta: float = Field(0.04, ge=0, description="KL coefficient beta (>= 0)")
        placement: Literal["reward", "loss"] = Field(
            "loss", description="'reward': -beta x KL added to per-token rewards (no grad); "
                                "'loss': +beta x KL added to the per-token loss")

    @property
    def beta(self) -> float:
        """The KL coefficient the step uses this step (default: ``params.beta``)."""
        return float(self.params.beta)

    @abstractmethod
    def kl(self, logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, ratio: Tensor) -> Tensor:
        """Per-token KL of the policy from the reference, ``[B, T]``."""


class Baseline(Component):
    """Base of ``baseline`` components: rewards -> :class:`~policyzoo.contract.Advantages`.

    Declared parameters: ``whiten``, ``whiten_over``, ``whiten_std``, ``whiten_eps`` -- the
    composition: any baseline may be chained with batch whitening over the whole step, which the
    step applies to the hook's result through :meth:`chain` (so a group baseline followed by
    batch whitening is a parameter, not a new component per combination).
    Declared: ``needs_values`` (True: the engine loads a critic, passes ``values [B, T]`` to the
    hook and trains the critic with :meth:`value_loss`, which the component must then implement);
    ``needs_pi_squared`` (True: the step scores the batch once more for ``old_logprobs`` and
    ``sum_pi_squared [B, T]`` -- ``Policy.sum_pi_squared`` -- and passes both to the hook);
    ``std`` and ``zero_std_tol``, the std convention and tolerance by which
    :meth:`zero_std_fraction` counts groups that carry no signal (the ``zero_std_frac`` metric);
    a group baseline sets them from its own parameters so the metric counts what it zeroes."""

    slot = "baseline"
    needs_values: ClassVar[bool] = False
    needs_pi_squared: ClassVar[bool] = False
    std: Literal["sample", "population"] = "sample"
    zero_std_tol: float = 1e-6

    class Params(Component.Params):
        whiten: bool = Field(False, description="then whiten the advantages over the whole step (every rank): "
                             "the chained batch normalisation, e.g. group_mean + whiten = REINFORCE++-baseline")
        whiten_over: Literal["tokens", "rows"] = Field(
            "tokens", description="whiten over every trainable token (verl masked_whiten) or once per row "
                                  "(TRL normalize_then_sum, GDPO)")
        whiten_std: Literal["population", "sample"] = Field(
            "population", description="whitening std: 'population' (divide by n) or 'sample' (n-1, verl/TRL)")
        whiten_eps: float = Field(1e-6, ge=0, description="added to the whitening std (>= 0)")

    @abstractmethod
    def baseline(self, rewards: Tensor, group_ids: Tensor, response_mask: Tensor, token_rewards: Tensor,
                 values: Tensor | None, collective: Collective, reward_components: Tensor,
                 reward_weights: Tensor, greedy_rewards: Tensor, old_logprobs: Tensor,
                 sum_pi_squared: Tensor | None) -> Advantages:
        """Advantages ``[B, T]`` (and returns for a critic)."""

    def chain(self, out: Advantages, rewards: Tensor, response_mask: Tensor,
              collective: Collective = LOCAL) -> Advantages:
        """What the step does with the hook's result: with ``whiten``, the advantages ``[B, T]``
        whitened over the whole step through ``collective`` (:func:`policyzoo.contract.whiten`), over
        every trainable token of the rows with a non-NaN reward (``whiten_over: tokens``; a row
        weighs by its length, as verl's ``masked_whiten``) or once per such row (``rows``: mean and
        std of the rows' mean advantages, applied to every token; TRL's batch step); rows outside
        ``out.valid`` (when given) get 0 and enter no statistic. ``returns`` are kept. Without
        ``whiten``, ``out`` unchanged. A constant batch gives 0."""
        if not self.params.whiten:
            return out
        mask = response_mask.to(torch.bool)
        valid = ~torch.isnan(rewards) & mask.any(-1)
        if out.valid is not None:  # rows the baseline itself left out do not enter the statistics
            valid = valid & out.valid.to(valid.device)
        p = self.params
        adv = out.advantages
        where = mask & valid.unsqueeze(-1)
        of = None
        if p.whiten_over == "rows":
            row = torch.where(where, adv.double(), 0.0).sum(-1) / where.sum(-1).clamp(min=1)
            of = (row, valid)
        white = whiten(adv, where, collective, p.whiten_std, p.whiten_eps, of=of)
        return Advantages(white.to(adv.dtype), out.returns, out.valid)

    def value_loss(self, values: Tensor, old_values: Tensor, returns: Tensor, response_mask: Tensor,
                   totals: StepTotals) -> Tensor:
        """The critic's loss (scalar), for ``needs_values`` baselines; others are never asked."""
        raise TypeError(f"baseline {self.name!r} has needs_values = True but no value_loss()")

    def zero_std_fraction(self, rewards: Tensor, group_ids: Tensor, response_mask: Tensor) -> float:
        """Fraction of groups (of >= 2 valid rows) whose valid rewards have std <= ``zero_std_tol``,
        with the ``std`` convention ("sample": divide by n-1; "population": by n). Valid = reward not
        NaN and at least one token. 0.0 when no group has two valid rows."""
        valid = ~torch.isnan(rewards) & (response_mask.sum(-1) > 0)
        flat = total = 0
        for g in group_ids[valid].unique():
            r = rewards[valid & (group_ids == g)].double()
            if len(r) > 1:  # groups of one (G = 1) have no spread to measure
                total += 1
                flat += int(r.std(unbiased=self.std == "sample") <= self.zero_std_tol)
        return flat / total if total else 0.0


class Ratio(Component):
    """Base of ``ratio`` components: importance ratio ``[B, T]`` (grad through ``logprobs``), or an
    :class:`~policyzoo.contract.Importance` that adds a detached ``weight [B, T]`` which the step
    multiplies onto the clip's per-token loss (rollout/trainer mismatch corrections).

    Declared: ``level`` -- "token" (one ratio per token) or "sequence" (one per row, broadcast over
    T); reduces that sum a sequence-level ratio over tokens check it."""

    slot = "ratio"
    level: ClassVar[Literal["token", "sequence"]] = "token"

    @abstractmethod
    def ratio(self, logprobs: Tensor, old_logprobs: Tensor, rollout_logprobs: Tensor,
              response_mask: Tensor, advantages: Tensor) -> Tensor | Importance:
        """Importance ratio ``[B, T]`` (or an Importance), exactly 1 where the three log-probs agree."""


class Clip(Component):
    """Base of ``clip`` components: ratio and advantages -> :class:`~policyzoo.contract.Surrogate`
    (per-token loss ``[B, T]`` to minimise, and the clip masks for the clip-fraction metrics)."""

    slot = "clip"

    @abstractmethod
    def clip(self, ratio: Tensor, advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor,
             response_mask: Tensor, collective: Collective) -> Surrogate:
        """Per-token surrogate loss ``[B, T]``."""


class Term(Component):
    """Base of ``term`` components (a collect slot): an additive per-token loss term ``[B, T]``,
    0 where masked, with gradient through ``logprobs`` or ``entropy``.

    The step adds ``coef x term`` to the per-token loss of every micro-batch, after the clip's loss
    (times the ratio's weight) and the KL in loss placement (the first additive term), before the
    reduce -- so the term is aggregated by the run's reduce, as verl's ``agg_loss`` does with its
    entropy term. Declared: the parameter ``coef`` (the coefficient; the step reads it through the
    accessor :attr:`coef`, which a controller overrides to read its state) and ``needs_entropy``
    (True: the trainer computes the per-token entropy *with* gradient and passes it as ``entropy``;
    otherwise no component pays for that graph) and ``needs_ref`` (True: the step scores the
    reference -- the teacher with ``model.teacher`` -- and passes its log-probs as ``ref_logprobs``,
    as it does for a ``kl`` component). The metric ``term/<name>`` is the unscaled term's token mean."""

    slot = "term"
    needs_entropy: ClassVar[bool] = False
    needs_ref: ClassVar[bool] = False

    class Params(Component.Params):
        coef: float = Field(0.0, description="coefficient of the term in the loss (the step adds coef x term)")

    @property
    def coef(self) -> float:
        """The coefficient the step uses this step (default: ``params.coef``)."""
        return float(self.params.coef)

    @abstractmethod
    def term(self, logprobs: Tensor, entropy: Tensor | None, ref_logprobs: Tensor | None, ratio: Tensor,
             advantages: Tensor, response_mask: Tensor) -> Tensor:
        """Per-token loss term ``[B, T]`` (unscaled, to minimise), 0 where masked."""


class Reduce(Component):
    """Base of ``reduce`` components: per-token loss ``[B, T]`` -> the micro-batch's scalar.

    Declared: ``averages_per_sequence`` -- False for reduces that sum each row's tokens (a
    sequence-level ratio is then weighted by the row's length)."""

    slot = "reduce"
    averages_per_sequence: ClassVar[bool] = True

    @abstractmethod
    def reduce(self, loss: Tensor, response_mask: Tensor, totals: StepTotals) -> Tensor:
        """Scalar: exact under micro-batching (divide by ``totals``, never by local counts)."""
