"""The shared-prompt check's passing result, remembered between runs.

At start-up the trainer compares shared-prompt scoring with the per-row forward
(:meth:`~policyzoo.engine.trainer.scoring.Scoring.check_share_prompt`): two forwards of a fixed 107-token
sequence, ~2 s of every start of the default model on a 2-core CPU, with the same answer every time for the
same model, code and libraries. A pass is kept in ``CACHE/share-prompt-check/<key>.json`` (the cache of
:func:`policyzoo.engine.models.cache_dir`) and a later start with the same key reuses it instead of the two
forwards. Only passes are kept: a failing check runs (and warns) at every start.

The key covers what the comparison depends on: the model folder's files (name, size, modification time in
ns: a retrained or replaced weight file gives another key), the weights' dtype, the LoRA settings, the
attention implementation, the device type, the CPU's vector ISA (torch's capability: a cache shared between
kinds of CPU keeps one pass each), the versions of torch, transformers, peft and DeepSpeed, the source of the
modules that score (prefix caching, log-probs, packing, this check) and the checked token ids. A file that
cannot be read or written, or does not parse, is ignored (the check runs as without a cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

import torch

from policyzoo.engine.models import cache_dir

#: the modules whose code the check's numbers come from (read as files: scoring imports this module)
SCORING_MODULES = ("prefix.py", "logprob.py", "modeling.py", "scoring.py", "share_check.py")


def _source(name: str) -> str:
    try:
        return (Path(__file__).parent / name).read_text(encoding="utf-8")
    except OSError:
        return name


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def _files(folder: Path) -> list:
    """(name, size, mtime_ns) of every file directly in the model folder (weights, config, index)."""
    try:
        return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    except OSError:
        return []


def check_key(trainer, ids: list[int]) -> str | None:
    """A hex digest of what the check's result depends on (see the module docstring); None for a trainer
    without a model folder (nothing to key the result on: no cache)."""
    folder = getattr(getattr(trainer, "info", None), "path", None)
    if folder is None:
        return None
    model = getattr(trainer.engine, "module", trainer.engine)
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    parts = [_files(Path(folder)), trainer.dtype, repr(getattr(model, "peft_config", None)), attn,
             str(trainer.device), torch.backends.cpu.get_cpu_capability(),
             [_version(d) for d in ("torch", "transformers", "peft", "deepspeed")],
             [_source(name) for name in SCORING_MODULES], list(ids)]
    return hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()[:40]


def _path(key: str, root: Path | None) -> Path:
    return Path(root or cache_dir()) / "share-prompt-check" / f"{key}.json"


def recall(key: str | None, tolerance: float, root: Path | None = None) -> dict | None:
    """The remembered result of ``key`` (``max_diff``, ``mean_diff``) when it passes ``tolerance``; else None."""
    if key is None:
        return None
    try:
        data = json.loads(_path(key, root).read_text(encoding="utf-8"))
        max_diff, mean_diff = float(data["max_diff"]), float(data["mean_diff"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # RecursionError: a deeply nested file
        return None
    return {"max_diff": max_diff, "mean_diff": mean_diff} if max_diff <= tolerance else None  # NaN: not kept


def remember(key: str | None, result: dict, root: Path | None = None) -> None:
    """Keep a passing result (best effort: an unwritable cache is skipped; the file is replaced whole)."""
    if key is None:
        return
    path, tmp = _path(key, root), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".check-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"max_diff": result["max_diff"], "mean_diff": result["mean_diff"]}, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
