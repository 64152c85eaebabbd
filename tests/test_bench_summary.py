"""bench/summary.py (the one writer of bench/results/summary.json) and bench/ab.py's comparison."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ab  # noqa: E402
import summary  # noqa: E402


def test_record_keeps_other_entries_and_says_how_and_when(tmp_path):
    path = tmp_path / "summary.json"
    summary.record("step_ratio_default", 0.41, ["--steps", "6"], {"policyzoo_step_s": 6.08}, path=path)
    summary.record("startup_s", 19.9, ["--record-startup"], path=path)
    data = json.loads(path.read_text())
    assert set(data) == {"step_ratio_default", "startup_s"}
    e = data["step_ratio_default"]
    assert e["value"] == 0.41 and e["detail"] == {"policyzoo_step_s": 6.08}
    assert e["command"].startswith("python ") and e["command"].endswith("--steps 6")
    assert len(e["load_before"]) == 3 and len(e["load_after"]) == 3 and e["cpus"] >= 1
    assert e["loaded"] == (e["load_before"][0] > e["cpus"])
    assert e["date"].endswith("Z") and len(e["date"]) == 20
    summary.record("step_ratio_default", 0.5, [], path=path)  # rewritten in place
    assert json.loads(path.read_text())["step_ratio_default"]["value"] == 0.5
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left


def _run(times, rewards, rss, trainable, step_rss):
    return {"steps": [{"time_step": t, "time_rollout": t / 2, "time_train": t / 4, "reward_mean": r, "rss_gib": m}
                      for t, r, m in zip(times, rewards, step_rss)],
            "summary": {"peak_rss_gib": rss, "trainable_params": trainable, "startup_seconds": rss * 2}}


def test_ab_compare_by_hand():
    a = _run([9.0, 4.0, 6.0, 5.0], [0.0, 0.5, 0.25, 0.25], 8.0, 100, [1.0, 5.0, 4.0, 4.0])
    b = _run([9.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.0], 6.0, 10, [1.0, 3.0, 2.0, 3.0])
    res = ab.compare(a, b, warmup=1)
    # medians of steps 2-4: A 5.0, B 3.0 -> 0.6; peak RSS 6 / 8 = 0.75
    assert res["time_step_a"] == 5.0 and res["time_step_b"] == 3.0 and res["time_step"] == pytest.approx(0.6)
    assert res["peak_rss"] == 0.75 and res["time_train"] == pytest.approx(0.6)
    # RSS after a step, median of steps 2-4: A (5, 4, 4) -> 4, B (3, 2, 3) -> 3: 0.75
    assert res["rss_a"] == 4.0 and res["rss_b"] == 3.0 and res["rss"] == 0.75
    assert res["speedup"] == pytest.approx(5.0 / 3.0)
    assert res["startup"] == 0.75  # 12 s / 16 s
    # per-step differences B - A: 0.5, 0, 0.25, -0.25 -> mean 0.125; sample sd of those:
    # deviations 0.375, -0.125, 0.125, -0.375 -> squares sum 0.3125 / 3, sd 0.3227, / sqrt 4 = 0.1614
    assert res["reward_diff"] == pytest.approx(0.125)
    assert res["reward_diff_se"] == pytest.approx((0.3125 / 3) ** 0.5 / 2)


def _metrics_run(tmp_path, config: dict, recs: list[dict]) -> str:
    import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(tmp_path / "metrics.jsonl")


def test_ceiling_reads_the_runs_lengths_and_refuses_what_it_does_not_count(tmp_path):
    import ceiling

    recs = [{"kind": "train", "rows": 8, "prompt_tokens": 800, "response_length_mean": 120.0},
            {"kind": "train", "rows": 8, "sampled_rows": 16, "prompt_tokens": 1760, "response_length_mean": 100.0},
            {"kind": "eval", "accuracy": 0.5},
            {"kind": "train", "rows": 8, "prompt_tokens": 960, "response_length_mean": 130.0}]
    path = _metrics_run(tmp_path, {"algorithm": {"base": "grpo"}, "train": {"autocast": False}}, recs)
    # prompt tokens per sampled row: 800 / 8 = 100, 1760 / 16 = 110, 960 / 8 = 120 -> median 110;
    # responses 120, 100, 130 -> median 120
    assert ceiling.run_lengths(path) == {"prompt_len": 110, "response_len": 120}
    assert ceiling.unsupported_run(path) is None
    assert "no such file" in ceiling.unsupported_run(str(tmp_path / "missing.jsonl"))
    why = ceiling.unsupported_run(_metrics_run(tmp_path, {"algorithm": {"base": "ppo"},
                                                          "train": {"autocast": True}}, recs))
    assert "this run is ppo with train.autocast" in why


def test_paths_inside_the_repository_are_recorded_relative_to_it(tmp_path, monkeypatch):
    root = summary.ROOT
    assert summary.relative(f"python bench/x.py --out {root}/bench/results/a --cwd {root}") == \
        "python bench/x.py --out bench/results/a --cwd ."
    assert summary.relative(f"{root}-other/y /tmp/z") == f"{root}-other/y /tmp/z"  # other folders stay
    assert summary.relative({"cmd": [f"{root}/.venv/bin/policyzoo", 3]}) == {"cmd": [".venv/bin/policyzoo", 3]}
    monkeypatch.setattr(sys, "argv", [str(root / "bench" / "step_vs_trl.py"), "--out", str(root / "runs" / "r")])
    path = tmp_path / "summary.json"
    e = summary.record("k", 1.0, detail={"train_command": f"{root}/.venv/bin/policyzoo train --output-dir "
                                                          f"{root}/runs/c"}, path=path)
    assert e["command"] == "python bench/step_vs_trl.py --out runs/r"
    assert e["detail"]["train_command"] == ".venv/bin/policyzoo train --output-dir runs/c"
    summary.add_detail(["k"], {"out": str(root / "bench" / "results" / "o")}, path=path)
    assert json.loads(path.read_text())["k"]["detail"]["out"] == "bench/results/o"


def test_the_recorded_summary_holds_no_path_of_the_recording_machine():
    text = summary.SUMMARY.read_text()
    assert str(summary.ROOT) not in text and "/work/main" not in text  # where the entries were recorded
