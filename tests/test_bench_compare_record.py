"""bench/compare_record.py: the summary entry's intervals, the files it copies, its error without a table."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import compare_record  # noqa: E402


def stat(mean, half):
    return {"n": 3, "mean": mean, "half_width": half}


RESULT = {"algorithms": [
    {"algorithm": "grpo", "seeds": [0, 1], "runs": [], "eval_before": stat(0.2, 0.01), "eval_after": stat(0.45, 0.1),
     "paired_diff": None},
    {"algorithm": "rloo", "seeds": [0, 1], "runs": [], "eval_before": stat(0.2, 0.01),
     "eval_after": stat(0.123456, 0.04444), "paired_diff": stat(-0.326544, None)}]}


def test_headline_gives_mean_and_half_width_rounded_to_4_digits():
    got = compare_record.headline(RESULT)
    # 0.123456 -> 0.1235, 0.04444 -> 0.0444; a missing interval stays None; the baseline has no paired diff
    assert got["rloo"] == {"before": [0.2, 0.01], "after": [0.1235, 0.0444], "paired_diff": [-0.3265, None],
                           "seeds": [0, 1]}
    assert got["grpo"]["paired_diff"] is None


def test_copy_results_takes_the_table_and_each_runs_small_files_only(tmp_path):
    runs = tmp_path / "cmp"
    for algo in ("grpo", "rloo"):
        d = runs / algo / "seed0"
        (d / "checkpoints").mkdir(parents=True)
        for f in ("summary.json", "metrics.jsonl", "resolved.yaml", "completions.jsonl"):
            (d / f).write_text("{}")
    (runs / "compare.md").write_text("| table |")
    (runs / "compare.json").write_text("{}")
    result = {"algorithms": [{"algorithm": a, "runs": [str(runs / a / "seed0")]} for a in ("grpo", "rloo")]}
    out = tmp_path / "out"
    copied = compare_record.copy_results(runs, out, result)
    names = sorted(str(p.relative_to(out)) for p in copied)
    # 2 table files (no png here) + 3 files x 2 runs; no checkpoints, no completions
    assert names == ["compare.json", "compare.md"] + [f"{a}/seed0/{f}" for a in ("grpo", "rloo")
                                                      for f in ("metrics.jsonl", "resolved.yaml", "summary.json")]


def test_runs_reached_through_a_linked_folder_keep_their_algorithm_folders(tmp_path):
    # runs/cmp-zoo may be a link to the folder the runs were made in: each run keeps its ALGO/seedS place (it was
    # copied to out/seed0, every algorithm's seed 0 over the others)
    real = tmp_path / "made"
    for algo in ("grpo", "dr_grpo"):
        (real / algo / "seed0").mkdir(parents=True)
        (real / algo / "seed0" / "summary.json").write_text(f'{{"algo": "{algo}"}}')
    link = tmp_path / "link"
    link.symlink_to(real)
    (real / "dapo" / "seed0").mkdir(parents=True)  # a run that stopped early: in the table's runs, no statistics
    (real / "dapo" / "seed0" / "metrics.jsonl").write_text("{}")
    result = {"algorithms": [{"algorithm": a, "runs": [str(link / a / "seed0")]} for a in ("grpo", "dr_grpo")],
              "runs": [{"run_dir": str(link / a / "seed0")} for a in ("grpo", "dr_grpo", "dapo")]}
    copied = compare_record.copy_results(link, tmp_path / "out", result)
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in copied) == [
        "dapo/seed0/metrics.jsonl", "dr_grpo/seed0/summary.json", "grpo/seed0/summary.json"]  # each once


def test_a_folder_without_a_table_exits_2_with_the_command_that_makes_it(tmp_path, capsys):
    assert compare_record.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no compare.json" in err and "policyzoo compare" in err
