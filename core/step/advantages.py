"""Phase 2 of the step: rewards -> per-token rewards -> advantages, once per optimizer step on the
whole batch, through the ``kl`` and ``baseline`` hooks (no algorithm names here)."""

from __future__ import annotations

import torch
from torch import Tensor

from policyzoo.contract import LOCAL, Collective, StepBatch

from . import dispatch


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
    reward placement; the sampler's ``rollout_logprobs`` stand in when it is None.
 Runs on the batch's device; the metrics are 0-dim tensors
    there (:func:`policyzoo.step.metrics.to_host`); ``zero_std_frac`` is reported by ``learn``."""
    mask = batch.response_mask
    metrics: dict[str, float] = {}
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if batch.rollout.turn_rewards is not None:
        turn = batch.rollout.turn_rewards.to(device=mask.device, dtype=torch.float32)
        token_rewards = torch.where(mask, turn, token_rewards)
    if run.kl is not None and batch.ref_logprobs is not None:
        now = scored if scored is not None else batch.rollout.rollout_logprobs
        kl = dispatch.call(run, "kl", *mask.shape, logprobs=now, ref_logprobs=batch.ref_logprobs, response_mask=mask,
                      ratio=torch.ones_like(now))
        metrics["kl_ref"] = masked_mean(kl, mask)
        # verl's current_kl (apply_kl_penalty): each row's token mean (0 for a row with no token), then the
        # mean over rows -- what an adaptive KL controller reads in its update
        per_row = (kl.detach() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        metrics["kl_ref_row_mean"] = per_row.mean() if len(per_row) else 0.0
        metrics["kl_coef"] = run.kl.beta  # the coefficient used this step (verl actor/reward_kl_penalty_coeff)
        if run.kl.params.placement == "reward":
            token_rewards = token_rewards + torch.where(mask, -run.kl.beta * kl, torch.zeros_like(kl))
    parts = batch.reward_components  # [B, K]; a batch built without them has the rewards as its only one
    weights = torch.tensor([float(c.params.weight) for c in run.reward] if parts is not None else [1.0],
                           device=mask.device)
    parts = batch.rewards.unsqueeze(-1) if parts is None else parts
    out = dispatch.call(run, "baseline", *mask.shape, rewards=batch.rewards, group_ids=batch.rollout.group_ids,
                   response_mask=mask, token_rewards=token_rewards, values=batch.values, collective=collective,
                   reward_components=parts, reward_weights=weights,
                   greedy_rewards=batch.greedy_rewards if batch.greedy_rewards is not None
                   else torch.full_like(batch.rewards, torch.nan),
                   old_logprobs=scored if scored is not None else batch.rollout.rollout_logprobs,
                   sum_pi_squared=batch.sum_pi_squared)
    out = run.baseline.chain(out, batch.rewards, mask, collective)  # the declared composition (batch whitening)
    batch.token_rewards, batch.advantages, batch.returns = token_rewards, out.advantages, out.returns
    metrics["advantage_mean"] = masked_mean(out.advantages, mask)
    return batch, metrics


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x [B, T]`` over the True entries of ``mask [B, T]`` as a 0-dim tensor on ``x``'s device
    (0 when the mask is empty; no host copy)."""
    n = mask.sum()
    return torch.where(n > 0, (x.detach() * mask).sum() / n.clamp(min=1), 0.0)
