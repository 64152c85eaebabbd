"""GRPO with the built-in truncated IS (weight on the loss) trains two steps on the tiny Llama
through the real engine: vLLM's rollout_logprobs against DeepSpeed's old log-probs."""

from __future__ import annotations

import math

from _engine_helpers import metrics, run_train


def test_grpo_with_tis_trains_two_steps_and_reports_the_mismatch(tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", "algorithm.ratio.use=tis",
                     "algorithm.ratio.level=token", algo="grpo")
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert math.isfinite(r["loss"]) and r["skipped"] == 0
        # vLLM's processed log-probs match the trainer's to < 1e-4 nats in fp32 (docs/engine.md)
        assert 0.0 <= r["mismatch/log_ratio_abs_mean"] < 1e-3
        for key in ("mismatch/truncated_frac", "mismatch/masked_frac"):
            assert 0.0 <= r[key] <= 1.0, key
        assert r["mismatch/masked_frac"] == 0.0  # tis truncates, it never masks
    assert "tis from policyzoo" in (out / "resolved.yaml").read_text()
