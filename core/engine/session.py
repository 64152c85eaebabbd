"""One training run from checks to export (used by :func:`policyzoo.engine.train.main`)."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from datetime import datetime, timezone

from rich.console import Console

from ..errors import ConfigError, Interrupted, TrainingError, UserError
from . import dist
from .checks import ZeroSignalWatch, check_chat_template, sampling_warning, system_turn_warning
from .resume import FINGERPRINT_KEYS, check_resume, checkpoint_state, old_train_settings, optimizer_notes, rows_drawn
from .rundir import ResumeError, RunDir
from .startup import Background, peak_rss_gib, process_age_s

SEED_STRIDE = 1_000_003


def _at_step(error: UserError, step: str) -> None:
    """Put ``step`` (e.g. ``step 3``) before ``error``'s ``where`` (in place: its class and cause are kept)."""
    error.where = f"{step}, {error.where}"
    error.args = (error.render(),)


class Session:
    """Holds the checked pieces of a run: ``config``, ``task``, ``run`` (components), ``model``
    (a checked folder), ``rundir``; after :meth:`start` also ``trainer``, ``rollout``, ``policy``."""

    @classmethod
    def prepare(cls, config, resume: str | None, force_resume: bool = False) -> "Session":
        from ..assembly import Run, resolve_algorithm, resolved_view
        from ..config import reward_uses, step_settings
        from ..data import check_prompt_lengths, load_task
        from .models import encode_prompt, resolve_model

        self = cls()
        self.console = Console(stderr=True, quiet=dist.rank() != 0)
        self.config = config
        dist.init()  # join the launcher's process group (no-op for one rank)
        if config.train.prompts_per_step % dist.world_size():
            raise ConfigError("train.prompts_per_step", f"{config.train.prompts_per_step} prompts cannot be shared "
                              f"out in whole groups among {dist.world_size()} data-parallel ranks",
                              f"use a multiple of {dist.world_size()}, or launch another number of ranks")
        from ..catalog import get_catalog

        dist.check_same_catalog(get_catalog())
        self.task = load_task(config.data)
        bundle = resolve_algorithm(config.algorithm)
        rewards = reward_uses(config, self.task.default_rewards, bundle.env is not None)
        self.task_rewards_n = len(rewards)
        self.run = Run(bundle, rewards=rewards)
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
                                     sampling_warning(getattr(sp, "temperature", 1.0), self.n)) if w]
        count = lambda msgs: len(encode_prompt(self.model.tokenizer, msgs))  # noqa: E731
        env = self.run.env  # an env may start its episodes from another prompt than the row's
        start = (lambda rows: [dict(r, prompt=env.env(r).prompt) for r in rows]) if env else (lambda rows: rows)
        lengths = check_prompt_lengths(start(self.task.train_rows), count, budget, "data (training rows)",
                                       self.task.train_origins)
        lengths += check_prompt_lengths(start(self.task.eval_rows), count, budget, "data (held-out rows)",
                                        self.task.eval_origins)
        self.max_model_len = min(self.model.max_context, max(lengths) + self.max_tokens + 8)
        row = (self.task.eval_rows or self.task.train_rows)[0]
        answer = self.model.tokenizer(str(row.get("answer", "")), add_special_tokens=False).input_ids[:self.max_tokens]
        self.check_ids = (encode_prompt(self.model.tokenizer, row["prompt"]) + list(answer)
                          + [self.model.eos_token_ids[0]])[:self.max_model_len]
        self.resolved = resolved_view(config, self.run)
        self.fingerprint = {k: self.resolved[k] for k in FINGERPRINT_KEYS}
        self.fingerprint["algorithm"] = self.fingerprint["algorithm"]["slots"]
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
        else:
            out = dist.broadcast(config.output_dir or f"runs/{bundle.name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
            self.rundir = RunDir(out)
            if self.rundir.latest() is not None:
                raise ResumeError(out, "this run directory already holds a run",
                                  "pass --resume to continue it, or choose another --output-dir")
            self.rundir.check_new()
            self.resume_from, self.state, self.rows_drawn, self.resume_notes = None, {"step": 0, "batches": 0}, 0, []
        return self

    def start(self) -> None:
        """Load the models: DeepSpeed first, then the rollout engine in the same process."""
        from .policy import LMPolicy
        from .rollout import HFRollout, VLLMRollout
        from .trainer import Trainer

        c = self.config
        for w in self.warnings:
            self.console.print(f"warning: {w}", markup=False, highlight=False, style="yellow")
        t0 = time.perf_counter()
        early = None
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
                               score_tokens=c.train.max_tokens_per_micro_batch)
        parts = self.startup_parts = {"trainer_s": time.perf_counter() - t0}
        why = self.trainer.check_share_prompt(self.check_ids)
        if why:
            self.console.print(f"[yellow]warning:[/] {why} (engine.share_prompt)")
        parts["share_prompt_check_s"] = time.perf_counter() - t0 - sum(parts.values())
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
                                       critic_lr=c.engine.critic_lr or 10 * c.train.lr)
            for line in self.resume_notes:
                self.console.print(line, markup=False, highlight=False)
            self.policy.sync()
            self.rundir.truncate_metrics(self.state["step"])
            self.console.print(f"resumed from {self.resume_from} (step {self.state['step']})")
        self.rundir.create(c.model_dump(), self.resolved)  # on resume: records the new train.steps etc.
        from ..catalog import get_catalog

        self.rundir.write_plugins([{"distribution": p.dist, "version": p.version, "module": p.module}
                                   for p in get_catalog().plugins])
        parts["resume_and_run_dir_s"] = time.perf_counter() - t0 - sum(parts.values())
        self.startup_s = time.perf_counter() - t0
        self.process_to_ready_s = process_age_s()

    # ------------------------------------------------------------------ the loop
    def _evaluate(self, step: int) -> dict:
        from .evaluate import evaluate

        if dist.rank() != 0:  # held-out accuracy is measured once, by rank 0's rollout engine
            return {}
        t0 = time.perf_counter()
        try:
            rec = evaluate(self.rollout, self.run.reward[:self.task_rewards_n], self.task.eval_rows, self.turn_tokens,
                           env=self.run.env, policy=self.policy)
        except UserError as e:  # a reward error on a held-out row
            _at_step(e, f"held-out evaluation at step {step}")
            raise
        if rec:
            rec.update(step=step, kind="eval", time_eval=time.perf_counter() - t0)
            self.rundir.log(rec)
        return rec

    def train(self) -> dict:
        from ..data import rows_at
        from ..step import train_step
        from .progress import progress_bar

        c = self.config
        steps, start = c.train.steps, self.state["step"]
        P = c.train.prompts_per_step
        batches, self.rows_drawn = self.state["batches"], self.rows_drawn

        def next_prompts(peek: bool = False):  # this rank's share: P / N whole prompts, the same slice every round
            nonlocal batches
            rows = rows_at(self.task.train_rows, self.task.seed, self.rows_drawn, P)
            if not peek:
                batches, self.rows_drawn = batches + 1, self.rows_drawn + P
            return rows[dist.rank() * self.share:(dist.rank() + 1) * self.share]

        overlap = None
        if c.engine.overlap == "one_step":
            from .overlap import OverlapPolicy, overlapped_step

            overlap = OverlapPolicy(self.policy, c.engine.max_policy_lag)
        before = self._evaluate(0) if start == 0 else {}
        skips, last_saved, watch = 0, start, ZeroSignalWatch()
        self.stop_requested = False
        with progress_bar(self.console, steps, start) as bar, self._deferred_sigint():
            for step in range(start + 1, steps + 1):
                t0 = time.perf_counter()
                tok0, sec0 = self.policy.stats["tokens"], self.policy.stats["seconds"]
                try:
                    if overlap is None:
                        m = train_step(self.run, self.policy, next_prompts, seed=c.train.seed * SEED_STRIDE + step,
                                       settings=self.settings)
                    else:
                        m = overlapped_step(self, overlap, step, next_prompts)
                except UserError as e:  # a reward or component error: say which step it stopped
                    _at_step(e, f"step {step}")
                    raise
                toks, secs = self.policy.stats["tokens"] - tok0, self.policy.stats["seconds"] - sec0
                m.update(step=step, kind="train", time_step=time.perf_counter() - t0, rollout_tokens=toks,
                         rollout_tokens_per_s=toks / secs if secs > 0 else 0.0,
                         stop_requested=int(self.stop_requested))
                m = dist.merge_metrics(dist.gather(m))  # every rank holds the merged record
                stop = bool(m.pop("stop_requested"))
                self.rundir.log(m)
                skips = skips + 1 if m.get("skipped") else 0
                if (w := watch.update(m)) is not None:
                    self.console.print(f"warning: step {step}: {w}", markup=False, highlight=False, style="yellow")
                if skips >= c.train.max_consecutive_skips:
                    raise TrainingError(f"step {step}", f"{skips} optimizer steps in a row were skipped (last reason: "
                                        f"{m.get('skip_reason', 'non-finite loss or gradient')}); no weights were "
                                        "written by them; the last checkpoint holds the last good weights",
                                        "lower train.lr, check the reward components for NaN/inf, or raise "
                                        "train.max_consecutive_skips")
                bar.advance(m)
                if stop:
                    folder = self._save(step, batches, export=True)
                    raise Interrupted(f"step {step}", f"stopped by Ctrl-C; checkpoint of step {step} saved in "
                                      f"{folder}, with a save_pretrained export of its weights in {folder / 'hf'}",
                                      f"continue with `policyzoo train --resume {self.rundir.path}`")
                export = bool(c.train.export_every) and step % c.train.export_every == 0
                if (export or c.train.save_every and step % c.train.save_every == 0) and step < steps:
                    self._save(step, batches, export=export)
                    last_saved = step
                if c.train.eval_every and step % c.train.eval_every == 0 and step < steps:
                    self._evaluate(step)
        if last_saved != steps:
            self._save(steps, batches)
        after = self._evaluate(steps)
        self.trainer.export(str(self.rundir.path / "final"))
        summary = {"steps": steps, "algorithm": self.run.bundle.name, "model": str(self.model.path),
                   "eval_accuracy_before": before.get("eval_accuracy", self._first_eval()),
                   "eval_accuracy_after": after.get("eval_accuracy"), "startup_seconds": self.startup_s,
                   "startup_parts": self.startup_parts, "process_to_ready_seconds": self.process_to_ready_s,
                   "models_loaded": self.trainer.models_loaded(), "trainable_params": self.trainer.trainable_params,
                   "peak_rss_gib": peak_rss_gib(), "zero_stage": self.trainer.stage,
                   "rollout": self.config.engine.rollout,
                   "run_dir": str(self.rundir.path)}
        self.rundir.write_summary(summary)
        self.console.print(f"done: held-out accuracy {summary['eval_accuracy_before']} -> "
                           f"{summary['eval_accuracy_after']}; export in {self.rundir.path / 'final'}")
        return summary

    @contextlib.contextmanager
    def _deferred_sigint(self):
        """The first Ctrl-C (SIGINT) asks the loop to stop after the current step, save a
        checkpoint and exit (every rank stops at the same step: the request is merged with the
        step's metrics); a second Ctrl-C interrupts at once."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            if self.stop_requested:
                raise KeyboardInterrupt
            self.stop_requested = True
            self.console.print("Ctrl-C: stopping after this step and saving a checkpoint (again to abort)")
        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _first_eval(self):
        for r in self.rundir.read_metrics():
            if r.get("kind") == "eval" and r.get("step") == 0:
                return r.get("eval_accuracy")
        return math.nan

    def _save(self, step: int, batches: int, export: bool = False):
        """Write the checkpoint of ``step`` (with ``export``: also a save_pretrained export in
        its ``hf/`` folder); returns the checkpoint folder."""
        if not self.trainer.weights_finite():  # never write NaN/inf weights over a good checkpoint
            latest = self.rundir.latest()
            raise TrainingError(f"step {step}", "the trained weights hold NaN or inf values; no checkpoint was "
                                f"written (last complete checkpoint: {latest[0] if latest else 'none'})",
                                "lower train.lr or train.grad_clip, then resume from the last checkpoint")
        state = checkpoint_state(step, self.rows_drawn, batches, self.fingerprint, self.config, dist.world_size())
        return self.rundir.save_checkpoint(self.trainer, step, state, self.config.engine.keep_checkpoints, export)

