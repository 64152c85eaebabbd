"""Dr. GRPO: GRPO done right.

Liu et al. 2025, "Understanding R1-Zero-Like Training" (arXiv:2503.20783), eq. 3 / Sec. 3.2:
no std division in the advantage, no per-response length normalisation (token sum divided by a
configured constant, by default the response token limit), no KL. Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="dr_grpo",
    parent="grpo",
    paper="Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv:2503.20783), Sec. 3.2",
    summary="group mean baseline (no std), token sum over a constant, no KL",
    baseline=use("group_mean"),
    kl=None,
    reduce=use("token_sum_norm"),
)
