"""SAPO's soft gate, a ``clip`` component.

Gao et al. 2025, "Soft Adaptive Policy Optimization" (arXiv:2511.20347). Instead of PPO's hard
clip, each token's surrogate is a sigmoid of its ratio:

    f(r) = (4 / tau) * sigmoid(tau * (r - 1)),   loss_t = -f(r_t) * A_t,

with tau = ``tau_pos`` where A_t > 0 and ``tau_neg`` where A_t <= 0 (the paper recommends
tau_neg > tau_pos: negative-advantage updates spread probability to many unsampled tokens, so
their gate closes faster). The gradient is -A * 4 sigmoid(x)(1 - sigmoid(x)) * r * grad log pi with
x = tau (r - 1): at r = 1 the weight is exactly 1 (the plain policy gradient, whatever tau), and
it decays smoothly to 0 as r leaves 1 -- no token's gradient is cut to zero at a hard boundary.
"""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Clip, Surrogate, hookimpl

#: a token counts as soft-clipped when its gradient weight 4 s (1 - s) is below this.
ATTENUATED = 0.5


class SoftGate(Clip):
    """SAPO soft gate: loss_t = -(4/tau) sigmoid(tau (r_t - 1)) A_t, tau by the sign of A_t.

    Args (hook): ``ratio [B, T]`` (with grad), ``advantages [B, T]``, ``response_mask [B, T]``.
    Returns :class:`~policyzoo.Surrogate`: ``loss [B, T]`` (0 on masked positions) and
    ``clipped_low`` / ``clipped_high`` ``[B, T]`` bool: tokens whose gradient weight
    4 s (1 - s) fell below 0.5 (|r - 1| > 1.7627 / tau) with r < 1 / r > 1. The gate has no hard
    clip, so these "soft clip" fractions measure how much of the batch the gate attenuates; with
    tau near 1 they stay 0 until a ratio passes ~2.76.

    Conventions: the loss value at r = 1 is -2A/tau, not -A (only the gradient matches the plain
    policy gradient); A = 0 uses tau_neg (the loss is 0 either way). Parameters are temperatures
    > 0; ``ConfigError`` otherwise. Source: Gao et al. 2025, SAPO (arXiv:2511.20347), the soft-gate
    objective (f(x) = sigmoid(tau (x - 1)) 4 / tau, tau chosen by the sign of the advantage).
    """

    name = "sapo"

    class Params(Clip.Params):
        tau_pos: float = Field(1.0, gt=0, description="gate temperature where A > 0 (> 0)")
        tau_neg: float = Field(1.05, gt=0, description="gate temperature where A <= 0 (> 0; the paper "
                               "recommends tau_neg > tau_pos)")

    @hookimpl
    def clip(self, ratio, advantages, response_mask):
        pos = advantages > 0
        tau = torch.where(pos, torch.full_like(ratio, self.params.tau_pos),
                          torch.full_like(ratio, self.params.tau_neg))
        gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        loss = torch.where(response_mask, -gate * advantages, torch.zeros_like(ratio))
        with torch.no_grad():
            s = torch.sigmoid(tau * (ratio - 1.0))
            weak = (4.0 * s * (1.0 - s) < ATTENUATED) & response_mask
        return Surrogate(loss, weak & (ratio < 1.0), weak & (ratio > 1.0))
