"""``sample`` components: how a batch of responses is drawn from the policy."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import SAMPLING_OPTIONS, Rollout, Sample, TokenPolicy, hookimpl
from policyzoo.errors import ConfigError, UserError


class Group(Sample):
    """G responses per prompt from the shared engine (GRPO-style groups; G = 1 for PPO).

    Calls ``policy.generate(prompts, n, max_tokens, temperature, seed)`` and returns its
    :class:`~policyzoo.contract.Rollout` with B = P x n rows, ``group_ids [B]`` (one id per prompt),
    ``response_mask [B, T]``, ``rollout_logprobs [B, T]`` (nats) and ``truncated [B]``; it stamps
    ``rollout.temperature`` and ``rollout.max_tokens`` so the trainer scales logits by the same
    temperature and length-based rewards/reduces see the same limit.

    Conventions: ``max_tokens`` counts response tokens only (EOS included), and is the L_max that
    the ``overlong_penalty`` reward and the ``token_sum_norm`` reduce default to. ``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty`` and ``stop`` are passed to ``generate`` only when set (not their
    "off" value), and only to engines that name them in ``policy.sampling_options``; an engine without one
    raises a :class:`ConfigError` instead of silently sampling from the full distribution. (Like top_p, these
    change the sampled distribution; the trainer scores with temperature only, as TRL and verl.) (Nucleus sampling
    makes the sampler's distribution differ from the trainer's; the ratio still uses the trainer's
    ``old_logprobs``, as TRL and verl do.)

    ``greedy``: a second ``generate`` call at temperature 0 adds one greedy response per prompt
    (after the P x n sampled rows, in its prompt's group, ``Rollout.greedy`` True): ReMax's
    baseline (the step rewards and removes it).

    With an ``env`` (the run's ``env`` slot) every sample is an episode: the turns of all P x n
    episodes are sampled together through ``policy.generate_tokens`` (one batched call per turn,
    per-episode seeds) and the rollout is token-exact (``policy.run_episodes``, :mod:`policyzoo.step.episodes`);
    ``max_tokens`` then bounds each model turn, the env's ``max_total_tokens`` the trajectory; ``greedy`` adds
    one greedy episode per prompt.

    Errors: :class:`ConfigError` for an engine that cannot honour a setting or cannot drive an env;
    :class:`UserError` when the engine returns a rollout of the wrong size (B != P x n).
    Source: Shao et al. 2024 (DeepSeekMath, arXiv:2402.03300) Sec. 4.1 for groups of G samples.
    """

    name = "group"

    class Params(Sample.Params):
        temperature: float = Field(1.0, gt=0, description="sampling temperature (> 0); the trainer "
                                   "divides logits by the same value")
        top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass in (0, 1]; 1 = off")
        top_k: int = Field(0, ge=0, description="sample from the k most likely tokens only; 0 = off")
        min_p: float = Field(0.0, ge=0, le=1, description="drop tokens below min_p x the top token's "
                             "probability; 0 = off")
        repetition_penalty: float = Field(1.0, gt=0, description="divide logits of tokens already in the prompt or "
                                          "response by this (> 1 discourages repeats); 1 = off")
        stop: list[str] = Field([], description="strings that end a response (the string itself is kept in the "
                                "tokens); [] = end-of-sequence token and max_tokens only")

    def __init__(self, **params):
        super().__init__(**params)
        self._next_group = 0

    @hookimpl
    def sample(self, policy, prompts, seed, env):
        p = self.params
        kwargs = self.options(getattr(policy, "sampling_options", frozenset()), type(policy).__name__)
        if env is not None:
            if not isinstance(policy, TokenPolicy):
                raise ConfigError("algorithm.env", f"{type(policy).__name__} cannot drive the environment "
                                  f"{env.name!r}: it has no generate_tokens (token-level continuation)",
                                  "train with the language-model engine, or remove algorithm.env")
            rollout = policy.run_episodes(env, prompts, p.n, p.max_tokens, p.temperature, seed, **kwargs)
            best = policy.run_episodes(env, prompts, 1, p.max_tokens, 0.0, seed, **kwargs) if p.greedy else None
            return self._regroup(rollout, best, p)
        rollout: Rollout = policy.generate(prompts, p.n, p.max_tokens, p.temperature, seed, **kwargs)
        expected = len(prompts) * p.n
        if len(rollout) != expected or tuple(rollout.group_ids.shape) != (expected,):
            raise UserError("sample: group", f"{type(policy).__name__}.generate returned {len(rollout)} rows "
                            f"(group_ids {tuple(rollout.group_ids.shape)}) for {len(prompts)} prompts x n={p.n}",
                            "generate must return len(prompts) x n rows with one group id per row")
        best = policy.generate(prompts, 1, p.max_tokens, 0.0, seed, **kwargs) if p.greedy else None
        return self._regroup(rollout, best, p)

    def options(self, honoured: frozenset, engine: str) -> dict:
        """The sampling options that are set (not their "off" value), as keyword arguments; raises
        :class:`ConfigError` for one not in ``honoured`` (the engine's ``sampling_options``), on the
        single-turn and the episode path alike. The session calls it with the engine's options
        before any model loads."""
        p = self.params
        kwargs = {k: getattr(p, k) for k, off in SAMPLING_OPTIONS.items() if _is_set(getattr(p, k), off)}
        for key in kwargs:
            if key not in honoured:
                raise ConfigError(f"sample: group -> {key}", f"{key} = {kwargs[key]} but "
                                  f"{engine} takes no {key} (not in its sampling_options)",
                                  f"set sample.{key}: {'[]' if key == 'stop' else SAMPLING_OPTIONS[key]}, or use an "
                                  "engine that supports it")
        return kwargs

    def _regroup(self, rollout: Rollout, best: Rollout | None, p) -> Rollout:
        """Stamp temperature and max_tokens; renumber groups so ids never repeat within a run; append
        ``best``, one greedy response per prompt (prompt-major), in its prompt's group, marked."""
        rollout.temperature = p.temperature
        rollout.max_tokens = p.max_tokens
        ids = torch.as_tensor(rollout.group_ids)
        first_seen = {g: k for k, g in enumerate(dict.fromkeys(ids.tolist()))}
        rollout.group_ids = torch.tensor([self._next_group + first_seen[g] for g in ids.tolist()], dtype=torch.long)
        if best is not None:
            best.group_ids = torch.arange(len(best), dtype=torch.long) + self._next_group
            rollout.greedy = torch.zeros(len(rollout), dtype=torch.bool)
            best.greedy = torch.ones(len(best), dtype=torch.bool)
            best.temperature, best.max_tokens = p.temperature, p.max_tokens
            rollout = Rollout.concat([rollout, best])
        self._next_group += len(first_seen)
        return rollout


COMPONENTS = (Group,)


def _is_set(value, off) -> bool:
    """A sampling option differs from its "off" value (a list ``stop`` compares as a tuple)."""
    return (tuple(value) if isinstance(value, list) else value) != off
