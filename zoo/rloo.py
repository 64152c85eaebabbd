"""RLOO: REINFORCE with a leave-one-out baseline.

Ahmadian et al. 2024, "Back to Basics" (arXiv:2402.14740), eq. 6; Kool et al. 2019.
A_i = r_i - mean of the other G-1 rewards of the prompt; no clipping (plain REINFORCE, the ratio
is 1 on-policy); k1 KL in the reward (so it enters the sequence score); the loss is the sequence
log-prob (token sum) times the advantage, averaged over sequences.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="rloo",
    paper="Ahmadian et al. 2024, Back to Basics (arXiv:2402.14740), eq. 6",
    summary="leave-one-out baseline, REINFORCE (no clip), k1 KL in the reward",
    sample=use("group", n=4),
    baseline=use("leave_one_out"),
    ratio=use("token"),
    clip=use("none"),
    kl=use("k1", beta=0.05, placement="reward"),
    reduce=use("seq_mean_token_sum"),
)
