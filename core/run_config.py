"""What a run takes from its config besides the algorithm: the task's reward uses (``rewards:``) and
the step's settings (``train.*`` over the filters' own budget)."""

from __future__ import annotations

from .contract import use
from .errors import ConfigError
from .resolve import override
from .step import StepSettings


def step_settings(config, run) -> StepSettings:
    """The step's settings: the config's ``train`` values over the run's filters' own budget."""
    return StepSettings.for_run(run, max_sample_rounds=config.train.max_sample_rounds,
                                updates_per_batch=config.train.updates_per_batch,
                                micro_batches=config.train.micro_batches, on_shortfall=config.train.on_shortfall,
                                reward_nan=config.train.reward_nan,
                                max_tokens_per_micro_batch=config.train.max_tokens_per_micro_batch)


def reward_uses(config, default: list, has_env: bool = False) -> tuple:
    """``rewards:`` entries as :class:`~policyzoo.contract.Use`; when not given, the task's ``default`` --
    or, in a run with an environment (``has_env``), the episode reward ``env_reward``."""
    if config.rewards is None:
        return (use("env_reward"),) if has_env else tuple(default)
    if not config.rewards:
        raise ConfigError("rewards", "the list is empty: every advantage would be 0 and nothing would be learned",
                          "name at least one reward, e.g. `rewards: [{use: answer_match}]`, or drop the key "
                          "for the task's default")
    return tuple(override(None, r, f"rewards[{i}]") for i, r in enumerate(config.rewards))
