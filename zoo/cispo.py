"""CISPO: clipped importance-sampling-weight policy optimisation.

MiniMax 2025, "MiniMax-M1" (arXiv:2506.13585), eq. 4: loss = -sg(min(r, eps_high)) x A x log pi,
so every token keeps a (capped) gradient; the cap bounds the IS weight itself (ScaleRL's eps_max,
here 5.0), there is no positive lower bound; token mean over the step; no KL. Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="cispo",
    parent="grpo",
    paper="MiniMax 2025, MiniMax-M1 (arXiv:2506.13585), eq. 4",
    summary="stop-gradient capped IS weight x A x logprob, token mean, no KL",
    clip=use("cispo", eps_high=5.0),
    kl=None,
    reduce=use("token_mean"),
)
