"""``policyzoo train``: the main job. Rollout with vLLM, training with DeepSpeed, in one process.

``main(config, resume)`` runs, in order: load and check the task, assemble the algorithm, check
the model folder and every prompt's length (all before any model is loaded), start DeepSpeed
(policy, reference only with a ``kl`` component, critic only for baselines that need values)
and then the rollout engine, restore the last checkpoint when resuming, and loop
``train_step`` (``policyzoo.step``) with a weight sync after every optimizer step.
Per-step seeds derive from ``train.seed`` and the step number only, and the prompt stream from the
number of batches drawn, so a resumed run repeats the uninterrupted run exactly (CPU, fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from policyzoo.engine import dist
from policyzoo.engine.process import check_vllm_threads, quiet_libraries, setup_process
from policyzoo.engine.rundir import ResumeError
from policyzoo.errors import Interrupted
from policyzoo.native_bf16 import rollout_dtype_notes
from policyzoo.run_config import load_config

from .gpu_profile import check_planned_gpu, console_lines, set_tf32
from .interrupts import SignalReceived, finished_signals, quiet_teardown, raising_signals, signal_stop
from .loop import RunLoop
from .session import Prepared, prepare, start


def config_from_run_dir(run_dir: str, overrides: list[str] = ()):
    """The config a run was started with (``RUN_DIR/config.yaml``), plus ``key=value`` overrides
    (e.g. ``train.steps=40`` to extend a finished run)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ResumeError(str(run_dir), "not a run directory (no config.yaml)",
                          "pass the folder a previous `policyzoo train` wrote (its --output-dir)")
    return load_config(str(path), None, list(overrides))


def open_run(config, resume: str | None = None, force_resume: bool = False, verbose: bool = False,
             prepared: Callable[[Prepared], None] | None = None) -> RunLoop:
    """Set up the process, run every check and load the models: the loop over the started run's parts
    (what ``policyzoo.Trainer`` drives step by step). ``prepared(checked run)`` is called once the checks
    passed, before any model loads."""
    quiet_libraries(verbose)
    check_planned_gpu(config)  # engine.plan_gpu is for dry runs on a machine without a GPU
    if config.engine.rollout == "vllm":
        check_vllm_threads(config.engine.threads)
    threads = setup_process(config.engine.threads, config.engine.kv_cache_gb)
    ready = prepare(config, resume, force_resume)  # every check; no model loaded yet
    pre, console = ready.checked, ready.console
    if prepared is not None:
        prepared(ready)
    console.print(f"policyzoo train: {pre.run.bundle.name} on {pre.model.path.name}, "
                  f"data {pre.task.name}, {threads} threads -> {pre.rundir.path}")
    # auto's choices, the GPU profile's, the zoo bundle's parts that do nothing at these settings
    for line in rollout_dtype_notes(config) + console_lines(pre) + [f"note: {n}" for n in pre.inert_notes]:
        console.print(line, markup=False, highlight=False)
    set_tf32(config)  # train.tf32 (the GPU profile: on), before any model loads
    return RunLoop(start(ready, verbose), pre.rows_drawn)


def main(config, resume: str | None = None, force_resume: bool = False, verbose: bool = False) -> dict:
    """The whole run, then the process group left (:func:`policyzoo.engine.dist.close`), also after an error.

    A SIGINT or SIGTERM before the first step (the checks, the models loading, the first evaluation)
    raises :class:`~policyzoo.errors.Interrupted` saying that nothing was saved; during the steps the
    loop saves a checkpoint first (:mod:`.interrupts`). Either way the exit is quiet. Once the run has finished
    a signal during the clean-up ends the process with status 0 (:func:`.interrupts.finished_signals`)."""
    seen: list = []  # (the checked run, its step) once the checks passed
    loop = None
    try:
        with raising_signals():
            try:
                loop = open_run(config, resume, force_resume, verbose,
                                lambda p: seen.append((p, p.checked.state["step"])))
                summary = loop.train()
            except SignalReceived as e:
                quiet_teardown()
                asked = 0 if loop is None else loop.stop_requested  # a first signal during a step
                raise signal_stop(e.signum, *(seen[0] if seen else (None, None)), resume, asked) from None
            except Interrupted:  # the loop's stop after a step, with its checkpoint
                quiet_teardown()
                raise
        finished_signals()  # done: a signal during the clean-up exits 0 at once (nothing left to save)
        return summary
    finally:
        if seen:  # the run has ended, however: its folder holds no live run (run.pid names this process only)
            seen[0][0].checked.rundir.release()
        dist.close()
