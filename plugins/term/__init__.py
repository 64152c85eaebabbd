"""``term`` components: additive per-token loss terms (the step adds ``coef x term`` before the reduce).

* ``entropy``: the entropy bonus, term = -H per token (minimising ``loss - coef x H``). verl
  ``actor.entropy_coeff`` (``pg_loss - entropy_coeff x agg_loss(entropy)``, aggregated with the
  policy loss's ``loss_agg_mode``: the same here, the run's reduce aggregates it); TRL
  ``entropy_coef`` (always a token mean: equal with ``reduce: token_mean``); cleanrl's
  ``ent_coef``. H is the trainer's per-token entropy of softmax(logits / temperature), in nats,
  with gradient.
* ``entropy_adaptive``: the same bonus with Skywork-OR1's adaptive coefficient (He et al. 2025,
  arXiv:2505.22312; TRL ``use_adaptive_entropy``): after each step the coefficient moves by
  ``delta`` towards more bonus when the step's entropy (token mean over every rank) is at or below
  ``target``, towards less otherwise, within ``[coef_min, coef_max]``; the bonus is applied only
  while the last step's entropy is at or below the target (0 on the first step, as TRL's ``inf``
  start).
* ``distill``: on-policy distillation's reverse KL to a teacher (``model.teacher``): per sampled token
  the k1 estimate sg(log pi - log pi_teacher) weighted by the ratio, so its gradient is the policy
  gradient with advantage -(log pi - log pi_teacher) per token (Agarwal et al. 2024, GKD,
  arXiv:2306.13649, with lambda = 1 and the reverse KL; Thinking Machines' on-policy distillation
  recipe, 2025: per-token reverse KL as the advantage).
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from policyzoo.contract import LOCAL, Term, hookimpl, rank_mean
from policyzoo.errors import ConfigError


class Entropy(Term):
    """Entropy bonus: per-token term ``-entropy [B, T]`` (nats), 0 where masked; with ``coef`` c the
    step minimises ``loss - c x H`` aggregated by the run's reduce. Needs the entropy with grad
    (``needs_entropy``). Source: verl ``entropy_coeff``; TRL ``entropy_coef``; Mnih et al. 2016
    (arXiv:1602.01783), the entropy regulariser of A3C."""

    name = "entropy"
    needs_entropy = True

    class Params(Term.Params):
        coef: float = Field(0.001, ge=0, description="entropy bonus coefficient (verl entropy_coeff, TRL entropy_coef)")

    @hookimpl
    def term(self, entropy, response_mask):
        return torch.where(response_mask, -entropy, torch.zeros_like(entropy))


class EntropyAdaptive(Entropy):
    """Entropy bonus with an adaptive coefficient (a controller: ``coef`` reads its state).

    Per step (``update``): H = the step's token-mean entropy over all ranks (the ``entropy`` metric
    weighted by each rank's ``tokens``); ``coef <- min(coef + delta, coef_max)`` if H <= target,
    else ``max(coef - delta, coef_min)``. The coefficient applied in a step is the state's when
    the previous step's H was <= target, else 0 (and 0 before the first update). State:
    ``{"coef", "last_entropy"}`` (None before the first step). Source: He et al. 2025, Skywork
    Open Reasoner 1 (arXiv:2505.22312), section 3.2.3; TRL ``use_adaptive_entropy``."""

    name = "entropy_adaptive"

    class Params(Entropy.Params):
        coef: float = Field(0.0, ge=0, description="initial coefficient (TRL entropy_coef)")
        target: float = Field(0.2, ge=0, description="target token-mean entropy in nats (TRL entropy_target)")
        delta: float = Field(0.005, gt=0, description="step of the coefficient per update (TRL entropy_coef_delta)")
        coef_min: float = Field(0.0, ge=0, description="lower bound (TRL entropy_coef_min)")
        coef_max: float = Field(1.0, ge=0, description="upper bound (TRL entropy_coef_max)")

        @model_validator(mode="after")
        def _bounds(self):
            if not self.coef_min <= self.coef_max:
                raise ValueError(f"coef_min {self.coef_min} > coef_max {self.coef_max}")
            return self

    def __init__(self, **params):
        super().__init__(**params)
        self._coef = float(self.params.coef)
        self._last: float | None = None

    @property
    def coef(self) -> float:
        """The coefficient applied this step: the state's while the last entropy is <= target, else 0."""
        return self._coef if self._last is not None and self._last <= self.params.target else 0.0

    def update(self, metrics: dict, collective=LOCAL) -> None:
        if "entropy" not in metrics:
            return
        # the token-weighted mean over every rank, the same on each
        h, n = rank_mean(float(metrics["entropy"]), float(metrics.get("tokens", 0)), collective)
        if n <= 0:
            return
        p = self.params
        self._coef = min(self._coef + p.delta, p.coef_max) if h <= p.target else max(self._coef - p.delta, p.coef_min)
        self._last = h

    def state_dict(self) -> dict:
        return {"coef": self._coef, "last_entropy": self._last}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"coef", "last_entropy"}:
            raise ConfigError(f"term: {self.name}", f"the saved state {state!r} is not {{'coef', 'last_entropy'}}",
                              "resume from a checkpoint written by this version of the component")
        self._coef = float(state["coef"])
        self._last = None if state["last_entropy"] is None else float(state["last_entropy"])


class Distill(Term):
    """On-policy distillation: per-token term ``sg(logprobs - ref_logprobs) x ratio [B, T]``, 0 where
    masked, with the teacher's log-probs as ``ref_logprobs`` (``model.teacher``: the reference the
    step scores is the teacher).

    The value on-policy (ratio 1) is k1 = log pi(y_t) - log pi_T(y_t), the per-token reverse-KL
    estimate on the sampled token (its token mean is the ``term/distill`` metric, nats); the
    gradient is ``k1 x grad ratio`` = ``k1 x r grad log pi``: the policy gradient with the
    per-token advantage -k1 (importance weighted by the ratio slot's ratio off-policy), whose
    expectation under the student's samples is the gradient of the per-token reverse KL
    KL(pi || pi_T) (the score-function form; the k1 value itself in the loss would give a zero
    expected gradient). Needs ``ref_logprobs`` (``needs_ref``): raises ValueError without them.
    Source: Agarwal et al. 2024, On-Policy Distillation of Language Models (GKD, arXiv:2306.13649),
    the reverse-KL on-policy case (TRL ``GKDTrainer`` with ``lmbda=1``, ``beta=1``, there as the full
    vocabulary divergence); Lu & Thinking Machines 2025, "On-Policy Distillation" (per-token reverse
    KL on the sampled token as the advantage)."""

    name = "distill"
    needs_ref = True

    class Params(Term.Params):
        coef: float = Field(1.0, ge=0, description="weight of the reverse KL to the teacher in the loss")

    @hookimpl
    def term(self, logprobs, ref_logprobs, ratio, response_mask):
        if ref_logprobs is None:
            raise ValueError("the distill term needs the teacher's log-probs: set model.teacher")
        k1 = (logprobs - ref_logprobs).detach()
        return torch.where(response_mask, k1 * ratio, torch.zeros_like(ratio))


COMPONENTS = (Entropy, EntropyAdaptive, Distill)
