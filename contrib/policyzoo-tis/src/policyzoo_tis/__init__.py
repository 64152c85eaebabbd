"""policyzoo-tis: truncated importance sampling for the rollout/trainer mismatch.

Adds the ``ratio`` component ``tis`` (:class:`TruncatedIS`). The sampler (vLLM) and the trainer
(DeepSpeed) compute slightly different probabilities for the same weights, so "on-policy" samples
are off-policy; TIS re-weights each response by the capped trainer-vs-sampler likelihood ratio.
Sources: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
(token level, cap C = 2); the sequence-level form as analysed by Qi et al. 2025, "Defeating the
Training-Inference Mismatch via FP16" (arXiv:2510.26788), and Liu, Li et al. 2025, "When Speed
Kills Stability".
"""

from policyzoo import hookimpl

from .ratio import TruncatedIS

__version__ = "0.1.0"
COMPONENTS = (TruncatedIS,)


@hookimpl
def register_components(register):
    for cls in COMPONENTS:
        register(cls)
