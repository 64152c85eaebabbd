"""The training loop of a :class:`~policyzoo.engine.run.session.Session`: one step, held-out evaluation,
checkpoints, the whole run and its end. ``policyzoo.Trainer`` calls these methods one by one."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from pathlib import Path

from policyzoo.contract import runstate
from policyzoo.data import rows_at
from policyzoo.engine import dist
from policyzoo.engine.ahead.async_sampler import AsyncAhead, AsyncSampler, discarded_at_resume, merge_in_flight
from policyzoo.engine.ahead.overlap import OverlapAhead, OverlapPolicy
from policyzoo.engine.device import gpu_memory_metrics
from policyzoo.engine.report.progress import EVAL_DEFINITION, eval_metric_name, progress_bar
from policyzoo.engine.report.tracking import completion_rows
from policyzoo.engine.rollout.tensor_parallel import follow_evaluation
from policyzoo.engine.run.evaluate import evaluate as evaluate_held_out
from policyzoo.errors import Interrupted, TrainingError, UserError
from policyzoo.step import dispatch, round_seed, step_seed, train_step

from .resume import checkpoint_state
from .startup import peak_rss_gib, rss_gib, trim_heap


def _at_step(error: UserError, step: str) -> None:
    """Put ``step`` (e.g. ``step 3``) before ``error``'s ``where`` (in place: its class and cause are kept)."""
    error.where = f"{step}, {error.where}"
    error.args = (error.render(),)


def logs_completions(step: int, steps: int, every: int) -> bool:
    """Whether step ``step`` (1-based) of ``steps`` writes its completions: every ``every`` steps,
    and the first and the last step (a short run has some); never with ``every`` 0."""
    return bool(every) and (step % every == 0 or step in (1, steps))


class RunLoop:
    """The loop half of :class:`~policyzoo.engine.run.session.Session` (which sets the attributes it reads:
    ``config``, ``task``, ``run``, ``policy``, ``trainer``, ``rollout``, ``rundir``, ``tracker``, ``state``)."""

    # ------------------------------------------------------------------ the loop
    def epoch(self) -> float:
        """Passes over the training rows drawn so far (rows drawn / training rows)."""
        return self.rows_drawn / max(len(self.task.train_rows), 1)

    def eval_name(self) -> str:
        """``accuracy`` or ``held-out reward``: what ``eval_accuracy`` is for this task's rewards."""
        return eval_metric_name(self.run.reward[:getattr(self, "task_rewards_n", len(self.run.reward))])

    def evaluate(self) -> dict:
        """Held-out accuracy (``eval.n`` responses per prompt at ``eval.temperature``; pass@k, maj@k,
        mean@k) at the current step (rank 0; ``{}`` without held-out rows), logged to
        ``metrics.jsonl`` and the trackers."""
        step = self.state["step"]
        ev = self.config.eval
        if dist.rank() != 0:  # held-out accuracy is measured once, by rank 0's rollout engine
            follow_evaluation(self.rollout, bool(self.task.eval_rows), ev.n, self.turn_tokens, ev.temperature,
                              self.config.train.seed)  # rank 0's engine is shared with its TP group
            return {}
        t0 = time.perf_counter()
        sampler = getattr(self, "sampler", None)  # engine.max_staleness: its thread pauses meanwhile
        try:
            with sampler.exclusive() if sampler is not None else contextlib.nullcontext():
                rec = evaluate_held_out(self.rollout, self.run.reward[:self.task_rewards_n], self.task.eval_rows,
                                        self.turn_tokens, env=self.run.env, policy=self.policy, n=ev.n,
                                        temperature=ev.temperature, ks=ev.ks(), pass_threshold=ev.pass_threshold,
                                        seed=self.config.train.seed)
        except UserError as e:  # a reward error on a held-out row
            _at_step(e, f"held-out evaluation at step {step}")
            raise
        if rec:
            rec.update(step=step, kind="eval", time_eval=time.perf_counter() - t0)
            self.rundir.log(rec)
            self.tracker.log(rec)
            self.last_accuracy, self.last_eval = rec["eval_accuracy"], rec
            if step == 0:
                self.eval_before = rec
        return rec

    def step(self) -> dict:
        """One training step (sample, reward, update, sync): its merged metrics record, also written
        to ``metrics.jsonl``, the trackers and (every ``train.log_completions_every`` steps)
        ``completions.jsonl``. Raises :class:`TrainingError` after ``train.max_consecutive_skips``
        skipped updates in a row."""
        c = self.config
        step, P = self.state["step"] + 1, c.train.prompts_per_step

        def next_prompts(peek: bool = False):  # this rank's share: P / N whole prompts, the same slice every round
            rows = rows_at(self.task.train_rows, self.task.seed, self.rows_drawn, P)
            if not peek:
                self.state["batches"], self.rows_drawn = self.state["batches"] + 1, self.rows_drawn + P
            return rows[dist.rank() * self.share:(dist.rank() + 1) * self.share]

        runstate.update(step - 1, c.train.steps, self.epoch())
        every = c.train.log_completions_every
        seen: list = []
        if c.engine.overlap == "one_step" and getattr(self, "overlap", None) is None:
            self.overlap = OverlapPolicy(self.policy, c.engine.max_policy_lag)
        if c.engine.max_staleness and getattr(self, "sampler", None) is None:
            self.sampler = self._async_sampler()
        # sampling counters: sampled ahead, booked to the step that trains on the batch
        counters = (self.overlap.stats if c.engine.overlap == "one_step" else
                    self.sampler.stats if c.engine.max_staleness else self.policy.stats)
        t0, lr, stats0 = time.perf_counter(), self.trainer.lr(), dict(counters)
        on_batch = seen.append if logs_completions(step, c.train.steps, every) else None
        if c.engine.overlap == "one_step":  # nothing sampled ahead crosses a checkpoint, an evaluation or the end
            boundary = any(every and step % every == 0 for every in (c.train.save_every, c.train.eval_every))
            ahead = OverlapAhead(self.run, self.overlap).begin(
                step_seed(c.train.seed, step + 1) if step < c.train.steps and not boundary else None, next_prompts)
        elif c.engine.max_staleness:
            ahead = AsyncAhead(self.sampler).begin(step, self.rows_drawn)
        else:
            ahead = None
        try:
            m = train_step(self.run, self.policy if ahead is None else ahead.policy, next_prompts,
                           seed=step_seed(c.train.seed, step), settings=self.settings, on_batch=on_batch, ahead=ahead)
            if c.engine.max_staleness:
                m.update(getattr(self, "async_discarded", {}))
                self.async_discarded = {}
        except UserError as e:  # a reward or component error, a collective timeout: say which step it stopped
            _at_step(e, f"step {step}")
            raise
        except Exception as e:  # a collective failed outside a named phase (e.g. in a component)
            if not dist.is_collective_failure(e):
                raise
            with dist.phase(f"step {step}"):
                raise
        if c.engine.trim_memory:
            t_trim = time.perf_counter()
            trim_heap()
            m["time_trim"] = time.perf_counter() - t_trim
        delta = {k: counters.get(k, 0) - stats0.get(k, 0) for k in ("tokens", "prompt_tokens", "seconds")}
        m.update(step=step, kind="train", time_step=time.perf_counter() - t0, rollout_tokens=delta["tokens"],
                 prompt_tokens=delta["prompt_tokens"], stop_requested=int(self.stop_requested),
                 rss_gib=rss_gib(), peak_rss_gib=peak_rss_gib(), **gpu_memory_metrics(),
                 rollout_tokens_per_s=delta["tokens"] / delta["seconds"] if delta["seconds"] > 0 else 0.0)
        if getattr(self.rollout, "kv_cache_gib", None) is not None:  # vLLM on a GPU
            m["gpu_kv_cache_gib"] = self.rollout.kv_cache_gib
        with dist.phase(f"step {step}, merging the metrics"):
            m = dist.merge_metrics(dist.gather(m))  # every rank holds the merged record
        self.stop_requested = bool(m.pop("stop_requested"))
        self.state["step"] = step
        self.state["tokens_seen"] += int(m["rollout_tokens"] + m["prompt_tokens"])
        m.update(lr=lr, tokens_seen=self.state["tokens_seen"], epoch=self.epoch())
        self.rundir.log(m)
        self.tracker.log(m)
        if on_batch is not None:  # every rank's rows, in rank order (a rank that kept none sends none)
            rows = completion_rows(seen[0], self.run.reward_labels) if seen else []
            with dist.phase(f"step {step}, gathering the completions"):
                rows = [dict(row, rank=r) if dist.world_size() > 1 else row
                        for r, part in enumerate(dist.gather(rows)) for row in part]
            self.tracker.log_completions(step, rows)
        self.skips = self.skips + 1 if m.get("skipped") else 0
        if (w := self.watch.update(m)) is not None:
            self.warn(f"step {step}: {w}")
        if self.skips >= c.train.max_consecutive_skips:
            raise TrainingError(f"step {step}", f"{self.skips} optimizer steps in a row were skipped (last reason: "
                                f"{m.get('skip_reason', 'non-finite loss or gradient')}); no weights were "
                                "written by them; the last checkpoint holds the last good weights",
                                "lower train.lr, check the reward components for NaN/inf, or raise "
                                "train.max_consecutive_skips")
        return m

    def train(self) -> dict:
        """Run the remaining steps (with checkpoints, exports and evaluations as configured), then
        :meth:`finish`. The first Ctrl-C saves a checkpoint and raises :class:`Interrupted`."""
        c = self.config
        steps = c.train.steps
        if self.state["step"] == 0 and not self.eval_before:
            self.phase("first evaluation (held-out, greedy)")
            self.evaluate()
        with progress_bar(self.console, steps, self.state["step"]) as bar, self._deferred_sigint(), \
                self._sampler_stopped():
            while self.state["step"] < steps:
                m = self.step()
                step = self.state["step"]
                bar.advance(m, getattr(self, "last_accuracy", None), self.eval_name(),
                            getattr(self, "last_eval", {}).get("step"))
                if self.stop_requested:
                    folder = self.save(export=True)
                    raise Interrupted(f"step {step}", f"stopped by Ctrl-C; checkpoint of step {step} saved in "
                                      f"{folder}, with a save_pretrained export of its weights in {folder / 'hf'}",
                                      f"policyzoo train --resume {self.rundir.path}")
                export = bool(c.train.export_every) and step % c.train.export_every == 0
                if (export or c.train.save_every and step % c.train.save_every == 0) and step < steps:
                    self.save(export=export)
                if c.train.eval_every and step % c.train.eval_every == 0 and step < steps:
                    self.evaluate()
        return self.finish()

    def finish(self) -> dict:
        """Save the last checkpoint (unless saved at this step), evaluate (unless done at this step),
        export ``final/``, write ``summary.json`` and close the trackers; returns the summary."""
        step = self.state["step"]
        self._stop_sampler()
        if self.last_saved != step:
            self.save()
        last = getattr(self, "last_eval", {})
        after = last if last.get("step") == step else self.evaluate()
        self.trainer.export(str(self.rundir.path / "final"))
        summary = {"steps": step, "algorithm": self.run.bundle.name, "model": str(self.model.path),
                   "eval_accuracy_before": self.eval_before.get("eval_accuracy", self._first_eval()),
                   "eval_accuracy_after": after.get("eval_accuracy"),
                   "eval_after": {k[5:]: v for k, v in after.items() if k.startswith(("eval_pass@", "eval_maj@",
                                                                                       "eval_mean@"))},
                   "startup_seconds": self.startup_s,
                   "startup_parts": self.startup_parts, "process_to_ready_seconds": self.process_to_ready_s,
                   "preload_seconds": getattr(self, "preload_s", None),
                   "prompt_counts": getattr(self, "prompt_counts", {}),
                   "tokens_seen": self.state["tokens_seen"],
                   "models_loaded": self.trainer.models_loaded(), "trainable_params": self.trainer.trainable_params,
                   "peak_rss_gib": peak_rss_gib(), "zero_stage": self.trainer.stage,
                   "rollout": self.config.engine.rollout, "share_prompt": self.trainer.share_prompt,
                   "share_prompt_check": self.trainer.share_prompt_check, "run_dir": str(self.rundir.path),
                   "warnings": list(getattr(self, "warned", [])),
                   "eval_metric": self.eval_name(), "eval_metric_definition": EVAL_DEFINITION,
                   **{k: v for k, v in after.items() if k.startswith("eval_accuracy/")},  # per task (_task rows)
                   **{k.replace("eval_accuracy/", "eval_accuracy_before/"): v for k, v in self.eval_before.items()
                      if k.startswith("eval_accuracy/")}}
        self.rundir.write_summary(summary)
        self.tracker.close()
        acc = [summary["eval_accuracy_before"], summary["eval_accuracy_after"]]
        acc = [f"{a:.2f}" if isinstance(a, float) and math.isfinite(a) else "n/a" for a in acc]
        self.console.print(f"done: held-out {self.eval_name().removeprefix('held-out ')} {acc[0]} -> {acc[1]}; "
                           f"export in {self.rundir.path / 'final'}")
        return summary

    def save(self, export: bool = False) -> Path:
        """A complete checkpoint of the current step (with ``export``: also a save_pretrained export
        in its ``hf/`` folder); returns its folder."""
        with dist.phase(f"checkpoint of step {self.state['step']}"):
            folder = self._save(self.state["step"], self.state["batches"], export=export)
        self.last_saved = self.state["step"]
        return folder

    @contextlib.contextmanager
    def _deferred_sigint(self):
        """The first Ctrl-C (SIGINT) or SIGTERM (a scheduler's, ``timeout``'s) asks the loop to stop
        after the current step, save a checkpoint and exit (every rank stops at the same step: the
        request is merged with the step's metrics); a second one interrupts at once."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            if self.stop_requested:
                raise KeyboardInterrupt
            self.stop_requested = True
            what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            self.console.print(f"{what}: stopping after this step and saving a checkpoint (Ctrl-C again to abort)")
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def _first_eval(self):
        for r in self.rundir.read_metrics():
            if r.get("kind") == "eval" and r.get("step") == 0:
                return r.get("eval_accuracy")
        return None  # nothing held out: null in summary.json, like eval_accuracy_after

    def _save(self, step: int, batches: int, export: bool = False):
        """Write the checkpoint of ``step`` (with ``export``: also a save_pretrained export in
        its ``hf/`` folder); returns the checkpoint folder."""
        if not self.trainer.weights_finite():  # never write NaN/inf weights over a good checkpoint
            latest = self.rundir.latest()
            raise TrainingError(f"step {step}", "the trained weights hold NaN or inf values; no checkpoint was "
                                f"written (last complete checkpoint: {latest[0] if latest else 'none'})",
                                "lower train.lr or train.grad_clip, then resume from the last checkpoint")
        state = checkpoint_state(step, self.rows_drawn, batches, self.fingerprint, self.config, dist.world_size(),
                                 self.trainer.schedule_state())
        state["tokens_seen"] = getattr(self, "state", {}).get("tokens_seen", 0)
        run = getattr(self, "run", None)  # controllers' state (e.g. an adaptive KL coefficient)
        state["components"] = run.state_dict() if run is not None else {}
        if getattr(self, "sampler", None) is not None:  # sampled ahead, on every rank: not in the checkpoint
            state["async_in_flight"] = merge_in_flight(dist.gather(self.sampler.in_flight()))
        return self.rundir.save_checkpoint(self.trainer, step, state, self.config.engine.keep_checkpoints, export)

    # ------------------------------------------------------------------ engine.max_staleness
    def _async_sampler(self) -> AsyncSampler:
        """The background sampler of ``engine.max_staleness`` (started at the first step). A resumed
        run reports what was sampled ahead of its checkpoint and is sampled again now (a console
        line; ``async_discarded_batches`` / ``async_discarded_rows`` on the first step)."""
        c, P, sp = self.config, self.config.train.prompts_per_step, self.run.sample.params

        def plan(step: int, cursor: int):  # the prompts and seed of the step's first round at ``cursor``
            rows = rows_at(self.task.train_rows, self.task.seed, cursor, P)
            return (rows[dist.rank() * self.share:(dist.rank() + 1) * self.share],
                    round_seed(step_seed(c.train.seed, step), 0))

        def sample(policy, prompts, seed):
            return dispatch.call(self.run, "sample", rows=len(prompts) * (sp.n + sp.greedy), policy=policy,
                                 prompts=prompts, seed=seed, env=self.run.env)

        self.async_discarded, line = discarded_at_resume(self.state)
        if line:
            self.console.print(line, markup=False, highlight=False)
        return AsyncSampler(self.policy, c.engine.max_staleness, sample, plan, stride=P, last_step=c.train.steps,
                            version=self.state["step"])

    def _stop_sampler(self) -> None:
        if getattr(self, "sampler", None) is not None:
            self.sampler.stop()
            self.sampler = None

    @contextlib.contextmanager
    def _sampler_stopped(self):
        """The sampler's thread ends with the loop, also when a step fails."""
        try:
            yield
        finally:
            self._stop_sampler()
