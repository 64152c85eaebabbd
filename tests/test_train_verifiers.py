"""A verifiers environment (tests/verifiers_envs/vf_sum_weighted.py: single-turn, two weighted rubric
functions, one async) trains 2 steps end to end on the tiny Llama through the CLI: its dataset feeds
the prompts, its rubric's weighted sum is the reward, each function's score is its own metric."""

from __future__ import annotations

import math

from _engine_helpers import ROOT, metrics, run_train

REWARDS = "rewards=[{use: env_reward}]"  # the default with an env (the shared tiny settings set another)


def test_verifiers_single_turn_env_trains_two_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "verifiers_envs"))
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "algorithm.env.use=verifiers",
                     "algorithm.env.id=vf_sum_weighted", "algorithm.env.max_total_tokens=16", REWARDS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and r["rows"] == 8  # P = 2 prompts x G = 4
        assert r["env_turns_mean"] == 1.0 and r["env_score/num_turns"] == 1.0  # single-turn: one turn each
        # the env's reward is the rubric's weighted sum, row by row, so also in the mean: 1.0 x exact + 0.5 x short
        weighted = r["env_score/exact_answer"] + 0.5 * r["env_score/short_reply"]
        assert math.isclose(r["reward/env_reward"], weighted, abs_tol=1e-6)
    evals = metrics(out, "eval")
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:  # the environment's own eval_dataset: 4 rows
        assert r["eval_rows"] == 4 and "eval_env_score/short_reply" in r
    assert "use: verifiers" in (out / "resolved.yaml").read_text()
