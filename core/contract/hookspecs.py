"""The hook reference: every extension point of one policy-gradient step.

This module (the roof of :mod:`policyzoo.contract`) and the slot base classes of
:mod:`policyzoo.contract.slots` (what the step reads from a
component of each slot: its declared parameters and attributes) are the whole contract.
``docs/hooks.md`` is checked against both by a test. Every hook result is checked at the boundary
(:mod:`policyzoo.step.boundary`): a wrong type or shape is an error naming the component.

Conventions for every step hook
-------------------------------
* Shapes: B rows = P prompts x G samples, T response tokens. Per-token tensors are ``[B, T]``,
  per-sequence tensors ``[B]``; a sequence-level quantity used per token is broadcast over T.
* ``response_mask [B, T]`` (bool) is True on generated tokens that count. Values at masked-out
  positions are ignored by every consumer and must not carry gradient into the loss.
* Log-probabilities are natural-log, per token, of the sampled token (``logprobs`` = current
  policy with grad; ``old_logprobs`` = trainer at sampling time; ``rollout_logprobs`` = the
  sampling engine's; ``ref_logprobs`` = frozen reference model).
* Losses are to be minimised. Advantages are "higher is better".
* Implementations may accept any subset of a spec's arguments (pluggy passes only the names an
  implementation declares), so adding an argument to a spec never breaks a plugin.

Call types
----------
* **single**: exactly one component fills the slot in a run. The run manager refuses to start
  otherwise. Declared ``firstresult``.
* **optional** (single): at most one component (``kl`` absent: no reference model is loaded;
  ``env`` absent: one single-turn completion per sample). Declared ``firstresult``.
* **collect**: zero or more components; results combine as stated on the hook (weighted sum of
  rewards; logical AND of keep masks).
* **register**: called once per process on the catalog manager to add named components/bundles.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from .batch import Rollout
from .components import Bundle
from .ground import Advantages, Collective, Episode, Importance, Keep, StepTotals, Surrogate, hookspec
from .policy_protocol import Policy
from .slots import Env


class Spec:
    """Hook specifications (the methods' bodies are empty on purpose)."""

    # ------------------------------------------------------------------ registration hooks
    @hookspec
    def register_components(self, register: Callable[[type], None]) -> None:
        """Add named components to the catalog. Call ``register(ComponentClass)`` once per class.

        A name already taken in the same slot raises :class:`policyzoo.PluginError` naming both
        sources; nothing is overwritten."""

    @hookspec
    def register_bundles(self, register: Callable[[Bundle], None]) -> None:
        """Add algorithm bundles. Call ``register(bundle)`` with a :class:`policyzoo.Bundle`.
        Bundle names share one namespace; duplicates fail like components."""

    # ------------------------------------------------------------------ step hooks
    @hookspec(firstresult=True)
    def sample(self, policy: Policy, prompts: list[dict], seed: int, env: Env | None) -> Rollout:
        """single. Generate G responses (single-turn) or G episodes (with an ``env``) per prompt.

        Args: ``policy`` (an engine exposing ``generate``; with an env also ``generate_tokens``),
        ``prompts`` (P data rows, each a dict with at least ``prompt``), ``seed`` (int, for
        reproducible sampling), ``env`` (the run's ``env`` component, or None: single-turn).
        Returns: :class:`policyzoo.contract.Rollout` with B = P x G rows and explicit ``group_ids``.
        G is the component's ``n`` (1 for PPO and REINFORCE++). With the component's ``greedy``,
        P more rows (one greedy response per prompt, same group id) marked in ``Rollout.greedy``.
        With an env the response is the whole trajectory after the prompt -- model tokens and
        environment tokens exactly as generated -- with ``response_mask`` False and
        ``rollout_logprobs`` 0 on environment tokens, and the episode fields of the Rollout set
        (``env_rewards``, ``turn_rewards``, ``turns``...)."""

    @hookspec(firstresult=True)
    def env(self, row: dict) -> Episode:
        """optional single. Reset: start one :class:`Episode` from a data row. The sampler calls it
        once per sample (G times per prompt), then drives the episodes turn by turn, the turns of
        all episodes batched together, within the component's ``max_turns`` and
        ``max_total_tokens``. Absent: every sample is one single-turn completion."""

    @hookspec
    def reward(self, rollout: Rollout) -> Tensor:
        """collect. Score each row: returns ``rewards [B]`` float.

        The step sums the components' results, each times its ``weight`` parameter. NaN means
        "unscorable": the row is excluded from baseline statistics and gets advantage 0 (a NaN in
        any component makes the sum NaN)."""

    @hookspec
    def filter(self, rollout: Rollout, rewards: Tensor) -> Keep:
        """collect. Returns :class:`Keep`. Row masks ``[B]`` of all filters are ANDed; a row
        dropped by any filter leaves the step; rows are never reordered. A filter whose
        ``resample`` parameter is True makes the step sample again until the batch is full
        (dynamic sampling), up to the filter's own ``max_sample_rounds`` rounds (``train.max_sample_rounds``
        overrides it)."""

    @hookspec(firstresult=True)
    def kl(self, logprobs: Tensor, ref_logprobs: Tensor, response_mask: Tensor, ratio: Tensor) -> Tensor:
        """optional single. Per-token KL estimate ``[B, T]`` of the policy from the reference
        (k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) - 1 + log r with log r = logprobs -
        ref_logprobs; Schulman 2020). ``ratio [B, T]``: the ratio slot's importance ratio of this
        micro-batch (with grad) in ``loss`` placement, ones in ``reward`` placement (sampling time);
        for estimators weighted by the ratio (TRL ``use_bias_correction_kl``). The component's ``beta``
        and ``placement`` decide its use: ``reward`` subtracts beta x KL from per-token rewards at
        sampling time (no grad); ``loss`` adds beta x KL to the per-token loss. Absent: no reference
        model is loaded."""

    @hookspec(firstresult=True)
    def baseline(self, rewards: Tensor, group_ids: Tensor, response_mask: Tensor, token_rewards: Tensor,
                 values: Tensor | None, collective: Collective, reward_components: Tensor,
                 reward_weights: Tensor, greedy_rewards: Tensor, old_logprobs: Tensor,
                 sum_pi_squared: Tensor | None) -> Advantages:
        """single. Returns :class:`Advantages` ``[B, T]``.

        Args: ``rewards [B]`` (sequence rewards, NaN = unscorable), ``group_ids [B]``,
        ``response_mask [B, T]``, ``token_rewards [B, T]`` (per-token rewards such as a KL
        penalty in reward placement; zeros if none), ``values [B, T]`` (critic values, or None),
        ``collective`` (:class:`Collective`: statistics over more than one group must be reduced
        over the data-parallel ranks with it, so N ranks equal one), ``reward_components [B, K]``
        (each of the K reward components' own values before weighting, NaN where that component
        could not score the row; ``rewards`` is their weighted sum) and ``reward_weights [K]`` (their
        ``weight`` parameters), for baselines that normalise each reward separately (GDPO), and
        ``greedy_rewards [B]`` (the reward of the greedy response to the row's prompt when the
        sample component's ``greedy`` is set -- ReMax's baseline --, NaN otherwise),
        ``old_logprobs [B, T]`` (the trainer's log-probs at sampling time when the step scored
        them, else the sampler's ``rollout_logprobs``) and ``sum_pi_squared [B, T]`` (sum over the
        vocabulary of pi^2 per position, when the component ``needs_pi_squared``; else None).
        Rows with no trainable token and rows with NaN reward do not enter any statistic and get
        advantage 0."""

    @hookspec(firstresult=True)
    def ratio(self, logprobs: Tensor, old_logprobs: Tensor, rollout_logprobs: Tensor,
              response_mask: Tensor, advantages: Tensor) -> Tensor | Importance:
        """single. Importance ratio ``[B, T]`` between the current and the sampling policy
        (per token, or a sequence-level ratio broadcast over T), or an :class:`Importance` that
        also carries a detached ``weight [B, T]`` for the clip's per-token loss. Must be exactly 1
        (ratio and weight) where ``logprobs == old_logprobs == rollout_logprobs`` (a component that
        also corrects the sampler/trainer mismatch, e.g. truncated IS, weighs by pi_old /
        pi_rollout, so it is 1 only where all three agree). Gradient flows through ``logprobs``.
        ``advantages [B, T]`` (constants) are there for rules that depend on their sign
        (off-policy sequence masking)."""

    @hookspec(firstresult=True)
    def clip(self, ratio: Tensor, advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor,
             response_mask: Tensor, collective: Collective) -> Surrogate:
        """single. Per-token surrogate loss (to minimise): returns :class:`Surrogate`.
        ``collective`` reduces statistics that span rows (e.g. covariance selection) over the
        data-parallel ranks (:class:`Collective`)."""

    @hookspec
    def term(self, logprobs: Tensor, entropy: Tensor | None, ref_logprobs: Tensor | None, ratio: Tensor,
             advantages: Tensor, response_mask: Tensor) -> Tensor:
        """collect. An additive per-token loss term ``[B, T]`` (unscaled, to minimise, 0 where masked).

        The step adds each component's ``coef x term`` to the per-token loss, after the clip's loss
        (times the ratio's weight) and the KL in loss placement, before the reduce. Args:
        ``logprobs [B, T]`` (with grad), ``entropy [B, T]`` (the trainer's per-token entropy in nats,
        with grad, when the component ``needs_entropy``; else None), ``ref_logprobs [B, T]`` (when a
        ``kl`` component or a term that ``needs_ref`` loads the reference -- the teacher with
        ``model.teacher``; else None), ``ratio [B, T]`` (the ratio slot's, with
        grad), ``advantages [B, T]`` (constants), ``response_mask [B, T]``."""

    @hookspec(firstresult=True)
    def reduce(self, loss: Tensor, response_mask: Tensor, totals: StepTotals) -> Tensor:
        """single. Per-token loss ``[B, T]`` -> scalar for this micro-batch. ``totals``
        (:class:`StepTotals`) are the whole optimizer step's counts, so summing the micro-batch
        results gives the full-batch loss exactly, whatever the split and the padding width."""
