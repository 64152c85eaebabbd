"""One training step, top to bottom: sample -> reward -> filter -> score -> advantages -> update.

Used unchanged by the real engine and by the bandit test bed. Every algorithm-specific decision
is a hook call; this file names no algorithm.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from .batch import Rollout, StepBatch
from .episodes import EPISODE_METRICS, episode_sums
from .errors import ComponentError, UserError
from .loss import micro_loss, prepare, step_totals


@dataclass
class StepSettings:
    """Step-level settings (``train:`` in the config).

    ``updates_per_batch``: optimizer steps on each sampled batch (PPO epochs); 1 = on-policy, and
    then old_logprobs are the current log-probs detached (no extra forward, ratio exactly 1).
    ``micro_batches``: gradient-accumulation splits of the batch (the loss is exact for any split).
    ``max_tokens_per_micro_batch``: instead, micro-batches of at most this many prompt + response
    tokens (:meth:`~policyzoo.batch.StepBatch.split_tokens`), so long answers take more of them.
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


def round_seed(seed: int, r: int) -> int:
    """The seed handed to the ``sample`` component in sampling round ``r`` of the step with ``seed``."""
    return seed * 1000 + r


def collect(run, policy, next_prompts: Callable[[], list[dict]], seed: int,
            settings: StepSettings) -> tuple[Rollout, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Sample, score and filter until the batch holds P prompts' worth of kept groups. Returns the
    rollout, its rewards ``[B]`` (the weighted sum), each reward component's values ``[B, K]``, the
    reward of the greedy response to each row's prompt ``[B]`` (NaN without ``sample.greedy``; the
    greedy rows themselves are removed) and the metrics."""
    kept_rollouts: list[Rollout] = []
    kept_rewards: list[torch.Tensor] = []
    kept_parts: list[torch.Tensor] = []  # [rows, K]: each reward component's own values
    kept_greedy: list[torch.Tensor] = []  # [rows]: the reward of the greedy response to the row's prompt
    greedy_sum, greedy_count = 0.0, 0
    metrics: Counter = Counter()
    reward_sums: Counter = Counter()  # per reward label: sum and count of non-NaN values over sampled rows
    reward_counts: Counter = Counter()
    resample = any(f.params.resample for f in run.filter)
    rounds = settings.max_sample_rounds if resample else 1
    target_rows = 0
    for r in range(rounds):
        prompts = next_prompts()
        t0 = time.perf_counter()
        rollout = run.call("sample", rows=len(prompts) * (run.sample.params.n + run.sample.params.greedy),
                           policy=policy, prompts=prompts, seed=round_seed(seed, r), env=run.env)
        greedy = _greedy_rows(run, rollout)
        metrics["time_rollout"] += time.perf_counter() - t0
        target_rows = target_rows or int((~greedy).sum())  # the greedy baseline rows are not trained on
        b, t = rollout.response_mask.shape
        t0 = time.perf_counter()
        rewards = torch.zeros(b)
        parts = torch.zeros(b, len(run.reward))
        for k, (label, (comp, value)) in enumerate(zip(run.reward_labels,
                                                        run.call_each("reward", rows=b, rollout=rollout))):
            reward_sums[label] += float(torch.nansum(value[~greedy]))
            reward_counts[label] += int((~torch.isnan(value[~greedy])).sum())
            rewards = rewards + comp.params.weight * value
            parts[:, k] = value
        if settings.reward_nan == "nansum" and parts.shape[1]:  # TRL: a function's NaN counts as 0
            weights = torch.tensor([float(c.params.weight) for c in run.reward])
            nansum = torch.nansum(parts * weights, -1)
            rewards = torch.where(torch.isnan(parts).all(-1), torch.nan, nansum)
        metrics["time_reward"] += time.perf_counter() - t0
        baseline_reward = torch.full((b,), torch.nan)  # each row's prompt's greedy reward (ReMax)
        if bool(greedy.any()):
            for i in greedy.nonzero().flatten().tolist():
                baseline_reward[rollout.group_ids == rollout.group_ids[i]] = rewards[i]
            greedy_sum += float(torch.nansum(rewards[greedy]))
            greedy_count += int((~torch.isnan(rewards[greedy])).sum())
            rollout, rewards, parts, baseline_reward = (rollout.select(~greedy), rewards[~greedy], parts[~greedy],
                                                        baseline_reward[~greedy])
            rollout.greedy = None
            b = len(rollout)
        keep = torch.ones(len(rollout), dtype=torch.bool)
        mask = rollout.response_mask.clone()
        for comp, out in run.call_each("filter", rows=b, width=t, rollout=rollout, rewards=rewards):
            if out.keep.dim() == 2:
                mask &= out.keep
            else:
                keep &= out.keep
            for reason, count in out.reasons.items():
                metrics[f"filtered/{reason}"] += count
        rollout.response_mask = mask
        metrics["sampled_rows"] += len(rollout)
        metrics.update(episode_sums(rollout))
        metrics["reward_mean_sampled"] += float(torch.nansum(rewards))
        kept_rollouts.append(rollout.select(keep))
        kept_rewards.append(rewards[keep])
        kept_parts.append(parts[keep])
        kept_greedy.append(baseline_reward[keep])
        if sum(len(p) for p in kept_rollouts) >= target_rows:
            break
    rollout = Rollout.concat(kept_rollouts)
    rewards = torch.cat(kept_rewards)
    parts = torch.cat(kept_parts)
    baseline_reward = torch.cat(kept_greedy)
    if len(rollout) > target_rows:  # keep whole groups, first come first kept
        groups = list(dict.fromkeys(rollout.group_ids.tolist()))
        keep_groups, rows = [], 0
        for g in groups:
            size = int((rollout.group_ids == g).sum())
            if rows + size > target_rows:
                break
            keep_groups.append(g)
            rows += size
        keep = torch.isin(rollout.group_ids, torch.tensor(keep_groups))
        rollout, rewards, parts = rollout.select(keep), rewards[keep], parts[keep]
        baseline_reward = baseline_reward[keep]
    metrics["reward_mean_sampled"] /= max(metrics["sampled_rows"], 1)
    for key in EPISODE_METRICS if run.env is not None else ():  # means over the sampled episodes
        metrics[key] = metrics[key] / max(metrics["sampled_rows"], 1)
    for label in run.reward_labels:  # mean over the rows actually sampled, NaN (unscorable) left out
        metrics[f"reward/{label}"] = reward_sums[label] / reward_counts[label] if reward_counts[label] else math.nan
    if run.sample.params.greedy:  # mean reward of the greedy baseline responses (NaN left out)
        metrics["reward_greedy"] = greedy_sum / greedy_count if greedy_count else math.nan
    metrics["kept_frac"] = len(rollout) / max(metrics["sampled_rows"], 1)
    metrics["sample_rounds"] = len(kept_rollouts)
    if len(rollout) < target_rows and resample:
        metrics["shortfall_rows"] = target_rows - len(rollout)
        if settings.on_shortfall == "error":
            raise ShortfallError("dynamic sampling", f"only {len(rollout)} of {target_rows} rows kept after "
                                 f"{len(kept_rollouts)} rounds", "raise train.max_sample_rounds, loosen the filter, "
                                 "or set train.on_shortfall: train_on_fewer")
    return rollout, rewards, parts, baseline_reward, dict(metrics)


def train_step(run, policy, next_prompts: Callable[[], list[dict]], seed: int,
               settings: StepSettings = StepSettings(), on_batch: Callable[[StepBatch], None] | None = None) -> dict:
    """One optimizer step (or ``updates_per_batch`` of them) on a freshly sampled batch.
    ``on_batch`` (if given) sees the batch with its advantages before the update (for logging)."""
    rollout, rewards, parts, greedy_rewards, metrics = collect(run, policy, next_prompts, seed, settings)
    return learn(run, policy, rollout, rewards, metrics, settings, parts, greedy_rewards, on_batch)


def learn(run, policy, rollout: Rollout, rewards: torch.Tensor, metrics: dict,
          settings: StepSettings = StepSettings(), reward_components: torch.Tensor | None = None,
          greedy_rewards: torch.Tensor | None = None, on_batch: Callable[[StepBatch], None] | None = None) -> dict:
    """Score, advantages, update(s) and weight sync on a batch from :func:`collect` (its rollout,
    rewards, metrics, reward components ``[B, K]`` and greedy rewards); ``on_batch`` as in
    :func:`train_step`.

    Rows sampled by older weights than the trainer's (``rollout.policy_lag`` > 0, see
    ``engine.overlap``) are off-policy: their ``old_logprobs`` are the sampler's
    ``rollout_logprobs`` (the behaviour policy's), so the ratio and clip components correct for
    the lag (for the on-policy first update the ratio is exactly 1 instead)."""
    if len(rollout) == 0:  # train_on_fewer with nothing kept: no update, the run goes on
        return {**metrics, "skipped": 1, "skip_reason": "no rows kept by the filters", "rows": 0}

    # Score the batch with frozen models (only what the chosen components need).
    t0 = time.perf_counter()
    with torch.no_grad():
        kl_in_reward = run.kl is not None and run.kl.params.placement == "reward"
        pi2 = run.baseline.needs_pi_squared
        scored = (policy.logprobs(rollout, grad=False)[0] if (settings.updates_per_batch > 1 or kl_in_reward or pi2)
                  else None)
        sum_pi_squared = policy.sum_pi_squared(rollout) if pi2 else None
        ref = policy.ref_logprobs(rollout) if run.kl is not None else None
        values = policy.values(rollout, grad=False) if run.baseline.needs_values else None
    # On-policy (one update per batch): old_logprobs stay None and the loss uses the live
    # log-probs detached, so the first ratio is exactly 1 without a second forward.
    old = scored if settings.updates_per_batch > 1 else None
    if rollout.policy_lag is not None:
        lag = rollout.policy_lag
        metrics.update(policy_lag_max=int(lag.max()), policy_lag_mean=float(lag.float().mean()))
        if bool((lag > 0).any()):  # sampled by older weights: the behaviour policy's log-probs
            old = torch.where(rollout.response_mask, rollout.rollout_logprobs, 0.0)
    batch = StepBatch(rollout, rewards, old_logprobs=old, ref_logprobs=ref, values=values,
                      reward_components=reward_components, greedy_rewards=greedy_rewards,
                      sum_pi_squared=sum_pi_squared)
    batch, adv_metrics = prepare(run, batch, scored, policy.collective)
    metrics.update(adv_metrics)
    if on_batch is not None:
        on_batch(batch)
    totals = policy.reduce_totals(step_totals(batch))  # data parallel: the whole step's counts over all ranks

    # Update: each pass over the batch is one optimizer step; micro-batches accumulate exactly.
    # A non-finite reward, log-prob or loss skips the whole update: gradients are discarded and
    # the weights stay as they were (the engine's optimizer_step(skip=True) guarantees it).
    sums: Counter = Counter()
    counts: Counter = Counter()
    fault = _bad_rows("rewards", torch.isinf(rewards), rollout)
    budget = settings.max_tokens_per_micro_batch
    micro = batch.split_tokens(budget) if budget else batch.split(min(settings.micro_batches, len(batch)))
    coll = policy.collective
    if budget and coll.world_size > 1:  # every rank runs as many micro-batches (ZeRO 3, collectives in the clip)
        most = int(coll.gather(torch.tensor([len(micro)])).max())
        if most > len(micro):
            micro = batch.split(min(most, len(batch)))
    n_micro = metrics["micro_batches"] = len(micro)
    for _ in range(settings.updates_per_batch):
        for mb in micro if fault is None else []:
            logprobs, entropy = policy.logprobs(mb.rollout, grad=True, entropy=True)
            fault = _bad_rows("logprobs", (~torch.isfinite(logprobs.detach()) & mb.response_mask).any(-1), mb.rollout)
            if fault is not None:
                break
            loss, mb_sums = micro_loss(run, mb, logprobs, totals, entropy, policy.collective)
            value_loss = None
            if run.baseline.needs_values:
                value_loss = run.baseline.value_loss(values=policy.values(mb.rollout, grad=True),
                                                     old_values=mb.values, returns=mb.returns,
                                                     response_mask=mb.response_mask, totals=totals)
                mb_sums["value_loss"] = (float(value_loss.detach()), 1.0 / n_micro)
            if not all(math.isfinite(float(x.detach())) for x in (loss, value_loss) if x is not None):
                fault = _bad_rows("loss", torch.ones(len(mb), dtype=torch.bool), mb.rollout)
                break
            mb_sums["loss"] = (float(loss.detach()), 1.0 / n_micro)  # sum over micro-batches, mean over updates
            for k, (v, c) in mb_sums.items():
                sums[k] += v
                counts[k] += c
            policy.backward(loss, value_loss)
        if fault is not None:
            metrics.update(policy.optimizer_step(skip=True), skipped=1, **fault)
            break
        metrics.update(policy.optimizer_step())
    metrics["time_train"] = time.perf_counter() - t0
    for k in sums:  # token-weighted means over the step (loss: sum of micro-batch losses)
        metrics[k] = sums[k] / counts[k] if counts[k] else 0.0
    metrics.setdefault("skipped", 0)

    t0 = time.perf_counter()
    if not metrics["skipped"]:
        metrics.update(policy.sync())
    metrics["time_sync"] = time.perf_counter() - t0

    lengths = rollout.response_mask.sum(-1).float()
    valid = ~torch.isnan(rewards)
    metrics.update(
        reward_mean=float(rewards[valid].mean()) if valid.any() else math.nan,
        reward_std=float(rewards[valid].std(unbiased=False)) if valid.any() else math.nan,
        response_length_mean=float(lengths.mean()) if len(lengths) else 0.0,
        response_length_max=float(lengths.max()) if len(lengths) else 0.0,
        truncated_frac=float(rollout.truncated.float().mean()) if len(rollout) else 0.0,
        rows=len(rollout),
        reward_unscorable=int((~valid).sum()),
    )
    return metrics


def _greedy_rows(run, rollout: Rollout) -> torch.Tensor:
    """``[B]`` bool: the greedy baseline rows of ``rollout``; a sample component with ``greedy``
    that marks none (or P x n rows) is a :class:`ComponentError`."""
    greedy = rollout.greedy if rollout.greedy is not None else torch.zeros(len(rollout), dtype=torch.bool)
    if run.sample.params.greedy and int(greedy.sum()) * (run.sample.params.n + 1) != len(rollout):
        raise ComponentError(f"sample component {run.sample!r}", f"greedy = True but Rollout.greedy marks "
                             f"{int(greedy.sum())} of {len(rollout)} rows, not one per prompt",
                             "return one greedy response per prompt marked in Rollout.greedy (see the sample hook)")
    return greedy.to(torch.bool)


def _bad_rows(what: str, bad, rollout: Rollout) -> dict | None:
    """None if no row is bad, else the skip record: the reason, and the offending rows named by
    group id (stable across micro-batches) with the first few prompts."""
    if not bool(bad.any()):
        return None
    rows = bad.nonzero().flatten().tolist()
    return {"skip_reason": f"non-finite {what}", "skip_groups": sorted(set(rollout.group_ids[rows].tolist())),
            "skip_prompts": [rollout.prompt_excerpt(i) for i in rows[:4]] if rollout.prompts else []}
