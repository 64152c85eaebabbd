"""``load_task``: a :class:`DataSettings` -> a :class:`Task` (train rows, held-out rows, rewards).

Split rules (all deterministic in ``data.seed``):

* Built-in ``arithmetic``: held-out, example and training problems are generated separately
  (see :mod:`policyzoo.data.arithmetic`); ``limit`` training problems (default 5000).
* ``eval_path`` (a separate file or folder), else a separate held-out split (``eval_split``; gsm8k
  uses ``test`` by default): the first ``eval_size`` rows of it, in source order.
* Otherwise ``eval_size`` rows of ``split`` with distinct prompts are held out, chosen by a seeded
  shuffle; rows repeating a held-out prompt leave training (a warning gives their count). A
  separate held-out file or split is not changed: a warning gives the count of its prompts that
  the training rows repeat.
* ``eval_size`` is a count, or a fraction in (0, 1) of the rows (rounded to the nearest count). A
  count that would hold out half of the rows or more holds out none (a warning in
  ``Task.warnings``): a small file is for training, not for a held-out set that leaves nothing.
* Prompt-only data (no ``answer_column`` in any row): rows without ``answer``; ``Task.missing_answer``
  holds the error to raise when a reward needs answers (checked once the rewards are known).
* Few-shot examples are the first ``few_shot`` remaining rows (source order) and leave the
  training rows; then ``limit`` keeps the first rows of what is left.

Every check (file, columns, prompts, answers) runs here, before any model is loaded.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

import pydantic

from policyzoo.contract.components import Use, use
from policyzoo.errors import ConfigError, DataError, did_you_mean

from . import arithmetic, gym
from .answers import gsm8k_final_answer, gsm8k_worked_solution
from .batching import prompt_batches
from .config import DataSettings
from .rows import build_prompts, check_rows, missing_column
from .sources import _read_jsonl, read_cached_dataset, read_path

GSM8K_SYSTEM_PROMPT = ("Solve the math word problem. Think step by step, then give the final "
                       "answer as \\boxed{<number>}.")
GSM8K_SPLITS = {"train": "gsm8k_train.jsonl", "test": "gsm8k_test.jsonl"}


@dataclass
class Task:
    """A loaded task.

    ``train_rows`` / ``eval_rows``: lists of dicts with ``prompt`` (chat messages), ``answer``
    (str) and the source row's other columns. ``default_rewards``: the reward components to use
    when the config names none (``policyzoo.use(...)`` objects, for ``assemble(..., rewards=)``).
    """

    name: str
    train_rows: list[dict]
    eval_rows: list[dict]
    default_rewards: list[Use] = field(default_factory=list)
    seed: int = 0
    #: where each training / held-out row came from, e.g. ``"data.path (d.jsonl), row 17"``: the
    #: row's 0-based index in its source file or split (as :func:`check_rows` counts), for messages
    train_origins: list[str] = field(default_factory=list)
    eval_origins: list[str] = field(default_factory=list)
    #: things the user should know about how the rows were chosen (printed as warnings by the engine)
    warnings: list[str] = field(default_factory=list)
    #: for prompt-only data: the error for a reward that needs the reference answers; else None
    missing_answer: DataError | None = None

    def batches(self, P: int, start: int = 0) -> Iterator[list[dict]]:
        """``prompt_batches(self.train_rows, P, self.seed, start)``: P training rows per step."""
        return prompt_batches(self.train_rows, P, self.seed, start)


def load_task(data_config: DataSettings | dict | None = None) -> Task:
    """Load and check the task described by ``data_config`` (a ``DataSettings`` or a plain dict).

    Raises :class:`~policyzoo.errors.ConfigError` for bad settings and
    :class:`~policyzoo.errors.DataError` for bad data (missing file, unknown format, missing
    column, empty data set, non-numeric answer of a numeric task), each naming where and why."""
    s = _settings(data_config)
    if s.name == "reasoning_gym" and s.path is None:
        return _load_reasoning_gym(s)
    for key in ("tasks", "size", "task_settings"):
        if getattr(s, key) is not None:
            raise ConfigError(f"data.{key}", f"data.{key} applies to data.name: reasoning_gym, not to "
                              f"{name_of(s)}", f"remove data.{key}, or set data.name=reasoning_gym")
    if s.path is not None:
        return _load_rows(s, f"data.path ({s.path})", lambda split: read_path(s.path, split), _plain_answer,
                          default_prompt_column="prompt", default_eval_split=None, system=None)
    if s.name == "arithmetic":
        return _load_arithmetic(s)
    if s.name == "gsm8k":
        return _load_rows(s, "data.name (gsm8k)", _read_gsm8k,
                          lambda r: gsm8k_worked_solution(r["solution"], r["answer"]),
                          default_prompt_column="question", default_eval_split="test", system=GSM8K_SYSTEM_PROMPT)
    return _load_rows(s, f"data.name ({s.name})", lambda split: read_cached_dataset(s.name, split), _plain_answer,
                      default_prompt_column="prompt", default_eval_split=None, system=None)


def _settings(data_config) -> DataSettings:
    if isinstance(data_config, DataSettings):
        return data_config
    try:
        return DataSettings(**(data_config or {}))
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        why = (f"unknown setting {key!r}{did_you_mean(key, DataSettings.model_fields)}"
               if err["type"] == "extra_forbidden" else f"{err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"data.{key}", why, "data takes: " + ", ".join(DataSettings.model_fields)) from None


def _plain_answer(row: dict) -> str:
    return str(row["answer"])


def _read_gsm8k(split: str) -> list[dict]:
    if split not in GSM8K_SPLITS:
        raise DataError("data.split (gsm8k)", f"gsm8k has no split {split!r}", "use split: train or split: test")
    with resources.as_file(resources.files(__package__) / GSM8K_SPLITS[split]) as p:
        raw = _read_jsonl(p, "gsm8k")
    return [{"question": r["question"], "solution": r["answer"], "answer": gsm8k_final_answer(r["answer"])}
            for r in raw]


def _load_reasoning_gym(s: DataSettings) -> Task:
    """The task of ``data.name: reasoning_gym`` (:mod:`policyzoo.data.gym`): reasoning-gym's default
    system prompt (the ``<answer>`` format) and the question as the user message; reward ``gym_score``."""
    rg = gym.import_gym()
    if s.prompt_column not in (None, "question") or s.answer_column != "answer" or s.eval_path:
        raise ConfigError("data (reasoning_gym)", "prompt_column / answer_column / eval_path apply to data read "
                          "from files", "remove them: reasoning_gym generates its rows")
    train, held, warnings, plan = gym.generate(s)
    system = rg.utils.SYSTEM_PROMPTS["default"] if s.system_prompt is None else s.system_prompt
    plain = s.prompt_format == "plain"
    examples = gym.few_shot_examples(s, plan, held, s.few_shot or 0)

    def build(raw: list[dict], what: str) -> list[dict]:
        rows = check_rows(raw, "question", "answer", "text", f"data (reasoning_gym, {what})") if raw else []
        return build_prompts(rows, "question", system, examples, gym.solved, plain)

    def origins(rows: list[dict], what: str) -> list[str]:
        return [f"data (reasoning_gym), {what} {r['_task']} item seed {r['_seed']}" for r in rows]
    return Task("reasoning_gym", build(train, "training"), build(held, "held-out"), [use("gym_score")], s.seed,
                origins(train, "training"), origins(held, "held-out"), warnings)


def _load_arithmetic(s: DataSettings) -> Task:
    if s.prompt_column not in (None, "question") or s.answer_column != "answer" or s.answer_type != "number":
        raise ConfigError("data (arithmetic)", "prompt_column / answer_column / answer_type apply to data read "
                          "from data.path or a `datasets` name", "remove them, or set data.path")
    k = 2 if s.few_shot is None else s.few_shot
    try:
        size = s.limit or arithmetic.DEFAULT_TRAIN_SIZE  # a fractional eval_size is a fraction of it
        held, examples, train = arithmetic.generate(s.seed, _eval_count(s.eval_size, size), k, size)
    except ValueError as e:
        raise ConfigError("data.eval_size (arithmetic)", str(e),
                          "lower data.eval_size (at most a few thousand)") from None
    system = arithmetic.SYSTEM_PROMPT if s.system_prompt is None else s.system_prompt

    def build(raw: list[dict]) -> list[dict]:
        rows = check_rows(raw, "question", "answer", "number", "data (arithmetic)") if raw else []
        return build_prompts(rows, "question", system, examples, arithmetic.solved, s.prompt_format == "plain")
    return Task("arithmetic", build(train), build(held), [use("answer_match")], s.seed,
                [f"data (arithmetic), generated training problem {i}" for i in range(len(train))],
                [f"data (arithmetic), generated held-out problem {i}" for i in range(len(held))])


def _load_rows(s: DataSettings, where: str, read: Callable[[str], list[dict]], solved: Callable[[dict], str],
               default_prompt_column: str, default_eval_split: str | None, system: str | None) -> Task:
    pc = s.prompt_column or default_prompt_column
    has_splits = s.path is None or Path(s.path).is_dir()
    train_where = f"{where}, split {s.split!r}" if has_splits else where
    raw = read(s.split)
    rows = check_rows(raw, pc, s.answer_column, s.answer_type, train_where)
    origin = {id(r): f"{train_where}, row {i}" for i, r in enumerate(rows)}  # the source's own row numbers
    warnings: list[str] = []
    held, pool = _held_out(s, where, read, rows, pc, default_eval_split, has_splits, origin, warnings)
    k = s.few_shot or 0
    examples, train = pool[:k], pool[k:]
    train = train[:s.limit] if s.limit else train
    if not train:
        _nothing_to_train(where, rows, pool, held, examples, pc)
    system = system if s.system_prompt is None else s.system_prompt
    plain = s.prompt_format == "plain"
    missing = None if any("answer" in r for r in rows) else missing_column(raw, s.answer_column, "answer_column", where)
    return Task(name_of(s), build_prompts(train, pc, system, examples, solved, plain),
                build_prompts(held, pc, system, examples, solved, plain), [use("math_verify")], s.seed,
                [origin[id(r)] for r in train], [origin[id(r)] for r in held], warnings, missing)


def _nothing_to_train(where: str, rows: list, pool: list, held: list, examples: list, column: str) -> None:
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


def _held_out(s: DataSettings, where: str, read: Callable[[str], list[dict]], rows: list[dict], pc: str,
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
        held, pool = held[:_eval_count(s.eval_size, len(held))], rows
        origin.update({id(r): f"{eval_where}, row {i}" for i, r in enumerate(held)})
    elif eval_split is not None and eval_split != s.split:
        held = check_rows(read(eval_split), pc, s.answer_column, s.answer_type, f"{where}, split {eval_split!r}")
        held, pool = held[:_eval_count(s.eval_size, len(held))], rows
        origin.update({id(r): f"{where}, split {eval_split!r}, row {i}" for i, r in enumerate(held)})
    else:
        n = _eval_count(s.eval_size, len(rows))
        if isinstance(s.eval_size, int) and n and 2 * n >= len(rows):
            warnings.append(f"data.eval_size={n} would leave {max(len(rows) - n, 0)} of the {len(rows)} rows of "
                            f"{name_of(s)} for training, so none are held out and there is no held-out evaluation; "
                            "set data.eval_size to a fraction (e.g. 0.1) or data.eval_path to evaluate")
            n = 0
        held, pool = _split_by_prompt(rows, n, pc, s.seed)
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


def env_task(name: str, train: list[dict], held: list[dict], seed: int) -> Task:
    """The task of an environment that brings its own rows (``Env.task_rows``): every prompt checked
    (a list of chat messages or a string), ``_raw_prompt`` set as for file data; no default reward
    (a run with an env defaults to ``env_reward``). Raises :class:`DataError` naming the row."""
    where = f"env {name}"
    for what, rows in (("training", train), ("held-out", held)):
        for i, row in enumerate(rows):
            check_rows([row], "prompt", "\0no-answer-column", "text", f"{where}, {what} row {i}")
    if not train:
        raise DataError(where, "the environment's dataset has no training rows", "give it a dataset with rows")
    return Task(name, build_prompts(train, "prompt", None, [], str), build_prompts(held, "prompt", None, [], str),
                [], seed, [f"{where}, training row {i}" for i in range(len(train))],
                [f"{where}, held-out row {i}" for i in range(len(held))])


def prompt_key(prompt) -> str:
    """A row's prompt as comparable text (chat messages as canonical JSON)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def _split_by_prompt(rows: list[dict], n: int, column: str, seed: int) -> tuple[list[dict], list[dict]]:
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


def name_of(s: DataSettings) -> str:
    return s.name if s.path is None else s.path


def _eval_count(eval_size: int | float, n: int) -> int:
    """Held-out rows for ``eval_size`` (a count, or a fraction of ``n`` rounded half to even)."""
    return round(eval_size * n) if isinstance(eval_size, float) else int(eval_size)

