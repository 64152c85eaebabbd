"""Tasks: prompts and reference answers for training and evaluation.

Public API::

    from policyzoo.data import DataSettings, Task, load_task, prompt_batches

    task = load_task(DataSettings(name="arithmetic", seed=0))   # or load_task({"name": "gsm8k"})
    batches = task.batches(P=4)            # == prompt_batches(task.train_rows, 4, task.seed)
    rows = next(batches)                   # 4 dicts: prompt (chat messages), answer (str), ...
    run = policyzoo.assemble("grpo", rewards=tuple(task.default_rewards))

Built-in tasks: ``arithmetic`` (default, generated) and ``gsm8k`` (shipped: 2,000 training rows,
the full 1,319-row test set; MIT, see ``LICENSE-gsm8k``). Any local JSON/JSONL/Parquet file or
saved ``datasets`` folder via ``path`` + ``prompt_column`` / ``answer_column``. See docs/data.md.
"""

from .answers import gsm8k_final_answer, normalize_number
from .batching import batch_at, prompt_batches, rows_at
from .data_section import DataSettings
from .rows import check_prompt_lengths, fit_prompt_lengths
from .task import Task, load_task

__all__ = ["DataSettings", "Task", "batch_at", "check_prompt_lengths", "fit_prompt_lengths", "gsm8k_final_answer",
           "load_task", "normalize_number", "prompt_batches", "rows_at"]
