"""A run that must stop keeps its work and names the real cause; a dry run refuses an output dir where
no file can be made; unscorable (NaN-reward) rows are said on the step's line and in summary.json.

The first tests drive :class:`~policyzoo.engine.run.loop.RunLoop` with a stand-in session (no model);
the last one is a real run of the tiny model (DeepSpeed + transformers rollout, seconds) whose reward
is constant, so DAPO's dynamic-sampling filter keeps no row.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from _engine_helpers import metrics, run_bounded, stand_in_part, train_cmd

from policyzoo.engine.report.progress import summary_text
from policyzoo.engine.run.loop import RunLoop
from policyzoo.engine.run.stop import RunStopped, skip_stop
from policyzoo.engine.run.summary import unscorable
from policyzoo.engine.rundir import RunDir, unwritable
from policyzoo.errors import TrainingError
from policyzoo.run_config import load_config

NOTHING = {"skipped": 1, "skip_reason": "no rows kept by the filters", "sampled_rows": 16, "sample_rounds": 1,
           "filtered/zero_std_group": 16, "kind": "train"}


# ---------------------------------------------------------------------------- the cause, in words
def test_nothing_kept_names_zero_std_groups_entropy_and_the_fixes_that_act():
    stop = skip_stop(5, [dict(NOTHING, step=4), dict(NOTHING, step=5)], entropy=(3, 0.04))
    assert isinstance(stop, TrainingError) and stop.cause == "nothing_to_train_on"
    why = " ".join(stop.why.split())
    # 16 of the 16 sampled rows were in constant groups: 16 / 16 = 100%
    assert "2 steps in a row had nothing to train on" in why
    assert "of the 16 rows sampled in 1 round at step 5, the filters kept none" in why
    assert "16 (100%) were in zero-std groups" in why
    assert "policy entropy 0.04 nats/token at step 3, the last step that trained" in why
    for fix in ("train.max_sample_rounds", "algorithm.sample.temperature", "algorithm.term",
                "algorithm.clip.eps_high", "train.updates_per_batch >= 2"):
        assert fix in stop.fix, fix
    assert not stop.fix.startswith("lower train.lr") and "check the reward components for NaN" not in stop.fix
    assert stop.reason == ("nothing to train on for 2 steps in a row: the filters kept no rows (zero-std groups: 16 "
                           "of 16 rows sampled in 1 round, entropy 0.04 at step 3)")


def test_nothing_kept_by_another_filter_and_on_another_rank():
    # 12 of 16 rows in constant groups (12 / 16 = 75%), the other 4 truncated; rank 1 kept nothing
    rec = dict(NOTHING, **{"filtered/zero_std_group": 12, "filtered/truncated": 4, "sample_rounds": 3,
                           "skip_reason": "no rows kept by the filters on rank 1"})
    stop = skip_stop(2, [rec])
    why = " ".join(stop.why.split())
    assert "1 step in a row had nothing to train on" in why and "3 rounds on rank 1 at step 2" in why
    assert "12 (75%) were in zero-std groups" in why and "truncated: 4 dropped" in why
    assert "no step has trained yet" in why
    assert "(zero-std groups: 12, truncated: 4 of 16 rows sampled in 3 rounds)" in stop.reason
    only_truncated = skip_stop(2, [dict(NOTHING, **{"filtered/zero_std_group": 0, "filtered/truncated": 16})])
    assert "zero-std" not in only_truncated.why and "algorithm.filter" in only_truncated.fix


def test_non_finite_skips_keep_the_numeric_fixes():
    rec = {"skipped": 1, "skip_reason": "non-finite rewards", "kind": "train"}
    stop = skip_stop(4, [rec, rec], entropy=(2, 1.5))
    assert stop.cause == "non_finite" and stop.where == "step 4"
    assert stop.why.startswith("2 optimizer steps in a row were skipped (last reason: non-finite rewards)")
    assert stop.fix.startswith("lower train.lr, check the reward components for NaN/inf")
    assert stop.reason == "2 optimizer steps in a row skipped: non-finite rewards"


# ---------------------------------------------------------------------------- the loop keeps the work
def _session(tmp_path: Path, skip_from: int, **train):
    """A stand-in session (no model) whose steps skip from step ``skip_from`` on, with what ``finish`` calls:
    ``calls`` records saves, evaluations and exports."""
    from rich.console import Console

    overrides = [f"train.{k}={v}" for k, v in {"steps": 10, "max_consecutive_skips": 2, **train}.items()]
    pre = SimpleNamespace(rundir=RunDir(tmp_path / "run"), state={"step": 0, "tokens_seen": 0, "batches": 0},
                          rows_drawn=0, run=SimpleNamespace(bundle=SimpleNamespace(name="dapo"), reward=()),
                          model=SimpleNamespace(path=tmp_path), task_rewards_n=0, prompt_counts={},
                          task=SimpleNamespace(train_rows=[{}] * 8, eval_rows=[]))
    console = Console(file=open(tmp_path / "console.txt", "w"), width=400)
    calls: list = []
    trainer = SimpleNamespace(export=lambda path: calls.append(("export", path)), models_loaded=lambda: ["policy"],
                              trainable_params=1, stage=0, share_prompt=False, share_prompt_check=None)
    s = stand_in_part(load_config(None, "dapo", overrides), console, pre, trainer=trainer,
                      tracker=SimpleNamespace(close=lambda: None, log=lambda rec: None))
    s.rundir.path.mkdir()
    s.rundir.claim()  # run.pid of this process
    loop = RunLoop(s)
    loop.eval_before = {"step": 0, "eval_accuracy": 0.25}

    def step():  # a step's record as RunLoop.step logs it, then the loop's own skip count
        n = loop.state["step"] + 1
        m = (dict(NOTHING, unscorable_rows=1, **{"unscorable/fn": 1}) if n >= skip_from
             else {"skipped": 0, "entropy": 0.5, "kind": "train", "unscorable_rows": 0})
        loop.state["step"] = n
        m = dict(m, step=n)
        s.rundir.log(m)
        loop._check_skips(m, n)
        return m

    def save(export=False):
        calls.append(("save", loop.state["step"], export))
        loop.last_saved = loop.state["step"]
        return s.rundir.ckpt / f"step-{loop.state['step']:06d}"

    def evaluate():
        calls.append(("eval", loop.state["step"]))
        loop.last_eval = {"step": loop.state["step"], "eval_accuracy": 0.5}
        return loop.last_eval

    loop.step, loop.save, loop.evaluate = step, save, evaluate
    return s, loop, calls


def test_a_run_stopped_by_skips_checkpoints_evaluates_and_writes_its_summary(tmp_path):
    s, loop, calls = _session(tmp_path, skip_from=4)
    with pytest.raises(RunStopped) as e:
        loop.train()
    # steps 1-3 train, steps 4-5 keep nothing: 2 = max_consecutive_skips, so the run stops after step 5
    assert calls == [("save", 5, True), ("eval", 5)]  # the checkpoint with its hf/ export; no final/ export
    summary = json.loads((s.rundir.path / "summary.json").read_text())
    assert summary["stopped_early"] is True and summary["steps"] == 5
    assert summary["stop_reason"].startswith("nothing to train on for 2 steps in a row") and \
        "zero-std groups: 16 of 16 rows" in summary["stop_reason"] and summary["stop_cause"] == "nothing_to_train_on"
    assert summary["eval_accuracy_before"] == 0.25 and summary["eval_accuracy_after"] == 0.5
    assert summary["unscorable_rows"] == 2 and summary["unscorable_by_reward"] == {"fn": 2}  # 1 row at steps 4, 5
    assert not (s.rundir.path / "run.pid").exists()
    msg = " ".join(str(e.value).split())
    ckpt = s.rundir.ckpt / "step-000005"
    assert f"kept: checkpoint of step 5 in {ckpt}, with a save_pretrained export in {ckpt / 'hf'}" in msg
    assert "these are the weights of step 3, the last good ones" in msg and "held-out reward after: 0.50" in msg
    assert f"policyzoo train --resume {s.rundir.path}" in msg
    assert "policy entropy 0.5 nats/token at step 3" in msg  # the last trained step's entropy
    console = (tmp_path / "console.txt").read_text()
    assert "step 5/10  reward nan  len 0  0 tok/s  unscorable 1 (fn)  skipped (nothing kept)\n" \
        "stopping: nothing to train on for 2 steps in a row" in console  # the stopping step's line, then why


def test_a_finished_run_says_it_did_not_stop_and_releases_its_pid(tmp_path):
    s, loop, calls = _session(tmp_path, skip_from=99, steps=3)
    loop.train()
    assert calls == [("save", 3, False), ("eval", 3), ("export", str(s.rundir.path / "final"))]
    summary = json.loads((s.rundir.path / "summary.json").read_text())
    assert (summary["stopped_early"], summary["stop_reason"], summary["unscorable_rows"]) == (False, None, 0)
    assert not (s.rundir.path / "run.pid").exists()


def test_release_removes_only_this_process_pid_file(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    other = {"pid": os.getppid(), "host": os.uname().nodename}
    (rd.path / "run.pid").write_text(json.dumps(other))
    rd.release()  # another process's claim: kept
    assert json.loads((rd.path / "run.pid").read_text()) == other
    rd.claim()
    rd.release()
    assert not (rd.path / "run.pid").exists()


# ---------------------------------------------------------------------------- NaN values and TensorBoard
def test_tensorboard_gets_the_finite_numbers_only(tmp_path, capsys):
    from policyzoo.engine.report.tracking import Tracker

    tracker = Tracker(tmp_path, ["tensorboard"], {})
    got = []
    tracker.tb.add_scalar = lambda k, v, step: got.append((k, v, step))
    tracker.log({"step": 3, "kind": "train", "loss": math.nan, "reward_mean": 0.5, "grad_norm": math.inf,
                 "skipped": True, "skip_reason": "no rows kept by the filters"})
    # loss NaN and grad_norm inf are left out (a gap); the bool is 1.0; the text stays in metrics.jsonl only
    assert got == [("reward_mean", 0.5, 3), ("skipped", 1.0, 3)]
    assert "NaN or Inf" not in capsys.readouterr().err
    tracker.close()


# ---------------------------------------------------------------------------- unscorable rows, said
def test_unscorable_rows_on_the_step_line_and_summed_for_the_summary():
    m = {"reward_mean": 0.5, "response_length_mean": 12, "rollout_tokens_per_s": 100, "unscorable_rows": 3,
         "unscorable/math_verify": 3}
    assert summary_text(m, None) == "reward 0.5  len 12  100 tok/s  unscorable 3 (math_verify)"
    assert "unscorable" not in summary_text(dict(m, unscorable_rows=0), None)
    assert summary_text(dict(NOTHING, reward_mean=math.nan), None).endswith("skipped (nothing kept)")
    # nothing kept: 16 rows sampled, 4 right (reward 1) and 12 wrong: 4 / 16 = 0.25 over the rows sampled;
    # no row trained, so no length (not ``len 0``) and no ``nan``
    skipped = dict(NOTHING, reward_mean=math.nan, reward_mean_sampled=0.25, rows=0, response_length_mean=0.0,
                   rollout_tokens_per_s=80)
    assert summary_text(skipped, None) == "reward 0.25 (sampled)  80 tok/s  skipped (nothing kept)"
    records = [{"kind": "eval", "unscorable_rows": 9}, {"kind": "train", "unscorable_rows": 3, "unscorable/a": 3},
               {"kind": "train", "unscorable_rows": 2, "unscorable/a": 1, "unscorable/b": 2}, {"kind": "train"}]
    # train records only: 3 + 2 = 5 rows; a: 3 + 1 = 4, b: 2 (a row NaN in both counts under each)
    assert unscorable(records) == (5, {"a": 4, "b": 2})


# ---------------------------------------------------------------------------- dry run: a place that takes no file
def test_an_output_dir_where_no_file_can_be_made_is_refused_with_the_reason(tmp_path):
    assert unwritable(tmp_path) is None and list(tmp_path.iterdir()) == []  # the probe file is removed
    why = unwritable(Path("/proc"))  # root may "access" /proc for writing, yet no file can be created there
    assert why.startswith("/proc takes no new files (creating a probe file there failed: ")
    assert why.endswith("on a proc filesystem)")
    (tmp_path / "a-file").write_text("x")
    assert "Not a directory" in unwritable(tmp_path / "a-file")


def test_the_dry_run_refuses_proc_as_the_real_run_does(tmp_path, monkeypatch, capsys):
    from _engine_helpers import tiny_model

    from policyzoo.cli import main

    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "cache"))
    rows = tmp_path / "d.jsonl"
    rows.write_text("".join(json.dumps({"q": f"What is {i} + 1?", "a": str(i + 1)}) + "\n" for i in range(12)))
    args = ["train", "--algo", "grpo", "--dry-run", "--output-dir", "/proc/pz_run", f"model.path={tiny_model()}",
            f"data.path={rows}", "data.prompt_column=q", "data.answer_column=a", "data.eval_size=2",
            "algorithm.sample.max_tokens=12", "train.prompts_per_step=2", "rewards=[{use: answer_match}]"]
    assert main(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error at output_dir /proc/pz_run:" in err and "/proc takes no new files" in err
    assert "fix: choose a writable --output-dir" in err and "every check passed" not in err


# ---------------------------------------------------------------------------- a real run whose filter keeps nothing
def constant_reward_nan_first(prompts, completions, **_):
    """0.0 for every row, except NaN (unscorable) on row 0 of a training batch (P 2 x G 8 = 16 rows; held-out
    batches have 4): every group's valid rewards are equal, so DAPO's filter drops every group."""
    return [math.nan if len(completions) == 16 and i == 0 else 0.0 for i in range(len(completions))]


def test_a_tiny_run_whose_filter_keeps_nothing_stops_and_keeps_its_work(tmp_path):
    import torch
    from _engine_helpers import ROOT, engine_env, tiny_model
    from safetensors.torch import load_file

    out = tmp_path / "run"
    env = engine_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    cmd = train_cmd(out, "engine.rollout=transformers", "engine.threads=1", "algorithm.reward=[]",  # no overlong term
                    'rewards=[{use: function, function: "test_run_stop:constant_reward_nan_first"}]',
                    "train.steps=4", "train.max_sample_rounds=1", "train.max_consecutive_skips=2", algo="dapo")
    r = run_bounded(cmd, 600, logs=out, env=env)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr[-3000:]  # a TrainingError, as before the work was kept
    assert "error at step 2: 2 steps in a row had nothing to train on" in err and "Traceback" not in err
    assert "16 (100%) were in zero-std groups" in err and "train.max_sample_rounds" in err
    assert [(m["step"], m["skipped"], m["skip_reason"]) for m in metrics(out)] == \
        [(1, 1, "no rows kept by the filters"), (2, 1, "no rows kept by the filters")]
    # the step's console line says the skip and the unscorable row (row 0 of the step's 16)
    for step in (1, 2):  # the stopping step's line too
        assert f"step {step}/4" in err
    assert err.count("unscorable 1 (constant_reward_nan_first) skipped (nothing kept)") == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] is True and summary["steps"] == 2
    assert "zero-std groups: 16 of 16 rows sampled in 1 round" in summary["stop_reason"]
    assert summary["eval_accuracy_after"] == 0.0  # 4 held-out rows, each rewarded 0.0: mean 0.0
    assert summary["unscorable_rows"] == 2 and summary["unscorable_by_reward"] == {"constant_reward_nan_first": 2}
    assert [m["step"] for m in metrics(out, "eval")] == [0, 2]  # before step 1 and after the stop
    assert json.loads((out / "checkpoints" / "latest.json").read_text()) == {"step": 2, "path": "step-000002"}
    assert not (out / "run.pid").exists() and not (out / "final").exists()
    # no update was made: the checkpoint's export holds the initial weights exactly (the last good ones)
    kept = load_file(out / "checkpoints" / "step-000002" / "hf" / "model.safetensors")
    initial = load_file(tiny_model() / "model.safetensors")
    assert "model.norm.weight" in set(kept) & set(initial)
    assert all(torch.equal(kept[k], initial[k]) for k in set(kept) & set(initial))
