"""Clip-Cov: DAPO with the gradient cut on a few high-covariance tokens.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv:2505.22617), Sec. 5: a random 2e-4 share of the tokens whose advantage x log-prob
covariance lies in (1, 5) loses its gradient, which keeps the policy's entropy from collapsing;
the rest of the recipe is DAPO's (the authors' runs are verl's DAPO recipe). Parent: dapo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="clip_cov",
    parent="dapo",
    paper="Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617), eq. 11",
    summary="DAPO whose clip also cuts the gradient of a few high-covariance tokens",
    clip=use("clip_cov", eps_high=0.28, select_frac=2e-4, cov_low=1.0, cov_high=5.0),
)
