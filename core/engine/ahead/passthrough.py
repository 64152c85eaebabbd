"""The :class:`~policyzoo.contract.Policy` methods a sampling-ahead wrapper hands to the policy it wraps
unchanged (:class:`PassThrough`).

:class:`~policyzoo.engine.ahead.overlap.OverlapPolicy`, :class:`~policyzoo.engine.ahead.async_sampler.AsyncSampler`
and the recorders their threads sample with change only ``generate`` (and, the first two, ``sync``); every
other method of the protocol is written out here, so a reader grepping ``def logprobs`` finds the path a
wrapped policy takes, and a method added to the protocol without a line here fails
``tests/test_layout.py::test_every_wrapper_defines_its_protocol``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from policyzoo.contract import Collective, Rollout, StepTotals


class PassThrough:
    """A :class:`~policyzoo.contract.Policy` that passes every call to ``inner`` (any Policy: the
    language-model engine, the bandit test bed, a test's stand-in). Subclasses override what they change.

    Besides the protocol: ``device`` (the trainer's device the step moves its batch to; None when ``inner``
    names none, as the step's ``getattr(policy, "device", None)`` reads it)."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def collective(self) -> Collective:
        return self.inner.collective

    @property
    def sampling_options(self) -> frozenset:
        """The inner engine's (empty when it names none: temperature only)."""
        return getattr(self.inner, "sampling_options", frozenset())

    @property
    def device(self) -> torch.device | None:
        return getattr(self.inner, "device", None)

    def generate(self, prompts: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 **options) -> Rollout:
        return self.inner.generate(prompts, n, max_tokens, temperature, seed, **options)

    def logprobs(self, rollout: Rollout, *, grad: bool, entropy: bool = False,
                 entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        return self.inner.logprobs(rollout, grad=grad, entropy=entropy, entropy_grad=entropy_grad)

    def ref_logprobs(self, rollout: Rollout) -> Tensor:
        return self.inner.ref_logprobs(rollout)

    def sum_pi_squared(self, rollout: Rollout) -> Tensor:
        return self.inner.sum_pi_squared(rollout)

    def values(self, rollout: Rollout, *, grad: bool) -> Tensor:
        return self.inner.values(rollout, grad=grad)

    def backward(self, loss: Tensor, value_loss: Tensor | None = None) -> None:
        self.inner.backward(loss, value_loss)

    def optimizer_step(self, skip: bool = False) -> dict:
        return self.inner.optimizer_step(skip=skip)

    def sync(self) -> dict:
        return self.inner.sync()

    def reduce_totals(self, totals: StepTotals) -> StepTotals:
        return self.inner.reduce_totals(totals)
