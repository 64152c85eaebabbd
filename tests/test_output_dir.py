"""``train --output-dir D``: a run folder (the files a run writes) is told from the user's own content, the dry
run gives the real start's verdict, and no fix suggests deleting anything."""

from pathlib import Path

import pytest

from policyzoo.cli import main
from policyzoo.engine.rundir import RUN_MARKS, RUN_WRITES, RunDir, remove_hint
from policyzoo.errors import UserError

# (what the folder holds, the verdict: None = accepted, else a phrase of the refusal)
CASES = {
    "absent": ([], None),
    "empty": (["."], None),
    "the user's notes only": (["notes.txt", "data/rows.jsonl"], None),  # kept beside the run's files
    "the user's config.yaml only": (["config.yaml"], "holds config.yaml, not written by a run"),
    "a folder named final": (["final/model.bin"], "holds final, not written by a run"),
    "a killed run's metrics": (["metrics.jsonl"], "already holds another run's files (metrics.jsonl)"),
    "a run that stopped while starting": (["config.yaml", "startup.log", "notes.txt"],
                                          "already holds another run's files (startup.log)"),
}


def _make(root, names):
    out = root / "out"
    for name in names:
        path = out / name
        if name == ".":
            out.mkdir(parents=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine\n")
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_and_real_start_give_one_verdict_and_never_suggest_deleting(tmp_path, case):
    names, expect = CASES[case]
    verdicts = []
    for create in (False, True):  # the dry run, then the real start's check
        out = _make(tmp_path / str(create), names)
        before = sorted(p.relative_to(out) for p in out.rglob("*")) if out.exists() else None
        try:
            RunDir(out).check_new(create=create)
            verdicts.append(None)
        except UserError as e:
            verdicts.append(e)
            text = str(e).lower()
            assert "delete" not in text and "rm " not in text and "remove" not in text, text
            assert str(out / "run") in e.fix or "choose another --output-dir" in e.fix
        after = sorted(p.relative_to(out) for p in out.rglob("*")) if out.exists() else None
        assert after == before or (before is None and create and after == [])  # nothing touched (create: mkdir)
    if expect is None:
        assert verdicts == [None, None]
    else:
        assert all(v is not None and expect in v.why for v in verdicts), verdicts
        assert verdicts[0].why == verdicts[1].why.replace(str(tmp_path / "True"), str(tmp_path / "False"))


def test_a_users_config_gets_a_fix_that_trains_with_it_in_a_new_folder(tmp_path):
    out = _make(tmp_path, ["config.yaml"])
    with pytest.raises(UserError) as e:
        RunDir(out).check_new(create=False)
    assert e.value.fix == (f"choose a new folder, e.g. --output-dir {out / 'run'}; to train with that config: "
                           f"--config {out / 'config.yaml'} --output-dir {out / 'run'}")
    RunDir(out / "run").check_new(create=False)  # the folder the fix names is accepted


def test_the_marks_are_files_a_run_writes():
    assert set(RUN_MARKS) < set(RUN_WRITES)
    # config.yaml, checkpoints and final are written by a run but may be the user's: they are not marks
    assert {"config.yaml", "checkpoints", "final"} == set(RUN_WRITES) - set(RUN_MARKS) - {"tensorboard", "wandb"}


def test_after_an_interrupt_only_the_runs_files_are_named_for_removal(tmp_path):
    for name in ("config.yaml", "resolved.yaml", "notes.txt"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "checkpoints").mkdir()
    assert remove_hint(tmp_path) == (f"remove the run's files from {tmp_path} (checkpoints, config.yaml, "
                                     "resolved.yaml), then run the same command again")  # notes.txt is not named
    assert remove_hint(tmp_path / "nothing-here") == "run the same command again"


def test_train_dry_run_refuses_a_folder_holding_only_the_users_config(tmp_path, capsys):
    out = _make(tmp_path, ["config.yaml"])
    (out / "config.yaml").write_text("algorithm: grpo\n")
    assert main(["train", "--dry-run", "--config", str(out / "config.yaml"), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error at output_dir {out}:" in err and "holds config.yaml, not written by a run" in err
    assert "another run's files" not in err and "delete" not in err and "Traceback" not in err
    assert (out / "config.yaml").read_text() == "algorithm: grpo\n" and sorted(p.name for p in out.iterdir()) == [
        "config.yaml"]


def test_the_default_folder_of_a_long_hybrid_is_one_folder_within_a_names_limit(capsys):
    stop = '["' + "/".join(["x"] * 80) + '"]'  # a parameter with '/' in it, 159 characters of the name
    assert main(["train", "--dry-run", "--algo", "grpo", f"algorithm.sample.stop={stop}"]) == 0
    out, err = capsys.readouterr()
    assert "name: grpo+sample.stop=" in out  # the hybrid's name keeps the whole change
    folder = Path(err.split("run directory ")[1].split(")")[0])
    # runs/ + the first 120 characters of the name with '/' as '_' + '-YYYYmmdd-HHMMSS' (16)
    assert folder.parent == Path("runs") and len(folder.name) == 120 + 16
    assert folder.name.startswith('grpo+sample.stop=["x_x_x')


def test_rank_0s_own_start_files_do_not_stop_the_other_ranks_of_its_launch(tmp_path, monkeypatch):
    # rank 0 writes run.pid, startup.log and config.yaml as it starts; rank 1 of the same launch may check the
    # folder a moment later (seen on two ranks under load): it must not take them for another run's or a user's
    # files. Rank 0 checks the content, and its refusal ends the launch.
    out = _make(tmp_path, ["run.pid", "startup.log"])
    monkeypatch.setenv("RANK", "1")
    RunDir(out).check_new()  # no refusal on rank 1
    (out / "startup.log").unlink()
    (out / "config.yaml").write_text("algorithm: grpo\n")  # run.pid and config.yaml alone: a clash on rank 0
    RunDir(out).check_new()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match=r"another run's files \(run.pid\)"):
        RunDir(out).check_new()
    # a file in place of the folder stops every rank
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(UserError, match="is a file"):
        RunDir(out / "config.yaml").check_new()
