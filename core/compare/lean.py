"""Lean runs: what ``policyzoo compare``'s runs keep on disk, and the plan line's disk estimate.

A compare run is one measurement: what the table reads is its ``config.yaml``, ``summary.json`` and
``metrics.jsonl`` (kilobytes). Each run therefore gets, unless the overrides set them:

* ``engine.keep_checkpoints=1``: one checkpoint at a time (resume needs only the last one);
* ``engine.delete_checkpoints_at_end=true``: that checkpoint is deleted once ``summary.json`` is written
  (and the last step's checkpoint is not written: a kill during the last evaluation resumes from the
  last ``train.save_every`` one);
* ``train.export_final=false``: no ``final/`` save_pretrained export (``--export`` keeps it).

These keys change what is written, never the update: :data:`OUTPUT_KEYS` may differ between runs
compared (:mod:`.aggregate`) and between a folder and its plan (:mod:`.runs`).

The estimate (:func:`estimate`) counts bytes from the model's ``config.json`` (:mod:`policyzoo.plan`'s
parameter count): a DeepSpeed checkpoint of a full fine-tune holds the weights in ``model.dtype``
(4 or 2 bytes per parameter), AdamW's two moments in fp32 (8 bytes) and, for bf16 weights, the fp32
master copy (4 bytes): 12 bytes per parameter in fp32, 14 in bf16 (SmolLM2-135M: 134.5M x 12 = 1.61 GB).
The export holds the weights in ``model.dtype``. LoRA runs and a critic's checkpoint are not estimated.
"""

from __future__ import annotations

from policyzoo.errors import UserError
from policyzoo.plan.model_shape import load_shape

OUTPUT_KEYS = ("engine.keep_checkpoints", "engine.delete_checkpoints_at_end", "train.export_final")
GB = 1e9


def overrides(given: list[str], export: bool) -> list[str]:
    """The lean settings (module docstring) the overrides ``given`` do not set themselves."""
    keys = {item.split("=", 1)[0].strip() for item in given}
    lean = {"engine.keep_checkpoints": "1", "engine.delete_checkpoints_at_end": "true",
            "train.export_final": "true" if export else "false"}
    return [f"{k}={v}" for k, v in lean.items() if k not in keys]


def estimate(config: dict) -> dict | None:
    """Bytes of one run of ``config`` (a ``config.model_dump()``): ``checkpoint`` (one), ``export``
    (``final/``), ``peak`` while it runs and ``kept`` after it (both without metrics and logs);
    None for a LoRA run or a model whose ``config.json`` cannot be read."""
    model, engine, train = config.get("model") or {}, config.get("engine") or {}, config.get("train") or {}
    if model.get("lora") is not None:
        return None
    try:
        params = load_shape(model.get("path")).params
    except UserError:
        return None
    width = 2 if model.get("dtype") == "bfloat16" else 4
    checkpoint = params * (width + 8 + (4 if width == 2 else 0))
    export = params * width if train.get("export_final", True) else 0
    saves = checkpoints_written(train, bool(engine.get("delete_checkpoints_at_end")))
    keep = int(engine.get("keep_checkpoints", 2))
    kept = 0 if engine.get("delete_checkpoints_at_end") else min(saves, keep)
    return {"params": params, "checkpoint": checkpoint, "export": export, "saves": saves,
            "peak": min(saves, keep + 1) * checkpoint + export, "kept": kept * checkpoint + export}


def checkpoints_written(train: dict, delete_at_end: bool) -> int:
    """How many checkpoints a run of ``train`` settings writes: one at every ``save_every`` or
    ``export_every`` step before the last, and one at the last step unless ``delete_at_end``. While
    one is written the ``keep_checkpoints`` before it are still there (it replaces them once complete)."""
    steps, every = int(train.get("steps", 20)), [int(train.get(k) or 0) for k in ("save_every", "export_every")]
    periodic = sum(any(e and k % e == 0 for e in every) for k in range(1, steps))
    return periodic + (0 if delete_at_end else 1)


def plan_line(configs: list[dict], parallel: int) -> str:
    """The plan's disk line for the runs still to do (their configs), or ``""`` without an estimate."""
    sizes = [e for e in map(estimate, configs) if e is not None]
    if not sizes:
        return ""
    e = max(sizes, key=lambda x: x["peak"])
    parts = (f"one checkpoint {e['checkpoint'] / GB:.2f} GB ({e['params'] / 1e6:.1f}M parameters: weights + AdamW)"
             if e["saves"] else "no checkpoint written: train.save_every and train.export_every are 0, and the last "
             f"step's is skipped when deleted at the end (resume would need one of {e['checkpoint'] / GB:.2f} GB)")
    if e["export"]:
        parts += f" + final/ export {e['export'] / GB:.2f} GB"
    kept = sum(x["kept"] for x in sizes)
    return (f"disk (estimate): up to {e['peak'] / GB:.2f} GB per run while it runs ({parts}), {e['kept'] / GB:.2f} "
            f"GB kept per run after it, besides its metrics; {len(sizes)} run(s): peak about "
            f"{(min(parallel, len(sizes)) * e['peak'] + kept) / GB:.2f} GB, {kept / GB:.2f} GB kept at the end")
