"""PPO with a learned critic, as used for RLHF.

Schulman et al. 2017 (arXiv:1707.06347) eq. 7 (clipped surrogate); GAE from Schulman et al. 2016
(arXiv:1506.02438) with gamma 1, lambda 0.95; Ouyang et al. 2022 (arXiv:2203.02155) for the
per-token k1 KL penalty in the reward. One sample per prompt; advantages whitened over the batch;
value loss clipped at 0.2 around the sampling-time values.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="ppo",
    paper="Schulman et al. 2017 (arXiv:1707.06347); GAE arXiv:1506.02438; Ouyang et al. 2022",
    summary="critic + GAE, PPO clip, k1 KL in the reward",
    sample=use("group", n=1),
    baseline=use("gae", gamma=1.0, lam=0.95, whiten=True, value_clip=0.2),
    ratio=use("token"),
    clip=use("ppo_clip", eps_low=0.2, eps_high=0.2),
    kl=use("k1", beta=0.01, placement="reward"),
    reduce=use("token_mean"),
)
