"""GPG: group policy gradient, the plain REINFORCE objective with a group mean baseline.

Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"
(arXiv:2504.02546), Sec. 3: no surrogate clip, no KL, no reference model; A = alpha (r - mean_g)
with the batch factor alpha = B / (B - M) (M rows of constant groups); loss = -A log pi averaged over
the step's tokens. verl: ``adv_estimator=gpg`` with ``policy_loss.loss_mode=gpg``. Parent: grpo.
"""

from policyzoo.contract import Bundle, use

BUNDLE = Bundle(
    name="gpg",
    parent="grpo",
    paper="Chu et al. 2025, GPG (arXiv:2504.02546), Sec. 3",
    summary="group mean x batch factor alpha, plain policy gradient (no clip, no KL), token mean",
    baseline=use("gpg"),
    clip=use("none"),
    kl=None,
    reduce=use("token_mean"),
)
