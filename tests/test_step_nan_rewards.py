"""NaN rewards through the real step: unscorable rows are excluded, never spread NaN.

A NaN reward means "unscorable" (hookspecs.reward): the row enters no baseline statistic, gets
advantage 0, and the step's reward metrics ignore it. It still counts in the reduce's sequence
normaliser N (it has response tokens; the step does not drop it).
"""

import math

import pytest
import torch

from policyzoo.step import train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


RIGHT, WRONG, UNSCORABLE = 0, 1, 2
NAN = float("nan")


def recorded(bandit):
    seen = []
    generate = bandit.generate

    def record(*args, **kwargs):
        seen.append(generate(*args, **kwargs))
        return seen[-1]

    bandit.generate = record
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unscorable_rows_get_no_advantage_and_no_share_of_the_baseline(catalog, seed):
    # one question, all answers 1 token; scores 1 / 0 / NaN; uniform start; SGD lr 1
    bandit = Bandit([[1, 1, 1]], scores=[[1.0, 0.0, NAN]], optimizer="sgd", lr=1.0)
    seen = recorded(bandit)
    # grpo without KL, with the Dr. GRPO mean baseline (A = r - mean of the VALID rows)
    run = bandit_run({"base": "grpo", "kl": None, "baseline": {"use": "group_mean"}}, catalog)
    m = train_step(run, bandit, lambda: bandit.prompts(1), seed=seed, settings=step_settings(run))
    k = seen[0].response_ids[:, 0]
    n = [int((k == j).sum()) for j in range(3)]
    G = 8
    assert n[RIGHT] > 0 and n[WRONG] > 0 and n[UNSCORABLE] > 0
    # valid mean m = n0 / (n0 + n1); A_right = 1 - m, A_wrong = -m, A_unscorable = 0.
    mean = n[RIGHT] / (n[RIGHT] + n[WRONG])
    # On-policy, 1-token answers, seq_mean_token_mean over N = G = 8 rows (NaN rows count in N):
    # loss = -(1/G) sum_i A_i log pi(k_i); d theta_j = (1/G) sum_i A_i (1[k_i = j] - p_j), and
    # sum_i A_i = n0 (1 - m) - n1 m = 0, so d theta_j = (1/G) n_j A_j:
    want = torch.tensor([n[RIGHT] * (1 - mean), -n[WRONG] * mean, 0.0]) / G
    assert torch.allclose(bandit.theta.detach()[0], want, atol=1e-6)
    # metrics: NaN rows excluded from the reward mean/std, counted as unscorable, nothing skipped
    assert m["skipped"] == 0 and math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    assert m["reward_mean"] == pytest.approx(mean)
    assert m["reward_std"] == pytest.approx(math.sqrt(mean * (1 - mean)))  # population std of 0/1
    assert m["reward_unscorable"] == n[UNSCORABLE]
    # counted over the sampled rows too, with the reward component that gave the NaN
    assert m["unscorable_rows"] == n[UNSCORABLE] and m["unscorable/bandit_correct"] == n[UNSCORABLE]


def test_unscorable_rows_are_counted_where_a_filter_drops_them(catalog):
    # scores 1 / NaN with DAPO's dynamic sampling: every group's valid rewards are all 1 (constant), so the
    # filter keeps no row in any of its 3 rounds and the step is skipped; the NaN rows sampled in those rounds
    # are still counted (``reward_unscorable`` counts only kept rows: none here)
    bandit = Bandit([[1, 1]], scores=[[1.0, NAN]], optimizer="sgd", lr=1.0)
    seen = recorded(bandit)
    run = bandit_run({"base": "dapo", "reward": []}, catalog)
    m = train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run))
    assert m["skipped"] == 1 and m["skip_reason"] == "no rows kept by the filters"
    assert len(seen) == 3 and m["sample_rounds"] == 3 and m["sampled_rows"] == 3 * 2 * 8  # 3 rounds x P 2 x G 8
    nan_rows = sum(int((r.response_ids[:, 0] == 1).sum()) for r in seen)  # answer 1 scores NaN
    assert nan_rows > 0 and m["unscorable_rows"] == nan_rows and m["unscorable/bandit_correct"] == nan_rows


def test_a_group_whose_valid_rewards_agree_is_zero_std(catalog):
    # scores 1 / NaN: every valid reward is 1, so the group is constant (zero std) and nothing moves
    bandit = Bandit([[1, 1]], scores=[[1.0, NAN]], optimizer="sgd", lr=1.0)
    seen = recorded(bandit)
    run = bandit_run({"base": "grpo", "kl": None}, catalog)
    m = train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run))
    assert bool((seen[0].response_ids[:, 0] == 1).any())  # some NaN rows were sampled
    assert m["zero_std_frac"] == 1.0 and m["reward_mean"] == 1.0
    assert m["skipped"] == 0 and m["grad_norm"] == 0.0
    assert torch.equal(bandit.theta.detach(), torch.zeros(1, 2))


def test_all_unscorable_trains_nothing_and_reports_nan_reward(catalog):
    bandit = Bandit([[1, 1]], scores=[[NAN, NAN]], optimizer="sgd", lr=1.0)
    run = bandit_run({"base": "grpo", "kl": None}, catalog)
    m = train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run))
    assert m["skipped"] == 0 and m["grad_norm"] == 0.0 and m["loss"] == 0.0
    assert math.isnan(m["reward_mean"]) and m["reward_unscorable"] == 16
    assert torch.equal(bandit.theta.detach(), torch.zeros(1, 2))


def test_infinite_reward_skips_the_whole_update(catalog):
    # +inf is not "unscorable" but a broken reward: the step skips the update, names the group,
    # leaves weights, optimizer state and the sampler as they were
    bandit = Bandit([[1, 1]], scores=[[float("inf"), 0.0]], optimizer="adam", lr=1.0)
    run = bandit_run({"base": "grpo", "kl": None}, catalog)
    m = train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run))
    assert m["skipped"] == 1 and m["skip_reason"] == "non-finite rewards"
    assert torch.equal(bandit.theta.detach(), torch.zeros(1, 2)) and len(bandit.opt.state) == 0
    assert "sync_max_change" not in m
