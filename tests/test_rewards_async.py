"""Async reward functions: awaited (coroutine functions, ``async def __call__`` objects), the async
components of one step run concurrently, a per-call timeout cancels, and a raising async function
is searched row by row like a synchronous one."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import pytest
import torch
from _engine_helpers import metrics, run_train

import policyzoo
from policyzoo.api import reward_entry
from policyzoo.contract import Rollout
from policyzoo.plugins.reward import Function, RewardFunctionError
from policyzoo.step import dispatch


def rollout(completions):
    b = len(completions)
    return Rollout(prompt_ids=[[1]] * b, response_ids=torch.full((b, 2), 5), response_mask=torch.ones(b, 2, dtype=bool),
                   rollout_logprobs=torch.zeros(b, 2), group_ids=torch.zeros(b, dtype=torch.long),
                   truncated=torch.zeros(b, dtype=torch.bool), prompts=["p"] * b, completions=completions,
                   rows=[{"prompt": "p", "answer": str(i)} for i in range(b)])


async def slow_length(completions, **kwargs):
    await asyncio.sleep(0.5)
    return [float(len(c)) for c in completions]


async def slow_double(completions, **kwargs):
    await asyncio.sleep(0.5)
    return [2.0 * len(c) for c in completions]


MEET = threading.Barrier(2)  # the two rewards of one step must be inside their calls at the same time


async def meet_length(completions, **kwargs):
    await asyncio.to_thread(MEET.wait, 60)  # one after the other, the barrier breaks after 60 s and this raises
    return [float(len(c)) for c in completions]


async def meet_double(completions, **kwargs):
    await asyncio.to_thread(MEET.wait, 60)
    return [2.0 * len(c) for c in completions]


class Judge:
    """A class-based async reward (``async def __call__``), as API judges are written."""

    def __init__(self):
        self.calls = 0

    async def __call__(self, completions, answer, **kwargs):
        self.calls += 1
        await asyncio.sleep(0)
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


async def raises_on_b(completions, **kwargs):
    if "b" in completions:
        raise ValueError("cannot score 'b'")
    return [0.0] * len(completions)


async def hangs(completions, **kwargs):
    await asyncio.sleep(30)


def fn(callable_, i=0, **params):
    return Function(function=reward_entry(callable_, i)["function"], **params)


def test_two_async_rewards_of_a_step_run_concurrently():
    # each reward waits at a barrier of two: the step passes only if both calls are in flight at once
    # (no wall-clock bound: run one after the other, the first call waits 60 s, the barrier breaks and it raises)
    MEET.reset()
    uses = tuple(policyzoo.use("function", function=reward_entry(f, i)["function"])
                 for i, f in enumerate((meet_length, meet_double)))
    run = policyzoo.assemble("grpo", rewards=uses)
    assert all(c.concurrent for c in run.reward)
    out = dispatch.call_each(run, "reward", rows=3, rollout=rollout(["a", "bb", "ccc"]))
    assert [v.tolist() for _, v in out] == [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]]  # lengths, doubled; config order


def test_an_async_call_method_is_awaited():
    judge = Judge()
    comp = fn(judge)
    assert comp.concurrent
    assert comp.reward(rollout=rollout(["0", "x", "2"])).tolist() == [1.0, 0.0, 1.0]  # answers "0", "1", "2"
    assert judge.calls == 1  # one call for the batch


def test_async_reward_works_inside_a_running_event_loop():
    async def main():  # a notebook runs a loop in the calling thread
        return fn(slow_length).reward(rollout=rollout(["abcd"]))

    assert asyncio.run(main()).tolist() == [4.0]


def test_timeout_cancels_and_names_the_limit():
    comp = fn(hangs, timeout=0.2)
    t0 = time.perf_counter()
    with pytest.raises(RewardFunctionError, match=r"timed out .* 3 rows.*0\.2 s"):
        comp.reward(rollout=rollout(["a", "b", "c"]))
    assert time.perf_counter() - t0 < 20  # cancelled, not waited for the 30 s sleep


def test_a_raising_async_reward_names_the_first_failing_row():
    with pytest.raises(RewardFunctionError, match=r"ValueError: cannot score 'b' on row 1"):
        fn(raises_on_b).reward(rollout=rollout(["a", "b", "b"]))


def test_timeout_on_a_synchronous_function_is_refused():
    with pytest.raises(RewardFunctionError, match="synchronous"):
        fn(lambda completions, **k: [0.0] * len(completions), timeout=1.0)


def test_nan_for_none_and_sync_functions_stay_inline():
    async def some_none(completions, **kwargs):
        return [None, 1]

    assert [math.isnan(x) for x in fn(some_none).reward(rollout=rollout(["a", "b"])).tolist()] == [True, False]
    assert fn(lambda completions, **k: [0.0] * len(completions)).concurrent is False


def test_engine_trains_two_steps_with_two_async_rewards(tmp_path):
    out = tmp_path / "run"
    f = "policyzoo.testing.tiny:async_spread_reward"
    rewards = f'rewards=[{{use: function, function: "{f}", timeout: 30}}, {{use: function, function: "{f}"}}]'
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=2", rewards, "eval.n=2", "eval.temperature=1.0",
                     timeout=1500)  # a shared machine
    assert proc.returncode == 0, proc.stderr[-4000:]
    evals = metrics(out, "eval")  # 4 held-out prompts x eval.n = 2 sampled responses, before and after
    assert [e["eval_n"] for e in evals] == [2, 2] and all(0 <= e["eval_pass@1"] <= e["eval_pass@2"] <= 1 for e in evals)
    after = json.loads((out / "summary.json").read_text())["eval_after"]
    assert set(after) == {"pass@1", "pass@2", "maj@1", "maj@2", "mean@2"}
    train = [r for r in metrics(out) if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert math.isfinite(r["loss"]) and r["reward/async_spread_reward"] > 0
        assert r["reward/async_spread_reward"] == r["reward/async_spread_reward_2"]  # the same function twice


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def double(completions, **kwargs):
    return [2.0 * len(c) for c in completions]


def test_each_collect_component_is_called_through_pluggy():
    # the step dispatches every reward component through the run's plugin manager on its own, so call
    # monitoring (HookRecorder) sees one call per component with that component's own result
    from policyzoo.testing import HookRecorder

    uses = tuple(policyzoo.use("function", function=reward_entry(f, i)["function"]) for i, f in enumerate((length,
                                                                                                          double)))
    run = policyzoo.assemble("grpo", rewards=uses)
    rec = HookRecorder().attach(run)
    out = dispatch.call_each(run, "reward", rows=2, rollout=rollout(["a", "bbb"]))
    rec.detach()
    assert [v.tolist() for _, v in out] == [[1.0, 3.0], [2.0, 6.0]]  # len("a") = 1, len("bbb") = 3; doubled
    calls = rec.of("reward")
    assert [c.component for c in calls] == [repr(c) for c in run.reward]
    assert [list(c.result) for c in calls] == [[1.0, 3.0], [2.0, 6.0]]  # each component's own result, unwrapped
