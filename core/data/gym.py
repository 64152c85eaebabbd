"""``data.name: reasoning_gym``: procedurally generated tasks of the reasoning-gym package.

Settings (:class:`~policyzoo.data.data_section.DataSettings`): ``tasks`` (one task name, a list of
names weighted equally, or ``{name: weight}`` for a mixture), ``size`` (training rows, default
:data:`DEFAULT_SIZE`), ``eval_size`` (held-out rows, a count or a fraction of ``size``),
``seed``, and ``task_settings`` (``{name: {key: value}}``, passed to the task's own config
dataclass, e.g. difficulty ranges). Nothing is downloaded: every row is generated.

Rows: a task's share of ``size`` is its weight's share, rounded by largest remainder (ties: the
order of ``tasks``). reasoning-gym builds item ``i`` of a data set from ``Random(seed + i)``, so two
data sets of one task whose seed ranges overlap share rows (seed 22 with 100 rows lies inside
seed 11 with 400). Here task t's training rows are items ``seed .. seed + n_t - 1`` and its
held-out rows the items that follow, ``seed + n_t .. seed + n_t + e_t - 1``: the seed ranges are
disjoint by construction. A training row whose question text equals a held-out one (a task with
few distinct questions) leaves training, with a warning giving the count, so no held-out
question is ever trained on.

Prompt: reasoning-gym's own format, its ``SYSTEM_PROMPTS["default"]`` as the system message
(answer inside ``<answer>...</answer>``) and the question as the user message. Reward: the
``gym_score`` component (:mod:`policyzoo.plugins.reward.gym`): the task's ``score_answer`` on
``extract_answer(completion)``. Each row keeps ``question``, ``answer``, ``metadata`` (the entry
``score_answer`` reads) and ``_task`` (the held-out evaluation's per-task key).
Few-shot (``data.few_shot: k``, default 0 here): k solved examples before each prompt, the assistant
turn ``<answer>ANSWER</answer>`` (the format the system prompt asks for), taken round-robin over the
tasks from the items after each task's held-out range (``seed + n_t + e_t ..``), so they are neither
trained on nor held out; a candidate whose question text equals a held-out one is passed over.
Errors: ``UserError`` naming the ``gym`` extra when the package is missing; ``ConfigError`` for
an unknown task (close matches, and ``policyzoo data reasoning_gym`` to list them) or setting.
Source: reasoning-gym (github.com/open-thought/reasoning-gym), ``create_dataset`` / ``score_answer``.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from policyzoo.errors import ConfigError, UserError

DEFAULT_SIZE = 1000
LIST_COMMAND = "policyzoo data reasoning_gym"


def import_gym(where: str = "data.name (reasoning_gym)"):
    """The ``reasoning_gym`` module; a :class:`UserError` naming the extra when it is missing."""
    try:
        import reasoning_gym
    except ImportError:
        raise UserError(where, "the reasoning-gym package is not installed",
                        "pip install 'policyzoo[gym]'  (reasoning-gym 0.1.25)") from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every registered reasoning-gym task name, sorted."""
    return sorted(import_gym().factory.DATASETS)


def task_weights(tasks) -> dict[str, float]:
    """``data.tasks`` as ``{name: weight}`` (a name or a list: weight 1 each), every name checked
    against the registry. Raises :class:`ConfigError` for no task, an unknown name (with close
    matches and the listing command) or a weight that is not a positive number."""
    if tasks is None or tasks == [] or tasks == {} or tasks == "":
        raise ConfigError("data.tasks", "data.name: reasoning_gym needs at least one task",
                          f"set data.tasks, e.g. data.tasks=basic_arithmetic (list them: {LIST_COMMAND})")
    weights = {tasks: 1.0} if isinstance(tasks, str) else (
        {t: 1.0 for t in tasks} if isinstance(tasks, list) else dict(tasks))
    if isinstance(tasks, list) and len(weights) != len(tasks):
        raise ConfigError("data.tasks", "a task is named twice", "name each task once (a mapping gives weights)")
    known = set(task_names())
    for name, w in weights.items():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"data.tasks ({name})", f"reasoning-gym has no task {name!r}{hint}",
                              f"list the {len(known)} task names with: {LIST_COMMAND}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
            raise ConfigError(f"data.tasks ({name})", f"the weight {w!r} is not a positive number",
                              "give each task a weight > 0, e.g. {basic_arithmetic: 2, chain_sum: 1}")
    return {k: float(v) for k, v in weights.items()}


def split_counts(weights: dict[str, float], total: int) -> dict[str, int]:
    """``total`` rows shared out by weight, largest remainder first (ties: the order of
    ``weights``): ``{a: 2, b: 1}`` of 10 rows gives 20/3 = 6.67 -> 7 and 10/3 = 3.33 -> 3."""
    s = sum(weights.values())
    exact = {k: total * w / s for k, w in weights.items()}
    counts = {k: int(v) for k, v in exact.items()}
    order = sorted(weights, key=lambda k: -(exact[k] - counts[k]))  # stable: ties keep the given order
    for k in order[:total - sum(counts.values())]:
        counts[k] += 1
    return counts


def make_dataset(name: str, settings: dict[str, Any], seed: int, size: int, where: str):
    """``reasoning_gym.create_dataset(name, seed=, size=, **settings)``; a :class:`ConfigError`
    naming the key for a setting the task's config does not have or a value it refuses."""
    rg = import_gym(where)
    config_cls = rg.factory.DATASETS[name][1]
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    for key in settings:
        if key not in fields or key in ("seed", "size"):
            close = difflib.get_close_matches(str(key), fields, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{where}.{key}", f"task {name!r} has no setting {key!r}{hint}"
                              + (" (seed and size are data.seed and data.size)" if key in ("seed", "size") else ""),
                              f"settings of {name}: {', '.join(fields)}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **settings)
    except (AssertionError, ValueError, TypeError) as e:
        raise ConfigError(where, f"task {name!r} refuses these settings: {type(e).__name__}: {e}"[:400],
                          f"fix the values (settings of {name}: {', '.join(fields)})") from None


def generate(s) -> tuple[list[dict], list[dict], list[str], dict]:
    """``(train, held, warnings, plan)`` raw rows for the settings ``s`` (see the module docstring);
    ``plan[task] = (train_count, eval_count)``. Each row: question, answer, metadata, ``_task``,
    ``_seed`` (the item's generating seed, ``seed + index``) and ``_gym`` (task and settings)."""
    weights = task_weights(s.tasks)
    settings = dict(s.task_settings or {})
    for name in settings:
        if name not in weights:
            raise ConfigError(f"data.task_settings.{name}", f"{name!r} is not one of data.tasks "
                              f"({', '.join(weights)})", "add it to data.tasks, or remove its settings")
    size = min(s.size or DEFAULT_SIZE, s.limit or DEFAULT_SIZE * 10 ** 6)  # data.limit caps data.size
    n_eval = round(s.eval_size * size) if isinstance(s.eval_size, float) else int(s.eval_size)
    train_n, eval_n = split_counts(weights, size), split_counts(weights, n_eval)
    train, held = [], []
    for name in weights:
        own = dict(settings.get(name) or {})
        where = f"data.task_settings.{name}"
        for rows, seed, n in ((train, s.seed, train_n[name]), (held, s.seed + train_n[name], eval_n[name])):
            if n == 0:
                continue
            ds = make_dataset(name, own, seed, n, where)
            rows += [{"question": e["question"], "answer": e["answer"], "metadata": e.get("metadata", {}),
                      "_task": name, "_seed": seed + i, "_gym": {"task": name, "settings": own}}
                     for i, e in enumerate(ds)]
    asked = {str(r["question"]) for r in held}
    kept = [r for r in train if str(r["question"]) not in asked]
    warnings = []
    if len(kept) < len(train):
        warnings.append(f"{len(train) - len(kept)} generated training rows of reasoning_gym repeat a held-out "
                        "question and were left out of training, so held-out rows are questions the model "
                        "never trained on")
    return kept, held, warnings, {k: (train_n[k], eval_n[k]) for k in weights}


def few_shot_examples(s, plan: dict[str, tuple[int, int]], held: list[dict], k: int) -> list[dict]:
    """``k`` solved examples for ``data.few_shot`` (see the module docstring): rows with ``question``
    and ``answer``, round-robin over ``plan``'s tasks (``plan[task] = (train_count, eval_count)``),
    from the seeds after the task's held-out range; none equal to a ``held`` question. ``[]`` for 0."""
    if not k:
        return []
    settings, asked = dict(s.task_settings or {}), {str(r["question"]) for r in held}
    pools = []
    for name, (n_train, n_eval) in plan.items():
        own = dict(settings.get(name) or {})
        items = make_dataset(name, own, s.seed + n_train + n_eval, k + 8, f"data.task_settings.{name}")
        pools.append([{"question": e["question"], "answer": e["answer"]} for e in items
                      if str(e["question"]) not in asked])
    picked = [pool[i] for i in range(k) for pool in pools if i < len(pool)]
    return picked[:k]


def solved(example: dict) -> str:
    """The assistant turn of a few-shot example: the answer in reasoning-gym's ``<answer>`` format."""
    return f"<answer>{example['answer']}</answer>"


def describe() -> list[tuple[str, str]]:
    """``(name, category)`` of every task, for ``policyzoo data reasoning_gym``."""
    rg = import_gym("policyzoo data reasoning_gym")
    out = []
    for name in task_names():
        module = rg.factory.DATASETS[name][0].__module__.split(".")
        out.append((name, module[1] if len(module) >= 3 else "other"))
    return out


def cmd_data(args, out) -> None:
    """``policyzoo data reasoning_gym``: every task name with its category (a rich table on ``out``)."""
    from rich.table import Table

    rows = describe()
    table = Table(title=f"reasoning-gym tasks ({len(rows)}; data.use=reasoning_gym data.tasks=NAME)")
    table.add_column("task")
    table.add_column("category")
    for name, category in rows:
        table.add_row(name, category)
    out.print(table)
