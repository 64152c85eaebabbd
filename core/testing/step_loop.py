"""Running the real step in-process, N times (:func:`train`, :func:`step_settings`): the loop the bandit
test bed trains with (:mod:`policyzoo.testing.bandit` re-exports both)."""

from __future__ import annotations

from typing import Callable

import torch

from policyzoo.step import StepSettings, train_step


def step_settings(run, **overrides):
    """:class:`~policyzoo.step.StepSettings` from the run's components plus ``overrides``."""
    return StepSettings.for_run(run, **overrides)


def train(run, bandit, steps: int, prompts_per_step: int = 8, seed: int = 0, settings=None,
          on_step: Callable[[int, dict], None] | None = None, threads: int | None = 1) -> list[dict]:
    """Run ``steps`` calls of :func:`policyzoo.step.train_step` on ``bandit`` (a
    :class:`~policyzoo.testing.bandit.Bandit`; step i uses seed ``seed * 1_000_000 + i``); returns each
    step's metrics plus ``accuracy`` and ``expected_reward`` after the step. ``threads``: torch intra-op
    threads for the run, restored after (default 1: the tensors are tiny and extra threads only add
    overhead, ~8x slower on 2 busy cores); None leaves the setting alone."""
    settings = settings or step_settings(run)
    saved = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    history = []
    try:
        for i in range(steps):
            m = train_step(run, bandit, lambda: bandit.prompts(prompts_per_step), seed=seed * 1_000_000 + i,
                           settings=settings)
            m.update(accuracy=bandit.accuracy(), expected_reward=bandit.expected_reward())
            history.append(m)
            if on_step is not None:
                on_step(i, m)
    finally:
        torch.set_num_threads(saved)
    return history
