"""GRPO: group-relative policy optimisation.

Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. (3) and Sec. 4.1.
Advantage (r - mean) / std over the G samples of a prompt (sample std, as TRL and verl);
PPO clip 0.2; KL to the reference by the k3 estimator added to the loss with beta 0.04;
loss averaged over each sequence's tokens, then over sequences (the paper's 1/G sum 1/|o_i|).
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="grpo",
    paper="Shao et al. 2024, DeepSeekMath (arXiv:2402.03300), eq. 3",
    summary="group-normalised advantages, PPO clip, k3 KL in the loss",
    sample=use("group", n=8),
    baseline=use("group_norm", std="sample"),
    ratio=use("token"),
    clip=use("ppo_clip", eps_low=0.2, eps_high=0.2),
    kl=use("k3", beta=0.04, placement="loss"),
    reduce=use("seq_mean_token_mean"),
)
