"""Checks of the task against the rewards and the model's context, made in
:meth:`Session.prepare <policyzoo.engine.session.Session.prepare>` before any model loads."""

from __future__ import annotations

from typing import Callable

from ..errors import DataError


def check_answers(task, run) -> None:
    """Prompt-only data (``task.missing_answer`` set) with a reward that compares completions with
    the reference answer (``needs_answer``: ``answer_match``, ``math_verify``) raises
    :class:`DataError`; rewards that need none (``reward_model``, ``function``) go on."""
    needing = [c.name for c in run.reward if getattr(c, "needs_answer", False)]
    if task.missing_answer is not None and needing:
        e = task.missing_answer
        raise DataError(e.where, f"{e.why}; the reward {', '.join(needing)} compares completions with it",
                        f"{e.fix}, or use rewards that need no answer (a reward_model, a function)")


def fit_prompts(task, count: Callable[[list[dict]], int], budget: int, on_long: str) -> list[int]:
    """Keep the rows whose prompt fits in ``budget`` tokens (``data.on_long_prompt``: ``drop`` adds a
    warning with the counts to ``task.warnings``; ``error`` raises naming the first long row by its
    origin); returns the kept rows' prompt lengths. Raises :class:`DataError` when no training row
    is left."""
    from ..data import fit_prompt_lengths

    task.train_rows, lengths, task.train_origins, dropped = fit_prompt_lengths(
        task.train_rows, count, budget, "data (training rows)", on_long, task.train_origins)
    task.eval_rows, more, task.eval_origins, dropped_eval = fit_prompt_lengths(
        task.eval_rows, count, budget, "data (held-out rows)", on_long, task.eval_origins)
    if dropped or dropped_eval:
        task.warnings.append(f"dropped {dropped} training and {dropped_eval} held-out rows whose prompt is longer "
                             f"than the {budget} tokens the context leaves for it (data.on_long_prompt: drop; set "
                             "it to error to stop instead)")
    if not task.train_rows:
        raise DataError("data", f"every training prompt is longer than the {budget} tokens the context leaves for "
                        "it", "shorten the prompts, lower data.few_shot or algorithm.sample.max_tokens")
    return lengths + more
