"""The training loop over a started run's parts (a :class:`~policyzoo.engine.run.session.RunPart`): one
step, held-out evaluation, checkpoints, the whole run and its end. ``policyzoo.Trainer`` calls these
methods one by one."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

from policyzoo.contract import runstate
from policyzoo.data import rows_at
from policyzoo.engine import dist
from policyzoo.engine.device import gpu_memory_metrics
from policyzoo.engine.report.progress import eval_metric_name, progress_bar, summary_text
from policyzoo.engine.report.tracking import completion_rows
from policyzoo.engine.rollout.tensor_parallel import follow_evaluation
from policyzoo.engine.run.evaluate import evaluate as evaluate_held_out
from policyzoo.errors import Interrupted, UserError
from policyzoo.step import step_seed, train_step

from .batch_sources import batch_source
from .checks import ZeroSignalWatch
from .interrupts import deferred_signals, signal_name
from .resume import write_checkpoint
from .session import RunPart, phase
from .startup import peak_rss_gib, rss_gib, trim_heap
from .stop import RunStopped, SkipWatch
from .summary import print_done, run_summary


def _at_step(error: UserError, step: str) -> None:
    """Put ``step`` (e.g. ``step 3``) before ``error``'s ``where`` (in place: its class and cause are kept)."""
    error.where = f"{step}, {error.where}"
    error.args = (error.render(),)


def logs_completions(step: int, steps: int, every: int) -> bool:
    """Whether step ``step`` (1-based) of ``steps`` writes its completions: every ``every`` steps,
    and the first and the last step (a short run has some); never with ``every`` 0."""
    return bool(every) and (step % every == 0 or step in (1, steps))


class RunLoop:
    """The loop of a started run (``part``: its ``config``, ``task``, ``run``, ``policy``, ``trainer``,
    ``rollout``, ``rundir``, ``tracker``, ``console`` ... and ``state``, the run's counters
    ``{step, batches, tokens_seen}``, which the loop advances in place). ``rows_drawn``: the training rows
    drawn before it (a resumed checkpoint's position; 0 for a new run).

    It owns, made here and nowhere else: ``rows_drawn`` (training rows drawn so far), ``source`` (where
    a step's batch comes from, see :mod:`~policyzoo.engine.run.batch_sources`; ended by :meth:`close`),
    ``skips`` (skipped updates in a row: a :class:`SkipWatch`), ``last_saved`` (the step of the last checkpoint),
    ``stop_requested`` (0, or the number of the SIGINT / SIGTERM that asked to stop after this step),
    ``eval_before`` (the step-0 evaluation record), ``last_eval`` / ``last_accuracy`` (the latest
    evaluation) and ``watch``."""

    def __init__(self, part: RunPart, rows_drawn: int = 0):
        self.part, self.config, self.state = part, part.config, part.state
        self.rows_drawn = rows_drawn
        self.source = batch_source(part)
        self.skips, self.last_saved, self.stop_requested = SkipWatch(self.config.train), self.state["step"], 0
        self.eval_before: dict = {}
        self.last_eval: dict = {}
        self.last_accuracy: float | None = None
        self.watch = ZeroSignalWatch()

    def close(self) -> None:
        """Stop what samples in the background (a later step starts it again)."""
        self.source.stop()

    # ------------------------------------------------------------------ the loop
    def epoch(self) -> float:
        """Passes over the training rows drawn so far (rows drawn / training rows)."""
        return self.rows_drawn / max(len(self.part.task.train_rows), 1)

    def eval_name(self) -> str:
        """``accuracy`` or ``held-out reward``: what ``eval_accuracy`` is for this task's rewards."""
        return eval_metric_name(self.part.run.reward[:self.part.task_rewards_n])

    def next_prompts(self, peek: bool = False) -> list[dict]:
        """This rank's share of the next ``train.prompts_per_step`` rows (P / N whole prompts, the same
        slice every round); drawn (``batches`` and ``rows_drawn`` advance) unless ``peek``."""
        s, P = self.part, self.config.train.prompts_per_step
        rows = rows_at(s.task.train_rows, s.task.seed, self.rows_drawn, P)
        if not peek:
            self.state["batches"], self.rows_drawn = self.state["batches"] + 1, self.rows_drawn + P
        return rows[dist.rank() * s.share:(dist.rank() + 1) * s.share]

    def evaluate(self) -> dict:
        """Held-out accuracy (``eval.n`` responses per prompt at ``eval.temperature``; pass@k, maj@k,
        mean@k) at the current step (rank 0; ``{}`` without held-out rows), logged to
        ``metrics.jsonl`` and the trackers."""
        s, step, ev = self.part, self.state["step"], self.config.eval
        s.policy.weight_sync.before_sampling()  # every rank: a level-2 vLLM without its weights gets them first
        if dist.rank() != 0:  # held-out accuracy is measured once, by rank 0's rollout engine
            follow_evaluation(s.rollout, bool(s.task.eval_rows), ev.n, s.turn_tokens, ev.temperature,
                              self.config.train.seed)  # rank 0's engine is shared with its TP group
            return {}
        t0 = time.perf_counter()
        try:
            with self.source.exclusive():  # engine.max_staleness: its thread pauses meanwhile
                rec = evaluate_held_out(s.rollout, s.run.reward[:s.task_rewards_n], s.task.eval_rows, s.turn_tokens,
                                        env=s.run.env, policy=s.policy, n=ev.n, temperature=ev.temperature,
                                        ks=ev.ks(), pass_threshold=ev.pass_threshold, seed=self.config.train.seed)
        except UserError as e:  # a reward error on a held-out row
            _at_step(e, f"held-out evaluation at step {step}")
            raise
        if rec:
            rec.update(step=step, kind="eval", time_eval=time.perf_counter() - t0)
            s.rundir.log(rec)
            s.tracker.log(rec)
            self.last_accuracy, self.last_eval = rec["eval_accuracy"], rec
            if step == 0:
                self.eval_before = rec
        return rec

    def step(self) -> dict:
        """One training step (sample, reward, update, sync): its merged metrics record, also written to
        ``metrics.jsonl``, the trackers and (every ``train.log_completions_every`` steps) ``completions.jsonl``.
        Raises :class:`RunStopped` (naming the cause) after ``train.max_consecutive_skips`` skips in a row."""
        t = self.config.train
        step = self.state["step"] + 1
        runstate.update(step - 1, t.steps, self.epoch())
        seen: list = []
        counters = self.source.counters()  # sampled ahead: booked to the step that trains on the batch
        t0, lr, stats0 = time.perf_counter(), self.part.trainer.lr(), dict(counters)
        on_batch = seen.append if logs_completions(step, t.steps, t.log_completions_every) else None
        m = self._train_step(step, on_batch)
        delta = {k: counters.get(k, 0) - stats0.get(k, 0) for k in ("tokens", "prompt_tokens", "seconds")}
        self._measure(m, step, t0, delta)
        with dist.phase(f"step {step}, merging the metrics"):
            m = dist.merge_metrics(dist.gather(m))  # every rank holds the merged record
        self._record(m, step, lr)
        if on_batch is not None:
            self._log_completions(step, seen)
        self._check_skips(m, step)
        return m

    def _train_step(self, step: int, on_batch) -> dict:
        """``train_step`` on the source's batch; errors name the step."""
        s = self.part
        ahead = self.source.begin(step, self)
        try:
            m = train_step(s.run, s.policy if ahead is None else ahead.policy, self.next_prompts,
                           seed=step_seed(self.config.train.seed, step), settings=s.settings, on_batch=on_batch,
                           ahead=ahead)
            self.source.after_step(m)
        except UserError as e:  # a reward or component error, a collective timeout: say which step it stopped
            _at_step(e, f"step {step}")
            raise
        except Exception as e:  # a collective failed outside a named phase (e.g. in a component)
            if not dist.is_collective_failure(e):
                raise
            with dist.phase(f"step {step}"):
                raise
        return m

    def _measure(self, m: dict, step: int, t0: float, delta: dict) -> None:
        """Add this rank's time since ``t0`` (``time.perf_counter`` seconds), memory (GiB) and sampling
        counters (``delta``: tokens, prompt tokens and seconds sampled for this step) to step ``step``'s
        record ``m`` (trimming the heap first with ``engine.trim_memory``)."""
        if self.config.engine.trim_memory:
            t_trim = time.perf_counter()
            trim_heap()
            m["time_trim"] = time.perf_counter() - t_trim
        m.update(step=step, kind="train", time_step=time.perf_counter() - t0,
                 rollout_tokens=delta["tokens"], prompt_tokens=delta["prompt_tokens"],
                 stop_requested=int(self.stop_requested), rss_gib=rss_gib(), peak_rss_gib=peak_rss_gib(),
                 **gpu_memory_metrics(),
                 rollout_tokens_per_s=delta["tokens"] / delta["seconds"] if delta["seconds"] > 0 else 0.0)
        rollout = self.part.rollout
        kv = getattr(rollout, "kv_cache_gib", None)  # vLLM on a GPU
        if kv is not None:
            m["gpu_kv_cache_gib"] = kv

    def _record(self, m: dict, step: int, lr: float) -> None:
        """Advance the counters by the merged record ``m`` and log it (metrics.jsonl, trackers)."""
        self.stop_requested = int(m.pop("stop_requested"))  # the signal's number (the ranks' largest), or 0
        self.state["step"] = step
        self.state["tokens_seen"] += int(m["rollout_tokens"] + m["prompt_tokens"])
        m.update(lr=lr, tokens_seen=self.state["tokens_seen"], epoch=self.epoch())
        self.part.rundir.log(m)
        self.part.tracker.log(m)

    def _log_completions(self, step: int, seen: list) -> None:
        """Every rank's rows of ``seen`` (this rank's batch, if any), in rank order, to the trackers."""
        rows = completion_rows(seen[0], self.part.run.reward_labels) if seen else []
        with dist.phase(f"step {step}, gathering the completions"):
            rows = [dict(row, rank=r) if dist.world_size() > 1 else row
                    for r, part in enumerate(dist.gather(rows)) for row in part]
        self.part.tracker.log_completions(step, rows)

    def _check_skips(self, m: dict, step: int) -> None:
        """Warn on zero signal; raise :class:`RunStopped` at ``train.max_consecutive_skips`` skips in a row."""
        if (w := self.watch.update(m)) is not None:
            self.part.warnings.warn(f"step {step}: {w}")
        if (stop := self.skips.update(m, step)) is not None:
            raise stop

    def train(self) -> dict:
        """Run the remaining steps (with checkpoints, exports and evaluations as configured), then
        :meth:`finish`. The first SIGINT / SIGTERM saves a checkpoint and raises :class:`Interrupted`; a
        :class:`RunStopped` is raised after :meth:`finish` has kept the work."""
        steps = self.config.train.steps
        if self.state["step"] == 0 and not self.eval_before:
            phase(self.part.console, "first evaluation (held-out, greedy)")
            self.evaluate()
        try:
            with progress_bar(self.part.console, steps, self.state["step"]) as bar, deferred_signals(self), \
                    self._closed():
                while self.state["step"] < steps:
                    m = self.step()
                    bar.advance(m, self.last_accuracy, self.eval_name(), self.last_eval.get("step"))
                    self._after_step(self.state["step"])
        except RunStopped as stop:  # the stopping step's line (the bar ended with the exception), then why
            line = f"step {self.state['step']}/{steps}  {summary_text(stop.metrics, None)}\nstopping: {stop.reason}"
            self.part.console.print(f"{line}; keeping the work", markup=False, highlight=False)
            self.finish(stop)
            raise
        return self.finish()

    def _after_step(self, step: int) -> None:
        """Stop on request (a checkpoint, then :class:`Interrupted`); else save, export and evaluate
        as configured (the last step's are :meth:`finish`'s)."""
        t, steps = self.config.train, self.config.train.steps
        if self.stop_requested:
            folder = self.save(export=True)
            raise Interrupted(f"step {step}", f"stopped by {signal_name(self.stop_requested)}; checkpoint of step "
                              f"{step} saved in {folder}, with a save_pretrained export of its weights in "
                              f"{folder / 'hf'}", f"policyzoo train --resume {self.part.rundir.path}",
                              self.stop_requested)
        export = bool(t.export_every) and step % t.export_every == 0
        if (export or t.save_every and step % t.save_every == 0) and step < steps:
            self.save(export=export)
        if t.eval_every and step % t.eval_every == 0 and step < steps:
            self.evaluate()

    def finish(self, stop: RunStopped | None = None) -> dict:
        """Save the last checkpoint (unless saved at this step or deleted at the end), evaluate (unless done at
        this step), export ``final/`` (``train.export_final``), write ``summary.json``, delete ``checkpoints/``
        (``engine.delete_checkpoints_at_end``), remove ``run.pid``, close the trackers; returns the summary.
        After a ``stop``: a checkpoint with its ``hf/`` export, kept whatever the settings, no ``final/``, and
        :meth:`RunStopped.kept`."""
        s, step = self.part, self.state["step"]
        lean = self.config.engine.delete_checkpoints_at_end and stop is None
        self.close()
        # (a lean run's last checkpoint is not written: a kill during the last evaluation resumes from an earlier one)
        folder = self.save(export=True) if stop is not None else self.save() if self.last_saved != step and not lean \
            else None
        after = self.last_eval if self.last_eval.get("step") == step else self.evaluate()
        final = s.rundir.path / "final" if stop is None and self.config.train.export_final else None
        if final is not None:
            s.trainer.export(str(final))
        summary = run_summary(s, self, after, stop)
        s.rundir.write_summary(summary)
        if lean and dist.rank() == 0:  # resume needs them no more
            shutil.rmtree(s.rundir.ckpt, ignore_errors=True)
        s.tracker.close()
        s.rundir.release()
        if stop is None:
            print_done(s.console, summary, self.eval_name(), final)
        else:
            stop.kept(summary, folder, step - self.skips.count, self.eval_name())
        return summary

    def first_eval(self) -> float | None:
        """The step-0 held-out accuracy of ``metrics.jsonl`` (a resumed run's); None without one."""
        for r in self.part.rundir.read_metrics():
            if r.get("kind") == "eval" and r.get("step") == 0:
                return r.get("eval_accuracy")
        return None  # nothing held out: null in summary.json, like eval_accuracy_after

    def save(self, export: bool = False) -> Path:
        """A complete checkpoint of the current step (with ``export``: also a save_pretrained export
        in its ``hf/`` folder); returns its folder."""
        step = self.state["step"]
        with dist.phase(f"checkpoint of step {step}"):
            folder = write_checkpoint(self.part, step, self.state["batches"], self.rows_drawn,
                                      self.state.get("tokens_seen", 0), self.source.in_flight(), export)
        self.last_saved = step
        return folder

    @contextlib.contextmanager
    def _closed(self):
        """The source's background sampling ends with the loop, also when a step fails."""
        try:
            yield
        finally:
            self.close()
