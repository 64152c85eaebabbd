"""One-step overlap (``engine.overlap: one_step``): the staleness bound, the per-row lag, sync
after the sampling in flight, and the behaviour policy's log-probs in the ratio."""

from __future__ import annotations

import math
import time

import pytest
import torch
from _engine_helpers import metrics, run_train

from policyzoo.contract import Rollout
from policyzoo.engine.ahead.overlap import OverlapPolicy
from policyzoo.step import collect, learn
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings


class Engine:
    """A stand-in rollout engine + trainer: ``weights`` goes up by one per sync; a generation takes
    50 ms and writes the weights it used into ``rollout_logprobs``."""

    def __init__(self):
        self.weights, self.generating, self.calls = 0, False, []
        self.stats = {"tokens": 0, "prompt_tokens": 0, "seconds": 0.0}  # counted when sampled, as LMPolicy does

    def generate(self, prompts, n, max_tokens, temperature, seed, top_p=1.0):
        self.generating = True
        self.calls.append(seed)
        time.sleep(0.05)
        used = self.weights
        self.generating = False
        b = len(prompts) * n
        self.stats["tokens"] += b
        self.stats["prompt_tokens"] += 10 * b
        return Rollout(prompt_ids=[[1]] * b, response_ids=torch.zeros(b, 1, dtype=torch.long),
                       response_mask=torch.ones(b, 1, dtype=torch.bool),
                       rollout_logprobs=torch.full((b, 1), used * 1.0),
                       group_ids=torch.arange(b), truncated=torch.zeros(b, dtype=torch.bool))

    def sync(self):
        assert not self.generating  # never pushed under a running generation
        self.weights += 1
        return {}


def _sample(prompts, seed):
    return lambda policy: policy.generate(prompts, 2, 4, 1.0, seed)


def test_prefetched_batch_is_one_step_behind_and_sync_waits_for_it():
    eng = Engine()
    pol = OverlapPolicy(eng, max_lag=1)
    pol.prefetch(_sample([{"q": 1}], 7))  # sampled with weights 0 while the trainer steps
    pol.sync()  # waits for the generation, then pushes weights 1
    out = pol.generate([{"q": 1}], 2, 4, 1.0, 7)
    assert eng.calls == [7]  # not sampled again
    assert out.rollout_logprobs.flatten().tolist() == [0.0, 0.0]  # the weights it was sampled with
    assert out.policy_lag.tolist() == [1, 1] and pol.stale_dropped == 0
    fresh = pol.generate([{"q": 2}], 2, 4, 1.0, 8)  # nothing prefetched: sampled now, lag 0
    assert fresh.policy_lag.tolist() == [0, 0] and fresh.rollout_logprobs.flatten().tolist() == [1.0, 1.0]


def test_sampling_counters_are_booked_to_the_step_that_trains_on_the_batch():
    eng = Engine()
    pol = OverlapPolicy(eng, max_lag=1)
    pol.prefetch(_sample([{"q": 1}], 7))  # 1 prompt x 2 samples x 1 token, sampled during "step 1"
    pol.sync()
    assert eng.stats["tokens"] == 2 and pol.stats["tokens"] == 0  # sampled, not yet trained on
    pol.generate([{"q": 1}], 2, 4, 1.0, 7)  # "step 2" takes it: booked now
    assert pol.stats["tokens"] == 2 and pol.stats["prompt_tokens"] == 20
    pol.prefetch(_sample([{"q": 2}], 9))
    pol.generate([{"q": 3}], 2, 4, 1.0, 10)  # another request: the prefetch is dropped, not booked
    assert pol.stale_dropped == 1 and eng.stats["tokens"] == 6 and pol.stats["tokens"] == 4


def test_a_batch_beyond_the_staleness_bound_is_sampled_again():
    eng = Engine()
    pol = OverlapPolicy(eng, max_lag=1)
    pol.prefetch(_sample([{"q": 1}], 7))
    pol.sync()
    pol.sync()  # two optimizer steps pushed since it was sampled: lag 2 > 1
    out = pol.generate([{"q": 1}], 2, 4, 1.0, 7)
    assert eng.calls == [7, 7] and pol.stale_dropped == 1
    assert out.policy_lag.tolist() == [0, 0] and out.rollout_logprobs.flatten().tolist() == [2.0, 2.0]


def test_a_prefetch_for_another_request_is_dropped():
    eng = Engine()
    pol = OverlapPolicy(eng)
    pol.prefetch(_sample([{"q": 1}], 7))
    out = pol.generate([{"q": 1}], 2, 4, 1.0, 8)  # another seed (e.g. a second round of sampling)
    assert eng.calls == [7, 8] and pol.stale_dropped == 1 and out.policy_lag.tolist() == [0, 0]


@pytest.mark.usefixtures("one_thread")
def test_stale_rows_train_against_the_samplers_logprobs(catalog):
    def one(lag: int):
        bandit = Bandit.random(6, 5, right=2, min_len=2, max_len=8, seed=7, optimizer="sgd", lr=0.5)
        run = bandit_run({"base": "grpo", "sample": {"max_tokens": 8}}, catalog)
        settings = step_settings(run)
        rollout, rewards, parts, greedy, m = collect(run, bandit, lambda: bandit.prompts(3), 3, settings)
        rollout.policy_lag = torch.full((len(rollout),), lag)
        rollout.rollout_logprobs[:, 0] -= 0.1  # the sampler's log-prob of token 0, 0.1 nats below the trainer's
        return learn(run, bandit, rollout, rewards, m, settings, parts, greedy), rollout.response_mask

    m0, _ = one(0)
    assert m0["ratio_mean"] == 1.0 and m0["policy_lag_max"] == 0  # on-policy: live log-probs detached
    m1, mask = one(1)
    # lag 1: old = the sampler's log-probs: token 0 of each of the B rows has ratio exp(0.1), every
    # other token (log-prob 0 on both sides in the bandit) ratio 1
    b, n = mask.shape[0], int(mask.sum())
    assert m1["ratio_mean"] == pytest.approx((b * math.exp(0.1) + n - b) / n, rel=1e-6)
    assert m1["policy_lag_max"] == 1 and m1["policy_lag_mean"] == 1.0


def test_one_step_overlap_end_to_end(tmp_path):
    # 4 steps, checkpoint after step 2: step 1 sampled before any update (lag 0), step 2 sampled
    # while step 1 trained (lag 1); nothing is sampled ahead across the checkpoint, so step 3 is
    # sampled after it (lag 0) and step 4 during step 3's training (lag 1)
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=4", "train.save_every=2", "algorithm.sample.n=4", "engine.overlap=one_step")
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["policy_lag_max"] for r in train] == [0, 1, 0, 1]
    assert [r["stale_dropped"] for r in train] == [0, 0, 0, 0]
    for r in train:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and r["sync_max_diff"] <= 1e-4
    # each step logs the tokens of the batch it trained on: 2 prompts x 4 samples, >= 1 token each
    # (they were booked to the step that sampled them: the last step logged 0)
    assert all(r["rollout_tokens"] >= 8 and r["prompt_tokens"] > 0 and r["rollout_tokens_per_s"] > 0 for r in train)
    assert train[0]["ratio_mean"] == 1.0  # on-policy step
    assert train[1]["ratio_mean"] != 1.0  # sampled by the weights before step 1's update


def test_overlap_with_an_env_is_refused_before_any_model_loads(tmp_path):
    from _engine_helpers import TINY_OVERRIDES, tiny_model

    from policyzoo.engine.run.session import prepare
    from policyzoo.errors import ConfigError
    from policyzoo.run_config import load_config

    config = load_config(None, "grpo", [f"model.path={tiny_model()}", *TINY_OVERRIDES, f"output_dir={tmp_path / 'r'}",
                                        "algorithm.env.use=calculator", "engine.overlap=one_step"])
    with pytest.raises(ConfigError) as e:
        prepare(config, None)
    assert e.value.where == "engine.overlap" and "engine.overlap=none" in e.value.fix
    assert not (tmp_path / "r").exists()  # nothing written
