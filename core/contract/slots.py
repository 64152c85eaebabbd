"""The slot base classes: with :mod:`policyzoo.contract`, the whole component contract.

Every component derives from the base class of its slot. The base declares, typed, everything the
step or the engine reads from a component of that slot -- parameters (in its ``Params``) and class
attributes -- and the hook method's signature. The catalog refuses a component that does not
derive from its slot's base, whose ``Params`` does not extend the base's ``Params``, or that does
not implement the hook method; nothing in the step reads a name that is not declared here.

==========  ==========================================  =========================================
slot        declared (read by the step / engine)        hook method -> result
==========  ==========================================  =========================================
sample      ``n`` (G), ``max_tokens``, ``greedy``       ``sample(policy, prompts, seed, env)``
                                                        -> Rollout
env         ``max_turns``, ``max_total_tokens``         ``env(row)`` -> Episode
reward      ``weight``; ``label`` (metric key)          ``reward(rollout)`` -> ``[B]`` float
filter      ``resample``, ``max_sample_rounds``         ``filter(rollout, rewards)`` -> Keep
kl          ``beta`` (accessor), ``placement``          ``kl(logprobs, ref_logprobs, response_mask, ratio)``
baseline    ``whiten*`` parameters, ``chain()``,        ``baseline(rewards, group_ids, ...)``
            ``needs_values``, ``needs_pi_squared``,     -> Advantages
            ``value_loss()``,
            ``zero_std_fraction()``
ratio       ``level`` ("token" / "sequence")            ``ratio(logprobs, old_logprobs, ...)``
                                                        -> ``[B, T]`` or Importance
clip        --                                          ``clip(ratio, advantages, ...)`` -> Surrogate
term        ``coef`` (accessor), ``needs_entropy``      ``term(logprobs, entropy, ...)`` -> ``[B, T]``
reduce      ``averages_per_sequence``                   ``reduce(loss, response_mask, totals)``
==========  ==========================================  =========================================

A hook method may declare any subset of its spec's arguments (pluggy passes only those). Writing
``@hookimpl`` on it is optional: a subclass's hook method is marked when the class is created.
Every component may keep state (:meth:`~policyzoo.contract.Component.update`, ``state_dict``,
``load_state_dict``); an accessor such as ``KL.beta`` is what the step reads, so a controller
overrides it to read its state.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from .batch import Rollout
from .components import Component
from .ground import LOCAL, Advantages, Collective, Episode, Importance, Keep, StepTotals, Surrogate
from .stats import whiten


class Sample(Component):
    """Base of ``sample`` components: P prompt rows -> a Rollout of B = P x ``n`` rows.

    Declared parameters: ``n`` (samples per prompt G, >= 1), ``max_tokens`` (the response
    token limit L_max, >= 1, EOS included) and ``greedy`` (also one greedy response per prompt,
    marked True in ``Rollout.greedy``: the step rewards it, passes its reward to the baseline as
    ``greedy_rewards`` -- ReMax's baseline -- and drops it before the filters; it is never trained
    on). The engine sizes its context and KV cache from them, and length-based components
    (``overlong_penalty``, ``token_sum_norm``) default to ``max_tokens``. The step checks the
    result: B = P x n rows (P x (n + 1) with ``greedy``), ``[B, T]`` tensors, ``[B]`` ids. With an
    ``env``, ``max_tokens`` bounds each model turn and the env's ``max_total_tokens`` the whole
    trajectory; a sample component that does not take ``env`` cannot run with an env (the run
    refuses to start)."""

    slot = "sample"

    class Params(Component.Params):
        n: int = Field(8, ge=1, description="samples per prompt G (>= 1; group baselines need >= 2)")
        max_tokens: int = Field(256, ge=1, description="response token limit L_max (>= 1)")
        greedy: bool = Field(False, description="also one greedy response per prompt, whose reward is the "
                             "baseline's greedy_rewards (ReMax); never trained on")

    @abstractmethod
    def sample(self, policy, prompts: list[dict], seed: int, env: Env | None) -> Rollout:
        """Generate ``n`` responses (or episodes of ``env``) for each of ``prompts`` (see hookspecs)."""


class Env(Component):
    """Base of ``env`` components: multi-turn episodes (tool use) driven by the ``sample`` component.

    Declared parameters: ``max_turns`` (the turn budget: model turns per episode, >= 1) and
    ``max_total_tokens`` (the token budget: model plus environment tokens after the prompt, >= 1;
    the engine sizes its context from it). An episode that is still going when either runs out
    ends as truncated (metrics ``env_truncated_turns_frac`` / ``env_truncated_tokens_frac``).
    The hook method ``env(row)`` is the reset: it returns a
    :class:`~policyzoo.contract.Episode` whose ``step(turn_text, turn_ids)`` answers each model
    turn with an :class:`~policyzoo.contract.Observation` and whose ``reward()`` is the
    sequence reward, read by the ``env_reward`` reward component.
    Failures (``on_error``, ``step_timeout``): see :mod:`policyzoo.step.episodes` (metrics
    ``env_error_frac``, ``env_timeout_frac``)."""

    slot = "env"

    class Params(Component.Params):
        max_turns: int = Field(4, ge=1, description="turn budget: model turns per episode (>= 1)")
        max_total_tokens: int = Field(512, ge=1, description="token budget: model + environment tokens "
                                      "after the prompt (>= 1)")
        on_error: str = Field("stop", pattern=r"^(stop|drop_group|retry\([1-9][0-9]?\))$",
                              description="when Episode.step raises or times out: stop (the run stops with the "
                              "error), retry(k) (call step again with the same turn, up to k times, then stop), "
                              "drop_group (end the episode and drop its whole group from the step)")
        step_timeout: float | None = Field(None, gt=0, description="seconds one Episode.step call may take "
                                           "(None: no limit); a call over it counts as a failure (on_error)")

    @abstractmethod
    def env(self, row: dict) -> Episode:
        """Start one episode from the data row ``row`` (see hookspecs)."""

    def task_rows(self, data) -> tuple[list[dict], list[dict]] | None:
        """An environment that brings its own data set (``verifiers``) returns ``(training rows,
        held-out rows)`` -- dicts with ``prompt`` (chat messages) and its other columns -- which
        replace the ``data:`` task (``data`` is the run's ``DataSettings``: ``eval_size``, ``seed``);
        None (the default): the run's ``data:`` task."""
        return None


class Reward(Component):
    """Base of ``reward`` components: rollout -> ``rewards [B]`` float, NaN = unscorable.

    Declared parameter: ``weight`` (the step sums ``weight x rewards`` over components).
    ``label``: the key of this component's metric ``reward/<label>`` (default its name; two
    components with the same label get ``_2``, ``_3`` ... in config order). The step checks the
    result right after the call: one float per row, shape ``[B]``."""

    slot = "reward"

    class Params(Component.Params):
        weight: float = Field(1.0, description="multiplier of this reward in the weighted sum")

    @property
    def label(self) -> str:
        return self.name

    @abstractmethod
    def reward(self, rollout: Rollout) -> Tensor:
        """Score each row of ``rollout``: ``[B]`` float (NaN = unscorable)."""


class Filter(Component):
    """Base of ``filter`` components: -> :class:`~policyzoo.contract.Keep` (``[B]`` or ``[B, T]``).

    Declared parameters: ``resample`` (True: the step samples again until the batch is full --
    dynamic sampling) and ``max_sample_rounds`` (that budget, in rounds of P prompts; the largest
    budget among resampling filters applies unless ``train.max_sample_rounds`` is set)."""

    slot = "filter"

    class Params(Component.Params):
        resample: bool = Field(False, description="refill the batch by sampling again (dynamic sampling)")
        max_sample_rounds: int = Field(3, ge=1, description="with resample: sampling rounds of P prompts "
                                       "at most per step (>= 1); train.max_sample_rounds overrides it")

    @abstractmethod
    def filter(self, rollout: Rollout, rewards: Tensor) -> Keep:
        """Which rows (``[B]``) or tokens (``[B, T]``) stay in the step."""



# ----------------------------------------------------------------------------- the loss side
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


#: slot -> its base class (the catalog checks every component against it).
BASES: dict[str, type[Component]] = {cls.slot: cls for cls in (Sample, Env, Reward, Filter, KL, Baseline, Ratio,
                                                                Clip, Term, Reduce)}

__all__ = ["BASES", "Baseline", "Clip", "Env", "Filter", "KL", "Ratio", "Reduce", "Reward", "Sample", "Term"]
