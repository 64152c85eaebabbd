"""The probe's synthetic batches: the regime of a run's settings (:class:`Regime`, :func:`regime`) and the
batches that follow it (:func:`probe_batches`), the same for every algorithm compared."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from policyzoo.assembly import Run, reward_uses
from policyzoo.catalog import get_catalog
from policyzoo.contract import Bundle, Rollout
from policyzoo.data import load_task

WIDTH = 8  # response tokens of a probe batch (at most the run's limit)
PROMPTS = 4  # prompts of a probe batch (G rows each; 8 rows at least)
BATCHES = 2  # batches per kind (first update, later update, stale)


@dataclass(frozen=True)
class Regime:
    """What the probe's batches follow: the group size ``n`` (``algorithm.sample.n``), the updates per
    batch, whether batches arrive stale (``engine.max_staleness`` > 0 or ``engine.overlap: one_step``),
    the reward kinds (``binary``: 0/1 correctness with some constant groups; ``continuous``: real
    scores), and the response width ``width`` (tokens)."""

    n: int
    updates_per_batch: int = 1
    stale: bool = False
    rewards: tuple[str, ...] = ("binary",)
    width: int = WIDTH
    keys: str = "train.updates_per_batch=1"  # the settings as the user wrote them, for the messages

    @property
    def first_update_only(self) -> bool:
        """Every batch is trained on once, on-policy: every ratio is exactly 1."""
        return self.updates_per_batch == 1 and not self.stale


def regime(config, run: Run, reward_classes: list) -> Regime:
    """The regime of ``config`` for the assembled ``run`` with the run's reward components (classes or
    instances): a reward declaring ``binary = True`` is a 0/1 correctness score, ``binary = False`` a
    continuous one; when they do not all declare the same, both kinds of batches are probed."""
    kinds = {getattr(c, "binary", None) for c in reward_classes}
    rewards = ("binary",) if kinds == {True} else ("continuous",) if kinds == {False} else ("binary", "continuous")
    e = config.engine
    stale = e.max_staleness > 0 or e.overlap == "one_step"
    keys = [f"train.updates_per_batch={config.train.updates_per_batch}"]
    keys += [f"engine.max_staleness={e.max_staleness}"] if e.max_staleness else []
    keys += ["engine.overlap=one_step"] if e.overlap == "one_step" else []
    n = int(getattr(run.sample.params, "n", 1))
    width = max(1, min(WIDTH, int(run.max_response_tokens or WIDTH)))
    return Regime(n, config.train.updates_per_batch, stale, rewards, width, ", ".join(keys))


@dataclass
class ProbeBatch:
    """One synthetic batch: ``rollout`` (``response_mask [B, T]``, ``rollout_logprobs``, ``group_ids [B]``,
    ``truncated [B]``), ``rewards [B]``, the live ``logprobs [B, T]`` (float64, nats), ``old_logprobs``
    (None: the first update, on-policy), ``ref_logprobs``, ``values``, ``entropy``, ``sum_pi_squared``
    ``[B, T]`` and ``kind`` (first update, later update, stale)."""

    rollout: Rollout
    rewards: Tensor
    logprobs: Tensor
    old_logprobs: Tensor | None
    ref_logprobs: Tensor
    values: Tensor
    entropy: Tensor
    sum_pi_squared: Tensor
    kind: str = "first update"


def probe_batches(r: Regime, seed: int = 0) -> list[ProbeBatch]:
    """The batches of regime ``r`` (the same for every algorithm: a fixed seed): for each reward kind,
    :data:`BATCHES` first updates (``old_logprobs`` None, so the step's ratio is exactly 1), and when
    ``r.updates_per_batch`` > 1 later updates (``old_logprobs`` the log-probs at sampling time, the
    live ones moved by 1e-4 to 1 nats per row) and when ``r.stale`` stale batches (``old_logprobs``
    the sampler's, ``policy_lag`` 1). The sampler's log-probs differ from the trainer's by ~0.02 nats
    in every batch (the rollout/trainer mismatch of any real engine), the reference's by ~0.3."""
    g = torch.Generator().manual_seed(seed)
    kinds = ["first update"] + (["later update"] if r.updates_per_batch > 1 else []) + (["stale"] if r.stale else [])
    return [_batch(r, reward, kind, g) for reward in r.rewards for kind in kinds for _ in range(BATCHES)]


def _batch(r: Regime, reward: str, kind: str, g: torch.Generator) -> ProbeBatch:
    G, T = r.n, r.width
    P = max(PROMPTS, -(-8 // G))
    B = P * G
    noise = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[G - 1] = T  # a full-length row of the first group stops at the limit: truncated
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    truncated = torch.zeros(B, dtype=torch.bool)
    truncated[G - 1] = True
    group_ids = torch.arange(P).repeat_interleave(G)
    if reward == "binary":  # group 0 all right, group 1 all wrong (constant), the others mixed
        rewards = (torch.rand(B, generator=g) < 0.5).float()
        for p in range(P):
            rows = slice(p * G, (p + 1) * G)
            rewards[rows] = 1.0 if p == 0 else 0.0 if p == 1 else rewards[rows]
            if p > 1 and G > 1:
                rewards[p * G], rewards[p * G + 1] = 1.0, 0.0
    else:
        rewards = torch.randn(B, generator=g).float()
    zero = torch.zeros(B, T, dtype=torch.float64)
    lp0 = torch.where(mask, -0.05 - 3 * torch.rand(B, T, generator=g, dtype=torch.float64), zero)
    sampler = torch.where(mask, lp0 + 0.02 * noise(B, T), zero)
    scale = torch.tensor([1e-4, 0.05, 0.3, 1.0], dtype=torch.float64)[torch.arange(B) % 4].unsqueeze(1)
    moved = torch.where(mask, lp0 + scale * noise(B, T), zero)
    live, old = {"first update": (lp0, None), "later update": (moved, lp0), "stale": (moved, sampler)}[kind]
    rollout = Rollout([[1]] * B, torch.ones(B, T, dtype=torch.long), mask, sampler.float(), group_ids, truncated,
                      max_tokens=T, policy_lag=torch.full((B,), int(kind == "stale")))
    return ProbeBatch(rollout, rewards, live, old, torch.where(mask, lp0 + 0.3 * noise(B, T), zero),
                      noise(B, T), 0.1 + 2 * torch.rand(B, T, generator=g, dtype=torch.float64),
                      0.05 + 0.5 * torch.rand(B, T, generator=g, dtype=torch.float64), kind)


def task_reward_classes(config, bundle: Bundle, tasks: dict | None = None) -> list:
    """The reward component classes of a run of ``config``: ``rewards:`` or the data task's default
    (the task is loaded: its rows are read or generated, once per data setting in ``tasks``, a cache
    the caller keeps across entries), then the bundle's extras."""
    default = []
    if config.rewards is None:
        tasks = {} if tasks is None else tasks
        key = config.data.model_dump_json()
        if key not in tasks:
            tasks[key] = load_task(config.data).default_rewards
        default = tasks[key]
    uses = [*reward_uses(config, default, bundle.env is not None), *bundle.reward]
    return [get_catalog().component("reward", u.name) for u in uses]

