"""policyzoo compare's runs: the entries, the plan checked before anything runs, the folders' status
(finished skipped, interrupted resumed), the commands, Ctrl-C and failures (a fake process stands in
for `policyzoo train`; test_compare_e2e.py runs the real one)."""

from __future__ import annotations

import json
import shutil
import signal
import sys

import pytest
from _compare_helpers import write_planned, write_run

from policyzoo.catalog import get_catalog
from policyzoo.compare import entries, launch, runs
from policyzoo.compare.api import compare
from policyzoo.errors import ConfigError, Interrupted, UserError
from policyzoo.run_config import load_config

#: what every compare run gets (policyzoo.compare.lean): one checkpoint, deleted at the end; no final/ export
LEAN = ["engine.keep_checkpoints=1", "engine.delete_checkpoints_at_end=true", "train.export_final=false"]

class FakeTrain:
    """Stands in for a `policyzoo train` process: records its job, then 'finishes' (writes a finished run
    into the job's folder) on the first poll, or returns ``rc`` / raises Ctrl-C as told."""

    started: list = []

    def __init__(self, job, rc=0, ctrl_c=False):
        self.job, self.rc, self.ctrl_c, self.returncode, self.signals = job, rc, ctrl_c, None, []
        FakeTrain.started.append(self)

    def poll(self):
        if self.ctrl_c:  # the user's Ctrl-C arrives while compare waits; the training runs on until signalled
            if not self.signals:
                if self.returncode is None and not getattr(self, "told", False):
                    self.told = True
                    raise KeyboardInterrupt
                return None
        if self.returncode is None:
            self.returncode = 130 if self.signals else self.rc
            if self.returncode == 0:
                s = self.job.spec
                if s.path.exists():  # resumed: the fake writes the finished run anew
                    shutil.rmtree(s.path)
                write_run(s.path, s.base, s.seed, 0.1 * (s.seed + 1), steps=s.steps, config=s.config)
        return self.returncode

    def wait(self, timeout=None):
        return self.poll()

    def send_signal(self, sig):
        self.signals.append(sig)

    def kill(self):
        self.returncode = -9


@pytest.fixture(autouse=True)
def _fresh():
    FakeTrain.started = []


def test_entries_are_slot_changes_and_their_labels_round_trip():
    assert entries.parse_entry("grpo+clip=cispo+clip.eps_high=5") == (
        "grpo", ["algorithm.clip.use=cispo", "algorithm.clip.eps_high=5"])
    assert entries.parse_entry("grpo+kl=null") == ("grpo", ["algorithm.kl=null"])
    assert entries.parse_entry("grpo+conventions=trl") == ("grpo", ["algorithm.conventions=trl"])
    for bad in ("grpo+clip", "=x", "grpo+clip=a/b"):
        with pytest.raises(ConfigError):
            entries.parse_entry(bad)
    # the label a run's config.yaml gets back is the entry (among runs without its changes)
    for entry in ("grpo+clip=cispo", "dr_grpo+kl=null", "grpo+clip=cispo+kl.beta=0.1"):
        base, changes = entries.parse_entry(entry)
        algo = load_config(None, base, changes).algorithm
        assert entries.labels([algo, "grpo"])[0] == entries.canonical(entry) == entry
    assert entries.parse_seeds(3) == [0, 1, 2] and entries.parse_seeds("0,5,7") == [0, 5, 7]
    assert entries.parse_seeds("1") == [0] and entries.parse_seeds("5,") == [5]  # a count; one seed named
    with pytest.raises(ConfigError):
        entries.parse_seeds("0,0")
    assert entries.settings_overrides({"train": {"steps": 2}, "algorithm.sample.n": 4, "model": {"lora": {}},
                                       "algorithm": {"clip": {"use": "cispo"}}}) == [
        "train.steps=2", "algorithm.sample.n=4", "model.lora={}", "algorithm.clip.use=cispo"]


def test_unknown_algorithm_fails_before_anything_runs_with_the_close_match(tmp_path):
    out = tmp_path / "cmp"
    with pytest.raises(ConfigError) as e:
        compare(algos="grpo,gpro", seeds=2, output_dir=str(out), start=FakeTrain)
    with pytest.raises(ConfigError) as same:  # what `policyzoo train --algo gpro` stops with
        get_catalog().bundle("gpro")
    assert e.value.why == same.value.why and "'grpo'" in e.value.why and e.value.where == "--algos gpro"
    with pytest.raises(ConfigError, match="no clip component named 'cispoo'"):
        compare(algos="grpo+clip=cispoo", seeds=1, output_dir=str(out), start=FakeTrain)
    with pytest.raises(ConfigError, match="unknown key 'stepz'"):
        compare(algos="grpo", seeds=1, output_dir=str(out), start=FakeTrain, overrides=["train.stepz=2"])
    with pytest.raises(ConfigError, match="set by policyzoo compare"):
        compare(algos="grpo", seeds=1, output_dir=str(out), start=FakeTrain, overrides=["train.seed=4"])
    assert FakeTrain.started == [] and not out.exists()


def test_plan_pairs_the_seeds_and_pins_the_data_on_request(tmp_path):
    specs = runs.plan(["grpo", "dr_grpo"], [0, 3], tmp_path, ["train.steps=2"])
    assert [(s.entry, s.seed, s.path.relative_to(tmp_path).as_posix()) for s in specs] == [
        ("grpo", 0, "grpo/seed0"), ("grpo", 3, "grpo/seed3"), ("dr_grpo", 0, "dr_grpo/seed0"),
        ("dr_grpo", 3, "dr_grpo/seed3")]
    assert specs[3].overrides == ["train.steps=2", *LEAN, "train.seed=3", "data.seed=3"]
    assert specs[3].command() == f"policyzoo train --algo dr_grpo --output-dir {tmp_path}/dr_grpo/seed3 " \
                                 f"train.steps=2 {' '.join(LEAN)} train.seed=3 data.seed=3"
    pinned = runs.plan(["grpo"], [1], tmp_path, ["data.seed=7"])
    assert pinned[0].overrides == ["data.seed=7", *LEAN, "train.seed=1"]


def test_folder_status_done_resume_restart_blocked(tmp_path):
    assert runs.status(tmp_path / "nothing", 6) == ("new", "")
    done = write_run(tmp_path / "done", "grpo", 0, 0.1)
    assert runs.status(done, 6)[0] == "done"
    assert runs.status(done, 6 + 4) == ("blocked", runs.status(done, 10)[1])  # no checkpoint to extend from
    cut = write_run(tmp_path / "cut", "grpo", 0, 0.1)
    (cut / "summary.json").unlink()
    (cut / "checkpoints").mkdir()
    (cut / "checkpoints" / "latest.json").write_text(json.dumps({"step": 4, "path": "step-000004"}))
    assert runs.status(cut, 6) == ("resume", "from the checkpoint of step 4")
    early = write_run(tmp_path / "early", "grpo", 0, 0.1)
    (early / "summary.json").unlink()
    assert runs.status(early, 6)[0] == "restart"
    runs.clear(early)
    assert list(early.iterdir()) == []
    (cut / "notes.txt").write_text("mine")  # the user's: it stays beside the run's files (as `train` keeps it)
    (cut / "checkpoints" / "latest.json").unlink()
    assert runs.status(cut, 6) == ("restart", "started before without a checkpoint (nothing to resume): its run files "
                                   "are removed (notes.txt: not a run's, kept beside the run's files)")
    runs.clear(cut)
    assert [p.name for p in cut.iterdir()] == ["notes.txt"]


def test_finished_runs_are_skipped_and_interrupted_ones_resumed(tmp_path, capsys):
    out = tmp_path / "cmp"
    planned = runs.plan(["grpo"], [0, 1], out, ["train.steps=2"])
    write_planned(planned[0])  # finished
    cut = write_planned(planned[1])  # interrupted after step 1
    (cut / "summary.json").unlink()
    (cut / "checkpoints").mkdir()
    (cut / "checkpoints" / "latest.json").write_text(json.dumps({"step": 1, "path": "step-000001"}))
    result = compare(algos=["grpo", "dr_grpo"], seeds=2, output_dir=str(out), start=FakeTrain, train={"steps": 2})
    argv = [f.job.argv for f in FakeTrain.started]
    head = [sys.executable, "-m", "policyzoo.cli", "train"]
    assert argv == [
        [*head, "--resume", str(cut), "train.steps=2", *LEAN, "train.seed=1", "data.seed=1"],
        [*head, "--algo", "dr_grpo", "--output-dir", str(out / "dr_grpo" / "seed0"), "train.steps=2", *LEAN,
         "train.seed=0", "data.seed=0"],
        [*head, "--algo", "dr_grpo", "--output-dir", str(out / "dr_grpo" / "seed1"), "train.steps=2", *LEAN,
         "train.seed=1", "data.seed=1"]]
    assert [a["n"] for a in result["algorithms"]] == [2, 2] and result["baseline"] == "grpo"
    assert (out / "compare.md").is_file() and (out / "compare.png").is_file()
    plan = capsys.readouterr().out
    assert "one run at a time" in plan and "1 done, 1 resume, 2 new" in plan
    assert "ETA: none yet" in plan  # the finished run's summary gives no process_to_ready_seconds


def test_eta_comes_from_the_finished_runs_measured_seconds(tmp_path):
    done = write_planned(runs.plan(["grpo"], [0], tmp_path, ["train.steps=2"])[0])
    summary = json.loads((done / "summary.json").read_text())
    (done / "summary.json").write_text(json.dumps({**summary, "process_to_ready_seconds": 3.0}))
    specs = runs.plan(["grpo"], [0, 1, 2, 3], tmp_path, ["train.steps=2"])
    # 3 s to ready + steps 5 + 1 s + two evaluations of 2 s = 13 s per run; 3 runs to do, 2 at once -> 2 waves, 26 s
    assert runs.measured_seconds(done) == pytest.approx(13.0)
    assert runs.eta_line(specs, 2) == "ETA: about 0.4 min (3 runs at 13 s, the finished runs' median)"


def test_parallel_splits_the_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "cores", lambda: 8)
    compare(algos="grpo", seeds=2, output_dir=str(tmp_path), start=FakeTrain, parallel=2, train={"steps": 2})
    # 8 cores // 2 runs = 4 threads each: engine.threads and OMP_NUM_THREADS (vLLM's check wants both)
    for f in FakeTrain.started:
        assert "engine.threads=4" in f.job.argv and f.job.env["OMP_NUM_THREADS"] == "4"
        assert f.job.log == tmp_path / "logs" / f"grpo-seed{f.job.spec.seed}.log"


def test_ctrl_c_stops_the_running_training_and_says_how_to_continue(tmp_path):
    out = tmp_path / "cmp"
    with pytest.raises(Interrupted) as e:
        compare(algos="grpo,dr_grpo", seeds=1, output_dir=str(out), start=lambda job: FakeTrain(job, ctrl_c=True),
                train={"steps": 2})
    assert len(FakeTrain.started) == 1 and FakeTrain.started[0].signals == [signal.SIGINT]
    assert e.value.fix == f"policyzoo compare --algos grpo,dr_grpo --seeds 1 --output-dir {out} train.steps=2"


def test_a_failed_training_stops_the_rest(tmp_path):
    specs = runs.plan(["grpo", "dr_grpo"], [0], tmp_path, ["train.steps=2"])
    jobs = launch.jobs_for(specs, tmp_path, 1, None)
    from rich.console import Console

    with pytest.raises(UserError) as e:
        launch.launch(jobs, 1, Console(quiet=True), "AGAIN", start=lambda job: FakeTrain(job, rc=2), poll_s=0)
    assert len(FakeTrain.started) == 1 and "exited with status 2" in e.value.why and e.value.fix.endswith("AGAIN")


def test_print_commands_prints_one_train_line_per_run_to_do(tmp_path, capsys):
    write_planned(runs.plan(["grpo"], [0], tmp_path, ["train.steps=2"])[0])
    got = compare(algos="grpo,grpo+clip=cispo", seeds=2, output_dir=str(tmp_path), print_commands=True,
                  overrides=["train.steps=2"], allow_equal=True)  # equal at 1 update: test_equivalence.py
    captured = capsys.readouterr()
    assert captured.out.splitlines() == got["commands"] and len(got["commands"]) == 3
    assert got["commands"][2] == (f"policyzoo train --algo grpo --output-dir {tmp_path}/grpo+clip=cispo/seed1 "
                                  f"train.steps=2 algorithm.clip.use=cispo {' '.join(LEAN)} train.seed=1 data.seed=1")
    assert f"# {tmp_path / 'grpo' / 'seed0'}: done" in captured.err and FakeTrain.started == []


def test_a_single_entry_is_a_seed_study_and_the_plan_says_so(tmp_path):
    from rich.console import Console

    console = Console(record=True, width=400)
    runs.print_plan(console, runs.plan(["grpo"], [0, 1], tmp_path, ["train.steps=2"]), tmp_path, 1, None)
    text = console.export_text()
    assert "policyzoo compare: 1 algorithm x 2 seeds = 2 runs in" in text
    assert "one algorithm (grpo): the table gives its spread over seeds, no paired difference" in text
    console = Console(record=True, width=400)
    runs.print_plan(console, runs.plan(["grpo", "dr_grpo"], [0], tmp_path, ["train.steps=2"]), tmp_path, 1, None)
    assert "one algorithm" not in console.export_text()


def test_print_commands_leaves_out_a_run_that_stopped_early(tmp_path, capsys):
    import json

    spec = runs.plan(["grpo"], [0], tmp_path, ["train.steps=4"])[0]
    write_planned(spec, steps=2)  # ended at step 2 of 4, and its summary says why (nothing to train on)
    summary = spec.path / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "stopped_early": True,
                                   "stop_reason": "nothing to train on for 3 steps in a row"}))
    got = compare(algos="grpo", seeds=1, output_dir=str(tmp_path), print_commands=True, overrides=["train.steps=4"])
    # the same run would stop the same way, and `policyzoo train` refuses its folder: no line for it
    assert got["commands"] == []
    assert f"# {spec.path}: stopped: stopped early at step 2: nothing to train on" in capsys.readouterr().err


def test_print_commands_restart_line_clears_the_started_run_so_train_accepts_the_folder(tmp_path, capsys):
    import subprocess

    from policyzoo.engine.rundir import RunDir

    run = tmp_path / "grpo" / "seed0"  # started, never stepped: a config.yaml and a startup.log, no checkpoint
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("algorithm: grpo\n")
    (run / "startup.log").write_text("loading\n")
    with pytest.raises(UserError, match="already holds another run's files"):
        RunDir(run).check_new(create=False)  # what `policyzoo train --output-dir` checks first
    got = compare(algos="grpo", seeds=1, output_dir=str(tmp_path), print_commands=True, overrides=["train.steps=2"])
    captured = capsys.readouterr()
    assert got["commands"] == [f"rm -rf -- {run}/config.yaml {run}/startup.log && policyzoo train --algo grpo "
                               f"--output-dir {run} train.steps=2 {' '.join(LEAN)} train.seed=0 data.seed=0"]
    assert f"# {run}: started before without a checkpoint (nothing to resume): its line removes" in captured.err
    removal = got["commands"][0].split(" && ")[0]
    subprocess.run(["bash", "-c", removal], check=True)  # as the scheduler runs it: bash -c "$line"
    assert list(run.iterdir()) == []
    RunDir(run).check_new(create=False)  # the train half is accepted now


def test_the_command_line_form_reports_mistakes_without_a_trace(tmp_path, capsys):
    from policyzoo.cli import main

    assert main(["compare", "--algos", "grpo,gpro", "--output-dir", str(tmp_path / "cmp"), "train.steps=2"]) == 2
    err = capsys.readouterr().err
    assert "error at --algos gpro:" in err and "did you mean" in err and "Traceback" not in err
    assert main(["compare"]) == 2 and "nothing to compare" in capsys.readouterr().err
    # with --algos the positionals are overrides
    assert main(["compare", "--algos", "grpo", "--output-dir", str(tmp_path), "runs/x"]) == 2
    assert "an override must look like key=value" in capsys.readouterr().err
    assert main(["compare", "--algos", "grpo", "--seeds", "0,2", "--output-dir", str(tmp_path), "--print-commands",
                 "--parallel", "2", "train.steps=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # --parallel splits threads only for runs compare starts itself: the printed lines are the scheduler's
    assert lines == [f"policyzoo train --algo grpo --output-dir {tmp_path}/grpo/seed{s} train.steps=2 {' '.join(LEAN)} "
                     f"train.seed={s} data.seed={s}" for s in (0, 2)] and not (tmp_path / "grpo").exists()


def test_policyzoo_compare_is_the_function_after_its_submodules_load():
    import importlib

    import policyzoo

    importlib.import_module("policyzoo.compare.plot")  # a submodule import sets the package's name only once
    assert policyzoo.compare is compare and "compare" in policyzoo.__all__


def test_sigterm_stops_the_running_training_like_ctrl_c(tmp_path):
    # a scheduler's SIGTERM to compare: the training is told (SIGINT: it checkpoints and stops), not orphaned
    import os

    class Terminated(FakeTrain):
        def poll(self):
            if not self.signals:  # runs on until told
                if not getattr(self, "sent", False):
                    self.sent = True
                    os.kill(os.getpid(), signal.SIGTERM)  # arrives while compare polls its training
                return None
            return super().poll()

    out = tmp_path / "cmp"
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or a handler a library imported earlier in this process set
    with pytest.raises(Interrupted):
        compare(algos="grpo,dr_grpo", seeds=1, output_dir=str(out), start=lambda job: Terminated(job),
                train={"steps": 2})
    assert len(FakeTrain.started) == 1 and FakeTrain.started[0].signals == [signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is before  # compare's handler is gone again, the one before restored


def test_aggregated_output_goes_to_the_folder_holding_every_given_run(tmp_path):
    # a run left out (half-written) still counts for where the table goes: never inside one run's folder
    from types import SimpleNamespace as Run

    from policyzoo.compare.api import _default_out

    kept = tmp_path / "cmp" / "grpo" / "seed0"
    kept.mkdir(parents=True)
    (kept / "config.yaml").write_text("{}")
    left = tmp_path / "half" / "rloo1"
    left.mkdir(parents=True)
    assert _default_out([str(left), str(kept)], [Run(path=kept)], [Run(path=left)]) == tmp_path
    assert _default_out([str(kept)], [Run(path=kept)]) == kept.parent  # one run: beside it
    assert _default_out([str(tmp_path / "cmp")], [Run(path=kept)]) == tmp_path / "cmp"  # the folder given
