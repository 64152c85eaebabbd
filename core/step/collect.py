"""Phase 1 of the step: sample, score and filter until the batch holds P prompts' worth of kept groups.

Every algorithm-specific decision is a hook call (``sample``, ``reward``, ``filter``); this file
names no algorithm. The seeds of a run live here too, so every path that samples (the plain step,
the overlapped one) draws the same numbers.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from policyzoo.contract import Rollout
from policyzoo.errors import ComponentError, UserError

from . import dispatch
from .episodes import EPISODE_METRICS, episode_sums, failed_groups

#: the seed of step ``s`` of a run with ``train.seed`` = k is ``k * SEED_STRIDE + s`` (:func:`step_seed`)
SEED_STRIDE = 1_000_003


def step_seed(train_seed: int, step: int) -> int:
    """The seed of optimizer step ``step`` (1-based) of a run with ``train.seed`` = ``train_seed``."""
    return train_seed * SEED_STRIDE + step


def round_seed(seed: int, r: int) -> int:
    """The seed handed to the ``sample`` component in sampling round ``r`` of the step with ``seed``."""
    return seed * 1000 + r


@dataclass
class StepSettings:
    """Step-level settings (``train:`` in the config).

    ``updates_per_batch``: optimizer steps on each sampled batch (PPO epochs); 1 = on-policy, and
    then old_logprobs are the current log-probs detached (no extra forward, ratio exactly 1).
    ``micro_batches``: gradient-accumulation splits of the batch (the loss is exact for any split).
    ``max_tokens_per_micro_batch``: instead, micro-batches of at most this many prompt + response
    tokens (:meth:`~policyzoo.contract.StepBatch.split_tokens`), so long answers take more of them.
    ``max_sample_rounds``: dynamic sampling budget (rounds of P prompts) when a filter resamples
    (:meth:`for_run` takes it from the filters).
    ``on_shortfall``: ``train_on_fewer`` or ``error`` when that budget cannot fill the batch;
    ``train_on_fewer`` with no row kept at all skips the update (``skipped`` = 1 in the metrics,
    counted by the engine's ``train.max_consecutive_skips``).
    ``reward_nan``: how the weighted sum of the reward components treats a component's NaN:
    ``unscorable`` (any NaN makes the row's reward NaN: it enters no statistic and gets advantage 0)
    or ``nansum`` (TRL's: that component counts as 0; NaN only when every component is NaN).
    """

    updates_per_batch: int = 1
    micro_batches: int = 1
    max_tokens_per_micro_batch: int | None = None
    max_sample_rounds: int = 1
    on_shortfall: str = "train_on_fewer"
    reward_nan: str = "unscorable"

    @classmethod
    def for_run(cls, run, max_sample_rounds: int | None = None, **settings) -> "StepSettings":
        """Settings for ``run``: ``max_sample_rounds`` None takes the largest budget among its
        resampling filters (each filter declares its own, ``Filter.Params.max_sample_rounds``),
        1 if no filter resamples."""
        rounds = max_sample_rounds or max((f.params.max_sample_rounds for f in run.filter if f.params.resample),
                                          default=1)
        return cls(max_sample_rounds=rounds, **settings)


class ShortfallError(UserError):
    pass


@dataclass
class Kept:
    """What the sampling rounds of one step kept: per round, the rollout and, for its rows, the
    rewards ``[rows]`` (weighted sum), each reward component's own values ``[rows, K]`` and the
    reward of the greedy response to the row's prompt ``[rows]`` (NaN without ``sample.greedy``)."""

    rollouts: list[Rollout] = field(default_factory=list)
    rewards: list[torch.Tensor] = field(default_factory=list)
    parts: list[torch.Tensor] = field(default_factory=list)
    greedy: list[torch.Tensor] = field(default_factory=list)

    def rows(self) -> int:
        return sum(len(r) for r in self.rollouts)


def collect(run, policy, next_prompts: Callable[[], list[dict]], seed: int,
            settings: StepSettings) -> tuple[Rollout, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Sample, score and filter until the batch holds P prompts' worth of kept groups. Returns the
    rollout, its rewards ``[B]`` (the weighted sum), each reward component's values ``[B, K]``, the
    reward of the greedy response to each row's prompt ``[B]`` (NaN without ``sample.greedy``; the
    greedy rows themselves are removed) and the metrics."""
    kept, metrics = Kept(), Counter()
    reward_sums: Counter = Counter()  # per reward label: sum and count of non-NaN values over sampled rows
    reward_counts: Counter = Counter()
    resample = any(f.params.resample for f in run.filter)
    target_rows = 0
    for r in range(settings.max_sample_rounds if resample else 1):
        prompts = next_prompts()
        t0 = time.perf_counter()
        rollout = dispatch.call(run, "sample", rows=len(prompts) * (run.sample.params.n + run.sample.params.greedy),
                                policy=policy, prompts=prompts, seed=round_seed(seed, r), env=run.env)
        greedy = _greedy_rows(run, rollout)
        metrics["time_rollout"] += time.perf_counter() - t0
        target_rows = target_rows or int((~greedy).sum())  # the greedy baseline rows are not trained on
        t0 = time.perf_counter()
        rewards, parts = _rewards(run, rollout, greedy, settings, reward_sums, reward_counts)
        metrics["time_reward"] += time.perf_counter() - t0
        rollout, rewards, parts, baseline_reward = _split_greedy(rollout, rewards, parts, greedy, metrics)
        keep = _filter(run, rollout, rewards, metrics)
        if rollout.stop_reasons is not None:  # env on_error: drop_group -- whole groups, no partial-group bias
            failed = failed_groups(rollout)
            metrics["filtered/env_error"] += int((failed & keep).sum())
            keep &= ~failed
        metrics["sampled_rows"] += len(rollout)
        metrics["unscorable_rows"] += int(torch.isnan(rewards).sum())  # NaN reward: no advantage, no baseline share
        metrics.update(episode_sums(rollout))
        metrics["reward_mean_sampled"] += float(torch.nansum(rewards))
        kept.rollouts.append(rollout.select(keep))
        kept.rewards.append(rewards[keep])
        kept.parts.append(parts[keep])
        kept.greedy.append(baseline_reward[keep])
        if kept.rows() >= target_rows:
            break
    rollout, rewards, parts, baseline_reward = _whole_groups(kept, target_rows)
    _means(run, metrics, reward_sums, reward_counts, len(rollout), len(kept.rollouts))
    if len(rollout) < target_rows and resample:
        metrics["shortfall_rows"] = target_rows - len(rollout)
        if settings.on_shortfall == "error":
            raise ShortfallError("dynamic sampling", f"only {len(rollout)} of {target_rows} rows kept after "
                                 f"{len(kept.rollouts)} rounds", "raise train.max_sample_rounds, loosen the filter, "
                                 "or set train.on_shortfall: train_on_fewer")
    return rollout, rewards, parts, baseline_reward, dict(metrics)


def _rewards(run, rollout: Rollout, greedy: torch.Tensor, settings: StepSettings, sums: Counter,
             counts: Counter) -> tuple[torch.Tensor, torch.Tensor]:
    """The weighted sum of the reward components ``[B]`` and each one's values ``[B, K]``; adds each
    component's non-NaN sum and count over the sampled (non-greedy) rows to ``sums`` / ``counts``."""
    b = len(rollout)
    rewards = torch.zeros(b)
    parts = torch.zeros(b, len(run.reward))
    scored = dispatch.call_each(run, "reward", rows=b, rollout=rollout)
    for k, (label, (comp, value)) in enumerate(zip(run.reward_labels, scored)):
        sums[label] += float(torch.nansum(value[~greedy]))
        counts[label] += int((~torch.isnan(value[~greedy])).sum())
        rewards = rewards + comp.params.weight * value
        parts[:, k] = value
    if settings.reward_nan == "nansum" and parts.shape[1]:  # TRL: a function's NaN counts as 0
        weights = torch.tensor([float(c.params.weight) for c in run.reward])
        nansum = torch.nansum(parts * weights, -1)
        rewards = torch.where(torch.isnan(parts).all(-1), torch.nan, nansum)
    return rewards, parts


def _split_greedy(rollout: Rollout, rewards, parts, greedy, metrics: Counter):
    """Remove the greedy baseline rows (ReMax); returns the rest and, per row, the reward of its
    prompt's greedy response (NaN when there is none). Adds their sum and count to ``metrics``."""
    baseline_reward = torch.full((len(rollout),), torch.nan)
    if not bool(greedy.any()):
        return rollout, rewards, parts, baseline_reward
    for i in greedy.nonzero().flatten().tolist():
        baseline_reward[rollout.group_ids == rollout.group_ids[i]] = rewards[i]
    metrics["greedy_sum"] += float(torch.nansum(rewards[greedy]))
    metrics["greedy_count"] += int((~torch.isnan(rewards[greedy])).sum())
    rollout = rollout.select(~greedy)
    rollout.greedy = None
    return rollout, rewards[~greedy], parts[~greedy], baseline_reward[~greedy]


def _filter(run, rollout: Rollout, rewards: torch.Tensor, metrics: Counter) -> torch.Tensor:
    """The AND of the filters' row masks ``[B]``; token masks ``[B, T]`` are ANDed into
    ``rollout.response_mask``; drop counts go to ``metrics`` as ``filtered/<reason>``."""
    b, t = rollout.response_mask.shape
    keep = torch.ones(b, dtype=torch.bool)
    mask = rollout.response_mask.clone()
    for comp, out in dispatch.call_each(run, "filter", rows=b, width=t, rollout=rollout, rewards=rewards):
        if out.keep.dim() == 2:
            mask &= out.keep
        else:
            keep &= out.keep
        for reason, count in out.reasons.items():
            metrics[f"filtered/{reason}"] += count
    rollout.response_mask = mask
    return keep


def _whole_groups(kept: Kept, target_rows: int):
    """The kept rounds concatenated, cut to at most ``target_rows`` rows of whole groups (first come,
    first kept)."""
    rollout = Rollout.concat(kept.rollouts)
    rewards, parts, baseline_reward = torch.cat(kept.rewards), torch.cat(kept.parts), torch.cat(kept.greedy)
    if len(rollout) <= target_rows:
        return rollout, rewards, parts, baseline_reward
    keep_groups, rows = [], 0
    for g in dict.fromkeys(rollout.group_ids.tolist()):
        size = int((rollout.group_ids == g).sum())
        if rows + size > target_rows:
            break
        keep_groups.append(g)
        rows += size
    keep = torch.isin(rollout.group_ids, torch.tensor(keep_groups))
    return rollout.select(keep), rewards[keep], parts[keep], baseline_reward[keep]


def _means(run, metrics: Counter, reward_sums: Counter, reward_counts: Counter, rows: int, rounds: int) -> None:
    """Turn the round sums in ``metrics`` into the step's means over the sampled rows."""
    sampled = max(metrics["sampled_rows"], 1)
    metrics["reward_mean_sampled"] /= sampled
    scores = [k for k in metrics if k.startswith("env_score/")]  # an env's named scores (Episode.scores)
    for key in (*EPISODE_METRICS, *scores) if run.env is not None else ():  # means over the sampled episodes
        metrics[key] = metrics[key] / sampled
    for label in run.reward_labels:  # mean over the rows actually sampled, NaN (unscorable) left out
        metrics[f"reward/{label}"] = reward_sums[label] / reward_counts[label] if reward_counts[label] else math.nan
        if metrics["sampled_rows"] > reward_counts[label]:  # rows this component could not score (NaN)
            metrics[f"unscorable/{label}"] = metrics["sampled_rows"] - reward_counts[label]
    greedy_sum, greedy_count = metrics.pop("greedy_sum", 0.0), metrics.pop("greedy_count", 0)
    if run.sample.params.greedy:  # mean reward of the greedy baseline responses (NaN left out)
        metrics["reward_greedy"] = greedy_sum / greedy_count if greedy_count else math.nan
    metrics["kept_frac"] = rows / sampled
    metrics["sample_rounds"] = rounds


def _greedy_rows(run, rollout: Rollout) -> torch.Tensor:
    """``[B]`` bool: the greedy baseline rows of ``rollout``; a sample component with ``greedy``
    that marks none (or P x n rows) is a :class:`ComponentError`."""
    greedy = rollout.greedy if rollout.greedy is not None else torch.zeros(len(rollout), dtype=torch.bool)
    if run.sample.params.greedy and int(greedy.sum()) * (run.sample.params.n + 1) != len(rollout):
        raise ComponentError(f"sample component {run.sample!r}", f"greedy = True but Rollout.greedy marks "
                             f"{int(greedy.sum())} of {len(rollout)} rows, not one per prompt",
                             "return one greedy response per prompt marked in Rollout.greedy (see the sample hook)")
    return greedy.to(torch.bool)
