"""Running the planned trainings as subprocesses (``python -m policyzoo.cli train ...``), N at a time.

Each training runs in its own process group, so a Ctrl-C reaches ``policyzoo compare`` alone, which
then sends every running training one SIGINT: that training finishes its step, saves a checkpoint and
exits (status 130); no further run starts, and :class:`~policyzoo.errors.Interrupted` carries the
command that continues (the same ``policyzoo compare`` again: finished runs are skipped, interrupted
ones resume). A second Ctrl-C sends a second SIGINT (the trainings stop at once) and kills what is
left after 30 s. SIGTERM counts as a Ctrl-C.
A training that fails (any other non-zero status) stops the launching too: the runs
after it would most likely fail the same way. A training that stopped early and said so (its
summary.json has ``"stopped_early": true`` and a ``stop_reason``, whatever its exit status) is not a
failure: its reason is printed, the table shows it, and the other runs go on.

With one run at a time its output is the console's; with several, each writes to
``OUTPUT_DIR/logs/<entry>-seed<s>.log`` and the console gets one line per start and end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from policyzoo.errors import Interrupted, UserError

from .rundirs import read_summary
from .runs import TRAIN, RunSpec, clear

if TYPE_CHECKING:  # rich loads when something is printed, not with `import policyzoo`
    from rich.console import Console


@dataclass
class Job:
    spec: RunSpec
    argv: list[str]
    env: dict
    log: Path | None = None


def jobs_for(specs: list[RunSpec], output_dir, parallel: int, threads: int | None) -> list[Job]:
    """A :class:`Job` per run still to do; with ``threads`` the environment gets ``OMP_NUM_THREADS``."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    out = []
    for s in specs:
        if s.status not in ("new", "resume", "restart"):
            continue
        log = Path(output_dir) / "logs" / f"{s.entry}-seed{s.seed}.log" if parallel > 1 else None
        out.append(Job(s, [*TRAIN, *s.train_args()], env, log))
    return out


def popen(job: Job) -> subprocess.Popen:
    """Start one training (its own process group; output to the console or to ``job.log``)."""
    if job.spec.status == "restart":
        clear(job.spec.path)
    if job.log is None:
        return subprocess.Popen(job.argv, env=job.env, process_group=0)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with open(job.log, "ab") as f:
        return subprocess.Popen(job.argv, env=job.env, stdout=f, stderr=subprocess.STDOUT, process_group=0)


def _tail(path: Path | None, lines: int = 12) -> str:
    if path is None or not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "; its log ends with:\n    " + "\n    ".join(text)


def _stop(running: dict, console: Console) -> None:
    """Ask every running training to stop at its next step boundary; wait (a second Ctrl-C: abort)."""
    for proc in running:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    console.print("Ctrl-C: each running training saves a checkpoint after its current step and stops "
                  "(Ctrl-C again to stop at once)", highlight=False, soft_wrap=True)
    try:
        for proc in running:
            proc.wait()
    except KeyboardInterrupt:
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """SIGTERM (what a scheduler, ``timeout`` or systemd sends) handled as Ctrl-C: the running
    trainings get their SIGINT, save a checkpoint and stop, instead of running on orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(jobs: list[Job], parallel: int, console: Console, again: str,
           start: Callable[[Job], subprocess.Popen] = popen, poll_s: float = 0.2) -> list[tuple[Job, int, float]]:
    with _sigterm_as_ctrl_c():
        return _launch(jobs, parallel, console, again, start, poll_s)


def _launch(jobs: list[Job], parallel: int, console: Console, again: str,
            start: Callable[[Job], subprocess.Popen], poll_s: float) -> list[tuple[Job, int, float]]:
    """Run ``jobs``, at most ``parallel`` at once; returns ``(job, exit status, seconds)`` per run
    that ended. Raises :class:`Interrupted` on Ctrl-C (or a training stopped by SIGINT) and
    :class:`UserError` when a training failed, both with ``again``, the command that continues."""
    pending, running, ended = list(jobs), {}, []
    total, failed, interrupted = len(jobs), None, False
    try:
        while pending or running:
            while pending and len(running) < parallel and failed is None and not interrupted:
                job = pending.pop(0)
                s = job.spec
                console.print(f"[{total - len(pending)}/{total}] {s.entry} seed {s.seed}: {s.status} -> {s.path}"
                              + (f" (log {job.log})" if job.log else ""), highlight=False, soft_wrap=True)
                running[start(job)] = (job, time.monotonic())
            finished = [p for p in running if p.poll() is not None]
            for proc in finished:
                job, t0 = running.pop(proc)
                ended.append((job, proc.returncode, time.monotonic() - t0))
                interrupted = interrupted or proc.returncode == 130
                stopped = stop_reason(job.spec.path) if proc.returncode != 130 else None
                if stopped is not None:
                    console.print(f"{job.spec.entry} seed {job.spec.seed} stopped early: {stopped}; the other runs "
                                  "go on", markup=False, highlight=False, soft_wrap=True, style="yellow")
                elif proc.returncode not in (0, 130) and failed is None:
                    failed = (job, proc.returncode)
                _report(console, ended, len(pending), parallel, total)
            if failed is not None or interrupted:
                pending.clear()
            if not finished:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        interrupted = True
        _stop(running, console)
        ended += [(job, proc.returncode, time.monotonic() - t0) for proc, (job, t0) in running.items()]
    if interrupted or failed is not None:  # the command on one line, to copy (the error block may wrap it)
        console.print(f"to continue: {again}", markup=False, highlight=False, soft_wrap=True)
    if interrupted:
        done = sum(rc == 0 for _, rc, _ in ended)
        raise Interrupted("policyzoo compare", f"stopped by Ctrl-C after {done} of {total} run(s) to do; a stopped "
                          "training saved a checkpoint and resumes from it", again)
    if failed is not None:
        job, rc = failed
        raise UserError(f"run {job.spec.entry} seed {job.spec.seed} ({job.spec.path})",
                        f"`policyzoo train` exited with status {rc}" + (_tail(job.log) if job.log else
                                                                        " (its error is printed above)")
                        + "; no further run was started",
                        f"fix the cause, then run the same command again (finished runs are kept): {again}")
    return ended


def stop_reason(path: Path) -> str | None:
    """``stop_reason`` of the run in ``path`` when its summary.json says it stopped early, else None."""
    summary = read_summary(path)
    if summary is None or summary.get("stopped_early") is not True:
        return None
    return str(summary.get("stop_reason") or "no reason given")


def _report(console: Console, ended: list, pending: int, parallel: int, total: int) -> None:
    job, rc, seconds = ended[-1]
    ok = [t for _, r, t in ended if r == 0]
    line = f"{job.spec.entry} seed {job.spec.seed}: " + ("done" if rc == 0 else f"exit {rc}") + f" in {seconds:.0f} s"
    if rc == 0 and pending:
        line += f"; {len(ended)}/{total} ended, about {sum(ok) / len(ok) * -(-pending // parallel) / 60:.1f} min left"
    console.print(line, highlight=False, soft_wrap=True)
