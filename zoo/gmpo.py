"""GMPO: geometric-mean policy optimisation.

Zhao et al. 2025 (arXiv:2507.20673): GRPO with the arithmetic mean of the token surrogates
replaced by their geometric mean, R_i = exp(mean_t clip(log r_t)), and a wider clip taken in log
space (e^-0.4, e^0.4); a small k3 KL in the loss as verl's example run (``kl_loss_coef`` 0.001).
Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="gmpo",
    parent="grpo",
    paper="Zhao et al. 2025, GMPO (arXiv:2507.20673), eq. 4",
    summary="geometric mean of log-space clipped token ratios x mean advantage, k3 KL 0.001",
    clip=use("gmpo", eps_low=0.4, eps_high=0.4),
    kl=use("k3", beta=0.001, placement="loss"),
)
