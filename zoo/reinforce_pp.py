"""REINFORCE++: REINFORCE with PPO's clip and global batch whitening, no critic.

Hu 2025, "REINFORCE++" (arXiv:2501.03262), Sec. 3: per-token k1 KL penalty in the reward, returns
summed to the end of the response (gamma 1), advantages whitened over every token of the batch.
One sample per prompt.
"""

from policyzoo import Bundle, use

BUNDLE = Bundle(
    name="reinforce_pp",
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262), Sec. 3",
    summary="batch-whitened returns, PPO clip, token k1 KL in the reward",
    sample=use("group", n=1),
    baseline=use("batch_whiten", gamma=1.0),
    ratio=use("token"),
    clip=use("ppo_clip", eps_low=0.2, eps_high=0.2),
    kl=use("k1", beta=0.01, placement="reward"),
    reduce=use("token_mean"),
)
