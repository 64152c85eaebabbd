"""SIGINT and SIGTERM during ``policyzoo train``: named, exit 128 + the signal's number (130 / 143), nothing
claimed that was not saved, and no nanobind leak report at exit (core/engine/run/interrupts.py)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from _engine_helpers import ROOT, engine_env, parser_with, run_train

from policyzoo.cli import main
from policyzoo.engine.run.interrupts import (
    SignalReceived,
    deferred_signals,
    raising_signals,
    signal_stop,
    startup_interrupted,
    stopped_at_once,
)
from policyzoo.engine.run.loop import RunLoop
from policyzoo.errors import Interrupted


@pytest.mark.parametrize("sig, name, code", [(signal.SIGINT, "SIGINT", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_a_signal_at_start_up_is_named_and_exits_128_plus_its_number(sig, name, code, monkeypatch, capsys):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(SignalReceived) as e:
        with raising_signals():
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises here, at once
    assert e.value.signum == sig and {s: signal.getsignal(s) for s in before} == before  # handlers restored
    stop = startup_interrupted(e.value.signum, None, None)  # during the checks of a new run
    assert isinstance(stop, Interrupted) and stop.exit_code == code  # 128 + 2 = 130, 128 + 15 = 143
    assert stop.why == f"interrupted during start-up ({name}): nothing to save (no step was taken)"

    def stopped(args, out):
        raise stop
    monkeypatch.setattr("policyzoo.cli.build_parser", parser_with(stopped))
    assert main(["zoo"]) == code
    err = " ".join(capsys.readouterr().err.split())
    assert err == f"stopped at start-up: interrupted during start-up ({name}): nothing to save (no step was taken) " \
                  "to continue: run the same command again"


@pytest.mark.parametrize("sig, name, code", [(signal.SIGINT, "SIGINT", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_a_signal_that_stops_at_once_is_named_by_the_cli(sig, name, code, monkeypatch, capsys):
    def aborted(args, out):
        raise SignalReceived(sig)  # the loop's second signal, or one while the run finishes
    monkeypatch.setattr("policyzoo.cli.build_parser", parser_with(aborted))
    assert main(["zoo"]) == code
    assert capsys.readouterr().err.strip() == f"interrupted ({name})"


def test_the_loops_stop_names_the_signal_it_got_and_exits_with_its_code(tmp_path):
    printed: list[str] = []
    loop = RunLoop.__new__(RunLoop)  # the loop's signal handling alone: no model, no session
    loop.stop_requested, loop.state = 0, {"step": 3}
    loop.config = SimpleNamespace(train=SimpleNamespace(steps=10, export_every=0, save_every=0, eval_every=0))
    loop.part = SimpleNamespace(console=SimpleNamespace(print=printed.append), rundir=SimpleNamespace(path=tmp_path))
    loop.save = lambda export: tmp_path / "checkpoints" / "step-000003"
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or a library's (verifiers' Environment sets one)
    with deferred_signals(loop):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the first signal only asks: nothing is raised
        assert loop.stop_requested == signal.SIGTERM
        with pytest.raises(SignalReceived) as e:  # a second one stops at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert e.value.signum == signal.SIGINT and signal.getsignal(signal.SIGTERM) is before  # restored
    assert printed == ["SIGTERM: stopping after this step and saving a checkpoint (a second SIGINT or SIGTERM "
                       "stops at once, without one)"]
    with pytest.raises(Interrupted) as stop:
        loop._after_step(3)
    assert stop.value.exit_code == 143 and "Ctrl-C" not in stop.value.why  # was: "stopped by Ctrl-C", exit 130
    assert stop.value.why.startswith(f"stopped by SIGTERM; checkpoint of step 3 saved in {tmp_path}/checkpoints")


def test_quiet_teardown_silences_what_the_exit_prints_after_it(tmp_path):
    # nanobind prints its leak report from its Py_AtExit callback, after the atexit handlers; an atexit
    # handler registered before quiet_teardown runs after its handler too (last in, first out) and stands
    # in for it here
    code = ("import atexit, os, sys\n"
            "atexit.register(lambda: os.write(2, b'nanobind: leaked 4 instances!\\n'))\n"
            "from policyzoo.engine.run.interrupts import quiet_teardown\n"
            "quiet_teardown()\n"
            "print('stopped at start-up', file=sys.stderr, end='')\n"  # unflushed until the exit
            "sys.exit(143)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (out.returncode, out.stderr) == (143, "stopped at start-up")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_after_the_end_exits_0_at_once(sig):
    # a finished run's clean-up (the engines' teardown at exit) stands in as a long sleep; before the fix the
    # default handler killed it: status -15 here, 143 in a shell
    code = ("import sys, time\n"
            "from policyzoo.engine.run.interrupts import finished_signals\n"
            "finished_signals()\n"
            "print('done: held-out accuracy 0.25 -> 0.50', flush=True)\n"
            "time.sleep(60)\n"
            "sys.exit(3)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout.readline().startswith("done:")
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0  # at once (not after the 60 s sleep, nor its 3), status 0
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_main_hands_the_signals_to_the_finished_handler_after_the_end(monkeypatch):
    from policyzoo.engine import dist
    from policyzoo.engine.run import train

    order: list = []
    monkeypatch.setattr(dist, "close", lambda: order.append("closed"))
    monkeypatch.setattr(train, "finished_signals", lambda: order.append(("finished", signal.getsignal(signal.SIGTERM))))
    before = signal.getsignal(signal.SIGTERM)

    class Finished:
        def train(self):
            order.append("trained")
            return {"steps": 2}
    monkeypatch.setattr(train, "open_run", lambda *a: Finished())
    assert train.main(object()) == {"steps": 2}
    # trained, then (raising_signals' handlers restored: the one found before) the finished handler, then closed
    assert order == ["trained", ("finished", before), "closed"]


def test_sigterm_during_a_resumed_runs_start_up_saves_nothing_and_says_so(tmp_path):
    out = tmp_path / "run"
    first = run_train(out, "train.steps=1")  # a checkpoint of step 1 to resume
    assert first.returncode == 0, first.stderr[-3000:]
    cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--resume", str(out), "train.steps=2"]
    p = subprocess.Popen(cmd, env=engine_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)  # its own process group, killed whole on failure
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in p.stderr] + [lines.put(None)], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.time() + 600
        while time.time() < deadline:  # the start-up marker: the models start loading (checks passed)
            line = lines.get(timeout=max(deadline - time.time(), 0.1))
            if line is None:
                break
            seen.append(line)
            if "loading the model" in line:
                os.kill(p.pid, signal.SIGTERM)
                break
        assert any("loading the model" in x for x in seen), "".join(seen)[-3000:]
        p.wait(180)
        while (line := lines.get(timeout=30)) is not None:
            seen.append(line)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(60)
    err = "".join(seen)
    flat = " ".join(err.split())
    assert p.returncode == 143, err[-3000:]  # 128 + SIGTERM (15)
    assert (f"stopped at start-up of {out}: interrupted during start-up (SIGTERM): nothing to save; the checkpoint "
            f"of step 1 ({out / 'checkpoints' / 'step-000001'}) is unchanged to continue: policyzoo train --resume "
            f"{out}") in flat, err[-3000:]
    assert "saved" not in err and "Ctrl-C" not in err and "nanobind" not in err and "Traceback" not in err
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 1
    assert sorted(x.name for x in (out / "checkpoints").iterdir()) == ["latest.json", "step-000001"]
    assert not (out / "run.pid").exists()  # the run ended: its folder holds no live run



def test_the_start_up_message_of_a_resumed_run_names_its_checkpoint(tmp_path):
    session = SimpleNamespace(rundir=SimpleNamespace(path=tmp_path), state={"step": 4},
                              resume_from=tmp_path / "checkpoints" / "step-000004")
    stop = startup_interrupted(signal.SIGTERM, session, str(tmp_path))
    assert (stop.where, stop.fix, stop.exit_code) == (f"start-up of {tmp_path}", f"policyzoo train --resume {tmp_path}",
                                                      143)
    assert stop.why == (f"interrupted during start-up (SIGTERM): nothing to save; the checkpoint of step 4 "
                        f"({tmp_path / 'checkpoints' / 'step-000004'}) is unchanged")
    (tmp_path / "config.yaml").write_text("{}")  # a new run whose folder was written before the signal
    stop = startup_interrupted(signal.SIGINT, session, None)
    # only the run's own files are named for removal (the folder may hold the user's files too)
    assert stop.exit_code == 130 and stop.fix == (f"remove the run's files from {tmp_path} (config.yaml), then run "
                                                  "the same command again")
    assert stop.why.endswith(f"nothing to save; {tmp_path} holds no checkpoint")


@pytest.mark.parametrize("step_taken", [False, True])
def test_main_says_what_is_saved_before_and_after_the_first_step(monkeypatch, tmp_path, step_taken):
    from policyzoo.engine import dist
    from policyzoo.engine.run import train

    quiet: list = []
    monkeypatch.setattr(train, "quiet_teardown", lambda: quiet.append(True))
    monkeypatch.setattr(dist, "close", lambda: None)
    step_1 = tmp_path / "checkpoints" / "step-000001"
    checked = SimpleNamespace(rundir=SimpleNamespace(path=tmp_path, latest=lambda: (step_1, {"step": 1}),
                                                     release=lambda: None),
                              state={"step": 0}, resume_from=None)
    prepared = SimpleNamespace(checked=checked, config=SimpleNamespace(train=SimpleNamespace(steps=2)))

    class Started:
        stop_requested = 0  # the second signal came at once (the first during step 2 is not modelled here)

        def train(self):  # the first evaluation (no step yet), or the second step's signal
            checked.state["step"] = 1 if step_taken else 0
            raise SignalReceived(signal.SIGTERM)

    def opened(config, resume, force_resume, verbose, prepared_hook):
        prepared_hook(prepared)  # the checks passed
        return Started()
    monkeypatch.setattr(train, "open_run", opened)
    with pytest.raises(Interrupted) as stop:
        train.main(object())
    assert stop.value.exit_code == 143  # 128 + 15
    if step_taken:  # a second signal during step 2 (the first asked to stop after it): nothing more saved
        assert stop.value.why == (f"interrupted at once (SIGTERM) during step 2: it was not saved; the last "
                                  f"checkpoint is step 1 ({step_1})")
        assert stop.value.fix == f"policyzoo train --resume {tmp_path}"
    else:
        assert stop.value.why == "interrupted during start-up (SIGTERM): nothing to save (no step was taken)"
    assert quiet == [True]


def test_a_second_signal_with_no_checkpoint_yet_says_there_is_none(tmp_path):
    session = SimpleNamespace(rundir=SimpleNamespace(path=tmp_path, latest=lambda: None), state={"step": 3},
                              config=SimpleNamespace(train=SimpleNamespace(steps=3)))  # all 3 steps done: the end
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "notes.txt").write_text("the user's own file, not named for removal\n")
    stop = stopped_at_once(signal.SIGINT, session, session.config.train.steps)
    assert (stop.where, stop.exit_code) == ("the end of the run", 130)
    assert stop.why == f"interrupted at once (SIGINT) during the end of the run: it was not saved; {tmp_path} holds " \
                       "no checkpoint"
    assert stop.fix == f"remove the run's files from {tmp_path} (metrics.jsonl), then run the same command again"


def test_a_second_signal_during_the_first_step_is_no_start_up_interrupt(tmp_path):
    prepared = SimpleNamespace(checked=SimpleNamespace(rundir=SimpleNamespace(path=tmp_path, latest=lambda: None),
                                                       state={"step": 0}),
                               config=SimpleNamespace(train=SimpleNamespace(steps=5)))
    # the first evaluation: no step asked to stop yet (the loop's stop_requested 0)
    assert signal_stop(signal.SIGINT, prepared, 0, None, 0).why.startswith("interrupted during start-up (SIGINT)")
    # the first signal came during step 1 (stop_requested SIGTERM), this second one too
    stop = signal_stop(signal.SIGTERM, prepared, 0, None, signal.SIGTERM)
    assert (stop.where, stop.exit_code) == ("step 1", 143)
    assert stop.why == f"interrupted at once (SIGTERM) during step 1: it was not saved; {tmp_path} holds no checkpoint"
