"""The training progress bar: steps done, time left, and the live reward."""

from __future__ import annotations

import contextlib

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class _Bar:
    def __init__(self, progress: Progress, task):
        self.progress, self.task = progress, task

    def advance(self, m: dict) -> None:
        info = (f"reward {m.get('reward_mean', float('nan')):.3f}  len {m.get('response_length_mean', 0):.0f}  "
                f"{m.get('rollout_tokens_per_s', 0):.0f} tok/s")
        self.progress.update(self.task, advance=1, info=info)


@contextlib.contextmanager
def progress_bar(console, total: int, done: int):
    """``with progress_bar(console, steps, start) as bar: bar.advance(metrics)``."""
    progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console)
    with progress:
        task = progress.add_task("train", total=total, completed=done, info="")
        yield _Bar(progress, task)
