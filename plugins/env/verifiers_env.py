"""``verifiers``: an environment of the verifiers package in the env slot (single-turn, multi-turn, tools).

``algorithm.env: {use: verifiers, id: MODULE[:FUNCTION], args: {...}}`` imports the installed
environment module and calls ``load_environment(**args)`` when the run is built, before any
model loads (:mod:`~policyzoo.plugins.env.verifiers_load`: what is refused and why).

Data: the environment's own dataset replaces ``data:`` (:meth:`Verifiers.task_rows`): its
``prompt`` messages (verifiers puts its ``system_prompt`` and ``few_shot`` in them) with
``answer`` and ``info``; the held-out rows are its ``eval_dataset`` (the first ``data.eval_size``
rows), else ``data.eval_size`` rows held out of the dataset (distinct prompts, seeded).

Episodes, token-exact (:mod:`policyzoo.step.episodes` drives them): policyzoo samples every model
turn itself (vLLM on token ids); the decoded turn becomes verifiers' assistant message; verifiers'
stop conditions (``is_completed``: ``max_turns``, ``ToolEnv``'s "no tool called", the env's own
``@vf.stop`` methods) end the episode, else ``env_response`` answers and its messages are appended
as environment tokens, their contents untrusted text. Trained ids are the sampled ids; nothing is
re-tokenised. Tools: the environment's tool definitions are listed in the system message with the
call format ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the Hermes format vLLM's
tool parser reads); each such block of a turn becomes a ``ToolCall``; a block that is not valid
JSON is a tool error and no call (as behind an API's tool parser: a turn of such blocks only has
no tool calls, which ends a ``ToolEnv`` episode). Reward: the rubric's weighted sum
(:func:`~policyzoo.plugins.env.verifiers_load.score`), read by ``env_reward``; each function's score
is reported as ``env_score/<function name>`` (:attr:`policyzoo.contract.Episode.scores`). A failing
function stops the run (the reward error policy); a failing ``env_response`` follows the env's
``on_error`` and ``step_timeout``.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from pydantic import Field

from policyzoo.contract import Env, Episode, Observation
from policyzoo.data.heldout import eval_count, split_by_prompt
from policyzoo.errors import DataError
from policyzoo.plugins.env import verifiers_load as vl
from policyzoo.plugins.reward.aio import resolve

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOL_FORMAT = ("You can call tools. To call one, write <tool_call>{\"name\": TOOL, \"arguments\": {...}}</tool_call>"
               " and you will get its result; answer without a tool call when you are done. Tools (JSON schema):\n")


def parse_tool_calls(text: str) -> tuple[str, list[dict], int]:
    """``(text without the calls, [{"id", "name", "arguments"}], malformed count)`` of a model turn:
    every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block, ``arguments`` kept as
    JSON text (verifiers' ``ToolCall.arguments``); a block that is not such JSON counts as malformed."""
    calls, bad = [], 0
    for k, body in enumerate(TOOL_CALL.findall(text)):
        try:
            obj = json.loads(body)
            name, args = obj["name"], obj.get("arguments", {})
            if not isinstance(name, str) or not isinstance(args, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        calls.append({"id": f"call_{k}", "name": name, "arguments": json.dumps(args)})
    return TOOL_CALL.sub("", text).strip(), calls, bad


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(getattr(p, "text", None) or (p.get("text") if isinstance(p, dict) else "") or "")
                       for p in content)
    return "" if content is None else str(content)


class VerifiersEpisode(Episode):
    """One rollout of a verifiers environment: its ``State`` (built as verifiers' ``init_state``
    builds it, without a model client) and the conversation so far."""

    def __init__(self, row: dict, comp: "Verifiers"):
        super().__init__(row)
        self.comp, self.vf, self.env = comp, comp.vf, comp.vf_env
        self.prompt = comp.prompt_with_tools([{"role": m["role"], "content": m["content"]} for m in row["prompt"]])
        self.state = None
        self.messages: list = []

    def _state(self):
        if self.state is None:
            from verifiers.legacy.types import flatten_task_input
            from verifiers.legacy.utils.message_utils import normalize_messages

            given = {k: v for k, v in self.row.items() if not str(k).startswith("_") and k != "prompt"}
            given["prompt"] = self.prompt
            task = flatten_task_input(given)
            st = self.vf.State(input=task)
            st["task"] = task
            st["prompt"] = normalize_messages(self.prompt, field_name="input.prompt")
            st.update(client=None, model="policyzoo", sampling_args=None, is_completed=False, is_truncated=False,
                      tool_defs=self.env.tool_defs or [], trajectory=[], completion=None, reward=None, metrics=None,
                      error=None, final_env_response=None, trajectory_id=uuid.uuid4().hex)
            setup = resolve(self.env.setup_state(st), None)
            self.state = setup if setup is not None else st
            self.messages = list(self.state["prompt"])
        return self.state

    def step(self, turn_text: str, turn_ids: list[int]) -> Observation:
        from verifiers.legacy.types import AssistantMessage, ToolCall
        from verifiers.legacy.utils.message_utils import normalize_messages

        st = self._state()
        content, calls, bad = parse_tool_calls(turn_text) if self.env.tool_defs else (turn_text, [], 0)
        reply = AssistantMessage(content=content, tool_calls=[ToolCall(**c) for c in calls] or None)
        st["trajectory"].append({"prompt": list(self.messages), "completion": [reply], "response": None,
                                 "tokens": None, "reward": None, "advantage": None, "is_truncated": False,
                                 "trajectory_id": st["trajectory_id"], "extras": {}})
        self.messages.append(reply)
        if resolve(self.env.is_completed(st), None):  # a turn of malformed calls only has no tool_calls, as
            return Observation(done=True, tool_call=bool(calls or bad), tool_error=bad > 0)  # with an API parser
        answer = normalize_messages(resolve(self.env.env_response(list(self.messages), st), None),
                                    field_name="env_response")
        if st.get("final_env_response") is not None:
            self.messages += answer
            return Observation(done=True, tool_call=bool(calls))
        self.messages += answer
        return Observation(messages=[{"role": m.role, "content": _text(m.content)} for m in answer],
                           tool_call=bool(calls), tool_error=bad > 0)

    def reward(self) -> float:
        """The rubric's weighted sum; ``self.scores``: every function's own score."""
        st = self._state()
        st["completion"] = self.messages[len(st["prompt"]):]
        total, self.scores = vl.score(self.vf, self.env, st, f"env component verifiers ({self.comp.params.id})")
        st["reward"], st["metrics"] = total, dict(self.scores)
        return total


class Verifiers(Env):
    """An environment of the verifiers package: its dataset, parser, rubric, stop conditions and
    ``env_response`` drive policyzoo's token-exact episodes (module docstring).

    Reset: the row's prompt (the environment's dataset row), with the tool list and call format
    added to its system message when the environment has tools. Step: verifiers' ``is_completed``
    then ``env_response`` (tool results as ``tool`` messages). Reward: the rubric's weighted sum;
    per-function scores as ``env_score/<name>``. Refused (``UserError`` before load): see
    :mod:`policyzoo.plugins.env.verifiers_load`.
    Source: verifiers (github.com/PrimeIntellect-ai/verifiers), the ``load_environment`` /
    ``MultiTurnEnv.env_response`` / ``Rubric`` API; driven token-exact as prime-rl trains on its
    environments, with policyzoo's own sampler instead of an OpenAI client."""

    name = "verifiers"

    class Params(Env.Params):
        id: str = Field(..., pattern=r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$",
                        description="the installed environment module (its load_environment), or module:function")
        args: dict[str, Any] = Field({}, description="keyword arguments of load_environment")

    contract_params = {"id": "policyzoo.testing.verifiers_example"}

    def __init__(self, **params):
        super().__init__(**params)
        where = f"algorithm.env (verifiers: {self.params.id})"
        self.vf = vl.import_verifiers(where)
        self.vf_env = vl.load(self.params.id, dict(self.params.args), where)
        defs = self.vf_env.tool_defs or []
        self.tools_text = TOOL_FORMAT + json.dumps(
            [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in defs]) if defs else ""

    def prompt_with_tools(self, messages: list[dict]) -> list[dict]:
        """``messages`` with the tool list and call format ending the system message (added first
        when there is none); unchanged without tools."""
        if not self.tools_text:
            return messages
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": messages[0]["content"] + "\n\n" + self.tools_text}, *messages[1:]]
        return [{"role": "system", "content": self.tools_text}, *messages]

    def task_rows(self, data) -> tuple[list[dict], list[dict]]:
        """``(training rows, held-out rows)`` from the environment's datasets (module docstring)."""
        where = f"algorithm.env (verifiers: {self.params.id}), dataset"
        train = self._rows(self.vf_env.dataset if self.vf_env.dataset is not None else self.vf_env.build_dataset(),
                           where)
        held_ds = self.vf_env.eval_dataset if self.vf_env.eval_dataset is not None else \
            self.vf_env.build_eval_dataset()
        if held_ds is not None and len(held_ds):  # an empty eval_dataset is none
            held = self._rows(held_ds, where.replace("dataset", "eval_dataset"))
            return train, held[:eval_count(data.eval_size, len(held))]
        n = eval_count(data.eval_size, len(train))
        n = 0 if 2 * n >= len(train) else n  # as for a file: never hold out half of the rows or more
        held, pool = split_by_prompt(train, n, "prompt", data.seed)
        return pool, held

    def _rows(self, ds, where: str) -> list[dict]:
        if ds is None:
            raise DataError(where, "the environment has no dataset", "give load_environment a dataset")
        rows = ds.to_list()
        if not rows:
            raise DataError(where, "the dataset is empty (0 rows)", "give load_environment a dataset with rows")
        if "prompt" not in rows[0]:
            raise DataError(where, f"no 'prompt' column (columns: {', '.join(map(str, rows[0]))})",
                            "give the environment's dataset a 'prompt' (chat messages) or 'question' column")
        return rows

    def env(self, row):
        return VerifiersEpisode(row, self)


COMPONENTS = (Verifiers,)
