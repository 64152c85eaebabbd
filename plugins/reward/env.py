"""The environment's episode reward (a ``reward`` component)."""

from __future__ import annotations

from policyzoo.contract import Reward, hookimpl
from policyzoo.errors import ConfigError


class EnvReward(Reward):
    """The environment's episode reward, ``[B]`` float: ``rollout.env_rewards`` (each episode's
    ``Episode.reward()``), so an env's reward goes through the same weighting, metrics
    (``reward/env_reward``) and baselines as any other. The task's default reward when the run
    has an env. Errors: ``ConfigError`` when the run has no ``env``.
    Source: the environment's own reward, ``Episode.reward()`` (the outcome reward of TRL's
    ``environment_factory`` and verl's agent loop)."""

    name = "env_reward"

    def check(self, run) -> None:
        if run.env is None:
            raise ConfigError("rewards (env_reward)", "the run has no environment, so there is no episode reward",
                              "add one, e.g. `algorithm: {base: grpo, env: {use: calculator}}`, or drop env_reward")

    @hookimpl
    def reward(self, rollout):
        if rollout.env_rewards is None:
            raise ConfigError("rewards (env_reward)", "the rollout holds no episode rewards (single-turn sampling)",
                              "set algorithm.env, or drop env_reward")
        return rollout.env_rewards.float()
