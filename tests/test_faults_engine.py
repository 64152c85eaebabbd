"""Faults during a real run (tiny Llama, transformers rollout, DeepSpeed ZeRO 0, one rank).

* a reward that turns +inf after two steps: the updates are skipped and logged with the
  offending groups, the run stops after ``train.max_consecutive_skips`` with a clear message and
  keeps its work: a checkpoint of the stop step holding the last good weights (and Adam moments:
  the skipped updates wrote nothing), the held-out evaluation and summary.json; it loads
  (``--force-resume``, since the reward config must change to go on);
* a reward function that raises: the error names the function and the row;
* Ctrl-C (SIGINT): the step finishes, a checkpoint is saved, exit status 130, and it resumes.

The reward functions below are imported by the training subprocess as ``test_faults_engine:...``
(``tests/`` is put on its PYTHONPATH).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time

import torch
from _engine_helpers import ROOT, engine_env, metrics, tiny_model, train_cmd
from safetensors.torch import load_file

FAST = ["engine.rollout=transformers", "engine.threads=1"]
_TRAIN_CALLS = [0]


def inf_from_step_3(prompts, completions, **_):
    """Finite rewards on the first two training batches (16 rows), then +inf on row 3 (group 0,
    sample 3) of every later one; evaluation batches (4 rows, greedy) stay finite."""
    training = len(completions) == 16
    _TRAIN_CALLS[0] += training
    bad = training and _TRAIN_CALLS[0] > 2
    return [math.inf if bad and i == 3 else len(set(c)) / (len(c) + 1) for i, c in enumerate(completions)]


_BAD_PROMPT: list[str] = []


def raise_on_second_prompt(prompts, completions, **_):
    """Raises on every row of the second prompt of the first training batch (rows 8-15)."""
    if not _BAD_PROMPT and len(completions) == 16:
        _BAD_PROMPT.append(prompts[8])
    if _BAD_PROMPT and _BAD_PROMPT[0] in prompts:
        raise ValueError("cannot parse this completion")
    return [0.0] * len(completions)


def raise_on_held_out(prompts, completions, **_):
    """Raises on the held-out batches (4 greedy rows; training batches have 16)."""
    if len(completions) == 4:
        raise ValueError("no score for held-out rows")
    return [0.0] * len(completions)


def _env():
    env = engine_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return env


def _reward(fn: str) -> str:
    return f'rewards=[{{use: function, function: "test_faults_engine:{fn}"}}]'


def _run(cmd, timeout=900):
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _states(folder):
    """The policy's weights and optimizer state of a checkpoint folder (ZeRO 0: both in model_states.pt)."""
    from policyzoo.engine.rundir import weights_only_load

    states = weights_only_load(str(next((folder / "policy").glob("*model_states.pt"))), map_location="cpu")
    return states["module"], states["optimizer"]["state"]


def test_non_finite_rewards_skip_updates_then_stop_and_the_run_keeps_its_work(tmp_path):
    out = tmp_path / "run"
    r = _run(train_cmd(out, *FAST, _reward("inf_from_step_3"), "train.steps=10", "train.save_every=2",
                       "train.max_consecutive_skips=2"))
    assert r.returncode == 2, r.stderr[-3000:]
    err = " ".join(r.stderr.split())
    assert "error at step 4:" in err and "2 optimizer steps in a row were skipped" in err
    assert "non-finite rewards" in err and "Traceback" not in err and "fix: lower train.lr" in err
    m = metrics(out)
    # steps 1-2 train; steps 3-4 skip, each naming the group of row 3 (prompt 0 of the step, G = 8):
    # group ids count on over the run, 2 prompts a step, so step s's first group is 2 * (s - 1)
    assert [x["skipped"] for x in m] == [0, 0, 1, 1]
    for x in m[2:]:
        assert x["skip_reason"] == "non-finite rewards" and x["skip_groups"] == [2 * (x["step"] - 1)]
        assert len(x["skip_prompts"]) == 1
        assert "grad_norm" not in x and "sync_max_diff" not in x  # no optimizer step, no sync
    # the work is kept: a checkpoint of step 4 (with its hf/ export), the held-out evaluation, the summary
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert latest == {"step": 4, "path": "step-000004"}
    assert f"kept: checkpoint of step 4 in {out / 'checkpoints' / 'step-000004'}" in err
    assert "these are the weights of step 2, the last good ones" in err
    assert (out / "checkpoints" / "step-000004" / "hf" / "model.safetensors").is_file()
    assert not (out / "final").exists() and not (out / "run.pid").exists()  # the run did not finish: no final/
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_early"] is True and summary["stop_cause"] == "non_finite"
    assert summary["stop_reason"] == "2 optimizer steps in a row skipped: non-finite rewards"
    assert [x["step"] for x in metrics(out, "eval")] == [0, 4] and summary["eval_accuracy_after"] is not None
    # a skipped update writes nothing: step 4's weights and Adam moments are step 2's, bit for bit
    (w2, opt2), (w4, opt4) = (_states(out / "checkpoints" / f"step-00000{s}") for s in (2, 4))
    assert w2.keys() == w4.keys() and all(torch.equal(w2[k], w4[k]) for k in w2)
    assert opt2.keys() == opt4.keys() and len(opt2) > 0
    assert all(torch.equal(torch.as_tensor(opt2[i][k]), torch.as_tensor(opt4[i][k])) for i in opt2 for k in opt2[i])

    # the kept checkpoint loads; two finite steps more and the export holds finite weights
    r = _run(train_cmd(out, *FAST, "train.steps=6", algo=None)[:4] + [
        "--resume", str(out), "--force-resume", "train.steps=6", 'rewards=[{use: function, function: '
        '"policyzoo.testing.tiny:spread_reward"}]'])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--force-resume: loading" in r.stderr
    m = metrics(out)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6] and [x["skipped"] for x in m] == [0, 0, 1, 1, 0, 0]
    assert json.loads((out / "summary.json").read_text())["stopped_early"] is False
    weights = load_file(out / "final" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_a_raising_reward_function_names_itself_and_the_row(tmp_path):
    r = _run(train_cmd(tmp_path / "run", *FAST, _reward("raise_on_second_prompt"), "train.steps=1"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # the function is re-run row by row: rows 0-7 (prompt 0) pass alone, row 8 is the first to raise
    err = " ".join(r.stderr.split())
    assert "error at step 1, reward: function test_faults_engine:raise_on_second_prompt" in err
    # the excerpt is the row's own question (arithmetic: "What is A op B?"), not the system prompt
    assert "ValueError: cannot parse this completion on row 8 (prompt 'What is " in err


def test_a_reward_error_in_the_held_out_evaluation_names_it(tmp_path):
    r = _run(train_cmd(tmp_path / "run", *FAST, _reward("raise_on_held_out"), "train.steps=1"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    err = " ".join(r.stderr.split())  # the first evaluation runs before step 1
    assert "error at held-out evaluation at step 0, reward: function test_faults_engine:raise_on_held_out" in err


def _stopped_by(sig, out) -> tuple[int, str]:
    """A long run on the tiny model, sent ``sig`` once its first step is logged: (exit status, stderr)."""
    proc = subprocess.Popen(train_cmd(out, *FAST, "train.steps=500"), env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 900
        while not ((out / "metrics.jsonl").is_file() and metrics(out)):
            assert proc.poll() is None and time.time() < deadline, "the run ended before a step was logged"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    out = tmp_path / "run"
    rc, err = _stopped_by(signal.SIGINT, out)
    assert rc == 130, err[-3000:]  # 128 + SIGINT (2)
    assert "stopped by SIGINT" in err and "Traceback" not in err and "nanobind" not in err
    done = metrics(out)[-1]["step"]
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == done
    # the checkpoint holds a save_pretrained export that transformers loads, with the trained weights
    from transformers import AutoModelForCausalLM

    export = out / "checkpoints" / f"step-{done:06d}" / "hf"
    assert "save_pretrained export of its weights in" in " ".join(err.split())
    model = AutoModelForCausalLM.from_pretrained(str(export))
    trained = load_file(export / "model.safetensors")
    initial = load_file(tiny_model() / "model.safetensors")
    assert torch.equal(model.state_dict()["model.norm.weight"], trained["model.norm.weight"])
    common = set(trained) & set(initial)
    assert "model.norm.weight" in common
    assert max((trained[k] - initial[k]).abs().max().item() for k in common) > 0  # lr 1e-3 moved them
    r = _run(train_cmd(out, algo=None)[:4] + ["--resume", str(out), f"train.steps={done + 1}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["step"] for x in metrics(out)] == list(range(1, done + 2))


def test_sigterm_saves_a_checkpoint_like_ctrl_c(tmp_path):
    # what a scheduler (Slurm before its kill), `timeout` or systemd sends: the same clean stop as Ctrl-C
    out = tmp_path / "run"
    rc, err = _stopped_by(signal.SIGTERM, out)
    assert rc == 143 and "SIGTERM: stopping after this step" in err and "Traceback" not in err  # 128 + 15
    assert "stopped by SIGTERM; checkpoint of step" in " ".join(err.split()) and "Ctrl-C" not in err
    done = metrics(out)[-1]["step"]
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == done
    assert not (out / "run.pid").exists()  # the run ended (was left behind after a signal)
