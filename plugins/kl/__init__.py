"""``kl`` components: per-token estimators of KL(pi || ref) and where the penalty goes.

With ``log r = logprobs - ref_logprobs`` (nats, per sampled token, y ~ pi) Schulman's estimators
(J. Schulman 2020, "Approximating KL Divergence", joschu.net/blog/kl-approx.html) are

* k1 = log r                          unbiased for KL(pi||ref), high variance, can be negative
* k2 = (log r)^2 / 2                  biased, low variance, >= 0
* k3 = exp(-log r) - 1 + log r        unbiased for KL(pi||ref), >= 0 (``r^-1 - 1 + log r``)

Every estimator returns ``[B, T]`` float, exactly 0 where ``response_mask`` is False (and no
gradient flows from there). ``beta`` (>= 0) is the coefficient; ``placement``:

* ``reward``: the step subtracts ``beta x KL`` from the per-token rewards at sampling time (no
  gradient through the estimator; InstructGPT / PPO-RLHF, REINFORCE++, RLOO).
* ``loss``: the step adds ``beta x KL`` to the per-token loss (GRPO), differentiated through
  ``logprobs``.

Which combinations give the gradient of KL(pi||ref) (on-policy; Tang & Munos 2025, "On a few
pitfalls in KL divergence gradient estimation for RL", arXiv:2506.09477; the "comedy of
estimators" discussion). With d = grad log pi(y):

* k1 in reward: E[k1 d] = grad KL(pi||ref). Correct (score function with KL as reward).
* k1 in loss:   grad k1 = d and E[d] = 0: zero expected gradient, only noise. Warned.
* k2 in loss:   grad k2 = log r d, E = grad KL(pi||ref). Correct.
* k2 in reward: E[k2 d] = grad E_pi[(log r)^2/2], not the KL gradient. Warned (biased).
* k3 in loss:   grad k3 = (1 - 1/r) d, E = grad KL(ref||pi): the *forward* KL's gradient, a
  valid regulariser but not the reverse KL the estimator's value estimates (GRPO's choice; kept
  silent because it is the paper's).
* k3 in reward: E[k3 d] = grad KL(pi||ref) - grad KL(ref||pi). Warned (biased).

Numerics: k3 clamps ``log r`` to [-20, 20] inside ``exp`` only (exp(20) ~ 4.9e8), so a token the
reference finds impossible gives a large finite value, never inf/NaN (verl clamps k3 to +-10 after
the fact instead; ours keeps the value exact for |log r| <= 20 unless ``clamp: 10`` is set).

Two switches on every estimator: ``straight_through`` (the estimator's value with k2's gradient,
k2 - sg(k2) + sg(k): verl's ``k1+``, ``k3+`` / ``low_var_kl+``, ``abs+``; ``k2+`` / ``mse+`` is k2
itself), which makes any estimator's gradient in the loss the unbiased reverse-KL gradient; and
``times_ratio`` (the estimate times the ratio slot's importance ratio, with grad: TRL's
``use_bias_correction_kl``, on by default there when beta > 0).
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from pydantic import Field

from policyzoo.contract import KL, hookimpl

EXP_CLAMP = 20.0

#: (estimator, placement) -> why its gradient is biased or useless.
BAD_COMBINATIONS = {
    ("k1", "loss"): "k1 = log r in the loss has gradient grad log pi, whose expectation under pi is 0: "
                    "the KL term adds only noise to the gradient",
    ("k2", "reward"): "k2 = (log r)^2/2 as a reward gives E[k2 grad log pi], which is not the gradient of "
                      "KL(pi||ref) (biased)",
    ("k3", "reward"): "k3 as a reward gives E[k3 grad log pi] = grad KL(pi||ref) - grad KL(ref||pi) (biased)",
    ("abs", "loss"): "|log r| in the loss has gradient sign(log r) grad log pi, which is not the gradient of a KL",
    ("abs", "reward"): "|log r| as a reward gives E[|log r| grad log pi], which is not the gradient of a KL",
}
GOOD_ALTERNATIVE = {"loss": "k2 (or k3, GRPO's choice) with placement: loss",
                    "reward": "k1 with placement: reward"}


class _KL(KL):

    class Params(KL.Params):
        straight_through: bool = Field(False, description="value of this estimator, gradient of k2 "
                                       "(verl's '+' variants: k1+, k3+, abs+)")
        times_ratio: bool = Field(False, description="multiply the estimate by the ratio slot's importance "
                                  "ratio, with grad (TRL use_bias_correction_kl; loss placement)")

    @property
    def estimator(self) -> str:
        """The estimator's name (k1, k2, k3, abs): the component's own name here."""
        return self.name

    @hookimpl
    def kl(self, logprobs, ref_logprobs, response_mask, ratio):
        log_r = torch.where(response_mask, logprobs - ref_logprobs, torch.zeros_like(logprobs))
        out = self.estimate(log_r)
        if self.params.straight_through:
            k2 = 0.5 * log_r * log_r
            out = k2 - k2.detach() + out.detach()
        if self.params.times_ratio:
            out = out * ratio
        return torch.where(response_mask, out, torch.zeros_like(out))

    def check(self, run) -> None:
        placement = self.params.placement
        if self.params.times_ratio and placement == "reward":
            warnings.warn(f"kl: {self.name} with times_ratio in placement 'reward': the ratio is 1 at sampling "
                          "time, so times_ratio changes nothing there (it is meant for placement: loss)",
                          UserWarning, stacklevel=2)
        if self.params.straight_through and placement == "loss":
            return  # the gradient is k2's, the correct one in the loss
        why = BAD_COMBINATIONS.get((self.estimator, placement))
        if why:
            other = "reward" if placement == "loss" else "loss"
            warnings.warn(f"kl: {self.estimator} with placement {placement!r}: {why} "
                          f"(Tang & Munos 2025, arXiv:2506.09477). Use {GOOD_ALTERNATIVE[other]} "
                          f"or {GOOD_ALTERNATIVE[placement]}, or straight_through: true in the loss.",
                          UserWarning, stacklevel=2)


class K1(_KL):
    """k1 = log r = logprobs - ref_logprobs per token ``[B, T]`` (nats), 0 where masked.

    Unbiased for KL(pi||ref). Default placement ``reward`` (the gradient-correct one, as in
    InstructGPT and REINFORCE++); in ``loss`` its expected gradient is zero and ``check`` warns.
    Source: Schulman 2020, "Approximating KL Divergence"."""

    name = "k1"

    class Params(_KL.Params):
        beta: float = Field(0.01, ge=0, description="KL coefficient beta (>= 0)")
        placement: Literal["reward", "loss"] = Field(
            "reward", description="'reward' (recommended for k1) or 'loss' (zero expected gradient)")

    @staticmethod
    def estimate(log_r):
        return log_r


class K2(_KL):
    """k2 = (log r)^2 / 2 per token ``[B, T]``, 0 where masked. Its gradient in the loss is the
    unbiased on-policy gradient of KL(pi||ref); as a reward it is biased and ``check`` warns.
    Source: Schulman 2020; Tang & Munos 2025 (arXiv:2506.09477)."""

    name = "k2"

    @staticmethod
    def estimate(log_r):
        return 0.5 * log_r * log_r


class K3(_KL):
    """k3 = exp(-log r) - 1 + log r per token ``[B, T]`` (>= 0), 0 where masked; ``log r`` clamped
    to +-20 inside exp only. GRPO's estimator in the loss (DeepSeekMath eq. 4, beta 0.04); as a
    reward it is biased and ``check`` warns. ``clamp`` c: the value is clamped to [-c, c] after the
    fact (verl's ``low_var_kl`` always clamps at 10; no gradient where it acts); None (default)
    keeps the exact value. ``times_ratio`` in the loss: d(r k3) = (k3 + 1 - ref/pi) grad log pi at
    r = 1, whose expectation under pi is grad KL(pi||ref) -- the reverse KL's gradient (TRL's
    default ``use_bias_correction_kl``, DeepSeek-V3.2 arXiv:2512.02556 eq. 7).
    Source: Schulman 2020, "Approximating KL Divergence"."""

    name = "k3"

    class Params(_KL.Params):
        clamp: float | None = Field(None, gt=0, description="clamp the k3 value to [-clamp, clamp] (verl: 10); "
                                    "None = exact")

    def estimate(self, log_r):
        k3 = torch.exp(-log_r.clamp(-EXP_CLAMP, EXP_CLAMP)) - 1.0 + log_r
        c = self.params.clamp
        return k3 if c is None else k3.clamp(-c, c)


class Abs(_KL):
    """|log r| per token ``[B, T]`` (nats), 0 where masked: a distance, not an estimator of a KL.
    Its gradient is sign(log r) grad log pi in the loss and E[|log r| grad log pi] as a reward,
    neither a KL gradient: ``check`` warns unless ``straight_through`` (k2's gradient) in the loss.
    Source: verl ``kl_loss_type`` / ``kl_penalty: abs``."""

    name = "abs"

    @staticmethod
    def estimate(log_r):
        return log_r.abs()


COMPONENTS = (K1, K2, K3, Abs)
