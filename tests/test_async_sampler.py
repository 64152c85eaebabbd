"""Asynchronous training with a staleness bound (``engine.max_staleness``): the queue, version and
staleness bookkeeping worked by hand with a stand-in engine (no thread: the test plays the
sampler's thread), the bound under a real thread (invariants only: no timing is asserted), and
the off-policy step on the bandit."""

from __future__ import annotations

import threading

import pytest
import torch

from policyzoo.contract import Rollout
from policyzoo.engine.ahead.async_sampler import AsyncAhead, AsyncSampler
from policyzoo.step import dispatch, train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings


class Engine:
    """A stand-in rollout engine + trainer: ``weights`` goes up by one per push; a generation writes
    the weights it used into ``rollout_logprobs`` and fails the test if a push ran under it."""

    def __init__(self):
        self.weights, self.generating, self.calls = 0, False, []
        self.stats = {"tokens": 0, "prompt_tokens": 0, "seconds": 0.0}

    def generate(self, prompts, n, max_tokens, temperature, seed, top_p=1.0):
        assert not self.generating  # one user of the engine at a time
        self.generating, used = True, self.weights
        self.calls.append(seed)
        b = len(prompts) * n
        self.stats["tokens"] += b
        self.generating = False
        assert self.weights == used  # no push under a running generation
        return Rollout(prompt_ids=[[1]] * b, response_ids=torch.zeros(b, 1, dtype=torch.long),
                       response_mask=torch.ones(b, 1, dtype=torch.bool),
                       rollout_logprobs=torch.full((b, 1), float(used)),
                       group_ids=torch.arange(b) // n, truncated=torch.zeros(b, dtype=torch.bool))

    def sync(self):
        assert not self.generating
        self.weights += 1
        return {}


def _plan(step, cursor):  # one prompt per step, at the stream position; the step's seed
    return [{"q": cursor}], step


def _sample(policy, prompts, seed):
    return policy.generate(prompts, 2, 4, 1.0, seed)


def _sampler(s, last_step=6, **kw):
    eng = Engine()
    return eng, AsyncSampler(eng, s, _sample, _plan, stride=1, last_step=last_step, background=False, **kw)


def _run(sampler, steps, fill=lambda step: True):
    """Play ``steps`` steps: begin, take the batch, let the "thread" sample all it may while the
    step "trains" (when ``fill(step)``), push. Returns each step's per-row (version, staleness)."""
    seen = []
    for step in range(1, steps + 1):
        sampler.begin(step, cursor=step - 1)
        out = sampler.generate(*_plan(step, step - 1)[:1], 2, 4, 1.0, step)
        # the weights that sampled each row are the version it records
        assert out.rollout_logprobs.flatten().tolist() == out.policy_version.float().tolist()
        seen.append((out.policy_version.tolist(), out.policy_lag.tolist()))
        while fill(step) and sampler.sample_next() is not None:
            pass
        assert len(sampler.queue) <= sampler.s  # at most s batches ahead of the step training
        sampler.sync()
    return seen


def test_staleness_one_by_hand():
    # s = 1: step 1 is sampled by the trainer at version 0 (nothing ahead yet: staleness 0). While a
    # step m trains at version m-1 the thread may sample up to step version+1+s = m+1, so step m+1 is
    # sampled at version m-1 and trained at version m: staleness 1 from step 2 on
    eng, sampler = _sampler(1)
    seen = _run(sampler, 5)
    assert seen == [([0, 0], [0, 0]), ([0, 0], [1, 1]), ([1, 1], [1, 1]), ([2, 2], [1, 1]), ([3, 3], [1, 1])]
    assert eng.calls == [1, 2, 3, 4, 5, 6]  # every step sampled once, step 6 (the last) ahead of time
    assert sampler.stale_dropped == 0 and sampler.in_flight() == {"batches": 1, "rows": 2}


def test_staleness_two_by_hand():
    # s = 2: during step 1 (version 0) the thread samples steps 2 and 3 (<= 0+1+2); during step m >= 2
    # (version m-1) step m+2. Step 2: sampled at 0, trained at 1 -> 1; step 3: 0 -> 2 (staleness 2);
    # step 4: sampled during step 2 at version 1, trained at 3 -> 2; step 5: 2 -> 4: 2
    eng, sampler = _sampler(2)
    seen = _run(sampler, 5)
    assert [lag for _, lag in seen] == [[0, 0], [1, 1], [2, 2], [2, 2], [2, 2]]
    assert [v[0] for v, _ in seen] == [0, 0, 0, 1, 2]
    assert eng.calls == [1, 2, 3, 4, 5, 6]  # nothing past the last step (6): the queue ends there
    assert sampler.stale_dropped == 0


def test_a_slow_sampler_leaves_the_step_to_the_trainer():
    # s = 2, but the thread samples nothing while steps 2 and 3 train: step 3 was sampled during
    # step 1 (version 0, trained at 2: staleness 2); step 4 is not queued, so the trainer samples it
    # itself at version 3 (staleness 0); during step 4 (version 3) the thread samples steps 5 and 6
    # (<= 3+1+2), so step 5 trains at version 4: staleness 1
    _, sampler = _sampler(2)
    seen = _run(sampler, 5, fill=lambda step: step not in (2, 3))
    assert [lag[0] for _, lag in seen] == [0, 1, 2, 0, 1]
    assert [v[0] for v, _ in seen] == [0, 0, 0, 3, 3]
    assert sampler.stale_dropped == 0


def test_a_batch_beyond_the_bound_is_dropped_and_sampled_again():
    eng, sampler = _sampler(1)
    sampler.begin(1, 0)
    sampler.generate([{"q": 0}], 2, 4, 1.0, 1)
    assert sampler.sample_next() == 2 and sampler.sample_next() is None  # step 2 at version 0, then the bound
    sampler.sync()
    sampler.sync()  # two pushes before step 2 trains: staleness 2 > 1
    sampler.begin(2, 1)
    out = sampler.generate([{"q": 1}], 2, 4, 1.0, 2)
    assert out.policy_lag.tolist() == [0, 0] and out.policy_version.tolist() == [2, 2]  # sampled again now
    assert eng.calls == [1, 2, 2] and sampler.stale_dropped == 1 and sampler.stale_dropped_rows == 2


def test_batches_planned_at_a_moved_prompt_stream_are_dropped():
    # s = 2: steps 2 and 3 are queued for stream positions 1 and 2; step 1 then takes a second round
    # of dynamic sampling (the stream moves by 2), so step 2 starts at position 2: both predictions
    # are wrong, dropped (2 batches x 2 rows), and sampled again from the new position
    eng, sampler = _sampler(2)
    sampler.begin(1, 0)
    sampler.generate([{"q": 0}], 2, 4, 1.0, 1)
    assert [sampler.sample_next(), sampler.sample_next(), sampler.sample_next()] == [2, 3, None]
    sampler.sync()
    sampler.begin(2, 2)
    assert sampler.stale_dropped == 2 and sampler.stale_dropped_rows == 4 and sampler.queue == {}
    out = sampler.generate([{"q": 2}], 2, 4, 1.0, 2)  # step 2 now: sampled by the trainer
    assert out.policy_lag.tolist() == [0, 0]
    assert sampler.sample_next() == 3 and sampler.queue[3].cursor == 3  # replanned at the new position


def test_another_request_is_not_served_from_the_queue():
    # the second round of a step (another seed) or a step asking other prompts gets a fresh batch
    eng, sampler = _sampler(1)
    sampler.begin(1, 0)
    sampler.generate([{"q": 0}], 2, 4, 1.0, 1)
    sampler.sample_next()
    sampler.sync()
    sampler.begin(2, 1)
    out = sampler.generate([{"q": 1}], 2, 4, 1.0, 99)  # asked with another seed than the one planned (2)
    assert eng.calls == [1, 2, 99] and out.policy_lag.tolist() == [0, 0]
    assert sampler.stale_dropped == 1 and sampler.stale_dropped_rows == 2


def test_sampling_counters_are_booked_when_the_batch_is_used():
    eng, sampler = _sampler(1)
    sampler.begin(1, 0)
    sampler.generate([{"q": 0}], 2, 4, 1.0, 1)
    assert sampler.stats["tokens"] == 2
    sampler.sample_next()  # 2 rows x 1 token sampled ahead: not booked yet
    assert eng.stats["tokens"] == 4 and sampler.stats["tokens"] == 2
    sampler.sync()
    sampler.begin(2, 1)
    sampler.generate([{"q": 1}], 2, 4, 1.0, 2)
    assert sampler.stats["tokens"] == 4


def test_zero_staleness_is_the_synchronous_step_and_not_a_sampler():
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        AsyncSampler(Engine(), 0, _sample, _plan, stride=1, last_step=3, background=False)


@pytest.mark.parametrize("s", [1, 2])
def test_the_bound_holds_with_a_real_thread(s):
    # the thread samples whenever it may; what it manages before each push depends on timing, so
    # only the invariants are asserted: staleness within 0..s, the version is the weights used,
    # staleness = pushes since, and no push under a generation (Engine asserts it). The 30 steps run
    # in a helper thread so that a deadlock fails the test (generous bound: "did not hang")
    eng = Engine()
    sampler = AsyncSampler(eng, s, _sample, _plan, stride=1, last_step=30)
    box: dict = {}

    def steps():
        try:
            for step in range(1, 31):
                sampler.begin(step, step - 1)
                out = sampler.generate([{"q": step - 1}], 2, 4, 1.0, step)
                lag = out.policy_lag
                assert 0 <= int(lag.min()) and int(lag.max()) <= s
                assert (out.policy_version + lag == sampler.version).all()
                assert out.rollout_logprobs.flatten().tolist() == out.policy_version.float().tolist()
                with sampler.exclusive():  # an evaluation uses the engine: the thread waits (Engine asserts it)
                    eng.generate([{"q": -1}], 1, 4, 0.0, -step)
                sampler.sync()
            sampler.stop()
            box["done"] = True
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    runner = threading.Thread(target=steps, daemon=True)
    runner.start()
    runner.join(120)
    assert not runner.is_alive(), "the trainer and the sampler's thread deadlocked"
    if "error" in box:
        raise box["error"]
    assert box["done"] and sampler.stale_dropped == 0 and not sampler._thread.is_alive()
    assert sorted(c for c in set(eng.calls) if c > 0) == list(range(1, 31))  # every step sampled, none past the last


def test_a_failed_sampling_ahead_is_sampled_again_by_the_trainer():
    eng, sampler = _sampler(1)
    fail = threading.Event()
    fail.set()
    real = eng.generate

    def flaky(*a, **k):
        if fail.is_set():
            fail.clear()
            raise RuntimeError("sampler died")
        return real(*a, **k)

    sampler.begin(1, 0)
    sampler.generate([{"q": 0}], 2, 4, 1.0, 1)
    eng.generate = flaky
    assert sampler.sample_next() == 2  # it raised in the "thread": recorded, not raised there
    sampler.sync()
    sampler.begin(2, 1)
    out = sampler.generate([{"q": 1}], 2, 4, 1.0, 2)
    assert out.policy_lag.tolist() == [0, 0] and sampler.stale_dropped == 1


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("s", [1, 2])
def test_async_steps_on_the_bandit(s, catalog):
    # the real step (collect + learn) through the sampler; the test plays the thread: while each
    # step trains (on_batch, before the update) everything the bound admits is sampled. Staleness
    # per step as worked out in test_staleness_{one,two}_by_hand, and the stale rows train against
    # the sampler's log-probs (pi_old = the older weights': the ratio is not 1 once they moved)
    bandit = Bandit.random(6, 5, right=2, min_len=2, max_len=8, seed=7, optimizer="sgd", lr=0.5)
    run = bandit_run({"base": "grpo", "sample": {"max_tokens": 8, "n": 4}}, catalog)
    settings = step_settings(run)

    def sample(policy, prompts, seed):
        return dispatch.call(run, "sample", rows=len(prompts) * 4, policy=policy, prompts=prompts, seed=seed, env=None)

    def fill(batch):
        while sampler.sample_next() is not None:
            pass

    stream = bandit.prompts(60)
    sampler = AsyncSampler(bandit, s, sample, lambda m, c: (stream[c:c + 3], m * 1000), stride=3, last_step=8,
                           background=False)
    out = []
    for step in range(1, 9):
        cursor = 3 * (step - 1)
        out.append(train_step(run, sampler, lambda peek=False, at=cursor: stream[at:at + 3], step, settings,
                              on_batch=fill, ahead=AsyncAhead(sampler).begin(step, cursor)))
    lags = {1: [0, 1, 1, 1, 1, 1, 1, 1], 2: [0, 1, 2, 2, 2, 2, 2, 2]}[s]
    assert [m["policy_lag_max"] for m in out] == lags and [m["policy_lag_mean"] for m in out] == lags
    assert all(m["stale_dropped"] == 0 and m["skipped"] == 0 for m in out)
    assert out[0]["ratio_mean"] == 1.0  # on-policy: the live log-probs detached
    assert any(m["ratio_mean"] != 1.0 for m in out[1:])  # pi_old = the sampler's (older) log-probs


def test_a_resumed_run_counts_what_was_ahead_of_its_checkpoint(catalog):
    # the checkpoint of step 2 recorded 2 batches (16 rows) sampled ahead; the resumed run starts
    # its sampler at version 2 and reports them as discarded (a console line, metrics on step 3)
    from types import SimpleNamespace

    from policyzoo.engine.run.batch_sources import async_sampler
    from policyzoo.run_config import load_config

    printed: list[str] = []
    fake = SimpleNamespace(config=load_config(None, "grpo", ["engine.max_staleness=2", "train.steps=5"]),
                           run=bandit_run({"base": "grpo"}, catalog), task=SimpleNamespace(train_rows=[{}] * 8, seed=0),
                           state={"step": 2, "async_in_flight": {"batches": 2, "rows": 16}}, share=2,
                           console=SimpleNamespace(print=lambda text, **_: printed.append(text)), policy=Engine())
    sampler, discarded = async_sampler(fake)
    sampler.stop()
    assert sampler.version == 2 and sampler.s == 2 and sampler.last_step == 5
    assert discarded == {"async_discarded_batches": 2, "async_discarded_rows": 16}
    assert len(printed) == 1 and "2 batch(es) (16 rows sampled)" in printed[0]
    fresh = SimpleNamespace(**{**vars(fake), "state": {"step": 0}})
    sampler, discarded = async_sampler(fresh)
    sampler.stop()
    assert discarded == {} and len(printed) == 1  # a new run has nothing to report


def test_what_is_ahead_at_a_checkpoint_is_merged_over_ranks():
    from policyzoo.engine.ahead.async_sampler import discarded_at_resume, merge_in_flight

    # two ranks, each with its share (2 prompts x 4 = 8 rows) of the same step sampled ahead, and
    # rank 1 also with the next step's still being sampled (no rows yet): 2 batches, 8 + 8 rows
    assert merge_in_flight([{"batches": 1, "rows": 8}, {"batches": 2, "rows": 8}]) == {"batches": 2, "rows": 16}
    assert discarded_at_resume({"step": 0}) == ({}, None)  # a new run
    assert discarded_at_resume({"step": 4, "async_in_flight": {"batches": 0, "rows": 0}}) == ({}, None)


def test_vllm_sleep_with_asynchronous_sampling_is_refused():
    # vLLM cannot sleep while training when the thread samples during the update (as with overlap)
    from types import SimpleNamespace

    from policyzoo.engine.device import check_device_options
    from policyzoo.errors import ConfigError

    engine = SimpleNamespace(vllm_sleep=1, rollout="vllm", overlap="none", max_staleness=1, parallel_start=False)
    with pytest.raises(ConfigError) as e:
        check_device_options(engine, on_cuda=True)
    assert e.value.where == "engine.vllm_sleep" and "engine.max_staleness" in e.value.fix
    check_device_options(SimpleNamespace(**{**vars(engine), "max_staleness": 0}), on_cuda=True)  # allowed


@pytest.mark.parametrize("key, value", [("top_p", 0.9), ("top_k", 5), ("stop", ["\n"])])
def test_sampling_options_pass_through_and_match_the_queued_batch(key, value):
    # the sample component's options (top_p, top_k, stop ...) reach the engine from the thread, and
    # a batch queued without them does not serve a request with them
    calls = []

    class Inner(Engine):
        sampling_options = frozenset({"top_p", "top_k", "stop"})

        def generate(self, prompts, n, max_tokens, temperature, seed, **options):
            calls.append(options)
            return Engine.generate(self, prompts, n, max_tokens, temperature, seed)

    opts = {key: value}
    sampler = AsyncSampler(Inner(), 1, lambda pol, prompts, seed: pol.generate(prompts, 2, 4, 1.0, seed, **opts),
                           _plan, stride=1, last_step=3, background=False)
    assert sampler.sampling_options == frozenset({"top_p", "top_k", "stop"})
    sampler.begin(1, 0)
    sampler.generate([{"q": 0}], 2, 4, 1.0, 1, **opts)
    sampler.sample_next()  # step 2, with the option
    sampler.sync()
    sampler.begin(2, 1)
    out = sampler.generate([{"q": 1}], 2, 4, 1.0, 2, **opts)
    assert calls == [opts, opts] and out.policy_lag.tolist() == [1, 1] and sampler.stale_dropped == 0
    sampler.sample_next()  # step 3, with the option
    sampler.sync()
    sampler.begin(3, 2)
    sampler.generate([{"q": 2}], 2, 4, 1.0, 3)  # asked without it: sampled again
    assert calls == [opts, opts, opts, {}] and sampler.stale_dropped == 1
