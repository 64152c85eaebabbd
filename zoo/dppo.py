"""DPPO: divergence proximal policy optimisation (the Binary-TV variant).

Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning" (arXiv:2602.04879):
the ratio clip replaced by a bound on the change of the sampled token's probability
(|p - p_old| <= 0.15), a detached truncated IS weight on the log-prob; group-mean advantages
without std, token sum over a constant, no KL (verl's example run). ``clip: dppo_kl`` is the
Binary-KL variant (threshold 0.05). Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="dppo",
    parent="grpo",
    paper="Qi et al. 2026, DPPO (arXiv:2602.04879)",
    summary="trust region by the TV of the sampled token's probability, truncated IS weight, no KL",
    baseline=use("group_mean"),
    clip=use("dppo_tv", delta_low=0.15, delta_high=0.15),
    kl=None,
    reduce=use("token_sum_norm"),
)
