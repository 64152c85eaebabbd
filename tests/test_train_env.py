"""grpo, dapo, rloo and a hybrid train 2 steps with the calculator environment on the tiny Llama,
end to end through the CLI (vLLM episodes, DeepSpeed, weight sync with the sync check, held-out
episodes before and after). The random tiny model never calls the tool, so every episode is one
turn here; multi-turn layouts and a training step on 3-turn episodes are in test_env_engine.py."""

from __future__ import annotations

import math

import pytest
from _engine_helpers import metrics, run_train

# the calculator's reward is 0 for a random model: spread_reward keeps groups from being constant
REWARDS = ('rewards=[{use: env_reward}, {use: function, function: "policyzoo.testing.tiny:spread_reward", '
           'weight: 0.1}]')
ALGOS = {"grpo": [], "dapo": [], "rloo": [], "grpo+clip=cispo": ["algorithm.clip.use=cispo"]}


@pytest.mark.parametrize("name", list(ALGOS))
def test_bundle_trains_two_steps_with_the_calculator(tmp_path, name):
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "algorithm.env.use=calculator",
                     "algorithm.env.max_total_tokens=64", REWARDS, *ALGOS[name], algo=name.split("+")[0])
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and r["rows"] > 0
        assert r["sync_max_diff"] <= 1e-4
        assert r["reward/env_reward"] == 0.0  # a random model never answers right
        assert r["env_turns_mean"] >= 1 and 0 <= r["env_tool_call_frac"] <= 1
        for key in ("env_tool_calls_mean", "env_tool_errors_mean", "env_truncated_turns_frac",
                    "env_truncated_tokens_frac"):
            assert math.isfinite(r[key]), key
        assert r["response_length_max"] <= 64  # the token budget bounds the trajectory
    evals = metrics(out, "eval")
    assert [r["step"] for r in evals] == [0, 2]
    assert all(0 <= r["eval_env_tool_call_frac"] <= 1 and math.isfinite(r["eval_accuracy"]) for r in evals)
    resolved = (out / "resolved.yaml").read_text()
    assert "use: calculator" in resolved and "use: env_reward" in resolved
