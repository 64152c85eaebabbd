"""Where a run stands, for reward functions that shape rewards by training progress.

:func:`current` returns the :class:`TrainerState` of the run in this process (the engine updates it
before every step); TRL-style reward functions receive it as ``trainer_state``, with the
attribute names of ``transformers.TrainerState`` that reward functions read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainerState:
    """``global_step``: optimizer steps done before the current batch (0 at the first step);
    ``max_steps``: the run's ``train.steps``; ``epoch``: passes over the training rows drawn so
    far (fractional: batches drawn x prompts per step / training rows)."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0


_STATE = TrainerState()


def current() -> TrainerState:
    """The state of the run in this process (all zero outside a run)."""
    return _STATE


def update(global_step: int, max_steps: int, epoch: float) -> None:
    """Set the state (called by the engine before each step)."""
    _STATE.global_step, _STATE.max_steps, _STATE.epoch = global_step, max_steps, epoch
