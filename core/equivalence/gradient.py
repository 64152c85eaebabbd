"""What one algorithm does with a probe batch: the rows its filters keep and the step's gradient
d(loss)/d(logprobs) through :func:`policyzoo.step.prepare` and :func:`policyzoo.step.micro_loss`."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from policyzoo.assembly import Run
from policyzoo.contract import SLOTS, Bundle, StepBatch
from policyzoo.step import dispatch, micro_loss, needs_reference, prepare, step_totals

from .batches import ProbeBatch, Regime, probe_batches

#: two gradients agree when max|g_a - g_b| <= RTOL x max(max|g_a|, max|g_b|) (+ ATOL for two zeros)
RTOL, ATOL = 1e-6, 1e-12


@dataclass
class Probe:
    """What one algorithm does with one batch: ``keep [B]`` rows (and ``tokens [B, T]``) its filters
    keep, and its gradient ``grad [B, T]`` d(loss)/d(logprobs) (0 on dropped rows), ``grad_entropy``."""

    keep: Tensor
    tokens: Tensor
    grad: Tensor
    grad_entropy: Tensor


def filters(run: Run, b: ProbeBatch) -> list[tuple[Any, Tensor]]:
    """Each filter component of ``run`` with its keep mask ``[B]`` or ``[B, T]`` on ``b``."""
    if not run.filter:
        return []
    rows, width = b.rollout.response_mask.shape
    return [(comp, out.keep) for comp, out in dispatch.call_each(run, "filter", rows=rows, width=width,
                                                                 rollout=replace(b.rollout), rewards=b.rewards)]


def gradient(run: Run, b: ProbeBatch, updates_per_batch: int = 1) -> Probe:
    """The step's gradient for ``run`` on ``b`` (see the module docstring): the filters' masks, then
    :func:`~policyzoo.step.prepare` and :func:`~policyzoo.step.micro_loss` on the kept rows, one
    micro-batch, the whole step's totals. ``updates_per_batch`` decides, as the step does, whether the
    trainer's log-probs at sampling time reach the baseline and a KL in reward placement."""
    mask = b.rollout.response_mask
    keep, tokens = torch.ones(len(b.rewards), dtype=torch.bool), mask.clone()
    for _, k in filters(run, b):
        if k.dim() == 2:
            tokens &= k
        else:
            keep &= k
    lp = b.logprobs.clone().requires_grad_(True)
    ent = b.entropy.clone().requires_grad_(True)
    grad, grad_ent = torch.zeros_like(lp), torch.zeros_like(ent)
    if keep.any():
        rollout = replace(b.rollout, response_mask=tokens).select(keep)
        pick = lambda x: None if x is None else x[keep]  # noqa: E731
        kl_reward = run.kl is not None and run.kl.params.placement == "reward"
        pi2 = run.baseline.needs_pi_squared
        scored = pick(b.logprobs) if updates_per_batch > 1 or kl_reward or pi2 else None
        batch = StepBatch(rollout, b.rewards[keep], old_logprobs=pick(b.old_logprobs),
                          ref_logprobs=pick(b.ref_logprobs) if needs_reference(run) else None,
                          values=pick(b.values) if run.baseline.needs_values else None,
                          greedy_rewards=b.rewards[keep].flip(0) if getattr(run.sample.params, "greedy", False)
                          else None, sum_pi_squared=pick(b.sum_pi_squared) if pi2 else None)
        batch, _ = prepare(run, batch, scored)
        loss, _ = micro_loss(run, batch, lp[keep], step_totals(batch), ent[keep])
        found = torch.autograd.grad(loss, [lp, ent], allow_unused=True)
        grad = found[0] if found[0] is not None else grad
        grad_ent = found[1] if found[1] is not None else grad_ent
    return Probe(keep, tokens, grad.detach(), grad_ent.detach())


def _close(a: Tensor, b: Tensor) -> bool:
    scale = max(float(a.abs().max()), float(b.abs().max())) if a.numel() else 0.0
    return a.numel() == 0 or float((a - b).abs().max()) <= RTOL * scale + ATOL


def same(a: list[Probe], b: list[Probe]) -> bool:
    """Two algorithms' probes on the same batches agree: the same rows and tokens kept, gradients within RTOL."""
    return all(torch.equal(x.keep, y.keep) and torch.equal(x.tokens, y.tokens) and _close(x.grad, y.grad)
               and _close(x.grad_entropy, y.grad_entropy) for x, y in zip(a, b, strict=True))


def probe(run: Run, r: Regime, batches: list[ProbeBatch] | None = None) -> list[Probe]:
    """:func:`gradient` of ``run`` on every batch of ``r`` (under a fixed torch seed, the global one kept)."""
    # the CPU generator only: no CUDA context is made and no CUDA seed is queued for the run (devices=[])
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.default_generator.manual_seed(0)
        return [gradient(run, b, r.updates_per_batch) for b in (batches or probe_batches(r))]


def build_run(bundle: Bundle) -> Run:
    """The run the probe computes with: ``bundle`` without its ``env`` and its ``reward`` extras (they act
    on sampling, which the probe does not do, and may be costly to build: a reward model's weights); the
    verdicts compare those slots on the bundles themselves (:data:`policyzoo.equivalence.verdict.UNPROBED`)."""
    with warnings.catch_warnings():  # a component's check warns once, in the real run; not for each variant
        warnings.simplefilter("ignore")
        return Run(bundle.replace(env=None, reward=()) if bundle.env is not None or bundle.reward else bundle)


def components(run: Run) -> dict[str, list[tuple[str, dict]]]:
    """Each slot's components as ``[(name, parameters)]``."""
    out = {}
    for slot in SLOTS:
        comps = getattr(run, slot)
        comps = comps if isinstance(comps, list) else ([] if comps is None else [comps])
        out[slot] = [(c.name, json.loads(json.dumps(c.params.model_dump(), default=str))) for c in comps]
    return out

