"""ReMax: REINFORCE with the reward of the greedy response as the baseline.

Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
Aligning Large Language Models" (arXiv:2310.10505), Algorithm 1: one sampled and one greedy
response per prompt; loss -sum_t log pi(y_t) (r(y) - r(y_greedy)), averaged over the prompts; no
critic, no clip. KL to the reference in the reward (k1, beta 0.001 as verl's example).
verl: ``adv_estimator=remax``. Parent: rloo (REINFORCE, token sum per sequence, k1 KL in the reward).
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="remax",
    parent="rloo",
    paper="Li et al. 2023, ReMax (arXiv:2310.10505), Algorithm 1",
    summary="greedy response's reward as the baseline, REINFORCE, k1 KL in the reward",
    sample=use("group", n=1, greedy=True),
    baseline=use("remax"),
    kl=use("k1", beta=0.001),
)
