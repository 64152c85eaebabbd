"""data.name: reasoning_gym trains 2 steps end to end on the tiny Llama through the CLI (a mixture of two
tasks, the gym_score reward, held-out evaluation before and after with one accuracy per task in
summary.json and metrics.jsonl)."""

from __future__ import annotations

import json
import math

from _engine_helpers import metrics, run_train

# a random model never writes a right <answer>: spread_reward keeps groups from being constant
REWARDS = ('rewards=[{use: gym_score}, {use: function, function: "policyzoo.testing.tiny:spread_reward", '
           'weight: 0.1}]')


def test_reasoning_gym_mixture_trains_two_steps(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "data.use=reasoning_gym",
                     "data.tasks={basic_arithmetic: 1, chain_sum: 1}", "data.size=16", "data.eval_size=4", REWARDS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and r["rows"] == 8  # P = 2 prompts x G = 4
        assert 0.0 <= r["reward/gym_score"] <= 1.0
    evals = metrics(out, "eval")
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:  # 4 held-out rows, 2 per task (1:1): each task's accuracy and the overall one
        assert r["eval_rows"] == 4
        per_task = [r["eval_accuracy/basic_arithmetic"], r["eval_accuracy/chain_sum"]]
        assert all(0.0 <= a <= 1.0 for a in per_task)
        assert math.isclose(r["eval_accuracy"], sum(per_task) / 2, abs_tol=1e-6)  # equal row counts
    summary = json.loads((out / "summary.json").read_text())
    keys = {"eval_accuracy/basic_arithmetic", "eval_accuracy/chain_sum", "eval_accuracy_before/chain_sum"}
    assert keys <= set(summary)
    assert "use: gym_score" in (out / "resolved.yaml").read_text()
