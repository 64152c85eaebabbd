"""Training progress: a live bar on a terminal, one line per step otherwise.

On a terminal (rich decides: ``console.is_terminal``) a bar shows steps done, time elapsed and
left, and the last step's ``reward`` (``reward_mean``), the latest held-out evaluation with the
step it was taken at (``accuracy 0.25 (last eval, step 10)``: the value is measured only at the
evaluations, before the first step, every ``train.eval_every`` steps and after the last; named
``held-out reward`` when the task's reward is not one 0/1 correctness check: see
``eval_metric_name``), mean response length and rollout speed. Without one (a log file, a job
scheduler) each step prints one line with the same numbers, its time and the ETA: the mean step
time of this session so far x the steps left; the held-out value only on the first line after each
evaluation (a log of 20 steps does not repeat step 0's value 20 times). Numbers are rounded (3
significant digits for the reward, 2 decimals for the held-out value).
"""

from __future__ import annotations

import contextlib
import math
import time
from datetime import timedelta

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def summary_text(m: dict, accuracy: float | None, label: str = "accuracy", at: int | None = None) -> str:
    """``reward 0.423  accuracy 0.25 (last eval, step 10)  len 12  1540 tok/s``: the held-out value of the
    latest evaluation (``label``) and its step ``at`` (left out before any evaluation or when None); then
    ``unscorable 2 (math_verify)`` when rows got a NaN reward (``unscorable_rows``, with the components
    whose ``unscorable/<label>`` counts them) and ``skipped`` (``skipped (nothing kept)`` when the filters
    kept no row: then the reward is the sampled rows' mean, ``reward 0.5 (sampled)``, and no length is shown,
    since no row was trained on)."""
    reward = m.get("reward_mean", math.nan)
    if not math.isfinite(reward) and math.isfinite(m.get("reward_mean_sampled", math.nan)):
        # nothing kept (no row trained): the mean over the rows sampled, said as such (not ``nan``)
        parts = [f"reward {m['reward_mean_sampled']:.3g} (sampled)"]
    else:
        parts = [f"reward {reward:.3g}"]
    if accuracy is not None and math.isfinite(accuracy):
        parts.append(f"{label} {accuracy:.2f}" + (f" (last eval, step {at})" if at is not None else ""))
    if m.get("rows", 1):  # the kept rows' mean length: none kept, none to show (not ``len 0``)
        parts.append(f"len {m.get('response_length_mean', 0):.0f}")
    parts.append(f"{m.get('rollout_tokens_per_s', 0):.0f} tok/s")
    if m.get("unscorable_rows"):  # NaN rewards: those rows train on nothing; the reward components that gave them
        named = [k.removeprefix("unscorable/") for k in m if k.startswith("unscorable/") and m[k]]
        parts.append(f"unscorable {m['unscorable_rows']:.0f}" + (f" ({', '.join(named)})" if named else ""))
    if m.get("skipped"):
        parts.append("skipped" + (" (nothing kept)" if str(m.get("skip_reason", "")).startswith("no rows kept")
                                  else ""))
    return "  ".join(parts)


def eta(seconds_per_step: float, steps_left: int) -> str:
    """``H:MM:SS`` for ``steps_left`` steps of ``seconds_per_step`` (whole seconds, rounded)."""
    return str(timedelta(seconds=round(seconds_per_step * steps_left)))


class _Bar:
    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task

    def advance(self, m: dict, accuracy: float | None = None, label: str = "accuracy", at: int | None = None) -> None:
        self.progress.update(self.task, advance=1, info=summary_text(m, accuracy, label, at))


class _Lines:
    def __init__(self, console, total: int, done: int):
        self.console, self.total, self.done = console, total, done
        self.first, self.t0 = done, time.perf_counter()
        self.shown_at = None  # the step of the evaluation last printed

    def advance(self, m: dict, accuracy: float | None = None, label: str = "accuracy", at: int | None = None) -> None:
        if at is not None and at == self.shown_at:
            accuracy = None  # printed on an earlier line: a log line shows a held-out value once
        elif at is not None and accuracy is not None:
            self.shown_at = at
        self.done += 1
        per_step = (time.perf_counter() - self.t0) / (self.done - self.first)
        self.console.print(f"step {self.done}/{self.total}  {summary_text(m, accuracy, label, at)}  "
                           f"{m.get('time_step', per_step):.1f} s/step  ETA {eta(per_step, self.total - self.done)}",
                           highlight=False, markup=False, soft_wrap=True)


@contextlib.contextmanager
def progress_bar(console, total: int, done: int):
    """``with progress_bar(console, steps, start) as bar: bar.advance(metrics, accuracy)``."""
    if not console.is_terminal:
        yield _Lines(console, total, done)
        return
    progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console)
    with progress:
        task = progress.add_task("train", total=total, completed=done, info="")
        yield _Bar(progress, task)


#: what the held-out value is (summary.json's ``eval_metric_definition``, docs/usage.md, ``--help``)
EVAL_DEFINITION = ("the mean over the held-out rows of the task's summed reward (sum of weight x reward over the "
                   "task's reward functions) of one greedy completion per row")


def eval_metric_name(rewards) -> str:
    """``accuracy`` when the task's reward is one correctness check (``needs_answer``, 0/1, weight
    1), else ``held-out reward`` (e.g. a reward function or a sum of several rewards)."""
    if len(rewards) == 1 and getattr(rewards[0], "needs_answer", False) \
            and float(getattr(getattr(rewards[0], "params", None), "weight", 1.0)) == 1.0:
        return "accuracy"
    return "held-out reward"
