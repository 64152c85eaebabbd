"""GSPO: group sequence policy optimisation.

Zheng et al. 2025 (arXiv:2507.18071), eqs. 5-7: the importance ratio is the sequence-level
geometric mean exp(mean_t log r_t) (the log-ratio clamped before exp), clipped with tiny bounds
(3e-4 below, 4e-4 above), averaged over sequences; no KL. Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="gspo",
    parent="grpo",
    paper="Zheng et al. 2025, GSPO (arXiv:2507.18071), eqs. 5-7",
    summary="sequence geometric-mean ratio, sequence clip 3e-4/4e-4, no KL",
    ratio=use("sequence"),
    clip=use("ppo_clip", eps_low=3e-4, eps_high=4e-4),
    kl=None,
)
