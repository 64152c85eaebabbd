"""The reasoning-gym task's own scorer (a ``reward`` component)."""

from __future__ import annotations

import json
import math

import torch
from pydantic import Field

from policyzoo.contract import Reward, hookimpl
from policyzoo.data.gym import import_gym, make_dataset, task_weights
from policyzoo.errors import ConfigError, DataError, UserError


class GymScoreError(UserError):
    """A reasoning-gym scorer raised or returned something that is not a finite number."""


class GymScore(Reward):
    """reasoning-gym's ``score_answer``, ``[B]`` float32 (most tasks: 0.0 or 1.0; some give partial
    credit in [0, 1]).

    Per row: the answer is ``reasoning_gym.utils.extract_answer(completion)`` (the text inside the
    last ``<answer>...</answer>``, stripped; None without the tags, which every task scores 0.0),
    scored by ``score_answer(answer, entry)`` of the row's task, built once per (task, settings)
    with ``create_dataset`` (a scorer may read its config); ``entry`` is the row's ``question``,
    ``answer`` and ``metadata`` as the task generated them. The row names its task in ``_gym``
    (rows of ``data.name: reasoning_gym``, :mod:`policyzoo.data.gym`); ``task`` scores rows of other
    sources (a file of saved reasoning-gym entries) as that task, with its default settings.
    Errors: ``DataError`` for a row without ``_gym`` when ``task`` is unset; :class:`GymScoreError`
    (a ``UserError``: the run stops, as for a raising ``function`` reward, never a silent 0) when
    ``score_answer`` raises or returns a non-number or NaN, naming the task and the row.
    Source: reasoning-gym (github.com/open-thought/reasoning-gym), ``ProceduralDataset.score_answer``
    and ``utils.extract_answer``."""

    name = "gym_score"
    needs_answer = True
    contract_params = {"task": "basic_arithmetic"}  # the contract suite's rows come from no reasoning-gym task

    class Params(Reward.Params):
        task: str | None = Field(None, description="score rows without '_gym' (not from data.name: reasoning_gym) "
                                 "as this reasoning-gym task, e.g. basic_arithmetic")

    def __init__(self, **params):
        super().__init__(**params)
        self.rg = import_gym("reward: gym_score")
        self._scorers: dict[str, object] = {}
        if self.params.task is not None:
            try:
                task_weights(self.params.task)  # an unknown name: the close matches and the listing command
            except ConfigError as e:
                raise ConfigError("reward: gym_score (task)", e.why, e.fix) from None

    def scorer(self, task: str, settings: dict):
        """The data set object whose ``score_answer`` scores rows of ``task`` with ``settings``."""
        key = json.dumps([task, settings], sort_keys=True, default=str)
        if key not in self._scorers:
            self._scorers[key] = make_dataset(task, settings, 0, 1, f"reward: gym_score ({task})")
        return self._scorers[key]

    @hookimpl
    def reward(self, rollout):
        if not (len(rollout.rows) == len(rollout.completions) == len(rollout)):
            raise DataError("reward: gym_score", f"{len(rollout)} rows but {len(rollout.rows)} data rows and "
                            f"{len(rollout.completions)} completions", "the sampler must fill rows and completions")
        out = []
        for i, (row, text) in enumerate(zip(rollout.rows, rollout.completions)):
            gym = row.get("_gym") or ({"task": self.params.task} if self.params.task else None)
            if not isinstance(gym, dict):
                raise DataError(f"reward: gym_score, row {i}", "the data row is not a reasoning-gym row (no '_gym')",
                                "use gym_score with data.name: reasoning_gym, set its `task`, or use another reward")
            task = gym["task"]
            entry = {"question": row.get("question"), "answer": row.get("answer"),
                     "metadata": row.get("metadata") or {}}
            answer = self.rg.utils.extract_answer(text)
            try:
                value = self.scorer(task, gym.get("settings") or {}).score_answer(answer, entry)
            except Exception as e:  # the task's own code: any type
                raise GymScoreError(f"reward: gym_score ({task}), row {i}", f"score_answer raised "
                                    f"{type(e).__name__}: {e}"[:300] + f" on answer {str(answer)[:60]!r}",
                                    "report it to reasoning-gym, or drop the task from data.tasks") from None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise GymScoreError(f"reward: gym_score ({task}), row {i}", f"score_answer returned {value!r}, "
                                    "not a finite number", "drop the task from data.tasks, or score it with a "
                                    "`function` reward")
            out.append(float(value))
        return torch.tensor(out, dtype=torch.float32)
