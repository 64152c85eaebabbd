"""Learning dynamics of the zoo on the bandit test bed, through the real step and real assembly.

Each run is the unchanged ``policyzoo.step.train_step`` with ``policyzoo.assemble(name)``; only the
policy is tabular (see policyzoo.testing.bandit). A few hundred steps take about a second.
"""

import math

import pytest
import torch

from policyzoo.testing.bandit import Bandit, bandit_run, train

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


BUNDLES = ["ppo", "grpo", "rloo", "reinforce_pp", "dapo", "dr_grpo", "gspo", "cispo", "luspo", "gmpo", "dppo",
           "clip_cov", "kl_cov", "reinforce_pp_baseline", "gpg", "gdpo", "remax", "opo"]


@pytest.fixture(scope="module")
def grpo_history(catalog):
    torch.manual_seed(0)
    # 16 questions x 5 candidates, 2 right: uniform start, accuracy 2/5 = 0.4
    bandit = Bandit.random(16, 5, right=2, seed=0, lr=0.05)
    start = bandit.accuracy()
    before = []  # per-question accuracy at the start of each step
    right = bandit.scores == 1.0

    def snapshot():
        before.append((bandit.probs() * right).sum(-1))

    snapshot()
    history = train(bandit_run("grpo", catalog), bandit, 300, prompts_per_step=8, seed=0,
                    on_step=lambda i, m: snapshot())
    return start, history, before[:-1]


def test_bandit_correct_is_the_task_reward(catalog):
    run = bandit_run("grpo", catalog)
    assert [c.name for c in run.reward] == ["bandit_correct"]
    assert run.sources["reward"].startswith("bandit_correct from (in-process)")


def test_grpo_lifts_accuracy_from_04_above_09(grpo_history):
    start, history, _ = grpo_history
    assert start == pytest.approx(0.4)
    acc = [m["accuracy"] for m in history]
    first = next(i for i, a in enumerate(acc) if a > 0.9)
    assert first < 300 and acc[-1] > 0.9
    # and it got there through the metrics the step reports, never by a skipped update
    assert all(m["skipped"] == 0 for m in history)
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["kl_loss"]) for m in history)


def test_zero_std_groups_grow_with_accuracy(grpo_history):
    _, history, before = grpo_history
    zero = torch.tensor([m["zero_std_frac"] for m in history])
    # A group of G = 8 answers to a question with accuracy a is constant when all 8 are right or
    # all 8 wrong: P = a^8 + (1 - a)^8. At the start a = 0.4: 0.4^8 + 0.6^8 = 0.00066 + 0.01680
    # = 0.0175. At a = 0.95: 0.6634 + 4e-11 = 0.663.
    # Predicted per step: questions are drawn uniformly, so the mean of that over questions.
    predicted = torch.stack([(a ** 8 + (1 - a) ** 8).mean() for a in before])
    assert float(predicted[0]) == pytest.approx(0.4 ** 8 + 0.6 ** 8)
    # 300 steps x 8 groups: the observed mean matches the prediction within ~5 standard errors
    # (each group is Bernoulli, var <= 1/4: se <= sqrt(0.25 / 2400) = 0.0102)
    assert abs(float(zero.mean() - predicted.mean())) < 0.05
    # grows: the first 20 steps (accuracy near 0.4) vs the last 50 (accuracy above 0.9)
    assert float(zero[:20].mean()) < 0.1 < 0.5 < float(zero[-50:].mean())


@pytest.mark.parametrize("name", BUNDLES)
def test_every_bundle_improves_expected_reward(name, catalog):
    torch.manual_seed(0)
    bandit = Bandit.random(8, 5, right=2, seed=1, lr=0.05)
    run = bandit_run(name, catalog)
    g = run.sample.params.n
    # the same number of rows per step for every bundle: 64 (8 prompts x G = 8, 16 x 4, 64 x 1)
    history = train(run, bandit, 60, prompts_per_step=64 // g, seed=1)
    assert all(m["skipped"] == 0 and math.isfinite(m["loss"]) for m in history)
    if run.filter:  # dapo: dynamic sampling keeps whole groups, up to the 64-row target
        assert all(m["rows"] <= 64 and m["rows"] % g == 0 for m in history)
        assert sum(m["rows"] == 64 for m in history) > len(history) // 2
    else:
        assert all(m["rows"] == 64 for m in history)
    # from 0.4 (2 of 5 right, uniform) to 0.8 in 60 steps of 64 rows
    assert history[0]["expected_reward"] < 0.5 and history[-1]["expected_reward"] > 0.8
    if run.kl is not None and run.kl.params.placement == "reward":  # rloo, ppo, reinforce_pp
        assert all(math.isfinite(m["kl_ref"]) for m in history)
        assert any(m["kl_ref"] != 0.0 for m in history[1:])
    if name == "ppo":
        # the tabular critic learns: the value loss falls, V moves away from its zero start
        vl = [m["value_loss"] for m in history]
        assert sum(vl[-10:]) < sum(vl[:10]) and float(bandit.critic.detach().abs().max()) > 0.1


def test_kl_in_reward_pulls_towards_the_reference(catalog):
    # k1 in reward subtracts beta x (log pi - log pi_ref) per token; with a huge beta the policy
    # stays near the uniform reference, with beta -> 0 it moves freely.
    results = {}
    for beta in (1e-4, 50.0):
        bandit = Bandit.random(8, 5, right=2, seed=2, lr=0.05)
        run = bandit_run({"base": "rloo", "kl": {"beta": beta}}, catalog)
        train(run, bandit, 60, prompts_per_step=16, seed=2)
        results[beta] = bandit.expected_reward()
    assert results[1e-4] > 0.6 and results[50.0] < results[1e-4] - 0.1


def test_hybrid_runs_on_the_bandit(catalog):
    # a hybrid: grpo with cispo's clip (IS weight capped at 5) learns on the bandit too
    bandit = Bandit.random(8, 5, right=2, seed=3, lr=0.05)
    run = bandit_run({"base": "grpo", "clip": {"use": "cispo", "eps_high": 5.0}}, catalog)
    assert run.clip.name == "cispo" and run.clip.params.eps_high == 5.0
    history = train(run, bandit, 40, prompts_per_step=8, seed=3)
    assert history[-1]["expected_reward"] > 0.6


def test_runs_are_reproducible(catalog):
    def run_once():
        bandit = Bandit.random(8, 5, right=2, seed=4, lr=0.05)
        history = train(bandit_run("dapo", catalog), bandit, 15, prompts_per_step=4, seed=4)
        return bandit, [{k: v for k, v in m.items() if not k.startswith("time_")} for m in history]

    (b1, h1), (b2, h2) = run_once(), run_once()
    assert torch.equal(b1.theta.detach(), b2.theta.detach()) and h1 == h2
    b3 = Bandit.random(8, 5, right=2, seed=4, lr=0.05)
    train(bandit_run("dapo", catalog), b3, 15, prompts_per_step=4, seed=5)
    assert not torch.equal(b1.theta.detach(), b3.theta.detach())
