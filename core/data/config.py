"""``DataSettings``: the ``data:`` section of a run's config (which task, which rows, which prompt).

Three kinds of source, chosen in this order:

* ``path`` set: a local ``.json`` / ``.jsonl`` / ``.csv`` / ``.parquet`` file (read with
  ``datasets.load_dataset``), or a folder written by ``datasets.Dataset.save_to_disk``.
* ``name`` a built-in task: ``arithmetic`` (generated from ``seed``; the default) or ``gsm8k``
  (shipped inside the package).
* any other ``name``: a Hugging Face ``datasets`` data set that is already in the local cache.
  Nothing is ever downloaded at run time: a name that is not cached is an error.
"""

from __future__ import annotations

from typing import Literal

import pydantic


class DataSettings(pydantic.BaseModel):
    """Which data set feeds the prompts, and how its columns map to ``prompt`` and ``answer``."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: str = pydantic.Field(
        "arithmetic", description="built-in task ('arithmetic', 'gsm8k') or a locally cached `datasets` name")
    path: str | None = pydantic.Field(
        None, description="local .json/.jsonl/.csv/.parquet file or a `save_to_disk` folder; overrides `name`")
    eval_path: str | None = pydantic.Field(
        None, description="a separate file or folder of held-out rows (same columns); overrides eval_split")
    split: str = pydantic.Field("train", description="split to train on (gsm8k, `datasets` sources)")
    eval_split: str | None = pydantic.Field(
        None, description="split for held-out rows; None = gsm8k 'test', else `eval_size` rows held out of `split`")
    prompt_column: str | None = pydantic.Field(
        None, description="column holding the prompt: a string or a list of chat messages "
                          "(default: 'question' for gsm8k, 'prompt' otherwise)")
    answer_column: str = pydantic.Field("answer", description="column holding the reference answer (may be "
                                        "absent when no reward needs an answer: reward models, custom functions)")
    answer_type: Literal["number", "text"] = pydantic.Field(
        "number", description="'number': every answer must be a number (checked at load); 'text': any string")
    system_prompt: str | None = pydantic.Field(
        None, description="system message; None = the task's default, '' = no system message")
    prompt_format: Literal["chat", "plain"] = pydantic.Field(
        "chat", description="'chat': chat messages through the tokenizer's chat template; 'plain': one text "
                            "(system prompt, solved examples and the question joined by blank lines) tokenized as "
                            "is, for models without a chat template")
    few_shot: int | None = pydantic.Field(
        None, ge=0, le=16, description="solved examples put before each prompt (None = 2 for arithmetic, else 0)")
    eval_size: pydantic.NonNegativeInt | pydantic.confloat(gt=0, lt=1) = pydantic.Field(
        100, description="held-out rows for evaluation: a count, or a fraction of the rows (0.1); a count that "
        "would take half of a file's rows or more holds none out (with a warning)")
    on_long_prompt: Literal["drop", "error"] = pydantic.Field(
        "drop", description="a prompt longer than the context leaves room for: drop the row (counted, with a "
                            "warning) or stop with an error")
    seed: int = pydantic.Field(0, description="seed of the generated task, the held-out split and the shuffle")
    limit: int | None = pydantic.Field(
        None, ge=1, description="use at most this many training rows (None = all; arithmetic: 5000)")
