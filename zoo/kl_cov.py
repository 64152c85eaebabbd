"""KL-Cov: DAPO with an |log r| penalty on the highest-covariance tokens instead of a clip.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv:2505.22617), Sec. 5: the unclipped surrogate, plus 1 x |log pi - log pi_old| on the top
2e-3 of tokens by advantage x log-prob covariance (the paper's 7B setting); the rest of the
recipe is DAPO's. Parent: dapo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="kl_cov",
    parent="dapo",
    paper="Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617), eq. 12",
    summary="DAPO without the clip, |log r| penalty on the top-covariance tokens",
    clip=use("kl_cov", select_frac=2e-3, kl_coef=1.0),
)
