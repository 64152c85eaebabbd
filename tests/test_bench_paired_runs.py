"""bench/paired_runs.py: the paired per-step difference and its two standard errors, by hand."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("paired_runs", ROOT / "bench" / "paired_runs.py")
paired_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paired_runs)


def _run(folder: Path, rewards: list[float], before: float, after: float) -> None:
    folder.mkdir(parents=True)
    rows = [{"kind": "eval", "step": 0, "eval_accuracy": before}]
    rows += [{"kind": "train", "step": i + 1, "reward_mean": r, "kl_ref": 0.1, "time_step": 2.0, "time_rollout": 1.0,
              "time_train": 0.5} for i, r in enumerate(rewards)]
    rows += [{"kind": "eval", "step": len(rewards), "eval_accuracy": after}]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_alternating_differences_cancel_within_blocks():
    # d = +0.1, -0.1, ... over 20 steps: mean 0; sample sd sqrt(20 * 0.01 / 19) = 0.102598, / sqrt(20) = 0.022942;
    # every 10-step block's mean is 0, so the block standard error is 0
    p = paired_runs.paired([0.2] * 20, [0.3, 0.1] * 10)
    assert p["mean"] == pytest.approx(0.0, abs=1e-12) and p["steps"] == 20
    assert p["se_steps"] == pytest.approx(0.022942, abs=1e-6) and p["se_blocks"] == pytest.approx(0.0, abs=1e-12)


def test_seeds_are_paired_and_summed_up(tmp_path, capsys):
    # seed 0: B = A + 0.05 at every step, held-out after 0.40 vs 0.50; seed 1: B = A - 0.05, after 0.60 vs 0.50
    _run(tmp_path / "a" / "seed0", [0.3] * 12, 0.2, 0.5)
    _run(tmp_path / "b" / "seed0", [0.35] * 12, 0.2, 0.4)
    _run(tmp_path / "a" / "seed1", [0.3] * 12, 0.3, 0.5)
    _run(tmp_path / "b" / "seed1", [0.25] * 12, 0.3, 0.6)
    out = paired_runs.main([str(tmp_path / "a"), str(tmp_path / "b"), "--seeds", "0", "1"])
    assert out[0]["reward_diff"]["mean"] == pytest.approx(0.05)
    assert out[1]["reward_diff"]["mean"] == pytest.approx(-0.05)
    assert out[0]["after_diff"] == pytest.approx(-0.1) and out[1]["after_diff"] == pytest.approx(0.1)
    assert out[0]["a"]["step_s"] == 2.0 and "sync check off" in capsys.readouterr().out
