"""policyzoo compare's lean runs (the settings each run gets, the disk estimate worked by hand), a recorded
folder (resolved.yaml, no config.yaml) aggregated, and a run that stopped early shown with its reason while
the other runs go on (a fake process stands in for `policyzoo train`)."""

from __future__ import annotations

import json

import pytest
import yaml
from _compare_helpers import write_planned, write_run
from test_compare_runs import FakeTrain

from policyzoo.compare import lean, runs
from policyzoo.compare.api import compare
from policyzoo.compare.rundirs import find_runs

#: hidden 64, intermediate 128, 2 layers, 2 heads of 32 (q and kv widths 64), vocabulary 100, tied embeddings
SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": True}
# per layer: q, o 2 x 64 x 64 + k, v 2 x 64 x 64 + gate, up, down 3 x 64 x 128 = 40960, + 2 norms of 64 = 41088;
# x 2 layers = 82176, + embedding 100 x 64 = 6400, + final norm 64: 88640 parameters
SMALL_PARAMS = 88640


def test_compare_runs_are_lean_unless_asked(tmp_path):
    spec = runs.plan(["grpo"], [0], tmp_path, ["train.steps=2"])[0]
    engine, train = spec.config["engine"], spec.config["train"]
    assert (engine["keep_checkpoints"], engine["delete_checkpoints_at_end"], train["export_final"]) == (1, True, False)
    kept = runs.plan(["grpo"], [0], tmp_path, ["train.steps=2", "engine.keep_checkpoints=3"], export=True)[0]
    assert (kept.config["engine"]["keep_checkpoints"], kept.config["train"]["export_final"]) == (3, True)
    assert kept.overrides.count("engine.keep_checkpoints=3") == 1  # the user's value, not replaced
    # a run finished before (kept its checkpoints, exported) is the planned run all the same: done, not blocked
    write_planned(runs.plan(["grpo"], [0], tmp_path / "old", ["train.steps=2", "engine.keep_checkpoints=2",
                                                                "engine.delete_checkpoints_at_end=false",
                                                                "train.export_final=true"])[0])
    again = runs.plan(["grpo"], [0], tmp_path / "old", ["train.steps=2"])[0]
    assert again.status == "done"


def test_disk_estimate_by_hand(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    config = {"model": {"path": str(tmp_path), "dtype": "float32"},
              "train": {"steps": 20, "save_every": 10, "export_every": 0, "export_final": False},
              "engine": {"keep_checkpoints": 1, "delete_checkpoints_at_end": True}}
    e = lean.estimate(config)
    # fp32 weights 4 + AdamW moments 8 = 12 bytes per parameter; one checkpoint at step 10 (the last step's skipped)
    assert e == {"params": SMALL_PARAMS, "checkpoint": 12 * SMALL_PARAMS, "export": 0, "saves": 1,
                 "peak": 12 * SMALL_PARAMS, "kept": 0}
    # the default: keep 2, saves at 5, 10, 15 and the last step (4): while the 3rd and 4th are written 2 others are
    # there (3 at once); 2 kept, + final/ of 4 bytes per parameter
    config["train"].update(save_every=5, export_final=True)
    config["engine"].update(keep_checkpoints=2, delete_checkpoints_at_end=False)
    e = lean.estimate(config)
    assert e["peak"] == (3 * 12 + 4) * SMALL_PARAMS and e["kept"] == (2 * 12 + 4) * SMALL_PARAMS
    config["model"]["dtype"] = "bfloat16"  # bf16 weights 2 + fp32 master 4 + moments 8 = 14; export 2
    bf16 = lean.estimate(config)
    assert bf16["checkpoint"] == 14 * SMALL_PARAMS and bf16["export"] == 2 * SMALL_PARAMS
    assert lean.estimate({**config, "model": {"path": str(tmp_path), "lora": {"r": 8}}}) is None


def test_demo_comparison_stays_under_3_gb_and_the_plan_says_so(tmp_path):
    # the demo's 4 x 3 (make compare-default): 20 steps, save_every 10, the default model (134,515,008 parameters)
    specs = runs.plan(["grpo", "dr_grpo", "rloo", "gspo"], [0, 1, 2], tmp_path, ["train.steps=20",
                                                                                "train.save_every=10"])
    line = lean.plan_line([s.config for s in specs], 1)
    # one checkpoint of 12 x 134,515,008 = 1,614,180,096 bytes at a time, none kept
    assert line.startswith("disk (estimate): up to 1.61 GB per run while it runs (one checkpoint 1.61 GB (134.5M "
                           "parameters: weights + AdamW)), 0.00 GB kept per run after it")
    assert line.endswith("12 run(s): peak about 1.61 GB, 0.00 GB kept at the end")
    exported = runs.plan(["grpo"], [0, 1, 2], tmp_path, ["train.steps=20", "train.save_every=10"], export=True)
    # + final/ of 4 x 134,515,008 = 538,060,032 bytes each: 2.15 GB per run, 3 x 0.54 = 1.61 GB kept (+ the last
    # run's 2.15 GB peak: 3.77)
    assert lean.plan_line([s.config for s in exported], 1).endswith("3 run(s): peak about 3.77 GB, 1.61 GB kept at "
                                                                    "the end")
    never = runs.plan(["grpo"], [0], tmp_path, ["train.steps=20"])  # save_every 0: no checkpoint at all
    # 0 periodic saves + the last step's skipped (deleted at the end anyway) = 0 checkpoints, no export: 0 bytes
    assert lean.plan_line([s.config for s in never], 1).startswith(
        "disk (estimate): up to 0.00 GB per run while it runs (no checkpoint written: train.save_every and "
        "train.export_every are 0, and the last step's is skipped when deleted at the end (resume would need one of "
        "1.61 GB))")


def _recorded(folder, name: str, seed: int, after: float) -> None:
    """A run as bench/compare_record.py keeps it: resolved.yaml (algorithm resolved: name, base, slots), no
    config.yaml."""
    run = write_run(folder / name / f"seed{seed}", name, seed, after)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["algorithm"] = {"name": name, "base": name, "slots": {"clip": {"from": f"{name} default"}}}
    (run / "resolved.yaml").write_text(yaml.safe_dump(config))
    (run / "config.yaml").unlink()


def test_a_recorded_folder_is_aggregated_with_its_baseline(tmp_path):
    rec = tmp_path / "compare_default"
    for s, (g, d) in enumerate([(0.2, 0.3), (0.4, 0.6), (0.6, 0.6)]):
        _recorded(rec, "grpo", s, g)
        _recorded(rec, "dr_grpo", s, d)
    (rec / "compare.json").write_text(json.dumps({"baseline": "grpo"}))
    result = compare(str(rec))
    assert [(a["algorithm"], a["n"]) for a in result["algorithms"]] == [("dr_grpo", 3), ("grpo", 3)]
    # the recorded baseline, though dr_grpo is found first; paired d = 0.1, 0.2, 0.0: mean 0.1
    assert result["baseline"] == "grpo" and result["skipped"] == []
    assert next(a for a in result["algorithms"] if a["algorithm"] == "dr_grpo")["paired_diff"]["mean"] == \
        pytest.approx(0.1)
    assert (rec / "compare.md").is_file()
    bad = rec / "gspo" / "seed0"
    _recorded(rec, "gspo", 0, 0.5)
    (bad / "resolved.yaml").write_text("model: {path: m}\n")
    _, skipped = find_runs([str(rec)])
    assert [(s.path, s.why) for s in skipped] == [(bad, "no config.yaml, and resolved.yaml names no algorithm "
                                                        "(algorithm.name)")]


def _stop(path, step: int, reason: str) -> None:
    """Turn a finished run into one that stopped early at ``step``, as summary.json then says."""
    lines = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines if r["step"] <= step
                                                and not (r["kind"] == "eval" and r["step"] > 0)))
    (path / "summary.json").write_text(json.dumps({"steps": step, "eval_accuracy_before": 0.1, "stopped_early": True,
                                                   "stop_reason": reason, "eval_metric": "accuracy"}))


class StopsEarly(FakeTrain):
    """grpo seed 1 stops early (exit 1, its summary says why); the others finish. Started ones are recorded in
    ``FakeTrain.started``."""

    def poll(self):
        rc = super().poll()
        s = self.job.spec
        if (s.entry, s.seed) == ("grpo", 1) and self.returncode == 0:
            _stop(s.path, 1, "every reward NaN at step 1")
            self.returncode = rc = 1
        return rc


def test_a_run_that_stopped_early_is_shown_and_the_others_go_on(tmp_path, capsys):
    out = tmp_path / "cmp"
    FakeTrain.started = []
    result = compare(algos="grpo,dr_grpo", seeds=2, output_dir=str(out), start=StopsEarly, train={"steps": 2})
    # the runs after the stopped one (grpo seed 1, the 2nd) were started
    assert [(f.job.spec.entry, f.job.spec.seed) for f in FakeTrain.started] == [("grpo", 0), ("grpo", 1),
                                                                               ("dr_grpo", 0), ("dr_grpo", 1)]
    printed = " ".join(capsys.readouterr().out.split())
    assert "grpo seed 1 stopped early: every reward NaN at step 1; the other runs go on" in printed
    g = result["algorithms"][0]
    assert (g["algorithm"], g["n"], g["seeds"]) == ("grpo", 1, [0])  # the stopped run is not in the statistics
    assert g["stopped"] == [{"seed": 1, "run_dir": str(out / "grpo" / "seed1"), "step": 1, "steps": 2,
                             "reason": "every reward NaN at step 1"}]
    md = (out / "compare.md").read_text()
    assert "stopped early |" in md and "| seed 1 at step 1 of 2: every reward NaN at step 1 |" in md
    # the next call runs nothing: the stopped run is not started again
    FakeTrain.started = []
    spec = runs.plan(["grpo"], [1], out, ["train.steps=2"])[0]
    assert spec.status == "stopped" and "every reward NaN at step 1 (delete the folder" in spec.detail
    compare(algos="grpo,dr_grpo", seeds=2, output_dir=str(out), start=StopsEarly, train={"steps": 2})
    assert FakeTrain.started == [] and "(3 done, 1 stopped)" in capsys.readouterr().out


def _finished_session(tmp_path, overrides: list[str]):
    """A session at the end of step 2 (its checkpoint of step 1 on disk, the last evaluation done) whose
    trainer records the exports and checkpoints asked of it: the end of a run without a model."""
    from types import SimpleNamespace

    from _engine_helpers import stand_in_part
    from rich.console import Console

    from policyzoo.engine.run.loop import RunLoop
    from policyzoo.engine.rundir import RunDir
    from policyzoo.run_config import load_config

    asked = []
    tmp_path.mkdir(exist_ok=True)
    pre = SimpleNamespace(rundir=RunDir(tmp_path / "run"), state={"step": 2, "tokens_seen": 0, "batches": 2},
                          rows_drawn=0, run=SimpleNamespace(bundle=SimpleNamespace(name="grpo"), reward=()),
                          model=SimpleNamespace(path=tmp_path), task_rewards_n=0, prompt_counts={})
    trainer = SimpleNamespace(export=asked.append, models_loaded=lambda: 1, trainable_params=1, stage=0,
                              share_prompt=False, share_prompt_check=None)
    console = Console(file=open(tmp_path / "console.txt", "w"), width=300)
    s = stand_in_part(load_config(None, "grpo", overrides), console, pre, trainer=trainer,
                      tracker=SimpleNamespace(close=lambda: None))
    (s.rundir.ckpt / "step-000001").mkdir(parents=True)
    (s.rundir.ckpt / "latest.json").write_text('{"step": 1, "path": "step-000001"}')
    loop = RunLoop(s)
    loop.last_saved, loop.last_eval = 1, {"step": 2, "eval_accuracy": 0.5}
    loop.first_eval = lambda: None
    loop.save = lambda export=False: asked.append("checkpoint of step 2")
    return s, loop, asked


def test_a_lean_run_ends_with_its_summary_and_no_checkpoint_or_export(tmp_path):
    s, loop, asked = _finished_session(tmp_path, ["engine.delete_checkpoints_at_end=true", "train.export_final=false"])
    loop.finish()
    s.console.file.flush()
    assert asked == []  # no checkpoint of the last step (deleted at once anyway), no final/ export
    assert json.loads((s.rundir.path / "summary.json").read_text())["eval_accuracy_after"] == 0.5
    assert not s.rundir.ckpt.exists()
    assert "no export (train.export_final: false)" in (tmp_path / "console.txt").read_text()
    s, loop, asked = _finished_session(tmp_path / "default", [])  # the defaults: both kept
    loop.finish()
    assert asked == ["checkpoint of step 2", str(s.rundir.path / "final")]
    assert (s.rundir.ckpt / "step-000001").is_dir()
