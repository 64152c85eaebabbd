"""On-policy distillation end to end on the tiny Llama: the student samples, a teacher built from
another seed (one more layer, the same byte tokenizer) scores the sampled tokens through the
reference slot, and the ``distill`` term trains two steps -- at ZeRO 3, where the teacher loads
partitioned and runs as a stage-3 engine without optimizer, like the reference."""

from __future__ import annotations

import json
import math

from _engine_helpers import metrics, run_train

from policyzoo.testing.tiny import build_tiny_model


def test_distill_trains_two_steps_against_a_teacher(tmp_path):
    teacher = build_tiny_model(tmp_path / "teacher", seed=1, layers=3)
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "engine.zero_stage=3", f"model.teacher={teacher}",
                     algo="distill")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["skipped"] == 0 and math.isfinite(r["loss"]) and math.isfinite(r["term/distill"])
    # Step 1 is on-policy from the initial weights: had the reference been the initial policy,
    # log pi - log pi_ref would be exactly 0 on every token; the teacher from seed 1 differs.
    assert abs(rows[0]["term/distill"]) > 1e-4, rows[0]
    summary = json.loads((out / "summary.json").read_text())
    assert "teacher" in summary["models_loaded"], summary["models_loaded"]
