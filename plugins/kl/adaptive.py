"""``adaptive``: a KL penalty whose coefficient follows a target KL (a controller with state).

The rule (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences",
arXiv:1909.08593, section 2.2; verl ``AdaptiveKLController``, ``algorithm.kl_ctrl.type:
adaptive``; TRL's PPO ``adap_kl_ctrl``), applied once per step after the update::

    e      = clip(current_kl / target_kl - 1, -0.2, 0.2)
    beta  <- beta x (1 + e x n_rows / horizon)

``current_kl``: verl's (``apply_kl_penalty``): each row's token-mean KL estimate of the batch
(rows with no token count as 0), averaged over the rows of the whole step -- the step's
``kl_ref_row_mean`` metric of every rank, weighted by its ``rows`` through the collective, so all
ranks compute the same coefficient. ``n_rows``: the step's rows on all ranks (verl passes
``n_steps = batch_size``). The coefficient of a step is the one before that step's update (verl
applies the penalty, then updates); it is saved in every checkpoint and restored on resume.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from policyzoo.contract import LOCAL, rank_mean
from policyzoo.errors import ConfigError
from policyzoo.plugins.kl import _KL, K1, K2, K3, Abs

ESTIMATES = {"k1": K1.estimate, "k2": K2.estimate, "k3": K3.estimate, "abs": Abs.estimate}
MAX_ERROR = 0.2  # Ziegler et al. clip the proportional error to +-0.2


class Adaptive(_KL):
    """KL penalty with an adaptive coefficient (the ``beta`` accessor reads the controller's state).

    Parameters: ``estimator`` (k1 / k2 / k3 / abs, as the ``kl`` components of that name;
    verl ``kl_penalty``), ``beta`` (the initial coefficient; verl ``kl_ctrl.kl_coef``),
    ``target_kl`` (verl ``kl_ctrl.target_kl``), ``horizon`` (verl ``kl_ctrl.horizon``),
    ``placement`` (default ``reward``, verl's ``use_kl_in_reward``), ``clamp`` (k3 only, as ``k3``).
    The per-token estimate ``[B, T]`` is the unscaled KL; the step multiplies it by :attr:`beta`.
    Source: Ziegler et al. 2019 (arXiv:1909.08593); verl ``core_algos.AdaptiveKLController``."""

    name = "adaptive"

    class Params(_KL.Params):
        estimator: Literal["k1", "k2", "k3", "abs"] = Field("k1", description="per-token estimator "
                                                           "(verl kl_penalty: kl = k1, mse = k2, low_var_kl = k3)")
        beta: float = Field(0.001, ge=0, description="initial KL coefficient (verl kl_ctrl.kl_coef)")
        target_kl: float = Field(0.1, gt=0, description="the KL the coefficient steers to (verl kl_ctrl.target_kl)")
        horizon: float = Field(10000, gt=0, description="rows over which the coefficient moves by at most "
                               "x(1 +- 0.2) (verl kl_ctrl.horizon)")
        placement: Literal["reward", "loss"] = Field("reward", description="'reward' (verl use_kl_in_reward) "
                                                     "or 'loss'")
        clamp: float | None = Field(None, gt=0, description="k3 only: clamp its value to [-clamp, clamp]")

    def __init__(self, **params):
        super().__init__(**params)
        self._beta = float(self.params.beta)

    @property
    def estimator(self) -> str:
        return self.params.estimator

    @property
    def beta(self) -> float:
        """The coefficient of the coming step (the controller's state)."""
        return self._beta

    def estimate(self, log_r):
        fn = ESTIMATES[self.params.estimator]
        return fn(self, log_r) if fn is K3.estimate else fn(log_r)

    def update(self, metrics: dict, collective=LOCAL) -> None:
        """``beta <- beta x (1 + clip(kl / target - 1, -0.2, 0.2) x rows / horizon)`` with the step's
        row-mean KL and row count over all ranks (see the module docstring). A step with no row or
        no ``kl_ref_row_mean`` leaves beta unchanged."""
        if "kl_ref_row_mean" not in metrics:
            return
        # the row-weighted mean over every rank, the same on each
        kl, rows = rank_mean(float(metrics["kl_ref_row_mean"]), float(metrics.get("rows", 0)), collective)
        if rows <= 0:
            return
        error = min(max(kl / self.params.target_kl - 1.0, -MAX_ERROR), MAX_ERROR)
        self._beta *= 1.0 + error * rows / self.params.horizon

    def state_dict(self) -> dict:
        return {"beta": self._beta}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"beta"} or not isinstance(state["beta"], (int, float)):
            raise ConfigError(f"kl: {self.name}", f"the saved state {state!r} is not {{'beta': float}}",
                              "resume from a checkpoint written by this version of the component")
        self._beta = float(state["beta"])

    def check(self, run) -> None:
        if self.params.clamp is not None and self.params.estimator != "k3":
            raise ConfigError("algorithm.kl.clamp", f"clamp applies to the k3 estimator, not {self.params.estimator}",
                              "drop clamp, or set estimator: k3")
        super().check(run)


COMPONENTS = (Adaptive,)
