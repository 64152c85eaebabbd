"""Phase 3 of the step: score with frozen models, advantages, the update(s) and the weight sync.

:func:`train_step` is one whole step, top to bottom: :func:`~policyzoo.step.collect.collect` (sample
-> reward -> filter), then :func:`learn` (score -> advantages -> update -> sync). Used unchanged by
the real engine and by the bandit test bed; every algorithm-specific decision is a hook call.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Callable, Protocol

import torch

from policyzoo.contract import Rollout, StepBatch

from . import agree
from .advantages import prepare
from .collect import StepSettings, collect
from .loss import micro_loss, needs_entropy_grad, step_totals
from .metrics import step_means, to_host


class Ahead(Protocol):
    """How the coming batches are sampled ahead of the step that trains on them (the engine's
    one-step overlap and asynchronous sampler; without one, each batch is sampled when its step
    starts). The step calls ``before()`` before it collects its batch, ``collected()`` once it has
    (the moment to start sampling what comes next), and ``learned()`` after the update; the dict
    ``learned()`` returns joins the step's metrics."""

    def before(self) -> None: ...

    def collected(self) -> None: ...

    def learned(self) -> dict: ...


def train_step(run, policy, next_prompts: Callable[[], list[dict]], seed: int,
               settings: StepSettings = StepSettings(), on_batch: Callable[[StepBatch], None] | None = None,
               ahead: Ahead | None = None) -> dict:
    """One optimizer step (or ``updates_per_batch`` of them) on a batch: the one step of every
    rollout placement. ``policy`` samples it (fresh, or prefetched by an :class:`Ahead` whose
    ``policy`` this is); ``on_batch`` (if given) sees the batch with its advantages before the update
    (for logging)."""
    if ahead is not None:
        ahead.before()
    rollout, rewards, parts, greedy_rewards, metrics = collect(run, policy, next_prompts, seed, settings)
    if ahead is not None:
        ahead.collected()
    metrics = learn(run, policy, rollout, rewards, metrics, settings, parts, greedy_rewards, on_batch)
    return metrics if ahead is None else {**metrics, **ahead.learned()}


def learn(run, policy, rollout: Rollout, rewards: torch.Tensor, metrics: dict,
          settings: StepSettings = StepSettings(), reward_components: torch.Tensor | None = None,
          greedy_rewards: torch.Tensor | None = None, on_batch: Callable[[StepBatch], None] | None = None) -> dict:
    """Score, advantages, update(s) and weight sync on a batch from :func:`collect` (its rollout,
    rewards, metrics, reward components ``[B, K]`` and greedy rewards); ``on_batch`` as in
    :func:`train_step`.

    Rows sampled by older weights than the trainer's (``rollout.policy_lag`` > 0, see
    ``engine.overlap``) are off-policy: their ``old_logprobs`` are the sampler's
    ``rollout_logprobs`` (the behaviour policy's), so the ratio and clip components correct for
    the lag (for the on-policy first update the ratio is exactly 1 instead).

    On several ranks every collective is preceded by an agreement on the work (:mod:`.agree`): a
    step where some rank kept no row is skipped on every rank.

    The batch moves to the policy's ``device`` (if any) once; scoring, advantages and the loss stay
    there and their metrics come back in one copy (:func:`.metrics.to_host`)."""
    c = policy.collective
    with agree.phase(c, "agreeing on the rows kept (after sampling)"):
        counts = agree.row_counts(c, len(rollout))
    if min(counts) == 0:  # train_on_fewer with nothing kept (on some rank): no update, the run goes on
        empty = [r for r, n in enumerate(counts) if n == 0]
        where = "" if len(counts) == 1 else f" on rank {', '.join(map(str, empty))}"
        return {**metrics, **(_batch_metrics(rollout, rewards) if len(rollout) else {"rows": 0}), "skipped": 1,
                "skip_reason": f"no rows kept by the filters{where}"}
    t0 = time.perf_counter()
    metrics = _train(run, policy, rollout, rewards, metrics, settings, reward_components, greedy_rewards, on_batch)
    metrics["time_train"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if not metrics["skipped"]:
        with agree.phase(c, "weight sync"):
            metrics.update(policy.sync())
    metrics["time_sync"] = time.perf_counter() - t0
    metrics.update(_batch_metrics(rollout, rewards))
    if not metrics["skipped"]:
        with agree.phase(c, "updating stateful components"):
            update_state(run, {**metrics, "tokens": int(rollout.response_mask.sum())}, c)
    return metrics


def _train(run, policy, rollout: Rollout, rewards, metrics: dict, settings: StepSettings, reward_components,
           greedy_rewards, on_batch) -> dict:
    """Scoring, advantages and the update(s) of :func:`learn` on the policy's device; returns ``metrics``
    with the step's, on the host (one copy: :func:`.metrics.to_host`). ``rollout`` and ``rewards`` are
    the host's; the zero-std fraction and the staleness are read there."""
    c = policy.collective
    stale = _staleness(rollout, metrics)
    metrics["zero_std_frac"] = run.baseline.zero_std_fraction(rewards, rollout.group_ids, rollout.response_mask)
    rollout, rewards, reward_components, greedy_rewards = _to_device(
        getattr(policy, "device", None), rollout, rewards, reward_components, greedy_rewards)
    with agree.phase(c, "scoring with frozen models"):
        batch, scored = _score(run, policy, rollout, rewards, settings, reward_components, greedy_rewards, stale)
    with agree.phase(c, "advantages"):
        batch, adv_metrics = prepare(run, batch, scored, c)
    metrics.update(adv_metrics)
    if on_batch is not None:
        on_batch(batch)
    with agree.phase(c, "summing the loss normalisers"):
        totals = policy.reduce_totals(step_totals(batch))  # data parallel: the whole step's counts over all ranks
    _update(run, policy, batch, totals, metrics, settings)
    return to_host(metrics)  # the step's one device-to-host copy of its metrics


def update_state(run, metrics: dict, collective) -> None:
    """The once-per-step update of every stateful component (``Component.update``), in slot order,
    after the batch's optimizer step(s), with a copy of this rank's metrics (plus ``tokens``, its
    trainable token count, to weight token means across ranks) and the collective."""
    for comp in run.components():
        if comp.stateful:
            comp.update(metrics=dict(metrics), collective=collective)


def needs_reference(run) -> bool:
    """Whether the run reads reference log-probs: a ``kl`` component, or a ``term`` that declares
    ``needs_ref`` (the distillation term reads the teacher through the same slot)."""
    return run.kl is not None or any(getattr(t, "needs_ref", False) for t in run.term)


def _to_device(device, rollout: Rollout, *tensors):
    """The rollout and the tensors (or None) on ``device``: one host-to-device copy of the batch, after
    which nothing comes back until the metrics do; unchanged when ``device`` is None."""
    if device is None:
        return (rollout, *tensors)
    return (rollout.to(device), *(None if x is None else x.to(device) for x in tensors))


def _staleness(rollout: Rollout, metrics: dict) -> bool:
    """Whether some row was sampled by older weights (``policy_lag`` > 0), read on the host rollout;
    records ``policy_lag_max`` / ``policy_lag_mean`` in ``metrics`` when the rollout has lags."""
    lag = rollout.policy_lag
    if lag is None:
        return False
    metrics.update(policy_lag_max=int(lag.max()), policy_lag_mean=float(lag.float().mean()))
    return bool((lag > 0).any())


def _score(run, policy, rollout: Rollout, rewards, settings: StepSettings, reward_components,
           greedy_rewards, stale: bool) -> tuple[StepBatch, torch.Tensor | None]:
    """Score the batch with frozen models, only what the chosen components need; returns the
    :class:`StepBatch` and the trainer's log-probs at sampling time (None when nothing needs them).
    ``stale``: some row was sampled by older weights (:func:`_staleness`)."""
    with torch.no_grad():
        kl_in_reward = run.kl is not None and run.kl.params.placement == "reward"
        pi2 = run.baseline.needs_pi_squared
        scored = (policy.logprobs(rollout, grad=False)[0] if (settings.updates_per_batch > 1 or kl_in_reward or pi2)
                  else None)
        sum_pi_squared = policy.sum_pi_squared(rollout) if pi2 else None
        ref = policy.ref_logprobs(rollout) if needs_reference(run) else None
        values = policy.values(rollout, grad=False) if run.baseline.needs_values else None
    # On-policy (one update per batch): old_logprobs stay None and the loss uses the live
    # log-probs detached, so the first ratio is exactly 1 without a second forward.
    old = scored if settings.updates_per_batch > 1 else None
    if stale:  # sampled by older weights: the behaviour policy's log-probs
        old = torch.where(rollout.response_mask, rollout.rollout_logprobs, 0.0)
    batch = StepBatch(rollout, rewards, old_logprobs=old, ref_logprobs=ref, values=values,
                      reward_components=reward_components, greedy_rewards=greedy_rewards,
                      sum_pi_squared=sum_pi_squared)
    return batch, scored


def _micro_batches(batch: StepBatch, settings: StepSettings, collective) -> tuple[list[StepBatch], int]:
    """The micro-batches of one pass (by token budget or by count) and how many are real: on several
    ranks every rank runs as many as the rank that runs most, padded (:func:`agree.equal_micro_batches`)."""
    budget = settings.max_tokens_per_micro_batch
    micro = batch.split_tokens(budget) if budget else batch.split(min(settings.micro_batches, len(batch)))
    return agree.equal_micro_batches(micro, batch, collective)


def _update(run, policy, batch: StepBatch, totals, metrics: dict, settings: StepSettings) -> None:
    """Each pass over the batch is one optimizer step; micro-batches accumulate exactly. A
    non-finite reward, log-prob or loss (on any rank) skips the whole update: gradients are
    discarded and the weights stay as they were (the engine's ``optimizer_step(skip=True)``)."""
    sums: Counter = Counter()
    counts: Counter = Counter()
    c = policy.collective
    with agree.phase(c, "agreeing on the micro-batches"):
        fault = _bad_rows("rewards", torch.isinf(batch.rewards), batch.rollout)
        ranks = agree.any_fault(c, fault is not None)
        fault = agree.fault_record(ranks, fault, "rewards") if ranks else None
        micro, n_micro = _micro_batches(batch, settings, c)
    metrics["micro_batches"] = n_micro
    for _ in range(settings.updates_per_batch):
        for i, mb in enumerate(micro if fault is None else []):
            with agree.phase(c, f"update, micro-batch {i + 1} of {len(micro)}"):
                fault = _accumulate(run, policy, mb, totals, n_micro, sums, counts, padding=i >= n_micro)
            if fault is not None:
                break
        if fault is not None:
            with agree.phase(c, "optimizer step (skipped)"):
                metrics.update(policy.optimizer_step(skip=True), skipped=1, **fault)
            break
        with agree.phase(c, "optimizer step"):
            metrics.update(policy.optimizer_step())
    metrics.update(step_means(sums, counts))  # token-weighted means over the step (loss: sum of micro-batch losses)
    metrics.setdefault("skipped", 0)


def _accumulate(run, policy, mb: StepBatch, totals, n_micro: int, sums: Counter, counts: Counter,
                padding: bool = False) -> dict | None:
    """Forward, loss and backward of one micro-batch; adds its metric sums. Returns the skip record
    when a log-prob or the loss is not finite on this rank or another (agreed before any backward,
    so every rank stops at the same micro-batch; nothing is accumulated then), else None. A
    ``padding`` micro-batch (:func:`agree.padding`) runs the same calls and back-propagates zero."""
    # entropy with grad only when a term needs it (the flag is passed only then: policies without it keep working)
    logprobs, entropy = policy.logprobs(mb.rollout, grad=True, entropy=True,
                                        **({"entropy_grad": True} if needs_entropy_grad(run) else {}))
    finite = torch.isfinite(logprobs.detach())
    bad_lp = (~finite & mb.response_mask).any(-1)  # [B], on the device: read once below, with the loss's check
    # the loss runs even after a bad log-prob (on zeros there): its collectives (clip_cov, kl_cov) run on every
    # rank; where every log-prob is finite the values and gradients are those of the log-probs themselves
    lp = torch.where(finite, logprobs, 0.0)
    loss, mb_sums = micro_loss(run, mb, lp, totals, entropy, policy.collective)
    values = policy.values(mb.rollout, grad=True) if run.baseline.needs_values else None
    value_loss = None
    if values is not None:
        value_loss = run.baseline.value_loss(values=values, old_values=mb.values, returns=mb.returns,
                                             response_mask=mb.response_mask, totals=totals)
        mb_sums["value_loss"] = (value_loss.detach().double(), 1.0 / n_micro)
    if padding:  # the same forward and backward as a real micro-batch, with a gradient of exactly 0
        loss = 0.0 * lp.sum()
        value_loss = None if values is None else 0.0 * values.sum()
    # one device-to-host copy per micro-batch: the faults every rank agrees on before any backward
    checks = [bad_lp.any()] + [~torch.isfinite(x.detach()).all() for x in (loss, value_loss)
                               if x is not None and not padding]
    bad = torch.stack(checks).tolist()
    fault = _bad_rows("logprobs", bad_lp.cpu(), mb.rollout) if bad[0] else None
    if fault is None and any(bad[1:]):
        fault = _bad_rows("loss", torch.ones(len(mb), dtype=torch.bool), mb.rollout)
    ranks = agree.any_fault(policy.collective, fault is not None)
    if ranks:
        return agree.fault_record(ranks, fault, "log-probs or loss")
    if not padding:
        mb_sums["loss"] = (loss.detach().double(), 1.0 / n_micro)  # sum over micro-batches, mean over updates
        for k, (v, c) in mb_sums.items():
            sums[k] += v
            counts[k] += c
    policy.backward(loss, value_loss)
    return None


def _batch_metrics(rollout: Rollout, rewards: torch.Tensor) -> dict:
    """The batch's reward and length statistics (NaN rewards left out and counted).

    ``response_length_correct_mean`` / ``_wrong_mean``: mean response tokens of the rows with reward
    > 0 / <= 0 (a 0/1 verifier's right and wrong answers, and the +-1 convention's; NaN where the
    batch has none, written null), the lengths Dr. GRPO (Liu et al. 2025, sec. 3.1) says per-sequence
    normalisation pulls apart."""
    lengths = rollout.response_mask.sum(-1).float()
    valid = ~torch.isnan(rewards)
    right, wrong = valid & (rewards > 0), valid & (rewards <= 0)
    return dict(
        response_length_correct_mean=float(lengths[right].mean()) if right.any() else math.nan,
        response_length_wrong_mean=float(lengths[wrong].mean()) if wrong.any() else math.nan,
        reward_mean=float(rewards[valid].mean()) if valid.any() else math.nan,
        reward_std=float(rewards[valid].std(unbiased=False)) if valid.any() else math.nan,
        response_length_mean=float(lengths.mean()) if len(lengths) else 0.0,
        response_length_max=float(lengths.max()) if len(lengths) else 0.0,
        truncated_frac=float(rollout.truncated.float().mean()) if len(rollout) else 0.0,
        rows=len(rollout),
        reward_unscorable=int((~valid).sum()),
    )


def _bad_rows(what: str, bad, rollout: Rollout) -> dict | None:
    """None if no row is bad, else the skip record: the reason, and the offending rows named by
    group id (stable across micro-batches) with the first few prompts."""
    if not bool(bad.any()):
        return None
    rows = bad.nonzero().flatten().tolist()
    return {"skip_reason": f"non-finite {what}", "skip_groups": sorted(set(rollout.group_ids[rows].tolist())),
            "skip_prompts": [rollout.prompt_excerpt(i) for i in rows[:4]] if rollout.prompts else []}
