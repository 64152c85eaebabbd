"""DAPO: decoupled clip and dynamic sampling policy optimisation.

Yu et al. 2025 (arXiv:2503.14476): clip-higher (eps_low 0.2, eps_high 0.28, eq. 10), dynamic
sampling (groups whose rewards are all equal are dropped and the batch is refilled, eq. 11),
token-level loss over the whole step (eq. 12), soft overlong punishment (eq. 13, L_cache 512 of
L_max), no KL term. Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="dapo",
    parent="grpo",
    paper="Yu et al. 2025, DAPO (arXiv:2503.14476), eqs. 10-13",
    summary="clip-higher, dynamic sampling, token-mean loss, soft overlong penalty, no KL",
    clip=use("ppo_clip", eps_high=0.28),  # grpo's eps_low 0.2 is inherited
    kl=None,
    reduce=use("token_mean"),
    reward=(use("overlong_penalty"),),
    filter=(use("nonconstant_groups", resample=True, max_sample_rounds=3),),
)
