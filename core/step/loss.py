"""The loss of one micro-batch, computed through the ``ratio``, ``clip``, ``kl``, ``term`` and ``reduce``
hooks (no algorithm names here): :func:`micro_loss` runs per micro-batch with the current policy's
log-probs and returns the reduced loss plus the metrics each part reports; :func:`loss_terms` are
the additive per-token terms (the KL in loss placement first, then the ``term`` components);
:func:`step_totals` are the normalisers it divides by.
"""

from __future__ import annotations

import torch
from torch import Tensor

from policyzoo.contract import LOCAL, Collective, Importance, StepBatch, StepTotals

from . import dispatch


def step_totals(batch: StepBatch) -> StepTotals:
    """Token and sequence counts of the whole step (one rank; the engine all-reduces them)."""
    mask = batch.rollout.mask_on_host()  # counted on the host: the normalisers are Python ints
    return StepTotals(tokens=int(mask.sum()), sequences=int((mask.sum(-1) > 0).sum()), rows=len(batch))


def loss_terms(run, mb: StepBatch, logprobs: Tensor, ratio: Tensor,
               entropy: Tensor | None = None) -> list[tuple[str, float, Tensor]]:
    """The additive per-token loss terms of a micro-batch as ``(metric, coefficient, term [B, T])``,
    in the order the step adds them: the ``kl`` component in loss placement (``kl_loss``, its
    ``beta``), then each ``term`` component in config order (``term/<name>``, its ``coef``).
    ``entropy [B, T]`` (with grad when a term ``needs_entropy``) is handed to the terms."""
    mask = mb.response_mask
    shape = mask.shape
    out: list[tuple[str, float, Tensor]] = []
    if run.kl is not None and run.kl.params.placement == "loss":
        kl = dispatch.call(run, "kl", *shape, logprobs=logprobs, ref_logprobs=mb.ref_logprobs, response_mask=mask,
                      ratio=ratio)
        out.append(("kl_loss", run.kl.beta, kl))
    if getattr(run, "term", None):
        results = dispatch.call_each(run, "term", *shape, logprobs=logprobs, entropy=entropy,
                                     ref_logprobs=mb.ref_logprobs, ratio=ratio, advantages=mb.advantages,
                                     response_mask=mask)
        out += [(f"term/{comp.name}", comp.coef, value) for comp, value in results]
    return out


def needs_entropy_grad(run) -> bool:
    """True when a ``term`` component declares ``needs_entropy`` (the trainer then builds the entropy's graph)."""
    return any(t.needs_entropy for t in getattr(run, "term", ()))


def micro_loss(run, mb: StepBatch, logprobs: Tensor, totals: StepTotals, entropy: Tensor | None = None,
               collective: Collective = LOCAL) -> tuple[Tensor, dict[str, tuple[float, float]]]:
    """Reduced loss of one micro-batch and its metric sums.

    ``logprobs [B, T]`` carry grad. ``mb.old_logprobs`` None means on-policy (first update after
    sampling): old = ``logprobs.detach()``, so every ratio is exactly 1. A ratio that returns an
    :class:`Importance` with a ``weight`` has the clip's per-token loss multiplied by it (before the
    KL term); ``mismatch/*`` report mean |old - rollout| and the truncated / masked token fractions.
    Metrics are ``{name: (sum, count)}`` over masked tokens, so they add up across micro-batches: 0-dim
    float64 tensors on the log-probs' device (no host copy here; :func:`policyzoo.step.metrics.to_host`
    moves a step's metrics at once), or 0.0 for a part that reports nothing.
    """
    mask = mb.response_mask
    old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
    shape = mask.shape
    rollout_lp = mb.rollout.rollout_logprobs
    imp = dispatch.call(run, "ratio", *shape, logprobs=logprobs, old_logprobs=old, rollout_logprobs=rollout_lp,
                   response_mask=mask, advantages=mb.advantages)
    imp = imp if isinstance(imp, Importance) else Importance(imp)
    ratio = imp.ratio
    sur = dispatch.call(run, "clip", *shape, ratio=ratio, advantages=mb.advantages, logprobs=logprobs, old_logprobs=old,
                   response_mask=mask, collective=collective)
    per_token = sur.loss if imp.weight is None else sur.loss * imp.weight  # TRL/verl: weight on the clipped loss
    n = mask.sum().double()
    sums: dict[str, tuple[Tensor | float, Tensor]] = {}
    # the trainer/sampler mismatch |old - rollout| per token (nats), every step, and what the ratio did about it
    gap = torch.where(mask, (old.detach() - rollout_lp.to(old.dtype)).abs(), torch.zeros_like(old))
    sums["mismatch/log_ratio_abs_mean"] = (gap.sum().double(), n)
    for name, hit in (("mismatch/truncated_frac", imp.truncated), ("mismatch/masked_frac", imp.masked)):
        sums[name] = ((hit & mask).sum().double() if hit is not None else 0.0, n)
    for key, coef, value in loss_terms(run, mb, logprobs, ratio, entropy):
        per_token = per_token + coef * value
        sums[key] = ((value.detach() * mask).sum().double(), n)
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))  # no NaN leaks from padding
    loss = dispatch.call(run, "reduce", *shape, loss=per_token, response_mask=mask, totals=totals)
    for name, hit in (("clip_frac_low", sur.clipped_low), ("clip_frac_high", sur.clipped_high)):
        sums[name] = ((hit & mask).sum().double() if hit is not None else 0.0, n)
    sums["ratio_mean"] = ((ratio.detach() * mask).sum().double(), n)
    if entropy is not None:
        sums["entropy"] = ((entropy.detach() * mask).sum().double(), n)
    return loss, sums
