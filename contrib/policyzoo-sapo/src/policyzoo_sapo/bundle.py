"""The ``sapo`` bundle: GRPO with PPO's hard clip replaced by SAPO's soft gate.

Gao et al. 2025, "Soft Adaptive Policy Optimization" (arXiv:2511.20347): group-normalised
advantages, token ratios, the soft gate with tau_pos 1.0 and tau_neg 1.05, each response's tokens
averaged then averaged over responses (1/G sum_i 1/|y_i| sum_t), no KL term. Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="sapo",
    parent="grpo",
    paper="Gao et al. 2025, Soft Adaptive Policy Optimization (arXiv:2511.20347)",
    summary="GRPO with a temperature-controlled sigmoid gate instead of the hard clip, no KL",
    clip=use("sapo", tau_pos=1.0, tau_neg=1.05),
    kl=None,
)
