"""GDPO: group reward-decoupled normalisation for several rewards.

Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward
RL Optimization" (arXiv:2601.05242), Sec. 3: each reward normalised within its group, the weighted
sum then normalised over the batch; the rest as GRPO. TRL:
``multi_objective_aggregation="normalize_then_sum"``. Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="gdpo",
    parent="grpo",
    paper="Liu et al. 2026, GDPO (arXiv:2601.05242), Sec. 3",
    summary="per-reward group normalisation, sum, batch normalisation; GRPO's clip and KL",
    baseline=use("gdpo"),
)
