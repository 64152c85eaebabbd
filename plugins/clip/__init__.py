"""``clip`` components: the per-token surrogate loss (to minimise) from ratio and advantages.

Inputs: ``ratio [B, T]`` (with grad), ``advantages [B, T]`` (constants, higher is better),
``logprobs [B, T]`` (with grad, nats). Output: :class:`~policyzoo.contract.Surrogate` with
``loss [B, T]`` and bool masks ``clipped_low`` / ``clipped_high`` of the tokens whose gradient the
clip cut or capped (counted over ``response_mask`` by the step for the clip-fraction metrics).

Clip-fraction convention (TRL's; verl counts ``clipped loss > unclipped loss`` instead, which is
the same set except for ties): a token counts only where the clip actually removes its gradient,
i.e. low = ratio < 1 - eps_low and A < 0, high = ratio > 1 + eps_high and A > 0 (plus, with dual
clip, ratio > c and A < 0). On the first update after sampling every ratio is 1, so both are 0.
"""

from __future__ import annotations

from policyzoo.plugins.clip import cispo, covariance, divergence, dro, ppo, sequence
from policyzoo.plugins.clip.cispo import CISPO
from policyzoo.plugins.clip.covariance import ClipCov, KLCov
from policyzoo.plugins.clip.divergence import DPPOKL, DPPOTV
from policyzoo.plugins.clip.dro import DRO
from policyzoo.plugins.clip.ppo import NoClip, PPOClip
from policyzoo.plugins.clip.sequence import GMPO, VESPO

#: one module per family of surrogates
MODULES = (ppo, cispo, covariance, divergence, sequence, dro)
COMPONENTS = tuple(cls for module in MODULES for cls in module.COMPONENTS)

__all__ = ["CISPO", "COMPONENTS", "DPPOKL", "DPPOTV", "DRO", "GMPO", "VESPO", "ClipCov", "KLCov", "NoClip", "PPOClip"]
