"""The advantage variants that need something from the engine, end to end on the tiny Llama:
the optimal token baseline (the trainer's sum of squared next-token probabilities) in a grpo hybrid."""

from __future__ import annotations

import math

from _engine_helpers import metrics, run_train


def test_optimal_token_baseline_trains_on_the_engine(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "algorithm.baseline.use=tir_optimal_token_baseline")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and math.isfinite(r["advantage_mean"])
    assert any(r["advantage_mean"] != 0.0 for r in rows)  # a real signal reached the loss
