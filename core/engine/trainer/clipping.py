"""The gradient norm of a step, and its clipping at ZeRO 0 in one process from that same norm.

:meth:`policyzoo.engine.trainer.deepspeed_trainer.Trainer.step` needs the gradient norm before
the update (to report it and to detect a non-finite gradient). At ZeRO 0 with fp32 weights,
DeepSpeed's ``step()`` then clips (``clip_fp32_gradients`` -> ``deepspeed.runtime.utils.clip_grad_norm_``):
it computes every gradient's norm a second time, all-reduces the total over a data-parallel group
of one, and multiplies every gradient by the clip coefficient even when that coefficient is 1.0.
In one process :func:`step_clipped` does the same clipping from the per-parameter norms already
taken: the same formula (``coef = min(1, max_norm / (total + 1e-6))`` with DeepSpeed's total
``sqrt(sum ||g_i||^2)``), no all-reduce, and no multiplication by exactly 1.0 (which changes no
value). The weights are bit for bit those of DeepSpeed's own path (``tests/test_trainer_clipping.py``).
"""

from __future__ import annotations

import torch


def step_norm(engine, world: int) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The L2 norm of the gradients held on this rank's module parameters (all of them at ZeRO 0/1;
    partitioned away at 2/3; 0 for none) as ``torch.nn.utils.get_total_norm`` computes it: not finite
    when any entry is NaN or inf (or the sum of squares overflows fp32), which is how the step
    detects a bad gradient in one pass. With the per-parameter norms (fp32 scalars, in
    ``parameters()`` order) when :func:`clips_itself`, else None."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(()), ([] if clips_itself(engine, world) else None)
    if not clips_itself(engine, world):
        return torch.nn.utils.get_total_norm(grads), None
    norms = list(torch._foreach_norm(grads, 2.0))  # get_total_norm's own per-tensor norms (one device, fp32)
    return torch.linalg.vector_norm(torch.stack(norms), 2.0), norms


def clips_itself(engine, world: int) -> bool:
    """Whether :func:`step_clipped` replaces DeepSpeed's clipping for ``engine``: ZeRO 0, one
    process, fp32 (no fp16/bf16 optimizer, no autocast grad scaler), clipping on."""
    return (world == 1 and engine.zero_optimization_stage() == 0 and engine.gradient_clipping() > 0.0
            and not engine.fp16_enabled() and not engine.bfloat16_enabled()
            and not getattr(engine, "torch_autocast_z0_gradscaler", None))


def step_clipped(engine, norms: list[torch.Tensor]) -> None:
    """Clip ``engine``'s gradients as DeepSpeed's ``clip_grad_norm_`` would from their per-parameter
    ``norms`` (:func:`step_norm`'s, taken after the last backward), then run its ``step()`` with its
    own clipping switched off."""
    params = [p for p in engine.module.parameters() if p.grad is not None]
    if norms:
        total = torch.stack(norms).pow(2.0).sum().float().pow(0.5)  # DeepSpeed's formula and order
        one, most = (torch.tensor([x], device=total.device) for x in (1.0, float(engine.gradient_clipping())))
        coef = torch.min(one, most / (total + 1e-6))
        if bool(coef < 1.0):
            for p in params:
                p.grad.data.mul_(coef)
    engine.clip_fp32_gradients = lambda: None  # this step only: the instance attribute shadows the method
    try:
        engine.step()
    finally:
        del engine.clip_fp32_gradients
