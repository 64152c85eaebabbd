"""policyzoo compare end to end on the tiny model: 2 algorithms x 2 seeds x 2 steps (real `policyzoo
train` subprocesses, the transformers rollout on one thread), one of them a real resume, then the table
and the plot; a second call finds every run finished and runs nothing."""

from __future__ import annotations

import json

from _engine_helpers import TINY_OVERRIDES, engine_env, metrics, tiny_model
from rich.console import Console

from policyzoo.compare.api import compare


def test_two_algorithms_two_seeds_tiny_model_with_a_real_resume(tmp_path, monkeypatch, capsys):
    for key, value in engine_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "cmp"
    common = [f"model.path={tiny_model()}", *TINY_OVERRIDES, "engine.rollout=transformers", "engine.threads=1"]
    # grpo seed 1 first, to step 1 only, its checkpoint kept (a compare run deletes it once finished); its summary
    # removed: a run cut off after its checkpoint of step 1
    wide = Console(width=300)  # the plan's table on one line per run
    compare(algos="grpo", seeds=[1], output_dir=str(out), console=wide,
            overrides=[*common, "train.steps=1", "engine.delete_checkpoints_at_end=false"])
    cut = out / "grpo" / "seed1"
    (cut / "summary.json").unlink()
    capsys.readouterr()
    result = compare(algos="grpo,dr_grpo", seeds=2, output_dir=str(out), overrides=[*common, "train.steps=2"],
                     console=wide)
    plan = capsys.readouterr().out
    assert "4 runs in" in plan and "1 resume, 3 new" in plan and "from the checkpoint of step 1" in plan
    assert [r["step"] for r in metrics(cut)] == [1, 2]  # resumed: step 1 kept, step 2 trained
    assert json.loads((cut / "summary.json").read_text())["steps"] == 2
    g, d = result["algorithms"]
    assert (g["algorithm"], g["n"], d["algorithm"], d["n"]) == ("grpo", 2, "dr_grpo", 2)
    assert d["paired_diff"]["pairs"] == [[0, 0], [1, 1]] and d["paired_diff"]["half_width"] is not None
    # paired design: seed s gives both algorithms the same held-out rows, the same prompts in the same order and
    # the same starting weights: equal held-out values before training and equal step-1 prompts per seed
    def step1_prompts(run):
        rows = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
        return [r["prompt"] for r in rows if r["step"] == 1]
    for s in (0, 1):
        gr, dr = (json.loads((out / a / f"seed{s}" / "summary.json").read_text()) for a in ("grpo", "dr_grpo"))
        assert gr["eval_accuracy_before"] == dr["eval_accuracy_before"]
        assert step1_prompts(out / "grpo" / f"seed{s}") == step1_prompts(out / "dr_grpo" / f"seed{s}")
    assert step1_prompts(out / "grpo" / "seed0") != step1_prompts(out / "grpo" / "seed1")  # another seed, others
    md = (out / "compare.md").read_text()
    assert "| grpo | 2 |" in md and "| dr_grpo | 2 |" in md and "(baseline)" in md
    assert (out / "compare.png").stat().st_size > 20_000 and json.loads((out / "compare.json").read_text())
    # lean runs: once finished no checkpoint and no final/ export is left, only the run's small files
    for a in ("grpo", "dr_grpo"):
        for s in (0, 1):
            names = {p.name for p in (out / a / f"seed{s}").iterdir()}
            assert "checkpoints" not in names and "final" not in names and "summary.json" in names, (a, s)
    runs = {(r["algorithm"], r["seed"]): r for r in result["runs"]}
    assert all(0 < r["disk_mib"] < 5 and r["run_seconds"] > 0 for r in runs.values())
    again = compare(algos="grpo,dr_grpo", seeds=2, output_dir=str(out), overrides=[*common, "train.steps=2"],
                    console=wide)
    assert "(4 done)" in capsys.readouterr().out and again["algorithms"][1]["n"] == 2
