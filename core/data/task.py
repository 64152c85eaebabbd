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
  holds the error to raise when a reward needs answers (checked once the rewards are known). With
  ``few_shot`` the same error is raised here: the solved examples need the answers.
* Few-shot examples are the first ``few_shot`` remaining rows (source order) and leave the
  training rows; then ``limit`` keeps the first rows of what is left.

Every check (file, columns, prompts, answers) runs here, before any model is loaded.
"""

from __future__ import annotations

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
from .data_section import DataSettings, name_of
from .heldout import eval_count, held_out, nothing_to_train
from .readers import _read_jsonl, read_cached_dataset, read_path
from .rows import build_prompts, check_rows, missing_column

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
        held, examples, train = arithmetic.generate(s.seed, eval_count(s.eval_size, size), k, size)
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
    if s.answer_column != "answer" and not any(s.answer_column in r for r in raw) and any("answer" in r for r in raw):
        # the rows' own ``answer`` column would stand in for the one named, unchecked and unnormalised
        raise missing_column(raw, s.answer_column, "answer_column", train_where)
    rows = check_rows(raw, pc, s.answer_column, s.answer_type, train_where)
    origin = {id(r): f"{train_where}, row {i}" for i, r in enumerate(rows)}  # the source's own row numbers
    warnings: list[str] = []
    held, pool = held_out(s, where, read, rows, pc, default_eval_split, has_splits, origin, warnings)
    k = s.few_shot or 0
    missing = None if any("answer" in r for r in rows) else missing_column(raw, s.answer_column, "answer_column", where)
    if missing is not None and k:  # a few-shot example is a solved one: its answer is part of every prompt
        raise DataError(missing.where, f"{missing.why}; data.few_shot={k} shows {k} solved examples (question and "
                        "answer) before each prompt, so the answers are needed",
                        f"{missing.fix}, or set data.few_shot=0 for data without answers")
    examples, train = pool[:k], pool[k:]
    train = train[:s.limit] if s.limit else train
    if not train:
        nothing_to_train(where, rows, pool, held, examples, pc)
    system = system if s.system_prompt is None else s.system_prompt
    plain = s.prompt_format == "plain"
    return Task(name_of(s), build_prompts(train, pc, system, examples, solved, plain),
                build_prompts(held, pc, system, examples, solved, plain), [use("math_verify")], s.seed,
                [origin[id(r)] for r in train], [origin[id(r)] for r in held], warnings, missing)


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
