"""One training run from checks to export (used by :func:`policyzoo.engine.run.train.main`)."""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone

from rich.console import Console

from policyzoo.assembly import Run, resolve_algorithm, resolved_view, reward_uses, step_settings
from policyzoo.catalog import get_catalog
from policyzoo.data import load_task
from policyzoo.engine import dist
from policyzoo.engine.models import resolve_model
from policyzoo.engine.policy import LMPolicy
from policyzoo.engine.process import captured_output
from policyzoo.engine.report.tracking import Tracker, check_trackers
from policyzoo.engine.rollout.engines import HFRollout, VLLMRollout
from policyzoo.engine.rundir import ResumeError, RunDir
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.engine.trainer.dsconfig import check_engine
from policyzoo.errors import ConfigError
from policyzoo.step.episodes import encode_prompt

from .checks import (
    ZeroSignalWatch,
    check_answers,
    check_chat_template,
    filter_bias_warning,
    fit_prompts,
    sampling_warning,
    system_turn_warning,
)
from .loop import RunLoop
from .resume import FINGERPRINT_KEYS, check_resume, old_train_settings, optimizer_notes, rows_drawn
from .startup import Background, process_age_s


class Session(RunLoop):
    """Holds the checked pieces of a run: ``config``, ``task``, ``run`` (components), ``model``
    (a checked folder), ``rundir``; after :meth:`start` also ``trainer``, ``rollout``, ``policy``,
    ``tracker``. ``verbose`` False sends library output while models load to ``RUN_DIR/startup.log``."""

    verbose = False

    @classmethod
    def prepare(cls, config, resume: str | None, force_resume: bool = False) -> "Session":
        self = cls()
        self.console = Console(stderr=True, quiet=dist.rank() != 0, soft_wrap=True)
        self.config = config
        dist.init()  # join the launcher's process group (no-op for one rank)
        if config.train.prompts_per_step % dist.world_size():
            raise ConfigError("train.prompts_per_step", f"{config.train.prompts_per_step} prompts cannot be shared "
                              f"out in whole groups among {dist.world_size()} data-parallel ranks",
                              f"use a multiple of {dist.world_size()}, or launch another number of ranks")
        dist.check_same_catalog(get_catalog())
        self.task = load_task(config.data)
        bundle = resolve_algorithm(config.algorithm)
        rewards = reward_uses(config, self.task.default_rewards, bundle.env is not None)
        self.task_rewards_n = len(rewards)
        self.run = Run(bundle, rewards=rewards)
        check_answers(self.task, self.run)
        if config.engine.overlap != "none" and self.run.env is not None:
            raise ConfigError("engine.overlap", "one_step sampling ahead prefetches single-turn batches; the "
                              f"multi-turn episodes of the env '{self.run.env.name}' are not sampled ahead",
                              "set engine.overlap=none for runs with an env")
        check_trackers(config.train.report_to)
        check_engine(config)  # the DeepSpeed settings, before any model loads
        self.settings = step_settings(config, self.run)
        sp = self.run.sample.params
        self.turn_tokens, self.n = sp.max_tokens, sp.n
        self.max_tokens = self.run.max_response_tokens  # the whole trajectory with an env
        self.model = resolve_model(config.model.path, config.model.trust_remote_code)
        budget = self.model.max_context - self.max_tokens
        if budget < 1:
            key = "algorithm.env.max_total_tokens" if self.run.env is not None else "algorithm.sample.max_tokens"
            raise ConfigError(key, f"{self.max_tokens} response tokens leave no room for a "
                              f"prompt in the model's {self.model.max_context}-token context", f"lower {key}")
        tok = self.model.tokenizer
        check_chat_template(tok, self.task.train_rows + self.task.eval_rows, f"model.path ({self.model.path})")
        self.warnings = [w for w in (system_turn_warning(tok, self.task.train_rows),
                                     sampling_warning(getattr(sp, "temperature", 1.0), self.n),
                                     filter_bias_warning(self.run, config.engine.overlap)) if w]
        count = lambda msgs: len(encode_prompt(self.model.tokenizer, msgs))  # noqa: E731
        env = self.run.env  # an env may start its episodes from another prompt than the row's
        start = (lambda rows: [dict(r, prompt=env.env(r).prompt) for r in rows]) if env else (lambda rows: rows)
        lengths = fit_prompts(self.task, lambda msgs: count(start([{"prompt": msgs}])[0]["prompt"]) if env
                              else count(msgs), budget, config.data.on_long_prompt)
        self.warnings += self.task.warnings
        self.max_model_len = min(self.model.max_context, max(lengths) + self.max_tokens + 8)
        row = (self.task.eval_rows or self.task.train_rows)[0]
        answer = self.model.tokenizer(str(row.get("answer", "")), add_special_tokens=False).input_ids[:self.max_tokens]
        self.check_ids = (encode_prompt(self.model.tokenizer, row["prompt"]) + list(answer)
                          + [self.model.eos_token_ids[0]])[:self.max_model_len]
        self.resolved = resolved_view(config, self.run)
        self.fingerprint = {k: self.resolved[k] for k in FINGERPRINT_KEYS}
        self.fingerprint["algorithm"] = dict(self.fingerprint["algorithm"]["slots"])
        if not self.fingerprint["algorithm"]["term"]["components"]:  # as checkpoints from before the term slot
            del self.fingerprint["algorithm"]["term"]
        if resume:
            self.rundir = RunDir(resume)
            found = self.rundir.latest()
            if found is None:
                raise ResumeError(str(resume), "no complete checkpoint in this run directory",
                                  "start a new run (drop --resume), or set train.save_every to save checkpoints")
            self.resume_from, self.state = found
            for line in check_resume(str(self.resume_from), self.state, config, self.fingerprint,
                                     dist.world_size(), force_resume, str(resume)):
                self.console.print(line, markup=False, highlight=False)
            old_train = old_train_settings(self.state, self.rundir.path)
            self.rows_drawn = rows_drawn(self.state, old_train, config.train.prompts_per_step)
            self.resume_notes = optimizer_notes(old_train, config)
            self.run.load_state_dict(self.state.get("components", {}), str(self.resume_from))
        else:
            out = dist.broadcast(config.output_dir or f"runs/{bundle.name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
            self.rundir = RunDir(out)
            if self.rundir.latest() is not None:
                raise ResumeError(out, "this run directory already holds a run",
                                  "pass --resume to continue it, or choose another --output-dir")
            self.rundir.check_new()
            self.resume_from, self.state, self.rows_drawn, self.resume_notes = None, {"step": 0, "batches": 0}, 0, []
        self.state.setdefault("tokens_seen", 0)
        return self

    def start(self) -> None:
        """Load the models: DeepSpeed first, then the rollout engine in the same process."""
        c = self.config
        for w in self.warnings:
            self.console.print(f"warning: {w}", markup=False, highlight=False, style="yellow")
        t0 = time.perf_counter()
        total = c.train.steps * c.train.updates_per_batch  # optimizer steps of the whole run
        warmup = c.train.warmup_steps or math.ceil(c.train.warmup_ratio * total)
        log = self.rundir.path / "startup.log"
        self.phase(f"loading the model (DeepSpeed; library output goes to {log})")
        early = None
        with captured_output(log, enabled=not self.verbose):
            if c.engine.rollout == "vllm" and c.engine.parallel_start:  # vLLM starts while DeepSpeed initialises
                early = Background(lambda: VLLMRollout(self.model, c.model.dtype, self.max_model_len, c.train.seed,
                                                        c.engine.gpu_memory_utilization))
            self.trainer = Trainer(self.model, dtype=c.model.dtype, zero_stage=c.engine.zero_stage, lr=c.train.lr,
                                   weight_decay=c.train.weight_decay, grad_clip=c.train.grad_clip,
                                   need_ref=self.run.kl is not None,
                                   need_critic=bool(getattr(self.run.baseline, "needs_values", False)),
                                   critic_lr=c.engine.critic_lr or 10 * c.train.lr,
                                   trust_remote_code=c.model.trust_remote_code, share_prompt=c.engine.share_prompt,
                                   lora=c.model.lora, gradient_checkpointing=c.train.gradient_checkpointing,
                                   autocast=c.train.autocast, deepspeed_config=c.engine.deepspeed, seed=c.train.seed,
                                   score_tokens=c.train.max_tokens_per_micro_batch,
                                   betas=(c.train.adam_beta1, c.train.adam_beta2), eps=c.train.adam_epsilon,
                                   schedule=c.train.lr_scheduler_type, warmup_steps=warmup, total_steps=total)
            parts = self.startup_parts = {"trainer_s": time.perf_counter() - t0}
            why = self.trainer.check_share_prompt(self.check_ids)  # the first forward: DeepSpeed loads its op
        if why:
            self.console.print(f"[yellow]warning:[/] {why} (engine.share_prompt)")
        parts["share_prompt_check_s"] = time.perf_counter() - t0 - sum(parts.values())
        self.phase(f"starting the rollout engine ({c.engine.rollout})")
        with captured_output(log, enabled=not self.verbose):
            if early is not None:
                self.rollout = early.result()
            elif c.engine.rollout == "vllm":
                self.rollout = VLLMRollout(self.model, c.model.dtype, self.max_model_len, c.train.seed,
                                           c.engine.gpu_memory_utilization)
            else:
                self.rollout = HFRollout(self.model, c.model.dtype, c.model.trust_remote_code)
        cached = (self.check_ids * (self.max_model_len // len(self.check_ids) + 1))[:self.max_model_len - 1]
        self.policy = LMPolicy(self.rollout, self.trainer, check=c.engine.sync_check, tolerance=c.engine.sync_tolerance,
                               timeout_s=c.engine.sync_timeout_s, check_ids=self.check_ids, cached_ids=cached)
        parts["rollout_engine_s"] = time.perf_counter() - t0 - sum(parts.values())
        self.share = c.train.prompts_per_step // dist.world_size()
        self.policy.first_index = dist.rank() * self.share
        if self.resume_from is not None:
            self.rundir.remove_partial()
            self.trainer.load(str(self.resume_from))
            # the restored optimizer holds the checkpoint's lr / weight decay: use the configured ones
            self.trainer.set_optimizer(lr=c.train.lr, weight_decay=c.train.weight_decay,
                                       critic_lr=c.engine.critic_lr or 10 * c.train.lr,
                                       betas=(c.train.adam_beta1, c.train.adam_beta2), eps=c.train.adam_epsilon)
            for line in self.resume_notes:
                self.console.print(line, markup=False, highlight=False)
            self.policy.sync()
            self.rundir.truncate_metrics(self.state["step"])
            self.console.print(f"resumed from {self.resume_from} (step {self.state['step']})")
        self.rundir.create(c.model_dump(), self.resolved)  # on resume: records the new train.steps etc.
        self.rundir.write_plugins([{"distribution": p.dist, "version": p.version, "module": p.module}
                                   for p in get_catalog().plugins])
        self.tracker = Tracker(self.rundir.path, c.train.report_to, c.model_dump(),
                               self.state["step"] if self.resume_from is not None else None)
        parts["resume_and_run_dir_s"] = time.perf_counter() - t0 - sum(parts.values())
        self.startup_s = time.perf_counter() - t0
        self.process_to_ready_s = process_age_s()
        self.skips, self.last_saved, self.stop_requested = 0, self.state["step"], False
        self.eval_before: dict = {}
        self.watch = ZeroSignalWatch()

    def phase(self, what: str) -> None:
        """Print a start-up phase (rank 0), so a slow start says what it is waiting for."""
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {what} ...", highlight=False)
