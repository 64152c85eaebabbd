"""The adaptive KL controller (Ziegler et al. 2019; verl AdaptiveKLController) and the state contract:
the rule by hand, the coefficient the step reads through the ``beta`` accessor, every rank computing the
same coefficient, and the state surviving a checkpoint of the run directory exactly."""

import copy
from types import SimpleNamespace

import pytest
import torch

import policyzoo
from policyzoo.contract import LOCAL, Rollout, StepBatch
from policyzoo.engine.run.resume import write_checkpoint
from policyzoo.engine.rundir import RunDir
from policyzoo.errors import ConfigError
from policyzoo.plugins.kl.adaptive import Adaptive
from policyzoo.run_config import Config
from policyzoo.step import prepare, train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings, train
from policyzoo.testing.ranks import on_ranks

ADAPTIVE = {"base": "grpo", "kl": {"use": "adaptive", "beta": 0.1, "target_kl": 0.05, "horizon": 100}}


def test_update_rule_by_hand():
    kl = Adaptive(beta=0.1, target_kl=0.05, horizon=100)
    assert kl.stateful and kl.beta == 0.1
    # kl 0.0625: e = 0.0625 / 0.05 - 1 = 0.25, clipped to 0.2; x (1 + 0.2 x 8 / 100) = x 1.016 -> 0.1016
    kl.update({"kl_ref_row_mean": 0.0625, "rows": 8})
    assert kl.beta == pytest.approx(0.1016, rel=1e-12)
    # kl 0.055: e = 0.1 (inside the clip); x (1 + 0.1 x 20 / 100) = x 1.02 -> 0.1016 x 1.02 = 0.103632
    kl.update({"kl_ref_row_mean": 0.055, "rows": 20})
    assert kl.beta == pytest.approx(0.103632, rel=1e-12)
    # kl 0.01: e = -0.8, clipped to -0.2; x (1 - 0.2 x 10 / 100) = x 0.98 -> 0.10155936
    kl.update({"kl_ref_row_mean": 0.01, "rows": 10})
    assert kl.beta == pytest.approx(0.10155936, rel=1e-12)
    kl.update({"rows": 10})  # no KL measured (nothing scored): unchanged
    assert kl.beta == pytest.approx(0.10155936, rel=1e-12)
    assert kl.state_dict() == {"beta": kl.beta}


def test_the_step_reads_the_accessor_and_reports_verls_current_kl():
    run = policyzoo.assemble({"base": "grpo", "kl": {"use": "adaptive", "estimator": "k1", "beta": 0.5}})
    run.kl._beta = 0.25  # the controller's state, not params.beta, is what the step uses
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    lp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    ref = torch.tensor([[-1.2, -1.4], [-1.1, -1.0], [-1.0, -1.0]])
    rollout = Rollout(prompt_ids=[[1]] * 3, response_ids=torch.ones(3, 2, dtype=torch.long), response_mask=mask,
                      rollout_logprobs=lp, group_ids=torch.tensor([0, 0, 1]),
                      truncated=torch.zeros(3, dtype=torch.bool))
    batch, m = prepare(run, StepBatch(rollout, torch.tensor([1.0, 0.0, 1.0]), ref_logprobs=ref))
    # k1 = lp - ref = [[0.2, 0.4], [0.1, -]]; row means 0.3, 0.1 and 0 (no token) -> (0.3 + 0.1 + 0) / 3
    assert m["kl_ref_row_mean"] == pytest.approx(0.4 / 3)
    assert m["kl_ref"] == pytest.approx(0.7 / 3)  # the token mean: (0.2 + 0.4 + 0.1) / 3, unscaled
    assert m["kl_coef"] == 0.25
    # reward placement: -beta x k1 on each token = [[-0.05, -0.1], [-0.025, 0]]
    assert torch.allclose(batch.token_rewards, torch.tensor([[-0.05, -0.1], [-0.025, 0.0], [0.0, 0.0]]))


def test_the_step_updates_once_after_the_optimizer_step():
    run = bandit_run(ADAPTIVE)
    bandit = Bandit.random(questions=4, candidates=4, right=1, seed=0)
    hist = train(run, bandit, steps=2)
    # step 1 is on the reference (KL 0 -> e = -0.2): 0.1 x (1 - 0.2 x 64 / 100) = 0.0872; the rows are P x G
    assert hist[0]["rows"] == 64 and hist[0]["kl_coef"] == 0.1 and hist[0]["kl_ref_row_mean"] == 0.0
    assert hist[1]["kl_coef"] == pytest.approx(0.0872, rel=1e-12)
    e = min(max(hist[1]["kl_ref_row_mean"] / 0.05 - 1, -0.2), 0.2)
    assert run.kl.beta == pytest.approx(0.0872 * (1 + e * 64 / 100), rel=1e-12)


def _update_on_rank(rank, world):
    from policyzoo.engine.dist import DistCollective

    kl = Adaptive(beta=0.1, target_kl=0.05, horizon=100)
    # rank 0: 8 rows of mean KL 0.04; rank 1: 24 rows of mean KL 0.06 -> the step's 32 rows: 1.76 / 32 = 0.055
    kl.update({"kl_ref_row_mean": [0.04, 0.06][rank], "rows": [8, 24][rank]}, DistCollective())
    return kl.beta


def test_two_ranks_compute_the_same_coefficient():
    betas = on_ranks(_update_on_rank, world=2)
    # e = 0.055 / 0.05 - 1 = 0.1; x (1 + 0.1 x 32 / 100) = x 1.032 -> 0.1032 on both ranks, bit for bit
    assert betas[0] == betas[1]
    assert betas[0] == pytest.approx(0.1032, rel=1e-12)
    one = Adaptive(beta=0.1, target_kl=0.05, horizon=100)
    one.update({"kl_ref_row_mean": 0.04}, LOCAL)  # a rank alone would adapt to its own KL
    assert one.beta == 0.1


class _NoTrainer:
    def weights_finite(self):
        return True

    def save(self, folder, client_state):  # the weights are the bandit's, kept aside by the test
        pass

    def schedule_state(self) -> dict:  # no LR schedule here (the trainer's is saved beside the components)
        return {}


def _steps(run, bandit, seeds):
    return [train_step(run, bandit, lambda: bandit.prompts(8), seed=i, settings=step_settings(run)) for i in seeds]


def test_resume_restores_the_state_exactly(tmp_path):
    bandit = Bandit.random(questions=4, candidates=4, right=1, seed=0)
    straight = bandit_run(ADAPTIVE)
    whole = _steps(straight, copy.deepcopy(bandit), range(4))

    first = bandit_run(ADAPTIVE)
    b2 = copy.deepcopy(bandit)  # the weights and optimizer state travel with the bandit; the run's state below
    _steps(first, b2, range(2))
    pieces = SimpleNamespace(trainer=_NoTrainer(), rundir=RunDir(tmp_path / "run"), fingerprint={},
                             config=Config(), run=first)
    write_checkpoint(pieces, step=2, batches=2, rows=16)
    _, state = RunDir(tmp_path / "run").latest()  # state.json, as --resume reads it
    assert state["components"] == {"kl:adaptive": {"beta": first.kl.beta}}

    resumed = bandit_run(ADAPTIVE)  # a new process: the coefficient starts at params.beta ...
    assert resumed.kl.beta == 0.1
    resumed.load_state_dict(state["components"])  # ... until the checkpoint's state is loaded
    rest = _steps(resumed, b2, range(2, 4))
    assert [m["kl_coef"] for m in rest] == [m["kl_coef"] for m in whole[2:]]  # bit for bit
    assert resumed.kl.beta == straight.kl.beta != 0.1
    skipped = bandit_run(ADAPTIVE)  # without the state the coefficient restarts: the test can tell
    assert _steps(skipped, copy.deepcopy(b2), [2])[0]["kl_coef"] != whole[2]["kl_coef"]


def test_a_missing_or_foreign_state_is_refused():
    run = bandit_run(ADAPTIVE)
    with pytest.raises(ConfigError, match="keeps state but the checkpoint holds none"):
        run.load_state_dict({})
    with pytest.raises(ConfigError, match="which this run does not have"):
        bandit_run("grpo").load_state_dict({"kl:adaptive": {"beta": 0.2}})
    with pytest.raises(ConfigError, match="not {'beta': float}"):
        run.load_state_dict({"kl:adaptive": {"coef": 0.2}})
