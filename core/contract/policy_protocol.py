"""What the training step needs from an engine: the :class:`Policy` protocol, and
:class:`TokenPolicy`, what an engine that drives environments adds to it.

The real engine (vLLM rollout + DeepSpeed trainer, ``policyzoo.engine``) and the bandit test bed
(``policyzoo.testing.bandit``) both implement it, so every bundle's dynamics are tested on the same step
code that trains a language model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

from .batch import Rollout
from .ground import Collective, StepTotals

#: the keyword sampling options of ``Policy.generate`` and the value that means "off". An engine names
#: the ones it honours in ``sampling_options``; a sample component passes only options that are set
#: (not "off") and refuses, before sampling, one the engine does not name.
SAMPLING_OPTIONS: dict[str, object] = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                                       "stop": ()}


@dataclass
class Generated:
    """One continuation from ``generate_tokens``: the sampled token ``ids`` (EOS included when
    generated), their sampler ``logprobs`` (nats, same convention as ``rollout_logprobs``), the
    decoded ``text`` (special tokens skipped) and ``stopped`` (True: ended by EOS; False: hit its
    token limit)."""

    ids: list[int]
    logprobs: list[float]
    text: str
    stopped: bool


@runtime_checkable
class Policy(Protocol):
    """What the step needs from an engine.

    Engines that drive environments (an ``env`` in the run) are also a :class:`TokenPolicy`; the
    bandit test bed has no tokens and is not."""

    #: reductions over the data-parallel ranks (``policyzoo.contract.LOCAL`` for one process)
    collective: Collective
    #: the keys of :data:`SAMPLING_OPTIONS` that ``generate`` honours (empty: temperature only)
    sampling_options: frozenset[str]

    def generate(self, prompts: list[dict], n: int, max_tokens: int, temperature: float,
                 seed: int, **options) -> Rollout:
        """Sample ``n`` responses for each prompt row (B = len(prompts) x n rows, grouped by
        ``group_ids``, prompt-major), with the sampler's per-token ``rollout_logprobs``.
        ``temperature`` 0 means greedy decoding (the baseline response of ReMax). ``options``:
        keyword sampling options among ``sampling_options`` (see :data:`SAMPLING_OPTIONS`)."""

    def logprobs(self, rollout: Rollout, *, grad: bool, entropy: bool = False,
                 entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """Trainer log-probs ``[B, T]`` of the response tokens (token t scored from the logits at
        position t-1, divided by ``rollout.temperature``), and the per-token entropy ``[B, T]``
        of that distribution when ``entropy`` is True (else None). With ``grad`` the log-probs are
        attached to the trainable weights; the entropy too only with ``entropy_grad`` (asked, and
        passed, only when a ``term`` component ``needs_entropy``: its graph costs a [B, T, V]
        softmax kept for backward)."""

    def ref_logprobs(self, rollout: Rollout) -> Tensor:
        """Log-probs ``[B, T]`` of the frozen reference model (only called when ``kl`` is set)."""

    def sum_pi_squared(self, rollout: Rollout) -> Tensor:
        """``[B, T]`` (no grad): sum over the vocabulary of pi(v)^2 at each response position, pi the
        trainer's next-token distribution at the sampling temperature; 0 where ``response_mask`` is
        False. Only called when the baseline ``needs_pi_squared`` (the optimal token baseline)."""

    def values(self, rollout: Rollout, *, grad: bool) -> Tensor:
        """Critic values ``[B, T]`` (only called when the baseline ``needs_values``)."""

    def backward(self, loss: Tensor, value_loss: Tensor | None = None) -> None:
        """Accumulate gradients of one micro-batch's loss (and the critic's value loss)."""

    def optimizer_step(self, skip: bool = False) -> dict:
        """Apply accumulated gradients, zero them; returns metrics (e.g. ``grad_norm``).
        With ``skip`` (the step found a non-finite reward, log-prob or loss) discard the
        accumulated gradients and leave weights and optimizer state unchanged. Must also refuse
        to write weights if any gradient is non-finite (returns ``{"skipped": 1}`` then)."""

    def sync(self) -> dict:
        """Push trained weights into the rollout engine; returns timing/check metrics."""

    def reduce_totals(self, totals: StepTotals) -> StepTotals:
        """The optimizer step's :class:`~policyzoo.contract.StepTotals` summed over every
        data-parallel rank (a one-process engine returns ``totals`` unchanged)."""


@runtime_checkable
class TokenPolicy(Protocol):
    """What an engine adds to :class:`Policy` to drive environments (multi-turn episodes): it
    continues token ids. ``tokenizer``: a transformers tokenizer with a chat template;
    ``pad_token_id``: the id that pads responses. ``run_episodes`` is the step's token-exact episode
    loop bound to the engine (an engine gets it by deriving from
    :class:`policyzoo.step.episodes.DrivesEpisodes`)."""

    @property
    def tokenizer(self): ...

    @property
    def pad_token_id(self) -> int: ...

    def generate_tokens(self, contexts: list[list[int]], max_tokens: list[int], temperature: float,
                        seeds: list[int], top_p: float = 1.0, **options) -> list[Generated]:
        """One continuation of each token-id context (``contexts[i]``, a list of ids, continued for
        at most ``max_tokens[i]`` tokens with seed ``seeds[i]``), all contexts in one batched call;
        temperature 0 = greedy. ``options``: keyword sampling options among ``sampling_options``
        (an engine that names an option there honours it here too)."""

    def run_episodes(self, env, rows: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                     top_p: float = 1.0, **options) -> Rollout:
        """``n`` episodes of the ``env`` component per row, token-exact, as one Rollout of
        B = len(rows) x n rows (:func:`policyzoo.step.episodes.run_episodes` on this engine)."""
