"""The ground of the contract: hook markers, the slot table, the result types hooks return, and
:class:`Collective` (reductions over data-parallel ranks). Imports nothing of policyzoo.

The hook specifications themselves (the roof) are in :mod:`policyzoo.contract.hookspecs`; the
conventions every hook follows are stated there.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import pluggy
from torch import Tensor

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
    "term": "collect",
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
    ended (by ``done``, the turn budget or the token budget), gives the sequence reward.
    ``scores``: optional named scores of the episode (e.g. each function of a verifiers rubric),
    set by the time :meth:`reward` returns; reported as ``env_score/<name>`` means over the sampled
    episodes (an episode ended by a failure has none and counts 0)."""

    def __init__(self, row: dict):
        self.row = row
        self.prompt = row["prompt"]
        self.scores: dict[str, float] = {}

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
    order (0 .. world_size - 1), so a rank can find its own rows in a gathered tensor.
    ``phase(name)``: a context manager naming the phase of the step for the collectives inside it
    (the engine names it in the error of a collective that times out); a no-op here."""

    world_size: int = 1
    rank: int = 0

    def phase(self, name: str):
        return contextlib.nullcontext()

    def sum(self, x: Tensor) -> Tensor:
        return x

    def gather(self, x: Tensor) -> Tensor:
        return x


#: the one-process :class:`Collective` (identities).
LOCAL = Collective()
