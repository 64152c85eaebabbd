"""The hook reference: every extension point of one policy-gradient step.

This module and the slot base classes of :mod:`policyzoo.slots` (what the step reads from a
component of each slot: its declared parameters and attributes) are the whole contract.
``docs/hooks.md`` is checked against both by a test. Every hook result is checked at the boundary
(:mod:`policyzoo.boundary`): a wrong type or shape is an error naming the component.

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

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import pluggy
from torch import Tensor

if TYPE_CHECKING:  # annotations only (these modules import this one)
    from .batch import Rollout
    from .components import Bundle
    from .policy import Policy
    from .slots import Env

PROJECT = "policyzoo"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: slot name -> call type. The order is the order of one step.
SLOTS: dict[str, str] = {
    "sample": "single",
    "env": "optional",
    "reward": "collect",
    "filter": "collect",
    "kl": "optional",
    "baseline": "single",
    "ratio": "single",
    "clip": "single",
    "reduce": "single",
}


# ----------------------------------------------------------------------------- result types
@dataclass
class Keep:
    """What a ``filter`` returns. ``keep [B]`` bool (False drops the row from the step, order
    kept) or ``[B, T]`` bool (False removes those tokens from ``response_mask``).
    ``reasons`` counts dropped rows (or tokens) per reason, for the metrics."""

    keep: Tensor
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class Advantages:
    """What a ``baseline`` returns: ``advantages [B, T]`` (0 on masked positions) and, for critic
    baselines, ``returns [B, T]`` (the value targets). ``valid [B]`` bool, optional: the rows the
    baseline could score (e.g. ReMax leaves out a row whose greedy response is unscorable); the
    declared whitening (``Baseline.chain``) takes its statistics over these only. None: every row
    with a token and a non-NaN reward."""

    advantages: Tensor
    returns: Tensor | None = None
    valid: Tensor | None = None


@dataclass
class Surrogate:
    """What a ``clip`` returns: the per-token surrogate ``loss [B, T]`` (to minimise, before the
    reduce), and bool masks ``[B, T]`` of tokens whose gradient the clip cut (or capped) on the
    low side (ratio < 1 - eps_low) and the high side (ratio > 1 + eps_high)."""

    loss: Tensor
    clipped_low: Tensor | None = None
    clipped_high: Tensor | None = None


@dataclass
class Importance:
    """What a ``ratio`` may return instead of a bare ``[B, T]`` tensor: the ratio plus a weight on the
    loss, for rollout/trainer mismatch corrections (TRL ``vllm_importance_sampling_correction``,
    verl ``rollout_is``/``rollout_rs``).

    ``ratio [B, T]``: handed to the clip (grad through ``logprobs``), as a bare result would be.
    ``weight [B, T]`` or None: detached (no grad; the boundary refuses one that requires grad),
    multiplied by the step onto the clip's per-token ``loss`` before the KL term and the reduce --
    the TRL/verl placement; 0 removes a token's loss but keeps it in the reduce's normalisers.
    ``truncated`` / ``masked`` ``[B, T]`` bool or None: tokens whose weight was capped / set to 0,
    reported as ``mismatch/truncated_frac`` and ``mismatch/masked_frac``."""

    ratio: Tensor
    weight: Tensor | None = None
    truncated: Tensor | None = None
    masked: Tensor | None = None


@dataclass
class Observation:
    """What :meth:`Episode.step` returns after one model turn.

    ``messages``: chat messages the environment answers with (e.g. ``[{"role": "tool", "content":
    "42"}]``); they are rendered with the model's chat template and appended as environment tokens
    (``response_mask`` False), then the model takes the next turn. ``done``: the episode ends after
    this turn (an empty ``messages`` ends it too). ``reward``: an optional per-turn reward for the
    model turn just taken (placed on its last token, reaching the baseline as ``token_rewards``).
    ``tool_call`` / ``tool_error``: the turn called a tool / the call failed (metrics only)."""

    messages: list[dict] = field(default_factory=list)
    done: bool = False
    reward: float | None = None
    tool_call: bool = False
    tool_error: bool = False


class Episode(ABC):
    """One environment episode, made by an ``env`` component from a data row (the reset). A
    subclass implements :meth:`step` and :meth:`reward` (abstract: one that lacks either cannot be
    made, and the rollout names the env component).

    ``prompt``: the conversation the model starts from (chat messages; default: the row's
    ``prompt``, set by ``__init__``). :meth:`step` is called after every model turn with the turn's
    decoded text and its token ids exactly as sampled; :meth:`reward` once, when the episode has
    ended (by ``done``, the turn budget or the token budget), gives the sequence reward."""

    def __init__(self, row: dict):
        self.row = row
        self.prompt = row["prompt"]

    @abstractmethod
    def step(self, turn_text: str, turn_ids: list[int]) -> Observation:
        """React to one model turn: an :class:`Observation` (messages to append, or ``done``)."""

    @abstractmethod
    def reward(self) -> float:
        """The episode's final (sequence) reward; NaN = unscorable."""


@dataclass(frozen=True)
class StepTotals:
    """Normalisers over the whole optimizer step: all micro-batches and all data-parallel ranks.

    ``tokens``: number of True entries of ``response_mask``; ``sequences``: number of rows with at
    least one such token; ``rows``: every row, those with no token included (TRL's 'grpo' and
    'dr_grpo' normalise by it; None when not counted, then equal to ``sequences``). A reduce divides
    by these, never by a micro-batch's own counts, so the sum of micro-batch losses equals the
    full-batch loss exactly."""

    tokens: int
    sequences: int
    rows: int | None = None


class Collective:
    """Reductions over the data-parallel ranks that share one optimizer step, for statistics that
    span more than one group (batch whitening, a batch std, covariance selection): with them, N
    ranks give exactly what one rank gives with the whole batch. This one-process instance is the
    identity; the engine passes one backed by ``torch.distributed`` (``policyzoo.engine.dist``).

    ``sum(x)``: elementwise sum of ``x`` (same shape on every rank) over the ranks.
    ``gather(x)``: ``x`` of every rank concatenated along dim 0, in rank order (shapes may differ
    in dim 0 only). ``world_size``: the number of ranks; ``rank``: this process's index in that
    order (0 .. world_size - 1), so a rank can find its own rows in a gathered tensor."""

    world_size: int = 1
    rank: int = 0

    def sum(self, x: Tensor) -> Tensor:
        return x

    def gather(self, x: Tensor) -> Tensor:
        return x


#: the one-process :class:`Collective` (identities).
LOCAL = Collective()


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
        Returns: :class:`policyzoo.batch.Rollout` with B = P x G rows and explicit ``group_ids``.
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

    @hookspec(firstresult=True)
    def reduce(self, loss: Tensor, response_mask: Tensor, totals: StepTotals) -> Tensor:
        """single. Per-token loss ``[B, T]`` -> scalar for this micro-batch. ``totals``
        (:class:`StepTotals`) are the whole optimizer step's counts, so summing the micro-batch
        results gives the full-batch loss exactly, whatever the split and the padding width."""
