"""From raw rows to task rows: column mapping, checks, and chat prompts.

A task row is the source row (all its columns) with two keys set:

* ``prompt``: a list of chat messages ``[{"role": ..., "content": ...}]`` ready for
  ``tokenizer.apply_chat_template``: the system message (if any), then ``few_shot`` solved
  examples as user/assistant pairs, then the row's own prompt. A string prompt becomes one user
  message; a list of messages is kept as is (the system message is added only if it has none).
* ``answer``: the reference answer as a string (normalised when the task is numeric).
* ``_raw_prompt``: the row's own prompt as the data gives it (a string, or a list of messages),
  for TRL-style reward functions (plain-text data gets the string, chat data the messages).

Every check runs on every row before training, and names the row by its 0-based index in the
source (for JSON Lines: the index among non-empty lines).
"""

from __future__ import annotations

from typing import Callable

from policyzoo.errors import DataError, did_you_mean

from .answers import normalize_number

ROLES = ("system", "user", "assistant", "tool")


def check_rows(raw: list[dict], prompt_column: str, answer_column: str, answer_type: str,
               where: str) -> list[dict]:
    """Validate the columns of every row; return copies with ``answer`` set (normalised numbers
    for ``answer_type == "number"``) and the prompt left in ``prompt_column``.

    Prompt-only data: when no row has ``answer_column``, the rows get no ``answer`` key and the
    caller decides (:func:`missing_column` gives the error to raise if a reward needs answers)."""
    if not raw:
        raise DataError(where, "the data set is empty (0 rows)", "point data.path / data.name at data with rows")
    if prompt_column not in raw[0]:
        raise missing_column(raw, prompt_column, "prompt_column", where)
    has_answer = any(answer_column in row for row in raw)
    out = []
    for i, row in enumerate(raw):
        if not has_answer:
            _check_prompt(row.get(prompt_column), f"{where}, row {i}, column {prompt_column!r}")
            out.append(dict(row))
            continue
        for col in (prompt_column, answer_column):
            if row.get(col) is None:
                raise DataError(f"{where}, row {i}", f"column {col!r} is missing or null",
                                "fill it in or remove the row")
        _check_prompt(row[prompt_column], f"{where}, row {i}, column {prompt_column!r}")
        answer = row[answer_column]
        if answer_type == "number":
            norm = normalize_number(answer)
            if norm is None:
                raise DataError(f"{where}, row {i}, column {answer_column!r}",
                                f"the answer {str(answer)[:80]!r} is not a number, and this task's answers are numeric",
                                "fix the row, or set data.answer_type: text for free-form answers")
            answer = norm
        elif not isinstance(answer, (str, int, float)) or isinstance(answer, bool) or str(answer).strip() == "":
            raise DataError(f"{where}, row {i}, column {answer_column!r}",
                            f"the answer {answer!r} is empty or not a string/number", "fix the row or remove it")
        out.append({**row, "answer": str(answer)})
    return out


def _check_prompt(value, where: str) -> None:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(where, "the prompt is an empty string", "fill it in or remove the row")
        return
    if isinstance(value, list) and value:
        for j, m in enumerate(value):
            ok = isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
            if not ok:
                raise DataError(f"{where}, message {j}", f"expected {{'role': one of {ROLES}, 'content': str}}, "
                                f"got {str(m)[:80]}", "write the prompt as a string or a list of chat messages")
        if value[-1]["role"] == "assistant":
            raise DataError(where, "the prompt's last message is from the assistant, so there is nothing to answer",
                            "end the prompt with a user message")
        return
    raise DataError(where, f"the prompt must be a string or a non-empty list of chat messages, got "
                    f"{type(value).__name__}", "write the prompt as text or as [{'role': 'user', 'content': ...}]")


def missing_column(raw: list[dict], column: str, key: str, where: str) -> DataError:
    """The error for a column (``data.<key>``) that the rows of ``raw`` do not have."""
    columns = list(raw[0]) if raw else []
    return DataError(f"{where} (data.{key})", f"no column {column!r} in the data{did_you_mean(column, columns)}; "
                     f"columns are: {', '.join(map(str, columns))}",
                     f"set data.{key} to the column that holds the {key.split('_')[0]}")


def as_messages(value) -> list[dict]:
    """A prompt (string or list of messages) as a fresh list of messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [{"role": m["role"], "content": m["content"]} for m in value]


def build_prompts(rows: list[dict], prompt_column: str, system_prompt: str | None, examples: list[dict],
                  solved: Callable[[dict], str], plain: bool = False) -> list[dict]:
    """Set ``row["prompt"]`` to the chat messages: system, solved examples, the row's prompt.

    ``solved(example_row)`` is the assistant's text for a few-shot example (e.g. ``Answer: 68``).
    ``plain`` (``data.prompt_format: plain``): one string instead, for models without a chat
    template: the messages' contents joined by blank lines, except that each example's question
    and answer, and the row's own question and the reply to come, are joined by one newline::

        SYSTEM\n\nQUESTION 1\nANSWER 1\n\nQUESTION\n"""
    if plain:
        chats = build_prompts(rows, prompt_column, system_prompt, examples, solved)
        return [{**row, "prompt": _plain(row["prompt"])} for row in chats]
    shots: list[dict] = []
    for ex in examples:
        shots += [m for m in as_messages(ex[prompt_column]) if m["role"] != "system"]
        shots.append({"role": "assistant", "content": solved(ex)})
    out = []
    for row in rows:
        own = as_messages(row[prompt_column])
        head = []
        if own and own[0]["role"] == "system":
            head, own = [own[0]], own[1:]
        elif system_prompt:
            head = [{"role": "system", "content": system_prompt}]
        out.append({**row, "prompt": head + shots + own, "_raw_prompt": row[prompt_column]})
    return out


def _plain(messages: list[dict]) -> str:
    parts: list[str] = []
    for m in messages:
        if m["role"] == "assistant" and parts:
            parts[-1] += "\n" + m["content"]
        else:
            parts.append(m["content"])
    return "\n\n".join(parts) + "\n"


def check_prompt_lengths(rows: list[dict], count_tokens: Callable[[list[dict]], int], max_prompt_tokens: int,
                         where: str = "data", origins: list[str] | None = None) -> list[int]:
    """Token count of every row's ``prompt`` (``count_tokens(messages)``, e.g. the length of
    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``); raises
    :class:`DataError` naming the first row longer than ``max_prompt_tokens`` (the model's
    context minus the response budget): by ``origins[i]`` when given (the file and the file's
    own row, ``Task.train_origins``), else as ``"{where}, row {i}"``."""
    counts = []
    for i, row in enumerate(rows):
        n = int(count_tokens(row["prompt"]))
        if n > max_prompt_tokens:
            at = origins[i] if origins else f"{where}, row {i}"
            raise DataError(at, f"the prompt is {n} tokens, longer than the {max_prompt_tokens} "
                            "the context leaves for it (context length minus the response's max tokens)",
                            "shorten or drop the row, lower data.few_shot, or lower the response's max tokens")
        counts.append(n)
    return counts


def fit_prompt_lengths(rows: list[dict], count_tokens: Callable[[list[dict]], int], max_prompt_tokens: int,
                       where: str, on_long: str = "error", origins: list[str] | None = None
                       ) -> tuple[list[dict], list[int], list[str] | None, int]:
    """``(kept rows, their token counts, their origins, number dropped)``: with ``on_long == "drop"``
    the rows whose prompt is longer than ``max_prompt_tokens`` are left out (with their entries of
    ``origins``); with ``"error"`` the first one raises (see :func:`check_prompt_lengths`)."""
    if on_long == "error":
        return rows, check_prompt_lengths(rows, count_tokens, max_prompt_tokens, where, origins), origins, 0
    every = [int(count_tokens(row["prompt"])) for row in rows]  # each prompt counted once
    keep = [i for i, n in enumerate(every) if n <= max_prompt_tokens]
    return ([rows[i] for i in keep], [every[i] for i in keep], [origins[i] for i in keep] if origins else origins,
            len(rows) - len(keep))
