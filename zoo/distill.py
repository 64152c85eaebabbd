"""On-policy distillation: the student samples, a teacher (``model.teacher``) scores each sampled
token, and the per-token reverse KL log pi - log pi_teacher enters the loss as the ``distill`` term.

Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes" (GKD, arXiv:2306.13649), the on-policy reverse-KL case (lambda = 1); the per-token
sampled-token estimate as in Thinking Machines' on-policy distillation recipe (2025). The task's
reward still gives GRPO's group-normalised policy gradient beside it (a constant reward gives
advantage 0 everywhere: pure distillation). No KL to the initial policy (the reference slot holds
the teacher). Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="distill",
    parent="grpo",
    paper="Agarwal et al. 2024, On-Policy Distillation of Language Models (GKD, arXiv:2306.13649)",
    summary="on-policy distillation: per-token reverse KL to a teacher (model.teacher) as a loss term, "
            "beside the task reward's GRPO gradient",
    kl=None,
    term=(use("distill", coef=1.0),),
    reduce=use("token_mean"),
)
