"""A tiny CPU training run for plugin tests: the tabular bandit through the real training step.

``tiny_run("sapo", steps=2)`` assembles the algorithm (a name, a hybrid mapping or a Bundle) with
the bandit's reward, trains the bandit (:mod:`policyzoo.testing.bandit`) with
:func:`policyzoo.step.train_step` -- the same step code the language-model engine runs -- and
returns a :class:`TinyRun` with each step's metrics. A few steps take well under a second.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from policyzoo.assembly import Run, assemble
from policyzoo.catalog import Catalog, load_catalog
from policyzoo.contract import use

from . import bandit as bandit_mod
from .helpers import _as_plugin


@dataclass
class TinyRun:
    """``history``: one metrics dict per step (``loss``, ``reward_mean``, ``accuracy``, ...);
    ``run``: the assembled :class:`~policyzoo.assembly.Run` (``run.sources`` says where each slot
    came from); ``bandit``: the trained policy; ``initial_logits``: its logits before training."""

    history: list[dict]
    run: Run
    bandit: object
    initial_logits: torch.Tensor = field(repr=False)

    @property
    def weights_changed(self) -> bool:
        return not torch.equal(self.initial_logits, self.bandit.theta.detach())


def tiny_run(algorithm="grpo", steps: int = 2, seed: int = 0, *, plugins=(), catalog: Catalog | None = None,
             prompts_per_step: int = 4, questions: int = 4, candidates: int = 4, right: int = 1,
             lr: float = 0.1, recorder=None, **settings) -> TinyRun:
    """Train ``steps`` steps of ``algorithm`` on a random bandit (``questions`` x ``candidates``,
    ``right`` right answers each, lengths 2..6 tokens, seeded by ``seed``).

    ``catalog`` defaults to a fresh one with the built-ins, ``plugins`` (plugin modules, Component
    classes or Bundles, as for :func:`~policyzoo.testing.make_plugin`) and the bandit's reward.
    When ``plugins`` are given, installed distributions are not autoloaded (so testing a plugin
    that is also pip-installed does not register its names twice); without ``plugins`` the
    environment switches decide, as for a real run.
    ``settings`` override :class:`~policyzoo.step.StepSettings` (``micro_batches=2`` ...).
    ``recorder``: a :class:`~policyzoo.testing.HookRecorder` attached to the run before training.
    Errors: whatever assembly raises for an invalid algorithm (a ``ConfigError``)."""
    catalog = catalog or load_catalog(autoload=False if plugins else None,
                                      extra=[sys.modules[bandit_mod.__name__], *map(_as_plugin, plugins)])
    run = assemble(algorithm, rewards=(use("bandit_correct"),), catalog=catalog)
    if recorder is not None:
        recorder.attach(run)
    torch.manual_seed(seed)
    policy = bandit_mod.Bandit.random(questions, candidates, right, min_len=2, max_len=6, seed=seed, lr=lr)
    initial = policy.theta.detach().clone()
    history = bandit_mod.train(run, policy, steps, prompts_per_step=prompts_per_step, seed=seed,
                               settings=bandit_mod.step_settings(run, **settings))
    return TinyRun(history, run, policy, initial)
