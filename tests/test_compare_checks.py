"""policyzoo compare's checks of what it is given: run folders cut short or holding values that are not
numbers are left out with the reason; a folder made with other settings is blocked, not skipped as done;
the arguments (--seeds, --output-dir, --baseline, two spellings of one algorithm, what only goes with
--algos, the Python API's types) are refused before anything runs, without a stack trace."""

from __future__ import annotations

import io
import json

import pytest
from _compare_helpers import write_planned, write_run
from rich.console import Console

from policyzoo.compare import entries, runs
from policyzoo.compare.api import compare
from policyzoo.errors import ConfigError, UserError

QUIET = Console(quiet=True)


class Finish:
    """Stands in for a `policyzoo train` process: writes the planned run (after 0.1 (seed + 1)), exits 0."""

    started: list = []

    def __init__(self, job):
        self.job, self.returncode = job, None
        Finish.started.append(job)

    def poll(self):
        if self.returncode is None:
            s = self.job.spec
            write_run(s.path, s.base, s.seed, 0.1 * (s.seed + 1), steps=s.steps, config=s.config)
            self.returncode = 0
        return self.returncode


@pytest.fixture(autouse=True)
def _fresh():
    Finish.started = []


def _metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _write_metrics(path, records, tail=""):
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_a_metrics_file_cut_short_is_left_out_with_the_reason(tmp_path, capsys):
    for s, after in enumerate([0.2, 0.4, 0.6, 0.8]):
        write_run(tmp_path / "grpo" / f"seed{s}", "grpo", s, after)
    short, cut = tmp_path / "grpo" / "seed2", tmp_path / "grpo" / "seed3"
    # seed2: the eval of step 0 and train steps 1-3 of the 6 summary.json counts (records 0..3 of 8)
    _write_metrics(short, _metrics(short)[:4])
    # seed3: all 6 steps, then the last eval line cut off while written: line 1 eval, 2-7 train, 8 the cut one
    _write_metrics(cut, _metrics(cut)[:7], tail='{"kind": "eval", "step": 6, "eval_acc')
    result = compare(str(tmp_path))
    out = " ".join(capsys.readouterr().out.split())
    assert f"warning: {short} left out: metrics.jsonl holds 3 of the 6 training steps" in out
    assert f"warning: {cut} left out: metrics.jsonl line 8 does not parse" in out
    g = result["algorithms"][0]
    assert g["n"] == 2 and g["eval_after"]["mean"] == pytest.approx(0.3)  # (0.2 + 0.4) / 2: seeds 2, 3 left out
    assert sorted(s["path"] for s in result["skipped"]) == [str(short), str(cut)]


@pytest.mark.parametrize("where,key,value,reason", [
    ("summary", "eval_accuracy_after", "abc", "summary.json's eval_accuracy_after is 'abc', not a number"),
    ("summary", "steps", "x", "summary.json's steps is 'x', not a step count"),
    ("summary", "steps", None, "summary.json's steps is None, not a step count"),
    ("metrics", "reward_mean", "x", "metrics.jsonl's reward_mean at step 3 is 'x', not a number"),
    ("metrics", "time_step", "slow", "metrics.jsonl's time_step at step 3 is 'slow', not a number")])
def test_a_value_that_is_not_a_number_leaves_the_run_out(tmp_path, where, key, value, reason):
    write_run(tmp_path / "grpo" / "seed0", "grpo", 0, 0.2)
    bad = write_run(tmp_path / "grpo" / "seed1", "grpo", 1, 0.9)
    if where == "summary":
        summary = json.loads((bad / "summary.json").read_text())
        (bad / "summary.json").write_text(json.dumps({**summary, key: value}))
    else:
        records = _metrics(bad)
        records[3][key] = value  # record 3: train step 3 (record 0 is the eval of step 0)
        _write_metrics(bad, records)
    result = compare(str(tmp_path), console=QUIET)
    assert [s["path"] for s in result["skipped"]] == [str(bad)] and result["skipped"][0]["why"].startswith(reason)
    assert result["algorithms"][0]["eval_after"]["mean"] == pytest.approx(0.2)  # seed0 alone


def test_a_folder_made_with_other_settings_is_blocked_not_done(tmp_path):
    (spec,) = runs.plan(["grpo"], [0], tmp_path, ["train.steps=2"])
    other = dict(spec.config, train={**spec.config["train"], "lr": 0.5})
    write_run(spec.path, "grpo", 0, 0.1, steps=2, config=other)
    (again,) = runs.plan(["grpo"], [0], tmp_path, ["train.steps=2"])
    assert again.status == "blocked" and "train.lr 0.5 here, 1e-06 planned" in again.detail
    assert f"delete the folder {spec.path} (or choose another --output-dir)" in again.detail
    # the same run planned with lr 0.5 is done
    assert runs.plan(["grpo"], [0], tmp_path, ["train.steps=2", "train.lr=0.5"])[0].status == "done"
    # another algorithm's run in the folder: blocked too (the algorithm is part of what must match)
    (dr,) = runs.plan(["dr_grpo"], [0], tmp_path / "dr", ["train.steps=2"])
    write_run(tmp_path / "x" / "grpo" / "seed0", "dr_grpo", 0, 0.1, steps=2, config=dr.config)
    (mine,) = runs.plan(["grpo"], [0], tmp_path / "x", ["train.steps=2"])
    assert mine.status == "blocked" and "'dr_grpo' here" in mine.detail and "'grpo' planned" in mine.detail


def test_a_longer_run_is_another_experiment_and_odd_folders_are_blocked(tmp_path):
    (spec30,) = runs.plan(["grpo"], [0], tmp_path, ["train.steps=30"])
    write_planned(spec30)
    (spec20,) = runs.plan(["grpo"], [0], tmp_path)  # the default train.steps, 20
    assert spec20.steps == 20 and spec20.status == "blocked"
    assert spec20.detail.startswith("finished at step 30, the plan has train.steps 20: another experiment")
    (spec,) = runs.plan(["dr_grpo"], [0], tmp_path, ["train.steps=2"])
    write_planned(spec)
    assert runs.status(spec.path, 2, spec.config)[0] == "done"
    (spec.path / "notes.txt").write_text("mine")  # a file that is not a run's: it stays, as `train` keeps it
    assert runs.status(spec.path, 2, spec.config) == ("done", "finished at step 2 (notes.txt: not a run's, kept "
                                                      "beside the run's files)")
    (spec.path / "notes.txt").unlink()
    mine = tmp_path / "mine"  # the user's own config.yaml, no run's file beside it: kept, not a restart
    mine.mkdir()
    (mine / "config.yaml").write_text("algorithm: grpo\n")
    assert runs.status(mine, 2, spec.config) == ("blocked", "holds config.yaml, not written by a run (no resolved.yaml "
                                                 "or metrics.jsonl beside it): not a run; it is never removed: move it "
                                                 "elsewhere to run there, or choose another --output-dir")
    (spec.path / "config.yaml").write_text("train: [unclosed")
    state, why = runs.status(spec.path, 2, spec.config)
    assert state == "blocked" and why.startswith("config.yaml does not parse")
    summary = json.loads((spec30.path / "summary.json").read_text())
    (spec30.path / "summary.json").write_text(json.dumps({**summary, "steps": "x"}))
    assert runs.status(spec30.path, 30, spec30.config) == (
        "blocked", f"summary.json's steps is 'x', not a step count: delete the folder {spec30.path}")


def test_blocked_runs_are_neither_run_nor_counted(tmp_path):
    out = tmp_path / "cmp"
    (spec,) = runs.plan(["grpo"], [0], out, ["train.steps=2"])
    write_run(spec.path, "grpo", 0, 0.9, steps=2, config=dict(spec.config, data={**spec.config["data"],
                                                                               "name": "other"}))
    result = compare(algos="grpo", seeds=2, output_dir=str(out), train={"steps": 2}, start=Finish, console=QUIET)
    assert [j.spec.seed for j in Finish.started] == [1]  # seed 0 is blocked: not run, not replaced
    g = result["algorithms"][0]
    assert g["n"] == 1 and g["eval_after"]["mean"] == pytest.approx(0.2)  # seed 1's 0.1 * (1 + 1), not seed 0's 0.9
    (left,) = result["skipped"]
    assert left["path"] == str(spec.path) and "data.name 'other' here, 'arithmetic' planned" in left["why"]


def test_two_spellings_of_one_algorithm_are_refused_up_front(tmp_path):
    out = tmp_path / "cmp"
    for algos, first, second in [("grpo+clip=cispo,grpo+clip.use=cispo", "grpo+clip=cispo", "grpo+clip.use=cispo"),
                                 ("grpo,grpo+clip=ppo_clip", "grpo", "grpo+clip=ppo_clip")]:
        with pytest.raises(ConfigError) as e:
            compare(algos=algos, seeds=1, output_dir=str(out), start=Finish, console=QUIET)
        assert e.value.where == f"--algos {first},{second}" and "the same algorithm" in e.value.why
    assert Finish.started == [] and not out.exists()


@pytest.mark.parametrize("entry, override, both", [
    ("grpo+clip=cispo", "algorithm.clip.use=ppo_clip", "algorithm.clip.use"),  # the same key
    ("grpo+clip=cispo", "algorithm.clip={use: ppo_clip}", "algorithm.clip"),  # the override holds the entry's key
    ("grpo+kl=null", "algorithm.kl.beta=0.1", "algorithm.kl"),  # the entry removes the slot the override sets
    ("grpo+clip.eps_high=0.28", "algorithm.clip.eps_high=0.3", "algorithm.clip.eps_high")])
def test_an_override_and_a_hybrid_setting_one_key_are_refused_naming_both(tmp_path, entry, override, both):
    with pytest.raises(ConfigError) as e:
        compare(algos=f"grpo,{entry}", seeds=1, output_dir=str(tmp_path), print_commands=True, overrides=[override])
    assert e.value.where == f"--algos {entry}"
    assert repr(override) in e.value.why and f"both set {both}:" in e.value.why
    assert repr(entries.parse_entry(entry)[1][0]) in e.value.why  # the entry's change, as its run would get it
    assert not (tmp_path / "grpo").exists()
    # a parameter of the swapped slot is no clash: the override reaches every run, the entry swaps the component
    got = compare(algos="grpo,grpo+clip=cispo", seeds=1, output_dir=str(tmp_path), print_commands=True,
                  overrides=["algorithm.clip.eps_high=0.3"])
    assert len(got["commands"]) == 2


def test_the_baseline_is_checked_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "cmp"
    for kw in ({"print_commands": True}, {"start": Finish}):
        with pytest.raises(UserError) as e:
            compare(algos="grpo,dr_grpo", seeds=1, output_dir=str(out), baseline="rloo", console=QUIET, **kw)
        assert e.value.where == "--baseline rloo" and "grpo, dr_grpo" in e.value.fix
    assert Finish.started == [] and capsys.readouterr().out == "" and not out.exists()
    # an entry as given names its row even where the table's label is shorter (clip.eps_high is shared: no label)
    result = compare(algos="grpo+clip.eps_high=0.3,dr_grpo+clip.eps_high=0.3", seeds=1, output_dir=str(out),
                     baseline="dr_grpo+clip.eps_high=0.3", start=Finish, console=QUIET, train={"steps": 2})
    assert result["baseline"] == "dr_grpo" and [a["algorithm"] for a in result["algorithms"]] == ["grpo", "dr_grpo"]


def test_an_output_dir_that_is_a_file_and_wild_seeds_are_refused(tmp_path, capsys):
    from policyzoo.cli import main

    write_run(tmp_path / "runs" / "grpo" / "seed0", "grpo", 0, 0.1)
    taken = tmp_path / "taken.txt"
    taken.write_text("x")
    for args in (["compare", str(tmp_path / "runs"), "--output-dir", str(taken)],
                 ["compare", "--algos", "grpo", "--output-dir", str(taken / "cmp"), "train.steps=2"]):
        assert main(args) == 2
        err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
        assert f"{taken} is a file, not a folder" in err and "Traceback" not in err
    with pytest.raises(UserError):
        compare(algos="grpo", seeds=1, output_dir=str(taken), start=Finish, console=QUIET)
    assert Finish.started == [] and taken.read_text() == "x"
    for seeds, why in (("99999999999999999999", "a count is 1 to 1000"), ("1001", "a count is 1 to 1000"),
                       ("99999999999999999999,", "seed 99999999999999999999 is out of range")):
        assert main(["compare", "--algos", "grpo", "--seeds", seeds, "--output-dir", str(tmp_path / "c")]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert why in err and "Traceback" not in err


def test_what_only_goes_with_algos_is_a_usage_error_when_aggregating(tmp_path, monkeypatch, capsys):
    from policyzoo.cli import main

    write_run(tmp_path / "runs" / "grpo" / "seed0", "grpo", 0, 0.1)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    runs_dir = str(tmp_path / "runs")
    for extra, named in ((["train.steps=5"], "key=value overrides (train.steps=5)"), (["--print-commands"],
                         "--print-commands"), (["--seeds", "2"], "--seeds"), (["--parallel", "2"], "--parallel")):
        assert main(["compare", runs_dir, *extra]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"{named} only go with --algos" in err and "Traceback" not in err
    assert list((tmp_path / "cwd").iterdir()) == [] and not (tmp_path / "runs" / "compare.md").exists()
    # a folder whose name holds '=' (an entry's folder) is still a folder
    (tmp_path / "cwd" / "x=1").mkdir()
    write_run(tmp_path / "cwd" / "x=1" / "seed0", "grpo", 0, 0.1)
    assert main(["compare", "x=1"]) == 0 and (tmp_path / "cwd" / "x=1" / "compare.md").is_file()


def test_one_run_folder_gets_its_table_beside_it(tmp_path):
    run = write_run(tmp_path / "agg" / "grpo" / "seed0", "grpo", 0, 0.1)
    result = compare(str(run), console=QUIET)
    assert result["files"][0] == str(tmp_path / "agg" / "grpo" / "compare.md")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "metrics.jsonl", "summary.json"]


def test_the_python_api_refuses_a_string_of_overrides_and_bool_seeds(tmp_path):
    with pytest.raises(UserError, match="overrides must be a list of key=value strings"):
        compare(algos="grpo", output_dir=str(tmp_path), overrides="train.steps=5", start=Finish, console=QUIET)
    with pytest.raises(ConfigError, match="give a count"):
        compare(algos="grpo", output_dir=str(tmp_path), seeds=True, start=Finish, console=QUIET)
    assert Finish.started == [] and list(tmp_path.iterdir()) == []


def test_a_finished_run_with_a_bad_time_gives_no_eta_instead_of_a_crash(tmp_path):
    (spec,) = runs.plan(["grpo"], [0], tmp_path, ["train.steps=2"])
    done = write_planned(spec)
    summary = json.loads((done / "summary.json").read_text())
    (done / "summary.json").write_text(json.dumps({**summary, "process_to_ready_seconds": "slow"}))
    specs = runs.plan(["grpo"], [0, 1], tmp_path, ["train.steps=2"])
    assert specs[0].status == "done" and runs.measured_seconds(done) is None
    assert runs.eta_line(specs, 1).startswith("ETA: none yet")


@pytest.mark.parametrize("override, where, why", [
    ("data.path={d}/d1.jsonl", "data.prompt_column", "no column 'prompt' in the data"),
    ("data.path={d}/nonexist.jsonl", "data.path", "no such file or folder"),
    ("model.path={d}/nonexist", "model.path", "does not exist"),
])
def test_data_or_model_that_does_not_load_is_refused_before_any_command(tmp_path, capsys, override, where, why):
    # d1.jsonl has the columns question/solution, not prompt: `train --dry-run` stops on it, so compare does too,
    # before the equality probe (grpo,grpo+clip=cispo are equal at 1 update per batch) and before any line
    (tmp_path / "d1.jsonl").write_text('{"question": "1+1?", "solution": "2"}\n')
    with pytest.raises(UserError) as e:
        compare(algos="grpo,grpo+clip=cispo", seeds=1, output_dir=str(tmp_path / "c3"), print_commands=True,
                overrides=[override.format(d=tmp_path)], console=QUIET)
    assert where in e.value.where and why in e.value.why and e.value.fix
    out = capsys.readouterr()
    assert "policyzoo train" not in out.out and "claims nothing" not in out.err
    assert not (tmp_path / "c3").exists()


def test_user_files_are_kept_and_never_to_be_deleted_in_plan_and_table(tmp_path, capsys):
    # rundir's rule: other content stays beside a run's files unless it has a name a run writes (config.yaml)
    out = tmp_path / "o1"
    (out / "dapo" / "seed1").mkdir(parents=True)
    (out / "dapo" / "seed1" / "config.yaml").write_text("algorithm: dapo\n")  # the user's: no run's file beside it
    (out / "grpo" / "seed0").mkdir(parents=True)
    (out / "grpo" / "seed0" / "mydata.jsonl").write_text("{}\n")  # the user's: no clash, it stays
    lines = compare(algos="grpo,dapo", seeds=2, output_dir=str(out), print_commands=True, console=QUIET)["commands"]
    err = " ".join(capsys.readouterr().err.split())
    # 2 algorithms x 2 seeds = 4 runs, dapo/seed1 blocked: 3 lines, grpo/seed0 a plain train line with a note
    assert len(lines) == 3 and lines[0].startswith(f"policyzoo train --algo grpo --output-dir {out / 'grpo' / 'seed0'}")
    assert f"# {out / 'grpo' / 'seed0'}: new: holds mydata.jsonl: not a run's, kept beside the run's files" in err
    blocked = ("holds config.yaml, not written by a run (no resolved.yaml or metrics.jsonl beside it): not a run; it "
               "is never removed: move it elsewhere to run there")
    assert f"# {out / 'dapo' / 'seed1'}: blocked: {blocked}" in err
    seen = Console(file=io.StringIO(), width=1000)
    with pytest.raises(UserError):  # nothing finished to aggregate; the folder's reason is the planner's
        compare(str(out), console=seen)
    assert f"{out / 'dapo' / 'seed1'} left out: {blocked}" in " ".join(seen.file.getvalue().split())
    # a run cut off without a checkpoint beside a file of the user's: remove the run's files, never the folder
    cut = tmp_path / "cut" / "grpo" / "seed0"
    write_run(cut, "grpo", 0, 0.1)
    (cut / "summary.json").unlink()
    (cut / "mine.txt").write_text("x")
    seen = Console(file=io.StringIO(), width=1000)
    with pytest.raises(UserError):
        compare(str(tmp_path / "cut"), console=seen)
    text = " ".join(seen.file.getvalue().split())
    assert (f"remove the run's files from {cut} (config.yaml, metrics.jsonl; the other files are not a run's and "
            "stay), then run it again") in text and "delete" not in text
    assert (out / "dapo" / "seed1" / "config.yaml").exists() and (out / "grpo" / "seed0" / "mydata.jsonl").exists()


def test_a_bundle_is_taken_where_the_python_api_takes_an_algorithm_name(tmp_path, capsys):
    from dataclasses import replace

    from policyzoo.api import build_config
    from policyzoo.contract import use
    from policyzoo.zoo.grpo import BUNDLE as GRPO

    cispo = GRPO.replace(clip=use("cispo"))  # its .name is the entry "grpo+clip=cispo" (Bundle.replace's name)
    lines = compare(algos=["grpo", cispo], seeds=1, output_dir=str(tmp_path / "c"), print_commands=True,
                    allow_equal=True, baseline=cispo, console=QUIET)["commands"]
    # 2 entries x 1 seed: the Bundle's run is the hybrid's, in its folder and with its one change
    assert len(lines) == 2 and f"--output-dir {tmp_path / 'c' / 'grpo+clip=cispo' / 'seed0'} algorithm.clip.use=cispo" \
        in lines[1]
    with pytest.raises(ConfigError, match="the same algorithm"):  # the Bundle and its name are one entry
        compare(algos=[cispo, "grpo+clip.use=cispo"], seeds=1, output_dir=str(tmp_path / "d"), print_commands=True,
                console=QUIET)
    assert build_config(cispo, output_dir=str(tmp_path / "r")).algorithm == {"base": "grpo", "clip": {"use": "cispo"}}
    mine = replace(GRPO, name="mine")  # built by hand, not in the catalog: its name reads back to nothing
    for call in (lambda: build_config(mine, output_dir=str(tmp_path / "r")),
                 lambda: compare(algos=["grpo", mine], seeds=1, output_dir=str(tmp_path / "e"), print_commands=True)):
        with pytest.raises(UserError) as e:
            call()
        assert "the Bundle named 'mine' is not the algorithm that name reads back to" in e.value.why
        assert "pass its name" in e.value.fix and "Bundle(" not in str(e.value)
    with pytest.raises(ConfigError, match="int 3 is not an algorithm"):
        compare(algos=["grpo", 3], seeds=1, output_dir=str(tmp_path / "f"), print_commands=True)


def test_aggregating_names_entries_that_were_the_same_update_at_their_settings(tmp_path):
    # at train.updates_per_batch 1 (write_run's config: the default) every ratio is 1, so gspo's sequence ratio
    # and clip give grpo's gradient, and gspo has no kl: gspo is grpo+kl=null (docs/compare.md); dr_grpo is not
    # (no std in its baseline, a constant normaliser)
    for s in (0, 1):
        write_run(tmp_path / "grpo+kl=null" / f"seed{s}", "grpo+kl=null", s, 0.3 + 0.1 * s)
        write_run(tmp_path / "gspo" / f"seed{s}", "gspo", s, 0.2 + 0.1 * s)
        write_run(tmp_path / "dr_grpo" / f"seed{s}", "dr_grpo", s, 0.2 + 0.1 * s)
    result = compare(str(tmp_path), baseline="grpo+kl=null", console=QUIET)
    (pair,) = result["equal"]
    assert (pair["algorithm"], pair["equals"]) == ("gspo", "grpo+kl=null")
    assert pair["why"].startswith("gspo equals grpo+kl=null at train.updates_per_batch=1 (every ratio is 1")
    assert "ratio: sequence vs token" in pair["why"]
    md = (tmp_path / "compare.md").read_text()
    # gspo - grpo+kl=null per seed: 0.2 - 0.3 = 0.3 - 0.4 = -0.1: no verdict for it, the probe's reason instead
    assert f"* gspo - grpo+kl=null: no verdict: {pair['why']}: their runs measured noise (-0.100 over 2 paired " \
           "seeds)." in md
    assert "gspo and grpo+kl=null are not told apart" not in md and "gspo's held-out" not in md
    # dr_grpo keeps its verdict: 0.2 - 0.3 = -0.1 on both seeds, half-width 0 (s = 0): the interval excludes 0
    assert "dr_grpo's held-out accuracy is lower than grpo+kl=null's: -0.100 ± 0.000" in md
    assert json.loads((tmp_path / "compare.json").read_text())["equal"] == [pair]
    # two algorithms that differ at these settings: the table says the probe found no pair
    other = tmp_path / "other"
    for s in (0, 1):
        write_run(other / "grpo" / f"seed{s}", "grpo", s, 0.3)
        write_run(other / "dr_grpo" / f"seed{s}", "dr_grpo", s, 0.3)
    assert compare(str(other), console=QUIET)["equal"] == []
    assert "finds no two algorithms the same update" in (other / "compare.md").read_text()
