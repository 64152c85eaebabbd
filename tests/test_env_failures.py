"""Failure tolerance of the episode loop: the env's ``on_error`` (stop / retry(k) / drop_group) and
``step_timeout``, the metrics ``env_error_frac`` / ``env_timeout_frac``, and whole-group dropping
in the step. The calculator is made to fail by replacing its ``calc`` for two expressions:
``boom`` raises a RuntimeError (a crashing tool), ``hang`` sleeps 30 s (a hanging tool)."""

from __future__ import annotations

import math
import time

import pytest
import torch
from test_env_episodes import ROW, ScriptedPolicy

import policyzoo.plugins.env.calculator as env_module
from policyzoo import assemble, use
from policyzoo.contract import LOCAL
from policyzoo.errors import ComponentError, ConfigError
from policyzoo.plugins.env import Calculator
from policyzoo.step.collect import StepSettings, collect
from policyzoo.step.episodes import episode_sums, failed_groups, run_episodes
from policyzoo.testing.tiny import build_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(autouse=True)
def failing_calc(monkeypatch):
    real, calls = env_module.calc, []

    def calc(expr):
        calls.append(expr)
        if expr == "boom":
            raise RuntimeError("tool crashed")
        if expr == "hang":
            time.sleep(30)
        if expr.startswith("flaky") and calls.count(expr) <= int(expr[5:]):  # fails its first k calls
            raise ConnectionError("tool unavailable")
        return real(expr.removeprefix("flaky2").removeprefix("flaky3") or "1")

    monkeypatch.setattr(env_module, "calc", calc)
    return calls


def episodes(tok, env, script, rows=1, n=1):
    return run_episodes(ScriptedPolicy(tok, script), env, [ROW] * rows, n, 16, 1.0, 0)


def test_stop_is_the_default_and_names_the_env_and_the_fix(tok):
    with pytest.raises(ComponentError, match=r"(?s)Episode.step raised RuntimeError: tool crashed.*on_error"):
        episodes(tok, Calculator(), [[("calc(boom)", True)]])


def test_retry_calls_step_again_with_the_same_turn(tok, failing_calc):
    r = episodes(tok, Calculator(on_error="retry(2)"), [[("calc(flaky2)", True)], [("Answer: 4", True)]])
    assert failing_calc == ["flaky2"] * 3  # 2 failures, then the third call answers
    assert r.stop_reasons == ["env"] and r.env_rewards.tolist() == [1.0] and r.tool_calls.tolist() == [1]
    with pytest.raises(ComponentError, match=r"ConnectionError: tool unavailable \(2 attempts, on_error: retry\(1\)\)"):
        episodes(tok, Calculator(on_error="retry(1)"), [[("calc(flaky3)", True)]])


def test_drop_group_ends_the_episode_and_marks_its_whole_group(tok):
    # 2 prompts x n = 2: episode 1 (prompt 0, sample 1) crashes; the others answer at once.
    script = [[("Answer: 4", True), ("calc(boom)", True), ("Answer: 4", True), ("Answer: 5", True)]]
    r = episodes(tok, Calculator(on_error="drop_group"), script, rows=2, n=2)
    assert r.stop_reasons == ["env", "error", "env", "env"]
    assert math.isnan(r.env_rewards[1]) and r.env_rewards[[0, 2, 3]].tolist() == [1.0, 1.0, 0.0]
    assert failed_groups(r).tolist() == [True, True, False, False]  # group 0 whole, group 1 untouched
    sums = episode_sums(r)
    assert sums["env_error_frac"] == 1.0 and sums["env_timeout_frac"] == 0.0  # sums: 1 of 4 episodes


def test_step_timeout_stops_or_drops_a_hanging_tool(tok):
    t0 = time.perf_counter()
    with pytest.raises(ComponentError, match=r"did not return within step_timeout = 0.2 s"):
        episodes(tok, Calculator(step_timeout=0.2), [[("calc(hang)", True)]])
    script = [[("calc(hang)", True), ("Answer: 4", True)]]
    r = episodes(tok, Calculator(step_timeout=0.2, on_error="drop_group"), script, n=2)
    assert time.perf_counter() - t0 < 25  # two 0.2 s limits, not two 30 s sleeps (generous: a loaded machine)
    assert r.stop_reasons == ["timeout", "env"] and failed_groups(r).tolist() == [True, True]
    sums = episode_sums(r)
    assert sums["env_error_frac"] == 1.0 and sums["env_timeout_frac"] == 1.0


def test_on_error_values_are_checked():
    for bad in ("retry", "retry(0)", "drop", "skip"):
        with pytest.raises(ConfigError, match="on_error"):
            Calculator(on_error=bad)
    with pytest.raises(ConfigError, match="step_timeout"):
        Calculator(step_timeout=0)


class EpisodePolicy(ScriptedPolicy):
    """The scripted token policy with the rest of :class:`~policyzoo.contract.TokenPolicy` (the
    step only samples here)."""

    collective, sampling_options = LOCAL, frozenset({"top_p"})

    def unused(self, *args, **kwargs):
        raise AssertionError("the step only samples here")

    generate = logprobs = ref_logprobs = sum_pi_squared = values = backward = optimizer_step = sync = unused
    reduce_totals = unused

    def run_episodes(self, env, rows, n, max_tokens, temperature, seed, top_p=1.0):
        return run_episodes(self, env, rows, n, max_tokens, temperature, seed, top_p=top_p)


def test_the_step_drops_failed_groups_whole_and_reports_the_rates(tok):
    run = assemble({"base": "grpo", "env": {"use": "calculator", "on_error": "drop_group"},
                    "sample": {"n": 2}}, rewards=(use("env_reward"),))
    script = [[("Answer: 4", True), ("calc(boom)", True), ("Answer: 4", True), ("Answer: 5", True)]]
    rollout, rewards, _, _, m = collect(run, EpisodePolicy(tok, script), lambda: [ROW, ROW], 0, StepSettings())
    assert rollout.group_ids.tolist() == [1, 1] and rewards.tolist() == [1.0, 0.0]  # only group 1 trains
    assert m["filtered/env_error"] == 2  # both rows of group 0, the healthy one too
    assert m["env_error_frac"] == 0.25 and m["env_timeout_frac"] == 0.0  # 1 of 4 sampled episodes
    assert torch.equal(rollout.response_mask.any(-1), torch.tensor([True, True]))
