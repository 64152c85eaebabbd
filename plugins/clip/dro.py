"""DRO: the policy-gradient term on the log-probability, with a quadratic log-ratio penalty."""

from __future__ import annotations

import torch
from pydantic import Field

from policyzoo.contract import Clip, Surrogate, hookimpl


class DRO(Clip):
    """Direct Reward Optimisation: loss_t = -A_t logprobs_t + beta / 2 x (logprobs_t - old_logprobs_t)^2.

    No ratio and no clip: the gradient is (-A + beta log r) grad log pi, so a token is pulled back
    towards the sampling policy in proportion to how far it has moved (a proximal term instead of
    PPO's clip; on the first update after sampling log r = 0 and it is plain REINFORCE). The ratio
    slot's output is not used. Shapes ``[B, T]``, nats. ``beta`` has no default (verl requires
    ``dro_beta``; its example is 0.05). Errors: ``ConfigError`` for beta missing or <= 0.
    Source: Richemond et al. 2024, "Offline Regularised RL for LLM Alignment" (arXiv:2405.19107),
    DRO's regularised policy loss with pi_old in place of the reference; verl
    ``policy_loss.loss_mode: dro`` with ``policy_loss.dro_beta``."""

    name = "dro"
    contract_params = {"beta": 0.05}

    class Params(Clip.Params):
        beta: float = Field(gt=0, description="coefficient of the quadratic log-ratio penalty (> 0; verl dro_beta)")

    @hookimpl
    def clip(self, advantages, logprobs, old_logprobs, response_mask):
        log_r = torch.where(response_mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
        loss = -advantages * logprobs + 0.5 * self.params.beta * log_r * log_r
        return Surrogate(torch.where(response_mask, loss, torch.zeros_like(loss)))


COMPONENTS = (DRO,)
