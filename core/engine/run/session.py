"""One training run's parts, checked (:func:`prepare`: no model loaded) and then started (:func:`start`: the
models loaded, a :class:`RunPart`, which :class:`~policyzoo.engine.run.loop.RunLoop` runs)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from policyzoo.catalog import get_catalog
from policyzoo.config_sections import critic_lr
from policyzoo.engine import dist
from policyzoo.engine.lm_policy import LMPolicy
from policyzoo.engine.process import captured_output
from policyzoo.engine.report.tracking import Tracker
from policyzoo.engine.rollout.hf import HFRollout
from policyzoo.engine.rollout.server import ServerRollout
from policyzoo.engine.rollout.tensor_parallel import GroupRollout, start_rollout
from policyzoo.engine.rollout.vllm_engine import VLLMRollout
from policyzoo.engine.sync import WeightSync, cached_prefix, sync_mean_tolerance, sync_tolerance
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.step import needs_reference

from .preload import PreLoad, preload
from .startup import Background, freeze_heap, process_age_s

if TYPE_CHECKING:
    from policyzoo.assembly import Run
    from policyzoo.data.task import Task
    from policyzoo.engine.models import ModelInfo
    from policyzoo.engine.rundir import RunDir
    from policyzoo.run_config import Config
    from policyzoo.step import StepSettings

#: the rollout engines ``engine.rollout`` names (vLLM: one per rank, or a rank's share of a tensor-parallel group);
#: each satisfies the protocol :class:`~policyzoo.engine.rollout.engine_base.RolloutEngine`
ChosenRollout = VLLMRollout | GroupRollout | ServerRollout | HFRollout


@dataclass(frozen=True)
class Prepared:
    """A run whose every check passed and no model is loaded yet: its ``config``, the ``console`` (rank 0
    prints), what the checks made (``checked``) and their seconds (``preload_s``)."""

    config: Config
    console: Console
    checked: PreLoad
    preload_s: float


class Warnings:
    """The one channel of a run's warnings: the ``warning:`` block on the console (rank 0), a line in
    ``RUN_DIR/startup.log`` and an entry of ``summary.json``'s ``warnings`` list (:attr:`given`)."""

    def __init__(self, console: Console, rundir: RunDir):
        self.console, self.rundir = console, rundir
        self.given: list[str] = []

    def warn(self, text: str) -> None:
        self.given.append(text)
        self.console.print(f"warning: {text}", markup=False, highlight=False, style="yellow")
        if dist.rank() == 0 and self.rundir.path.is_dir():
            with open(self.rundir.path / "startup.log", "a", encoding="utf-8") as f:
                f.write(f"warning: {text}\n")


@dataclass(frozen=True)
class Startup:
    """How long the run took to be ready (s): the checks (``preload_s``), the start after them (``seconds``,
    the sum of ``parts``), and the process's age when ready (``process_to_ready_s``; None where unknown)."""

    preload_s: float | None
    seconds: float
    parts: dict[str, float]
    process_to_ready_s: float | None


@dataclass(frozen=True)
class RunPart:
    """The parts of a started run, made by :func:`start` and nowhere else: ``config``, ``console``, the ``task``
    (its rows), ``run`` (the components), the step's ``settings``, the ``model`` folder, the run directory
    ``rundir``, the ``trainer`` (DeepSpeed), the ``rollout`` engine, the ``policy`` joining them (with its
    :class:`~policyzoo.engine.sync.WeightSync`), the ``tracker``, ``share`` (this rank's prompts per
    step), the checkpoint ``fingerprint``, the task's own rewards (``task_rewards_n``), the response tokens of
    a turn (``turn_tokens``), the prompt-length count (``prompt_counts``), the ``warnings`` channel and the
    ``startup`` times. ``state``, the run's counters ``{step, batches, tokens_seen}``, is the one mutable
    part: the loop advances it in place."""

    config: Config
    console: Console
    task: Task
    run: Run
    settings: StepSettings
    model: ModelInfo
    rundir: RunDir
    state: dict
    trainer: Trainer
    rollout: ChosenRollout
    policy: LMPolicy
    tracker: Tracker
    share: int
    fingerprint: dict
    task_rewards_n: int
    turn_tokens: int
    prompt_counts: dict
    warnings: Warnings
    startup: Startup


def prepare(config: Config, resume: str | None, force_resume: bool = False) -> Prepared:
    """Join the launcher's process group and run every check before weights load (``preload``;
    raises its :class:`~policyzoo.errors.UserError`); no model is loaded yet."""
    freeze_heap()  # the imports' objects: out of every later full collection's scan
    console = Console(stderr=True, quiet=dist.rank() != 0, soft_wrap=True)
    dist.init(config.engine.collective_timeout_s)  # join the launcher's process group (no-op for one rank)
    t0 = time.perf_counter()
    pre = preload(config, resume, force_resume)  # every check before weights load (also --dry-run's)
    preload_s = time.perf_counter() - t0
    for line in pre.resume_lines:
        console.print(line, markup=False, highlight=False)
    pre.state.setdefault("tokens_seen", 0)
    return Prepared(config, console, pre, preload_s)


def start(prepared: Prepared, verbose: bool = False) -> RunPart:
    """Load the models (DeepSpeed first, then the rollout engine in the same process), restore the
    checkpoint when resuming, open the run directory and the trackers: the run's parts. ``verbose``
    False sends library output while models load to ``RUN_DIR/startup.log``."""
    c, console, pre = prepared.config, prepared.console, prepared.checked
    warnings = Warnings(console, pre.rundir)
    for w in pre.warnings:
        warnings.warn(w)
    freeze_heap()  # what the checks loaded (transformers, the tokenizer, the data)
    t0, parts = time.perf_counter(), {}
    log = pre.rundir.path / "startup.log"
    trainer, early = _start_trainer(c, console, pre, warnings, log, verbose, parts, t0)
    rollout = _start_rollout(c, console, pre, log, verbose, early)
    weight_sync = _weight_sync(c, pre, rollout, trainer)
    policy = LMPolicy(rollout, trainer, weight_sync)
    policy.first_index = dist.rank() * (c.train.prompts_per_step // dist.world_size())
    _book(parts, "rollout_engine_s", t0)
    if pre.resume_from is None and c.engine.rollout == "server":  # a server may hold other weights
        weight_sync.sync()
    if pre.resume_from is not None:
        _restore(c, console, pre, trainer, weight_sync)
    tracker = _open_run_dir(c, pre)
    now = time.perf_counter()  # one reading: the parts add up to the start's seconds exactly
    parts["resume_and_run_dir_s"] = now - t0 - sum(parts.values())
    return RunPart(config=c, console=console, task=pre.task, run=pre.run, settings=pre.settings, model=pre.model,
                   rundir=pre.rundir, state=pre.state, trainer=trainer, rollout=rollout, policy=policy,
                   tracker=tracker, share=c.train.prompts_per_step // dist.world_size(), fingerprint=pre.fingerprint,
                   task_rewards_n=pre.task_rewards_n, turn_tokens=pre.turn_tokens, prompt_counts=pre.prompt_counts,
                   warnings=warnings, startup=Startup(prepared.preload_s, now - t0, parts, process_age_s()))


def phase(console: Console, what: str) -> None:
    """Print a start-up phase (rank 0), so a slow start says what it is waiting for."""
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {what} ...", highlight=False)


def _book(parts: dict[str, float], name: str, t0: float) -> None:
    """Book the seconds since ``t0`` not booked yet to the start-up part ``name``."""
    parts[name] = time.perf_counter() - t0 - sum(parts.values())


def _rollout_dtype(c: Config) -> str:
    return c.engine.rollout_dtype or c.model.dtype  # bf16 sampling with fp32 training


def _vllm_options(c: Config) -> dict:
    """vLLM's ``fp32_head`` (its logits in fp32 over bf16 weights, as the fp32 trainer computes them:
    ``engine.fp32_lm_head``) and ``limits`` (``max_num_seqs`` / ``max_num_batched_tokens``,
    ``engine.vllm_max_num_*``; None: vLLM's defaults)."""
    e = c.engine
    return {"fp32_head": e.fp32_lm_head and c.model.dtype == "float32" and _rollout_dtype(c) != "float32",
            "limits": {"max_num_seqs": e.vllm_max_num_seqs, "max_num_batched_tokens": e.vllm_max_num_batched_tokens}}


def _start_trainer(c: Config, console: Console, pre: PreLoad, warnings: Warnings, log: Path, verbose: bool,
                   parts: dict[str, float], t0: float) -> tuple[Trainer, Background | None]:
    """The DeepSpeed trainer (policy; reference, critic as the components need), its first forward
    (the ``engine.share_prompt`` check); vLLM starting meanwhile with ``engine.parallel_start``
    (returned, to join)."""
    early, plan = None, pre.lr_plan
    phase(console, f"loading the model (DeepSpeed; library output goes to {log})")
    with captured_output(log, enabled=not verbose):
        if c.engine.rollout == "vllm" and c.engine.parallel_start:  # vLLM starts while DeepSpeed initialises
            early = Background(lambda: VLLMRollout(pre.model, _rollout_dtype(c), pre.max_model_len, c.train.seed,
                                                    c.engine.gpu_memory_utilization, c.engine.vllm_sleep,
                                                    compile_cpu=c.engine.vllm_compile, **_vllm_options(c)))
        trainer = Trainer(pre.model, c.model, c.train, c.engine, need_ref=needs_reference(pre.run),
                          need_critic=bool(getattr(pre.run.baseline, "needs_values", False)),
                          ref_path=None if pre.teacher is None else str(pre.teacher.path), lr_plan=plan)
        _book(parts, "trainer_s", t0)
        why = trainer.check_share_prompt(pre.check_ids)  # the first forward: DeepSpeed loads its op
    if why:
        warnings.warn(f"{why} (engine.share_prompt)")
    _book(parts, "share_prompt_check_s", t0)
    return trainer, early


def _start_rollout(c: Config, console: Console, pre: PreLoad, log: Path, verbose: bool,
                   early: Background | None) -> ChosenRollout:
    """The rollout engine ``engine.rollout`` names: vLLM (started early, or now; a rank's share of a
    tensor-parallel group's engine with k > 1, tensor_parallel.py), a rollout server or HF generate."""
    dtype = _rollout_dtype(c)
    freeze_heap(collect=True)  # the trainer's models; their loading's dead cycles freed first
    compiled = c.engine.rollout == "vllm" and c.engine.vllm_compile and early is None
    phase(console, f"starting the rollout engine ({c.engine.rollout})" + (
        "; its compiled forward takes ~2 min at the first start with these settings, seconds once cached"
        if compiled else ""))
    with captured_output(log, enabled=not verbose):
        if early is not None:
            rollout = early.result()
        elif c.engine.rollout == "server":  # the weight groups form here; the first push follows in start()
            rollout = ServerRollout(pre.model, pre.servers, c.engine.server_timeout_s, c.engine.sync_timeout_s)
        elif c.engine.rollout == "vllm":
            o = _vllm_options(c)
            rollout = start_rollout(pre.model, dtype, pre.max_model_len, c.train.seed,
                                    c.engine.gpu_memory_utilization, c.engine.vllm_sleep,
                                    c.engine.vllm_tensor_parallel_size, c.engine.vllm_compile, o["fp32_head"],
                                    o["limits"])
        else:
            rollout = HFRollout(pre.model, dtype, c.model.trust_remote_code)
    for line in getattr(rollout, "notes", list)():  # vLLM sharded over ranks: its layout
        console.print(line, markup=False, highlight=False)
    return rollout


def _weight_sync(c: Config, pre: PreLoad, rollout: ChosenRollout, trainer: Trainer) -> WeightSync:
    """The run's weight sync (``engine.sync_check``, ``engine.sync_tolerance``, ``engine.sync_timeout_s``)
    from the trainer into the rollout engine, checked on the held-out row's tokens."""
    dtype = _rollout_dtype(c)
    return WeightSync(rollout, trainer, check=c.engine.sync_check,
                      tolerance=sync_tolerance(c.model.dtype, c.engine.sync_tolerance, dtype),
                      mean_tolerance=sync_mean_tolerance(c.model.dtype, c.engine.sync_tolerance, dtype),
                      timeout_s=c.engine.sync_timeout_s, check_ids=pre.check_ids,
                      cached_ids=cached_prefix(pre.check_ids, pre.max_model_len))


def _restore(c: Config, console: Console, pre: PreLoad, trainer: Trainer, weight_sync: WeightSync) -> None:
    """Load the checkpoint being resumed (weights, optimizer with the configured lr / weight decay,
    schedule), push its weights into the rollout engine and cut ``metrics.jsonl`` after its step."""
    pre.rundir.remove_partial()
    trainer.load(str(pre.resume_from))
    trainer.set_schedule(pre.lr_plan)  # the checkpoint's schedule, kept or re-planned
    # the restored optimizer holds the checkpoint's lr / weight decay: use the configured ones
    trainer.set_optimizer(lr=c.train.lr, weight_decay=c.train.weight_decay,
                          critic_lr=critic_lr(c.engine, c.train),
                          betas=(c.train.adam_beta1, c.train.adam_beta2), eps=c.train.adam_epsilon)
    for line in pre.resume_notes:
        console.print(line, markup=False, highlight=False)
    weight_sync.sync()
    pre.rundir.truncate_metrics(pre.state["step"])
    console.print(f"resumed from {pre.resume_from} (step {pre.state['step']})")


def _open_run_dir(c: Config, pre: PreLoad) -> Tracker:
    """Write the run directory's config, resolved algorithm and plugins; start the trackers."""
    pre.rundir.create(c.model_dump(), pre.resolved)  # on resume: records the new train.steps etc.
    pre.rundir.write_plugins([{"distribution": p.dist, "version": p.version, "module": p.module}
                              for p in get_catalog().plugins])
    return Tracker(pre.rundir.path, c.train.report_to, c.model_dump(),
                   pre.state["step"] if pre.resume_from is not None else None)
