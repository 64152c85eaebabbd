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
The loss side's bases (``kl`` ... ``reduce``) are in :mod:`.loss_slots`, re-exported here.
Every component may keep state (:meth:`~policyzoo.contract.Component.update`, ``state_dict``,
``load_state_dict``); an accessor such as ``KL.beta`` is what the step reads, so a controller
overrides it to read its state.
"""

from __future__ import annotations

from abc import abstractmethod

from pydantic import Field
from torch import Tensor

from .batch import Rollout
from .components import Component
from .ground import Episode, Keep
from .loss_slots import KL, Baseline, Clip, Ratio, Reduce, Term


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


#: slot -> its base class (the catalog checks every component against it).
BASES: dict[str, type[Component]] = {cls.slot: cls for cls in (Sample, Env, Reward, Filter, KL, Baseline, Ratio,
                                                                Clip, Term, Reduce)}

__all__ = ["BASES", "Baseline", "Clip", "Env", "Episode", "Filter", "KL", "Ratio", "Reduce", "Reward", "Sample",
           "Term"]
