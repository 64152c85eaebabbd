"""One training run from checks to export (used by :func:`policyzoo.engine.run.train.main`)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from policyzoo.catalog import get_catalog
from policyzoo.engine import dist
from policyzoo.engine.policy import LMPolicy
from policyzoo.engine.process import captured_output
from policyzoo.engine.report.tracking import Tracker
from policyzoo.engine.rollout.engines import VLLMRollout
from policyzoo.engine.rollout.hf import HFRollout
from policyzoo.engine.rollout.server import ServerRollout
from policyzoo.engine.rollout.tensor_parallel import start_rollout
from policyzoo.engine.sync.check import sync_mean_tolerance, sync_tolerance
from policyzoo.engine.sync.push import WeightSync, cached_prefix
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.step import needs_reference

from .loop import RunLoop
from .preload import preload
from .startup import Background, freeze_heap, process_age_s


class Session:
    """The checked pieces of a run and the loop that runs it.

    After :meth:`prepare`: ``config``, ``console``, ``verbose`` and what the checks made (the fields of
    :class:`~policyzoo.engine.run.preload.PreLoad`: ``task``, ``run`` (components), ``settings``, ``model``
    (a checked folder), ``rundir``, ``state`` (the run's counters), ...; ``preload_s`` their seconds).
    After :meth:`start` also ``trainer``, ``rollout``, ``policy``, ``tracker``, ``share`` (this rank's
    prompts per step), the start-up times and ``loop`` (a :class:`~policyzoo.engine.run.loop.RunLoop`),
    which :meth:`step`, :meth:`evaluate`, :meth:`save`, :meth:`train` and :meth:`finish` drive.
    ``verbose`` False sends library output while models load to ``RUN_DIR/startup.log``."""

    def __init__(self, config, console: Console, pre, preload_s: float | None = None, verbose: bool = False):
        self.config, self.console, self.preload_s, self.verbose = config, console, preload_s, verbose
        vars(self).update({k: v for k, v in vars(pre).items() if k not in ("resume_lines", "rows_drawn")})
        self.rows_at_start: int = pre.rows_drawn  # the loop's rows_drawn when it is made
        self.state.setdefault("tokens_seen", 0)
        self.trainer = self.rollout = self.policy = self.tracker = self.loop = None
        self.share = config.train.prompts_per_step // dist.world_size()
        self.warned: list[str] = []
        self.startup_parts: dict = {}
        self.startup_s = self.process_to_ready_s = None

    @classmethod
    def prepare(cls, config, resume: str | None, force_resume: bool = False) -> "Session":
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
        return cls(config, console, pre, preload_s)

    # ------------------------------------------------------------------ start-up, in phases
    def start(self) -> None:
        """Load the models (DeepSpeed first, then the rollout engine in the same process), restore the
        checkpoint when resuming, open the run directory and the trackers, and make the loop."""
        for w in self.warnings:
            self.warn(w)
        freeze_heap()  # what the checks loaded (transformers, the tokenizer, the data)
        t0 = time.perf_counter()
        log = self.rundir.path / "startup.log"
        early = self._start_trainer(log, t0)
        self._start_rollout(log, early)
        self._part("rollout_engine_s", t0)
        if self.resume_from is None and self.config.engine.rollout == "server":  # a server may hold other weights
            self.policy.sync()
        if self.resume_from is not None:
            self._restore()
        self._open_run_dir()
        now = time.perf_counter()  # one reading: the parts add up to startup_s exactly
        self.startup_parts["resume_and_run_dir_s"] = now - t0 - sum(self.startup_parts.values())
        self.startup_s = now - t0
        self.process_to_ready_s = process_age_s()
        self.loop = RunLoop(self, self.rows_at_start)

    def _part(self, name: str, t0: float) -> None:
        """Book the seconds since ``t0`` not booked yet to the start-up part ``name``."""
        self.startup_parts[name] = time.perf_counter() - t0 - sum(self.startup_parts.values())

    def _rollout_dtype(self) -> str:
        return self.config.engine.rollout_dtype or self.config.model.dtype  # bf16 sampling with fp32 training

    def _fp32_head(self) -> bool:
        """vLLM's logits in fp32 over its bf16 weights, as the fp32 trainer computes them (``engine.fp32_lm_head``)."""
        return self.config.engine.fp32_lm_head and self.config.model.dtype == "float32" \
            and self._rollout_dtype() != "float32"

    def _limits(self) -> dict:
        """vLLM's ``max_num_seqs`` / ``max_num_batched_tokens`` (``engine.vllm_max_num_*``; None: vLLM's defaults)."""
        e = self.config.engine
        return {"max_num_seqs": e.vllm_max_num_seqs, "max_num_batched_tokens": e.vllm_max_num_batched_tokens}

    def _start_trainer(self, log: Path, t0: float) -> Background | None:
        """The DeepSpeed trainer (policy; reference, critic as the components need), its first forward
        (the ``engine.share_prompt`` check); vLLM starting meanwhile with ``engine.parallel_start``
        (returned, to join)."""
        c, early, baseline = self.config, None, self.run.baseline
        self.phase(f"loading the model (DeepSpeed; library output goes to {log})")
        with captured_output(log, enabled=not self.verbose):
            if c.engine.rollout == "vllm" and c.engine.parallel_start:  # vLLM starts while DeepSpeed initialises
                early = Background(lambda: VLLMRollout(self.model, self._rollout_dtype(), self.max_model_len,
                                                        c.train.seed, c.engine.gpu_memory_utilization,
                                                        c.engine.vllm_sleep, compile_cpu=c.engine.vllm_compile,
                                                        fp32_head=self._fp32_head(), limits=self._limits()))
            self.trainer = Trainer(self.model, dtype=c.model.dtype, zero_stage=c.engine.zero_stage, lr=c.train.lr,
                                   weight_decay=c.train.weight_decay, grad_clip=c.train.grad_clip,
                                   need_ref=needs_reference(self.run),
                                   ref_path=None if self.teacher is None else str(self.teacher.path),
                                   need_critic=bool(getattr(baseline, "needs_values", False)),
                                   critic_lr=c.engine.critic_lr or 10 * c.train.lr,
                                   trust_remote_code=c.model.trust_remote_code, share_prompt=c.engine.share_prompt,
                                   lora=c.model.lora, gradient_checkpointing=c.train.gradient_checkpointing,
                                   autocast=c.train.autocast, deepspeed_config=c.engine.deepspeed, seed=c.train.seed,
                                   score_tokens=c.train.max_tokens_per_micro_batch,
                                   betas=(c.train.adam_beta1, c.train.adam_beta2), eps=c.train.adam_epsilon,
                                   schedule=self.lr_plan["name"], warmup_steps=self.lr_plan["warmup_steps"],
                                   total_steps=self.lr_plan["total_steps"])
            self._part("trainer_s", t0)
            why = self.trainer.check_share_prompt(self.check_ids)  # the first forward: DeepSpeed loads its op
        if why:
            self.warn(f"{why} (engine.share_prompt)")
        self._part("share_prompt_check_s", t0)
        return early

    def _start_rollout(self, log: Path, early: Background | None) -> None:
        """The rollout engine (``engine.rollout``: vLLM, a server or HF generate) and the policy that
        samples from it and syncs the trainer's weights into it."""
        c, dtype = self.config, self._rollout_dtype()
        freeze_heap(collect=True)  # the trainer's models; their loading's dead cycles freed first
        compiled = c.engine.rollout == "vllm" and c.engine.vllm_compile and early is None
        self.phase(f"starting the rollout engine ({c.engine.rollout})" + (
            "; its compiled forward takes ~2 min at the first start with these settings, seconds once cached"
            if compiled else ""))
        with captured_output(log, enabled=not self.verbose):
            if early is not None:
                self.rollout = early.result()
            elif c.engine.rollout == "server":  # the weight groups form here; the first push follows below
                self.rollout = ServerRollout(self.model, self.servers, c.engine.server_timeout_s,
                                             c.engine.sync_timeout_s)
            elif c.engine.rollout == "vllm":  # k > 1: this rank's share of a group's engine (tensor_parallel.py)
                self.rollout = start_rollout(self.model, dtype, self.max_model_len, c.train.seed,
                                             c.engine.gpu_memory_utilization, c.engine.vllm_sleep,
                                             c.engine.vllm_tensor_parallel_size, c.engine.vllm_compile,
                                             self._fp32_head(), self._limits())
            else:
                self.rollout = HFRollout(self.model, dtype, c.model.trust_remote_code)
        rollout = self.rollout
        for line in getattr(rollout, "notes", list)():  # vLLM sharded over ranks: its layout
            self.console.print(line, markup=False, highlight=False)
        weight_sync = WeightSync(self.rollout, self.trainer, check=c.engine.sync_check,
                                 tolerance=sync_tolerance(c.model.dtype, c.engine.sync_tolerance, dtype),
                                 mean_tolerance=sync_mean_tolerance(c.model.dtype, c.engine.sync_tolerance, dtype),
                                 timeout_s=c.engine.sync_timeout_s, check_ids=self.check_ids,
                                 cached_ids=cached_prefix(self.check_ids, self.max_model_len))
        self.policy = LMPolicy(self.rollout, self.trainer, weight_sync)
        self.policy.first_index = dist.rank() * self.share

    def _restore(self) -> None:
        """Load the checkpoint being resumed (weights, optimizer with the configured lr / weight decay,
        schedule), push its weights into the rollout engine and cut ``metrics.jsonl`` after its step."""
        c = self.config
        self.rundir.remove_partial()
        self.trainer.load(str(self.resume_from))
        self.trainer.set_schedule(self.lr_plan)  # the checkpoint's schedule, kept or re-planned
        # the restored optimizer holds the checkpoint's lr / weight decay: use the configured ones
        self.trainer.set_optimizer(lr=c.train.lr, weight_decay=c.train.weight_decay,
                                   critic_lr=c.engine.critic_lr or 10 * c.train.lr,
                                   betas=(c.train.adam_beta1, c.train.adam_beta2), eps=c.train.adam_epsilon)
        for line in self.resume_notes:
            self.console.print(line, markup=False, highlight=False)
        self.policy.sync()
        self.rundir.truncate_metrics(self.state["step"])
        self.console.print(f"resumed from {self.resume_from} (step {self.state['step']})")

    def _open_run_dir(self) -> None:
        """Write the run directory's config, resolved algorithm and plugins; start the trackers."""
        c = self.config
        self.rundir.create(c.model_dump(), self.resolved)  # on resume: records the new train.steps etc.
        self.rundir.write_plugins([{"distribution": p.dist, "version": p.version, "module": p.module}
                                   for p in get_catalog().plugins])
        self.tracker = Tracker(self.rundir.path, c.train.report_to, c.model_dump(),
                               self.state["step"] if self.resume_from is not None else None)

    # ------------------------------------------------------------------ the loop's, driven from here
    @property
    def rows_drawn(self) -> int:
        """Training rows drawn so far: the loop's (the resumed checkpoint's position before :meth:`start`)."""
        return self.rows_at_start if self.loop is None else self.loop.rows_drawn

    def step(self) -> dict:
        """One training step: :meth:`RunLoop.step`."""
        return self.loop.step()

    def evaluate(self) -> dict:
        """Held-out evaluation now: :meth:`RunLoop.evaluate`."""
        return self.loop.evaluate()

    def save(self, export: bool = False) -> Path:
        """A checkpoint of the current step: :meth:`RunLoop.save`."""
        return self.loop.save(export)

    def train(self) -> dict:
        """The remaining steps, then the end: :meth:`RunLoop.train`."""
        return self.loop.train()

    def finish(self) -> dict:
        """The end (checkpoint, evaluation, export, summary): :meth:`RunLoop.finish`."""
        return self.loop.finish()

    # ------------------------------------------------------------------ the console
    def warn(self, text: str) -> None:
        """The one channel of a run's warnings: the ``warning:`` block on the console (rank 0), a
        line in ``RUN_DIR/startup.log`` and an entry of ``summary.json``'s ``warnings`` list."""
        self.warned.append(text)
        self.console.print(f"warning: {text}", markup=False, highlight=False, style="yellow")
        if dist.rank() == 0 and self.rundir.path.is_dir():
            with open(self.rundir.path / "startup.log", "a", encoding="utf-8") as f:
                f.write(f"warning: {text}\n")

    def phase(self, what: str) -> None:
        """Print a start-up phase (rank 0), so a slow start says what it is waiting for."""
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {what} ...", highlight=False)
