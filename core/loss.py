"""The loss of one policy-gradient step, computed through the hooks (no algorithm names here).

``prepare`` runs once per optimizer step on the whole batch (rewards -> advantages);
``micro_loss`` runs per micro-batch with the current policy's log-probs and returns the reduced
loss plus the metrics each part reports.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .batch import StepBatch
from .hookspecs import LOCAL, Collective, Importance, StepTotals


def step_totals(batch: StepBatch) -> StepTotals:
    """Token and sequence counts of the whole step (one rank; the engine all-reduces them)."""
    mask = batch.response_mask
    return StepTotals(tokens=int(mask.sum()), sequences=int((mask.sum(-1) > 0).sum()), rows=len(batch))


def prepare(run, batch: StepBatch, scored: Tensor | None = None,
            collective: Collective = LOCAL) -> tuple[StepBatch, dict]:
    """Per-token rewards (an env's per-turn rewards, KL in reward placement), then advantages
    through ``baseline``.

    Credit assignment: the sequence reward ``rewards [B]`` goes to the baseline as is (group
    baselines broadcast the advantage over the row's model tokens; GAE puts it on the last one);
    per-turn rewards ``rollout.turn_rewards [B, T]`` (on the last token of their turn) are added to
    ``token_rewards`` on masked-in tokens, so token-level baselines (GAE) credit each turn where it
    happened and group baselines score a row by its sum.

    ``scored [B, T]``: the trainer's log-probs at sampling time (no grad), needed for a KL in
    reward placement; the sampler's ``rollout_logprobs`` stand in when it is None."""
    mask = batch.response_mask
    metrics: dict[str, float] = {}
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if batch.rollout.turn_rewards is not None:
        turn = batch.rollout.turn_rewards.to(device=mask.device, dtype=torch.float32)
        token_rewards = torch.where(mask, turn, token_rewards)
    if run.kl is not None and batch.ref_logprobs is not None:
        now = scored if scored is not None else batch.rollout.rollout_logprobs
        kl = run.call("kl", *mask.shape, logprobs=now, ref_logprobs=batch.ref_logprobs, response_mask=mask,
                      ratio=torch.ones_like(now))
        metrics["kl_ref"] = masked_mean(kl, mask)
        if run.kl.params.placement == "reward":
            token_rewards = token_rewards + torch.where(mask, -run.kl.params.beta * kl, torch.zeros_like(kl))
    parts = batch.reward_components  # [B, K]; a batch built without them has the rewards as its only one
    weights = torch.tensor([float(c.params.weight) for c in run.reward]) if parts is not None else torch.ones(1)
    parts = batch.rewards.unsqueeze(-1) if parts is None else parts
    out = run.call("baseline", *mask.shape, rewards=batch.rewards, group_ids=batch.rollout.group_ids,
                   response_mask=mask, token_rewards=token_rewards, values=batch.values, collective=collective,
                   reward_components=parts, reward_weights=weights,
                   greedy_rewards=batch.greedy_rewards if batch.greedy_rewards is not None
                   else torch.full_like(batch.rewards, torch.nan),
                   old_logprobs=scored if scored is not None else batch.rollout.rollout_logprobs,
                   sum_pi_squared=batch.sum_pi_squared)
    out = run.baseline.chain(out, batch.rewards, mask, collective)  # the declared composition (batch whitening)
    batch.token_rewards, batch.advantages, batch.returns = token_rewards, out.advantages, out.returns
    metrics["zero_std_frac"] = run.baseline.zero_std_fraction(batch.rewards, batch.rollout.group_ids, mask)
    metrics["advantage_mean"] = masked_mean(out.advantages, mask)
    return batch, metrics


def masked_mean(x: Tensor, mask: Tensor) -> float:
    n = mask.sum()
    return float((x.detach() * mask).sum() / n) if n > 0 else 0.0


def micro_loss(run, mb: StepBatch, logprobs: Tensor, totals: StepTotals, entropy: Tensor | None = None,
               collective: Collective = LOCAL) -> tuple[Tensor, dict[str, tuple[float, float]]]:
    """Reduced loss of one micro-batch and its metric sums.

    ``logprobs [B, T]`` carry grad. ``mb.old_logprobs`` None means on-policy (first update after
    sampling): old = ``logprobs.detach()``, so every ratio is exactly 1. A ratio that returns an
    :class:`Importance` with a ``weight`` has the clip's per-token loss multiplied by it (before the
    KL term); ``mismatch/*`` report mean |old - rollout| and the truncated / masked token fractions.
    Metrics are ``{name: (sum, count)}`` over masked tokens, so they add up across micro-batches.
    """
    mask = mb.response_mask
    old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
    shape = mask.shape
    rollout_lp = mb.rollout.rollout_logprobs
    imp = run.call("ratio", *shape, logprobs=logprobs, old_logprobs=old, rollout_logprobs=rollout_lp,
                   response_mask=mask, advantages=mb.advantages)
    imp = imp if isinstance(imp, Importance) else Importance(imp)
    ratio = imp.ratio
    sur = run.call("clip", *shape, ratio=ratio, advantages=mb.advantages, logprobs=logprobs, old_logprobs=old,
                   response_mask=mask, collective=collective)
    per_token = sur.loss if imp.weight is None else sur.loss * imp.weight  # TRL/verl: weight on the clipped loss
    n = float(mask.sum())
    sums: dict[str, tuple[float, float]] = {}
    # the trainer/sampler mismatch |old - rollout| per token (nats), every step, and what the ratio did about it
    gap = torch.where(mask, (old.detach() - rollout_lp.to(old.dtype)).abs(), torch.zeros_like(old))
    sums["mismatch/log_ratio_abs_mean"] = (float(gap.sum()), n)
    for name, hit in (("mismatch/truncated_frac", imp.truncated), ("mismatch/masked_frac", imp.masked)):
        sums[name] = (float((hit & mask).sum()) if hit is not None else 0.0, n)
    if run.kl is not None and run.kl.params.placement == "loss":
        kl = run.call("kl", *shape, logprobs=logprobs, ref_logprobs=mb.ref_logprobs, response_mask=mask,
                      ratio=ratio)
        per_token = per_token + run.kl.params.beta * kl
        sums["kl_loss"] = (float((kl.detach() * mask).sum()), n)
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))  # no NaN leaks from padding
    loss = run.call("reduce", *shape, loss=per_token, response_mask=mask, totals=totals)
    for name, hit in (("clip_frac_low", sur.clipped_low), ("clip_frac_high", sur.clipped_high)):
        sums[name] = (float((hit & mask).sum()) if hit is not None else 0.0, n)
    sums["ratio_mean"] = (float((ratio.detach() * mask).sum()), n)
    if entropy is not None:
        sums["entropy"] = (float((entropy.detach() * mask).sum()), n)
    return loss, sums
