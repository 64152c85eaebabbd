"""REINFORCE++-baseline: a group mean subtracted, then batch whitening (the composition).

Hu 2025, "REINFORCE++" (arXiv:2501.03262), the REINFORCE++-baseline variant: G samples per prompt,
A = whiten(r - mean_g) over every token of the whole step, PPO clip, k1 KL in the reward.
verl: ``algorithm.adv_estimator=reinforce_plus_plus_baseline`` (examples use n = 8 and the KL in
the reward). Parent: reinforce_pp (its clip, KL and reduce).
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="reinforce_pp_baseline",
    parent="reinforce_pp",
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262), REINFORCE++-baseline",
    summary="group mean, then batch whitening; PPO clip, k1 KL in the reward",
    sample=use("group", n=8),
    baseline=use("reinforce_pp_baseline"),
)
