"""OPO: exact on-policy training with the optimal (length-weighted) reward baseline.

Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline" (arXiv:2505.23585): G samples per
prompt, A = r - sum_j |y_j| r_j / sum_j |y_j| (no std), one optimizer step per sampled batch (the
step's default), no KL and no entropy term; token mean as verl's recipe. verl: ``adv_estimator=opo``.
Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="opo",
    parent="grpo",
    paper="Hao et al. 2025, On-Policy RL with Optimal Reward Baseline (arXiv:2505.23585)",
    summary="length-weighted group baseline, exact on-policy, no KL, token mean",
    baseline=use("opo"),
    kl=None,
    reduce=use("token_mean"),
)
