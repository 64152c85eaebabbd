"""User reward functions, called TRL-style (a ``reward`` component)."""

from __future__ import annotations

import copy
import importlib
import math

import torch
from pydantic import Field

from policyzoo.contract import Reward, hookimpl, runstate
from policyzoo.errors import UserError
from policyzoo.plugins.reward.aio import RewardTimeout, gather, is_async, resolve


class RewardFunctionError(UserError):
    """A user reward function could not be imported, raised, or returned the wrong thing."""


def load_function(path: str, where: str):
    """Import ``"package.module:function"``; raise :class:`RewardFunctionError` with the fix."""
    module_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:
        raise RewardFunctionError(where, f"cannot import module {module_name!r} of reward function {path!r}: "
                                  f"{type(e).__name__}: {e}", "check the module is importable (installed or "
                                  "on PYTHONPATH) and the path is 'package.module:function'") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardFunctionError(where, f"module {module_name!r} has no attribute {attr!r}",
                                      f"define `def {attr.split('.')[-1]}(prompts, completions, **kwargs)` "
                                      f"in {module_name} or fix the name")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardFunctionError(where, f"{path!r} is a {type(obj).__name__}, not a function",
                                  "point `function` at a callable")
    return obj


class Function(Reward):
    """A user reward function, called TRL-style on the whole batch; ``[B]`` float32.

    ``function`` = "package.module:name" is imported when the run is built (the Python API,
    ``policyzoo.train(rewards=[callable])``, registers a callable under ``policyzoo.api:REWARDS.<name>``).
    It is called with TRL ``GRPOTrainer``'s keyword arguments: ``prompts`` and ``completions``
    (B each), ``completion_ids`` (B lists of generated token ids, end-of-sequence token included when
    generated), ``trainer_state`` (:class:`policyzoo.contract.runstate.TrainerState`: ``global_step``,
    ``max_steps``, ``epoch``), and every other column of the data rows as a list of B values
    (missing keys None; ``prompt``, ``completion`` and ``completion_ids`` are not repeated, keys
    starting with ``_`` are internal). Conversational data (the row's prompt was a list of chat
    messages) gets ``prompts`` as the message lists the model saw and ``completions`` as
    ``[{"role": "assistant", "content": text}]``; plain-text data gets the prompt strings as given in
    the data and the completion strings. It must return B numbers; None means unscorable (NaN).
    Its metric is ``reward/<name>`` (the function's name).
    Async: a coroutine function, an object with ``async def __call__`` or a function returning an
    awaitable is awaited (TRL ``GRPOTrainer`` accepts async reward functions too); async components
    of one step run concurrently, each in its own thread and event loop (``concurrent``), and
    ``timeout`` (seconds, async only) cancels a call that runs longer -- an error naming the limit.
    Errors (:class:`RewardFunctionError`, a ``UserError``): a path that does not import; a raising
    function (the function is re-run row by row to name the first failing row); a result of the
    wrong length or with a non-number (naming the row).
    Isolation: every call (also each row-by-row re-run) gets deep copies of its arguments, so a
    function that edits them in place changes nothing outside that call.
    Source: TRL ``GRPOTrainer._calculate_rewards`` reward-function convention (huggingface.co/docs/trl)."""

    name = "function"

    class Params(Reward.Params):
        function: str = Field(..., pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
                              description="import path 'package.module:function' of "
                              "fn(prompts, completions, **columns)")
        timeout: float | None = Field(None, gt=0, description="seconds one call of an async reward function may "
                                      "take before it is cancelled (None: no limit; async functions only)")

    def __init__(self, **params):
        super().__init__(**params)
        self.fn = load_function(self.params.function, f"reward: function -> {self.params.function}")
        #: async functions run concurrently with the step's other concurrent reward components
        self.concurrent = is_async(self.fn)
        if self.params.timeout is not None and not self.concurrent:
            raise RewardFunctionError(f"reward: function {self.params.function}", "`timeout` is set but the "
                                      "function is synchronous: a running Python function cannot be cancelled",
                                      "remove `timeout`, or make the function `async def` (it is then awaited "
                                      "and cancelled after `timeout` seconds)")

    @property
    def label(self) -> str:
        """The function's own name (``reward/<name>`` in the metrics), as TRL logs reward functions."""
        return self.params.function.rpartition(":")[2].rpartition(".")[2]

    @staticmethod
    def _columns(rows: list[dict]) -> dict[str, list]:
        skip = {"prompt", "completion", "completion_ids", "prompts", "completions", "trainer_state"}
        keys = list(dict.fromkeys(k for row in rows for k in row if k not in skip and not str(k).startswith("_")))
        return {k: [row.get(k) for row in rows] for k in keys}

    @staticmethod
    def _inputs(rollout, rows: list[dict]) -> tuple[list, list, list]:
        """``(prompts, completions, completion_ids)`` in TRL's form (see the class docstring)."""
        texts = list(rollout.completions)
        ids = [r[m].tolist() for r, m in zip(rollout.response_ids, rollout.response_mask)]
        raw = [row.get("_raw_prompt") for row in rows]
        if raw and all(isinstance(x, list) for x in raw):
            return ([row["prompt"] for row in rows], [[{"role": "assistant", "content": t}] for t in texts], ids)
        prompts = [x if isinstance(x, str) else p for x, p in zip(raw, rollout.prompts)] if rollout.prompts else raw
        return prompts, texts, ids

    def _call(self, prompts, completions, ids, rows):
        """One call of the function on its own copies of everything it is given: every row's prompt,
        completion, ids and column value are deep-copied one by one (no two rows share an object,
        as in TRL where each row comes fresh from the data set), and ``trainer_state`` is a copy. So a
        function that edits its arguments in place cannot reach the data set's rows (which the
        rest of the run trains and evaluates on), the rollout or the next reward's inputs."""
        own = [copy.deepcopy(x) for x in prompts], [copy.deepcopy(x) for x in completions]
        return self.fn(prompts=own[0], completions=own[1], completion_ids=[copy.deepcopy(x) for x in ids],
                       trainer_state=copy.copy(runstate.current()),
                       **{k: [copy.deepcopy(v) for v in vals] for k, vals in self._columns(rows).items()})

    @hookimpl
    def reward(self, rollout):
        name = self.params.function
        b = len(rollout)
        rows = rollout.rows if len(rollout.rows) == b else [{} for _ in range(b)]
        prompts, completions, ids = self._inputs(rollout, rows)
        try:
            result = resolve(self._call(prompts, completions, ids, rows), self.params.timeout)
        except RewardTimeout as e:
            raise RewardFunctionError(f"reward: function {name}", f"{name} timed out on the batch of {b} rows: {e}",
                                      "raise `timeout`, or make the function faster (a remote call: check "
                                      "the server)") from None
        except Exception as e:
            row = self._failing_row(prompts, completions, ids, rows)
            prompt = rollout.prompt_excerpt(row, 60) if row is not None else ""
            at = f"row {row} (prompt {prompt!r})" if row is not None else "the batch"
            raise RewardFunctionError(f"reward: function {name}", f"{name} raised {type(e).__name__}: {e} "
                                      f"on {at}", f"fix {name} or the data row; return None for rows it "
                                      "cannot score") from None
        try:
            values = list(result)
        except TypeError:
            values = None
        if values is None or len(values) != b:
            got = f"{len(values)} values" if values is not None else repr(type(result).__name__)
            raise RewardFunctionError(f"reward: function {name}", f"returned {got} for {b} completions",
                                      "return one float (or None) per completion, in order")
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append(math.nan)
                continue
            try:
                out.append(float(v))
            except (TypeError, ValueError):
                raise RewardFunctionError(f"reward: function {name}, row {i}", f"returned {v!r}, not a number",
                                          "return a float, or None for an unscorable row") from None
        return torch.tensor(out, dtype=torch.float32)

    def _failing_row(self, prompts, completions, ids, rows) -> int | None:
        if self.concurrent:  # the rows of an async function are retried concurrently
            slices = [(prompts[i:i + 1], completions[i:i + 1], ids[i:i + 1], rows[i:i + 1])
                      for i in range(len(completions))]
            results = gather([self._awaitable(*x) for x in slices], self.params.timeout)
            return next((i for i, r in enumerate(results) if isinstance(r, Exception)), None)
        for i in range(len(completions)):
            try:
                resolve(self._call(prompts[i:i + 1], completions[i:i + 1], ids[i:i + 1], rows[i:i + 1]), None)
            except Exception:
                return i
        return None

    async def _awaitable(self, *args):
        return await self._call(*args)
