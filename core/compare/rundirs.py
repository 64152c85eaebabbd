"""Reading the run directories ``policyzoo train`` writes (layout: :mod:`policyzoo.engine.rundir`).

A run directory counts when it holds ``config.yaml`` and a complete ``summary.json`` (valid JSON with
``steps`` and ``eval_accuracy_after``, or ``"stopped_early": true``: written last, once the run has
finished or stopped) and a ``metrics.jsonl`` with every training step up to the summary's ``steps``,
each line whole. A recorded run (``bench/compare_record.py`` copies ``resolved.yaml``, not
``config.yaml``) is read from ``resolved.yaml``: its sections are the config's, and its algorithm is
the resolved name (``grpo``, ``grpo+clip=cispo``); a parameter changed without a component swap is
not in that name, so two such runs of one seed are refused as the same algorithm twice. Anything else under a folder
searched is named and left out (:class:`Skipped`): an empty folder, a run without its summary (not
finished or half written), a metrics file cut short (fewer steps than the summary, a line cut off),
files that do not parse, a value that is not a number where the table needs one.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from policyzoo.engine.rundir import RUN_MARKS, RunDir

#: files a run directory holds (what marks a folder as one, and what a stale run start leaves); wandb's folder
#: (train.report_to) and curves.png (`policyzoo plot RUN_DIR`) included
RUN_FILES = {"config.yaml", "resolved.yaml", "metrics.jsonl", "summary.json", "completions.jsonl", "plugins.json",
             "run.pid", "startup.log", "checkpoints", "tensorboard", "final", "dataset", "eval_dataset", "wandb",
             "curves.png"}
#: the numbers the table reads: in summary.json, and in metrics.jsonl's records (a number or null each)
SUMMARY_NUMBERS = ("eval_accuracy_before", "eval_accuracy_after", "peak_rss_gib", "process_to_ready_seconds")
RECORD_NUMBERS = ("reward_mean", "kl_ref", "entropy", "clip_frac_low", "clip_frac_high", "response_length_mean",
                  "time_step", "time_eval", "rollout_tokens", "prompt_tokens", "peak_rss_gib",
                  "gpu_peak_allocated_gib", "eval_accuracy", "zero_std_frac", "kept_frac", "rows", "eval_rows",
                  "response_length_correct_mean", "response_length_wrong_mean")

MARKS = {"config.yaml", "summary.json", "metrics.jsonl", "run.pid"}  # a folder holding one is read as a run


def not_a_run(path: Path) -> str:
    """Why the folder holds no run although it holds a name a run writes (``config.yaml``, ``final``,
    ``checkpoints``) with none of the files only a run writes beside it (:data:`~policyzoo.engine.rundir.RUN_MARKS`),
    or ``""``: those are the user's, never removed (``policyzoo train`` refuses such a folder the same way)."""
    clash = RunDir(path).clashes()
    if not clash:
        return ""
    return (f"holds {', '.join(clash)}, not written by a run (no {' or '.join(RUN_MARKS[:2])} beside it): not a run; "
            "it is never removed: move it elsewhere to run there, or choose another --output-dir")


def start_over(path: Path) -> str:
    """How to run a folder's run again from scratch: delete the folder when it holds only a run's files
    (:data:`RUN_FILES`), else remove those alone (named), since the other files are the user's."""
    names = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    theirs = [n for n in names if n in RUN_FILES]
    if len(theirs) == len(names):
        return f"delete the folder {path}"
    return f"remove the run's files from {path} ({', '.join(theirs)}; the other files are not a run's and stay)"


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

    @property
    def stopped(self) -> bool:
        """The run stopped before its planned steps (summary.json's ``stopped_early``; why: ``stop_reason``)."""
        return self.summary.get("stopped_early") is True


@dataclass
class Skipped:
    path: Path
    why: str


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file up to the first line that does not parse (a kill's cut)."""
    return read_jsonl_cut(path)[0]


def read_jsonl_cut(path: Path) -> tuple[list[dict], int | None]:
    """The records up to the first line that does not parse (or is not a JSON object), and that
    line's number (1-based; None when every line parses)."""
    out: list[dict] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return out, None
    for i, line in enumerate(text.splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            return out, i
        if not isinstance(rec, dict):
            return out, i
        out.append(rec)
    return out, None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def not_a_number(summary: dict, records: list[dict]) -> str | None:
    """Why a value the table reads is unusable (a string where a number belongs), or None."""
    for key in SUMMARY_NUMBERS:
        if summary.get(key) is not None and not is_number(summary[key]):
            return f"summary.json's {key} is {summary[key]!r}, not a number"
    for rec in records:
        for key in RECORD_NUMBERS:
            if rec.get(key) is not None and not is_number(rec[key]):
                return f"metrics.jsonl's {key} at step {rec.get('step')} is {rec[key]!r}, not a number"
    return None


def summary_steps(summary: dict) -> int | None:
    """summary.json's ``steps`` when it is a step count (an integer >= 0), else None."""
    steps = summary.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else None


def read_summary(path: Path) -> dict | None:
    """``summary.json`` if it is complete (a mapping with ``steps`` and ``eval_accuracy_after``, or with
    ``steps`` and ``"stopped_early": true``), else None."""
    try:
        data = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or "steps" not in data:
        return None
    return data if "eval_accuracy_after" in data or data.get("stopped_early") is True else None


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
    foreign = not_a_run(path)
    if foreign:
        return Skipped(path, foreign)
    try:
        config = yaml.safe_load((path / "config.yaml").read_text())
    except FileNotFoundError:
        if (path / "resolved.yaml").is_file() and (path / "summary.json").is_file():
            return _recorded(path)
        if (path / "run.pid").exists():
            return Skipped(path, "no config.yaml: a run that stopped while starting (nothing to resume)")
        return Skipped(path, "no config.yaml: not a run directory of `policyzoo train`")
    except (OSError, yaml.YAMLError) as e:
        return Skipped(path, f"config.yaml does not parse ({type(e).__name__})")
    if not isinstance(config, dict):
        return Skipped(path, "config.yaml is not a mapping")
    summary = read_summary(path)
    if summary is None:
        return Skipped(path, "no complete summary.json: the run has not finished or was cut off; "
                       + _resume_hint(path, config))
    return _with_metrics(path, config, summary)


def _recorded(path: Path) -> Run | Skipped:
    """A recorded run (``resolved.yaml``, summary.json, metrics.jsonl; see the module docstring)."""
    try:
        config = yaml.safe_load((path / "resolved.yaml").read_text())
    except (OSError, yaml.YAMLError) as e:
        return Skipped(path, f"resolved.yaml does not parse ({type(e).__name__})")
    algo = config.get("algorithm") if isinstance(config, dict) else None
    if not isinstance(algo, dict) or not isinstance(algo.get("name"), str):
        return Skipped(path, "no config.yaml, and resolved.yaml names no algorithm (algorithm.name)")
    summary = read_summary(path)
    if summary is None:
        return Skipped(path, "no complete summary.json beside resolved.yaml: a recorded run that had not finished")
    return _with_metrics(path, {**config, "algorithm": algo["name"]}, summary)


def _resume_hint(path: Path, config: dict) -> str:
    """How to finish a run without its summary: resume from its checkpoint, or (none) run it again. A checkpoint
    of its final step (stopped while finishing) is one `--resume` alone refuses, as it would rewind the run."""
    try:
        latest = json.loads((path / "checkpoints" / "latest.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"it holds no checkpoint to resume from: {start_over(path)}, then run it again"
    train = config.get("train")
    steps = train.get("steps") if isinstance(train, dict) else None
    if isinstance(latest, int) and isinstance(steps, int) and latest >= steps:
        return (f"its checkpoint is of its final step {latest} (stopped while finishing), so `--resume` alone is "
                f"refused: `policyzoo train --resume {path} train.steps={latest + 1}` runs one step more, or "
                f"{start_over(path)} and run it again")
    return f"resume it with `policyzoo train --resume {path}`"


def _with_metrics(path: Path, config: dict, summary: dict) -> Run | Skipped:
    """The run once its summary's steps, its metrics file and its numbers hold up, else why not."""
    steps = summary_steps(summary)
    if steps is None:
        return Skipped(path, f"summary.json's steps is {summary['steps']!r}, not a step count: the file is not "
                       "the one `policyzoo train` wrote; run it again")
    records, cut = read_jsonl_cut(path / "metrics.jsonl")
    if cut is not None:
        return Skipped(path, f"metrics.jsonl line {cut} does not parse (cut off while written, or edited): the "
                       "per-step values would end early; run it again, or restore the file")
    train = by_step([r for r in records if r.get("kind", "train") == "train"])
    evals = by_step([r for r in records if r.get("kind") == "eval"])
    if not train:
        return Skipped(path, "metrics.jsonl holds no training step")
    have = {r["step"] for r in train}
    if sum(1 <= k <= steps for k in have) < steps:
        return Skipped(path, f"metrics.jsonl holds {len(have)} of the {steps} training steps summary.json "
                       "counts (cut short): its last-20% window would be another; run it again, or restore the "
                       "file")
    bad = not_a_number(summary, records)
    if bad is not None:
        return Skipped(path, f"{bad}: run it again, or fix the value")
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
