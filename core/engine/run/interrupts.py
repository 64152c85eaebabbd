"""SIGINT (Ctrl-C) and SIGTERM (a scheduler's, ``timeout``'s, ``kill``'s) during ``policyzoo train``.

* Start-up (the checks, loading the models, restoring a checkpoint, the first held-out evaluation):
  the first signal stops the run at once. Nothing has been saved by this run, and the message says
  so, naming the signal: ``interrupted during start-up (SIGTERM): nothing to save`` (with ``--resume``:
  the checkpoint being resumed is unchanged) and how to continue.
* Steps: the loop's own handler (:func:`deferred_signals`) asks to
  stop after the current step and saves a checkpoint first; a second signal stops at once, and the
  message names the last checkpoint on disk (:func:`stopped_at_once`).
* The exit status is 128 + the signal's number, the shells' convention: 130 for SIGINT, 143 for
  SIGTERM (:attr:`policyzoo.errors.Interrupted.exit_code`).
* After the end (``summary.json`` written, ``done:`` printed): nothing is left to save, so a signal during the
  clean-up (the engines' teardown at exit, seconds) ends the process at once with status 0, the run's
  (:func:`finished_signals`), not 143.
* The process leaves quietly: libraries built with nanobind (triton's ``libtriton``, which vLLM and
  torch import) print a ``nanobind: leaked ...`` report of ~30 lines at interpreter exit when their
  objects are still alive, as they are after an interrupt. nanobind prints it from its ``Py_AtExit``
  callback, after the ``atexit`` handlers, and triton exposes no switch for it
  (``nanobind::set_leak_warnings`` is C++ only), so :func:`quiet_teardown` points the process's
  stderr at ``/dev/null`` from an ``atexit`` handler, once everything the run says was flushed (the
  same as triton's ``_compile_warmup_pool`` does for its workers).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

from policyzoo.engine.rundir import remove_hint
from policyzoo.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int) -> str:
    """``SIGINT``, ``SIGTERM``, ...: the name the message gives a signal number."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class SignalReceived(KeyboardInterrupt):
    """A SIGINT or SIGTERM turned into an exception (a ``KeyboardInterrupt``, so that code that lets
    Ctrl-C through lets it through too), carrying ``signum``; the CLI exits with 128 + ``signum``."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(signal_name(signum))


@contextlib.contextmanager
def raising_signals():
    """SIGINT and SIGTERM raise :class:`SignalReceived` in the main thread while the block runs (a
    handler installed inside it, the loop's, takes over until it restores this one); the previous
    handlers are restored after. Outside the main thread (where Python cannot install handlers) a
    no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SignalReceived(signum)
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def signal_stop(signum: int, prepared, start: int | None, resume: str | None, asked: int = 0) -> Interrupted:
    """The :class:`Interrupted` of a signal that stopped ``policyzoo train`` at once: at start-up (no
    checked run yet, or still at the step ``start`` it began from, no step asked to stop (``asked``: the
    loop's ``stop_requested``), steps to do) :func:`startup_interrupted`, else :func:`stopped_at_once`.
    ``prepared``: the :class:`~policyzoo.engine.run.session.Prepared` run once its checks passed, else None."""
    pre = None if prepared is None else prepared.checked
    steps = None if prepared is None else prepared.config.train.steps
    if pre is None or (pre.state["step"] == start < steps and not asked):
        return startup_interrupted(signum, pre, resume)
    return stopped_at_once(signum, pre, steps)


def startup_interrupted(signum: int, pre, resume: str | None) -> Interrupted:
    """The :class:`Interrupted` of a signal received before the first step: nothing saved, said with
    the signal's name, what is on disk and how to go on. ``pre``: what the checks made
    (:class:`~policyzoo.engine.run.preload.PreLoad`: its run directory and the checkpoint it resumes)
    once they passed, else None (the checks were still running)."""
    name = signal_name(signum)
    why = f"interrupted during start-up ({name}): nothing to save"
    folder = pre.rundir.path if pre is not None else (resume and str(resume))
    if resume:
        step = pre.state["step"] if pre is not None else None
        kept = f"the checkpoint of step {step} ({pre.resume_from})" if step is not None else "its checkpoint"
        return Interrupted(f"start-up of {folder}", f"{why}; {kept} is unchanged",
                           f"policyzoo train --resume {folder}", signum)
    if pre is not None and (pre.rundir.path / "config.yaml").exists():  # a new run with a folder
        return Interrupted(f"start-up of {folder}", f"{why}; {folder} holds no checkpoint",
                           remove_hint(folder), signum)
    return Interrupted("start-up" if folder is None else f"start-up of {folder}", f"{why} (no step was taken)",
                       "run the same command again", signum)


def stopped_at_once(signum: int, pre, steps: int) -> Interrupted:
    """The :class:`Interrupted` of a signal after the first step that stops the run at once (a second
    one while the loop finishes its step, or one while the run ends; ``steps``: ``train.steps``): what
    it was doing was not saved, and the message names the last complete checkpoint on disk
    (``RUN_DIR/checkpoints/latest.json``) of ``pre``'s run directory, or says there is none, instead of
    the first signal's promise of one."""
    name, folder, step = signal_name(signum), pre.rundir.path, pre.state["step"]
    at = f"step {step + 1}" if step < steps else "the end of the run"
    try:
        found = pre.rundir.latest()
    except Exception:  # noqa: BLE001 - a latest.json naming a missing folder: as if none
        found = None
    why = f"interrupted at once ({name}) during {at}: it was not saved"
    if found is not None:
        return Interrupted(at, f"{why}; the last checkpoint is step {found[1]['step']} ({found[0]})",
                           f"policyzoo train --resume {folder}", signum)
    return Interrupted(at, f"{why}; {folder} holds no checkpoint", remove_hint(folder), signum)


def quiet_teardown() -> None:
    """From now on, the process's exit says nothing more: at exit (an ``atexit`` handler, so after
    whatever the run prints, and before nanobind's leak report) stdout and stderr are flushed and file
    descriptor 2 is pointed at ``/dev/null``. For a run that stops on a signal (see the module
    docstring)."""
    atexit.register(_stderr_to_devnull)


def _stderr_to_devnull() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)


def finished_signals() -> None:
    """The handler once a run has finished: SIGINT or SIGTERM flush stdout and stderr and end the process
    at once with status 0 (``os._exit``: the run's files are complete; what is left is freeing memory, and
    vLLM runs in this process, with no child to leave behind). Outside the main thread a no-op."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)
    for sig in SIGNALS:
        signal.signal(sig, handler)


@contextlib.contextmanager
def deferred_signals(loop):
    """The handler of a run's steps (``loop``: the :class:`~policyzoo.engine.run.loop.RunLoop`): the first
    SIGINT (Ctrl-C) or SIGTERM (a scheduler's, ``timeout``'s) asks the loop to stop after the current step,
    save a checkpoint and exit (every rank stops at the same step: the request, the signal's number, is
    merged with the step's metrics in ``loop.stop_requested``); a second one interrupts at once
    (:class:`SignalReceived`). Outside the main thread it installs nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if loop.stop_requested:
            raise SignalReceived(signum)
        loop.stop_requested = signum
        loop.part.console.print(f"{signal_name(signum)}: stopping after this step and saving a checkpoint "
                                   "(a second SIGINT or SIGTERM stops at once, without one)")
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
