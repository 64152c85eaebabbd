"""The held-out rows of a data file: a separate file or split, or ``eval_size`` rows held out by distinct
prompt (rows repeating a held-out prompt leave training), and the error of a file that leaves no training
row. The rules are stated in :mod:`policyzoo.data.task`, which calls :func:`held_out`."""

from __future__ import annotations

import json
import random
from typing import Callable

from policyzoo.errors import ConfigError, DataError

from .data_section import DataSettings, name_of
from .readers import read_path
from .rows import check_rows


def nothing_to_train(where: str, rows: list, pool: list, held: list, examples: list, column: str) -> None:
    """Raise the :class:`DataError` of a file that leaves no training row, naming why: prompts that repeat
    (rows are held out by distinct prompt, with all their repeats), else the counts held out and few-shot."""
    distinct = len({prompt_key(r.get(column)) for r in rows})
    if len(pool) < len(rows) - len(held) and distinct == len(held):  # every prompt held out, its repeats left out
        n = max((distinct - 1) // 4, 1)
        fewer = f"hold out fewer prompts (data.eval_size={n} leaves {distinct - n} to train on), " * (distinct > 1)
        raise DataError(where, f"no training rows left: the prompts repeat: {distinct} distinct of {len(rows)} rows; "
                        "held-out rows are split by distinct prompt (every row of a held-out prompt leaves "
                        f"training), so holding out {len(held)} prompts takes all {len(rows)} rows", f"{fewer}give a "
                        "separate held-out file with data.eval_path, or set data.eval_size=0 (no held-out evaluation)")
    raise DataError(where, f"no training rows left: {len(rows)} rows, {len(rows) - len(pool)} held out for "
                    f"evaluation, {len(examples)} used as few-shot examples",
                    "lower data.eval_size or data.few_shot, or set data.eval_split")


def held_out(s: DataSettings, where: str, read: Callable[[str], list[dict]], rows: list[dict], pc: str,
              default_eval_split: str | None, has_splits: bool, origin: dict, warnings: list[str]):
    """``(held-out rows, training pool)``: from ``data.eval_path``, another split, or ``eval_size`` rows of
    ``rows`` held out by prompt; records each held-out row's source in ``origin`` and appends the warnings
    (held-out prompts also trained on, rows left out). Raises :class:`ConfigError` for ``data.eval_split``
    on a single file."""
    eval_split = s.eval_split or default_eval_split
    if s.eval_split is not None and not has_splits:
        raise ConfigError("data.eval_split", f"{s.path} is a single file, it has no splits",
                          "remove data.eval_split (eval_size rows are then held out of the file), set "
                          "data.eval_path to a held-out file, or use a folder saved by datasets with train/test splits")
    if s.eval_path is not None:
        eval_where = f"data.eval_path ({s.eval_path})"
        held = check_rows(read_path(s.eval_path, eval_split or "test", "data.eval_path"), pc, s.answer_column,
                          s.answer_type, eval_where)
        held, pool = held[:eval_count(s.eval_size, len(held))], rows
        origin.update({id(r): f"{eval_where}, row {i}" for i, r in enumerate(held)})
    elif eval_split is not None and eval_split != s.split:
        held = check_rows(read(eval_split), pc, s.answer_column, s.answer_type, f"{where}, split {eval_split!r}")
        held, pool = held[:eval_count(s.eval_size, len(held))], rows
        origin.update({id(r): f"{where}, split {eval_split!r}, row {i}" for i, r in enumerate(held)})
    else:
        n = eval_count(s.eval_size, len(rows))
        if isinstance(s.eval_size, int) and n and 2 * n >= len(rows):
            warnings.append(f"data.eval_size={n} would leave {max(len(rows) - n, 0)} of the {len(rows)} rows of "
                            f"{name_of(s)} for training, so none are held out and there is no held-out evaluation; "
                            "set data.eval_size to a fraction (e.g. 0.1) or data.eval_path to evaluate")
            n = 0
        held, pool = split_by_prompt(rows, n, pc, s.seed)
        left_out = len(rows) - len(held) - len(pool)
        if left_out:
            warnings.append(f"{left_out} rows of {name_of(s)} repeat a held-out prompt and were left out of "
                            "training, so held-out rows are prompts the model never trained on")
    if s.eval_path is not None or (eval_split is not None and eval_split != s.split):
        seen = {prompt_key(r.get(pc)) for r in pool}
        overlap = sum(prompt_key(r.get(pc)) in seen for r in held)
        if overlap:
            warnings.append(f"{overlap} of the {len(held)} held-out prompts also appear in the training rows "
                            "(same prompt text), so held-out accuracy partly measures trained prompts; "
                            "deduplicate the held-out set against the training data")
    return held, pool


def prompt_key(prompt) -> str:
    """A row's prompt as comparable text (chat messages as canonical JSON)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def split_by_prompt(rows: list[dict], n: int, column: str, seed: int) -> tuple[list[dict], list[dict]]:
    """``(held, pool)``: ``n`` rows with distinct prompts chosen by a seeded shuffle (the same rows
    as a shuffle of row indices when every prompt is distinct), and the rows whose prompt is not
    held out (rows repeating a held-out prompt are in neither)."""
    order = list(range(len(rows)))
    random.Random(f"policyzoo-heldout:{seed}").shuffle(order)
    held, keys = [], set()
    for i in order:
        if len(held) == n:
            break
        key = prompt_key(rows[i].get(column))
        if key not in keys:
            keys.add(key)
            held.append(rows[i])
    chosen = {id(r) for r in held}
    return held, [r for r in rows if id(r) not in chosen and prompt_key(r.get(column)) not in keys]


def eval_count(eval_size: int | float, n: int) -> int:
    """Held-out rows for ``eval_size`` (a count, or a fraction of ``n`` rounded half to even)."""
    return round(eval_size * n) if isinstance(eval_size, float) else int(eval_size)

