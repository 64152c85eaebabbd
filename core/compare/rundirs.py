"""Reading the run directories ``policyzoo train`` writes (layout: :mod:`policyzoo.engine.rundir`).

A run directory counts when it holds ``config.yaml`` and a complete ``summary.json`` (valid JSON with
``steps`` and ``eval_accuracy_after``: written last, once the run has finished). ``metrics.jsonl`` is
read up to a line cut by a kill, as the engine reads it. Anything else under a folder searched is
named and left out (:class:`Skipped`): an empty folder, a run without its summary (not finished or
half written), files that do not parse.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

#: files a run directory holds (what marks a folder as one, and what a stale run start leaves)
RUN_FILES = {"config.yaml", "resolved.yaml", "metrics.jsonl", "summary.json", "completions.jsonl", "plugins.json",
             "run.pid", "startup.log", "checkpoints", "tensorboard", "final", "dataset", "eval_dataset"}

MARKS = {"config.yaml", "summary.json", "metrics.jsonl", "run.pid"}  # a folder holding one is read as a run


@dataclass
class Run:
    """One finished run: its folder, ``config`` (config.yaml), ``summary`` (summary.json) and the
    metrics records (``train`` and ``evals``, each sorted by step, one record per step)."""

    path: Path
    config: dict
    summary: dict
    train: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)

    @property
    def seed(self) -> int:
        return int((self.config.get("train") or {}).get("seed", 0))

    @property
    def data_seed(self) -> int:
        return int((self.config.get("data") or {}).get("seed", 0))


@dataclass
class Skipped:
    path: Path
    why: str


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file up to the first line that does not parse (a kill's cut)."""
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def read_summary(path: Path) -> dict | None:
    """``summary.json`` if it is complete (a mapping with ``steps`` and ``eval_accuracy_after``), else None."""
    try:
        data = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "steps" in data and "eval_accuracy_after" in data else None


def by_step(records: list[dict]) -> list[dict]:
    """One record per step (the last one written), sorted by step."""
    keep = {}
    for r in records:
        if isinstance(r.get("step"), int):
            keep[r["step"]] = r
    return [keep[s] for s in sorted(keep)]


def read_run(path: Path) -> Run | Skipped:
    """The finished run in ``path``, or why it is left out."""
    if not path.is_dir():
        return Skipped(path, "not a directory")
    if not any(path.iterdir()):
        return Skipped(path, "empty directory")
    try:
        config = yaml.safe_load((path / "config.yaml").read_text())
    except FileNotFoundError:
        if (path / "run.pid").exists():
            return Skipped(path, "no config.yaml: a run that stopped while starting (nothing to resume)")
        return Skipped(path, "no config.yaml: not a run directory of `policyzoo train`")
    except (OSError, yaml.YAMLError) as e:
        return Skipped(path, f"config.yaml does not parse ({type(e).__name__})")
    if not isinstance(config, dict):
        return Skipped(path, "config.yaml is not a mapping")
    summary = read_summary(path)
    if summary is None:
        ckpt = (path / "checkpoints" / "latest.json").is_file()
        how = (f"resume it with `policyzoo train --resume {path}`" if ckpt else
               "it holds no checkpoint to resume from: delete it and run it again")
        return Skipped(path, f"no complete summary.json: the run has not finished or was cut off; {how}")
    records = read_jsonl(path / "metrics.jsonl")
    train = by_step([r for r in records if r.get("kind", "train") == "train"])
    evals = by_step([r for r in records if r.get("kind") == "eval"])
    if not train:
        return Skipped(path, "metrics.jsonl holds no training step")
    return Run(path, config, summary, train, evals)


def _candidates(root: Path) -> list[Path]:
    """``root`` if it is a run directory, else every run directory and empty folder below it."""
    if any((root / name).exists() for name in MARKS):
        return [root]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = set(dirnames) | set(filenames)
        if here & MARKS:
            out.append(Path(dirpath))
            dirnames[:] = []  # a run's own folders (checkpoints, final) hold no other run
        elif not here:
            out.append(Path(dirpath))
        dirnames.sort()
    return out


def find_runs(patterns: list[str]) -> tuple[list[Run], list[Skipped]]:
    """The finished runs under the given folders or globs (each run once, in the order found) and the
    folders left out with the reason. A pattern that matches nothing is a Skipped entry too."""
    runs: list[Run] = []
    skipped: list[Skipped] = []
    seen: set[Path] = set()
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if Path(m).exists()]
        if not matches:
            skipped.append(Skipped(Path(pattern), "no such file or directory"))
            continue
        for m in matches:
            found = _candidates(Path(m)) if Path(m).is_dir() else [Path(m)]
            if not found:
                skipped.append(Skipped(Path(m), "no run directory below it"))
            for path in found:
                key = path.resolve()
                if key in seen:
                    continue
                seen.add(key)
                got = read_run(path)
                (runs if isinstance(got, Run) else skipped).append(got)
    return runs, skipped
