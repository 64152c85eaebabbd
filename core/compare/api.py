"""``policyzoo.compare(...)``: the Python twin of ``policyzoo compare``.

::

    import policyzoo

    table = policyzoo.compare(algos=["grpo", "dr_grpo", "grpo+clip=cispo"], seeds=3, output_dir="runs/cmp",
                              train={"steps": 20, "updates_per_batch": 4})  # runs what is missing, then aggregates
    table = policyzoo.compare("runs/cmp", baseline="grpo")    # aggregates runs that exist

Run mode (``algos`` given) plans one run per (algorithm, seed) (:mod:`.runs`), skips finished ones,
resumes interrupted ones, runs the rest one at a time (``parallel=N``: N at once, the cores split) and
aggregates them into ``output_dir``. Aggregate mode (``runs``: folders or globs) reads finished runs
wherever they were made. Both write ``compare.md``, ``compare.json`` and ``compare.png``, print the
table and return it: :func:`policyzoo.compare.aggregate.aggregate`'s dict plus ``skipped`` and
``files``. Runs are lean (:mod:`.lean`): no checkpoint kept once finished, no ``final/`` export
unless ``export=True``. ``print_commands=True`` returns ``{"commands": [...]}`` (one ``policyzoo train`` line per
run still to do) and runs nothing. Extra keywords are config keys, as for :func:`policyzoo.train`
(``**{"train.steps": 2}`` or ``train={"steps": 2}``); ``overrides`` takes ``key=value`` strings.
Mistakes raise :class:`~policyzoo.errors.UserError` before anything runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from policyzoo.equivalence import equal_entries, equal_pairs, probe_failure
from policyzoo.errors import UserError

from . import launch, plot, report, runs
from .aggregate import aggregate, resolve_baseline
from .entries import entry_of, labels, parse_algos, parse_seeds, settings_overrides
from .rundirs import RUN_FILES, Skipped, find_runs

if TYPE_CHECKING:  # rich loads when something is printed, not with `import policyzoo`
    from rich.console import Console


KEY_VALUE = re.compile(r"^[A-Za-z_][\w.]*=")  # train.steps=5: an override, not a folder


def _seeds_text(seeds: list[int]) -> str:
    return str(len(seeds)) if seeds == list(range(len(seeds))) else ",".join(map(str, seeds))


def compare(dirs: str | list[str] | None = None, *, algos: str | list[str] | None = None,
            seeds: int | str | list[int] | None = None, output_dir: str | None = None, baseline: str | None = None,
            allow_mixed: bool = False, parallel: int = 1, print_commands: bool = False, export: bool = False,
            overrides: list[str] = (), console: Console | None = None, allow_equal: bool = False,
            start: Callable | None = None, **settings: Any) -> dict:
    """See the module docstring. ``algos`` and ``baseline`` take :class:`~policyzoo.contract.Bundle` objects
    too, as their ``.name`` (:func:`policyzoo.compare.entries.entry_of`). ``allow_equal``: run entries the gradient
    probe finds equal at these settings (:func:`policyzoo.equivalence.equal_entries`; refused otherwise).
    ``console`` receives the plan, progress and table (default: stdout); ``start`` replaces
    :func:`policyzoo.compare.launch.popen` (tests)."""
    if console is None:
        from rich.console import Console

        console = Console()
    if isinstance(overrides, (str, bytes)):
        raise UserError("policyzoo.compare(overrides=...)", f"overrides must be a list of key=value strings, got "
                        f"the string {overrides!r}", f"write overrides=[{overrides!r}]")
    _check_output_dir(output_dir)
    baseline = entry_of(baseline, "policyzoo.compare(baseline=...)")  # a Bundle: its name, as in algos
    if algos is None:
        patterns = _aggregate_args(dirs, seeds, parallel, print_commands, [*overrides, *settings], export,
                                   allow_equal)
        return _aggregate(patterns, output_dir, baseline, allow_mixed, console,
                          "policyzoo compare " + shlex.join(patterns))
    if dirs is not None:
        raise UserError("policyzoo compare", "run directories and --algos were both given",
                        "give --algos to make runs, or directories to aggregate runs that exist")
    if not output_dir:
        raise UserError("--output-dir", "the runs need a folder (they go to OUTPUT_DIR/ALGO/seedS, and the same "
                        "folder resumes them)", "e.g. --output-dir runs/cmp")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise UserError("--parallel", f"{parallel!r}: give 1 or more runs at once", "e.g. --parallel 2")
    entries, seed_list = parse_algos(algos), parse_seeds(3 if seeds is None else seeds)
    given = [*overrides, *settings_overrides(settings)]
    user_threads = [item.split("=", 1)[1] for item in given if item.split("=", 1)[0].strip() == "engine.threads"]
    threads = (int(user_threads[-1]) if user_threads and user_threads[-1].strip().isdigit() else
               max(1, runs.cores() // parallel) if parallel > 1 and not print_commands else None)
    specs = runs.plan(entries, seed_list, output_dir, given, threads, export)
    label = _baseline_label(baseline, entries, specs)
    for line in equal_entries({s.entry: s.config for s in specs}, allow_equal):  # equal at these settings: refused
        print(line, file=sys.stderr)
    if print_commands:
        return {"commands": _print_commands(specs)}
    again = shlex.join(["policyzoo", "compare", "--algos", ",".join(entries), "--seeds", _seeds_text(seed_list),
                        "--output-dir", str(output_dir), *(["--parallel", str(parallel)] if parallel > 1 else []),
                        *(["--baseline", baseline] if baseline else []), *(["--export"] if export else []), *given])
    runs.print_plan(console, specs, output_dir, parallel, threads)
    jobs = launch.jobs_for(specs, output_dir, parallel, threads)
    launch.launch(jobs, parallel, console, again, **({"start": start} if start else {}))
    blocked = [Skipped(s.path, f"blocked: {s.detail}") for s in specs if s.status == "blocked"]
    return _aggregate([str(s.path) for s in specs if s.status != "blocked"], output_dir, label, allow_mixed,
                      console, again, blocked)


def _check_output_dir(output_dir) -> None:
    """An ``--output-dir`` that is (or lies below) a file is refused before anything runs."""
    if not output_dir:
        return
    for p in [Path(output_dir), *Path(output_dir).parents]:
        if p.exists() and not p.is_dir():
            raise UserError(f"--output-dir {output_dir}", f"{p} is a file, not a folder: the runs and compare.md, "
                            ".json, .png cannot go there", "choose a folder (it is created if missing)")


def _aggregate_args(dirs, seeds, parallel, print_commands, settings: list, export: bool = False,
                    allow_equal: bool = False) -> list[str]:
    """The folders to aggregate; what only goes with --algos (overrides, --seeds, --parallel,
    --print-commands, --export, --allow-equal) is a usage error here, not ignored."""
    if dirs is None:
        raise UserError("policyzoo compare", "nothing to compare", "give run directories (policyzoo compare "
                        "runs/cmp) or algorithms to run (policyzoo compare --algos grpo,dr_grpo --output-dir D)")
    patterns = [str(p) for p in ([dirs] if isinstance(dirs, (str, Path)) else list(dirs))]
    keys = [p for p in patterns if KEY_VALUE.match(p) and not Path(p).exists()]
    given = [name for name, on in (("key=value overrides", settings or keys), ("--seeds", seeds is not None),
                                   ("--parallel", parallel != 1), ("--print-commands", print_commands),
                                   ("--export", export), ("--allow-equal", allow_equal)) if on]
    if given:
        what = f" ({', '.join(map(str, keys))})" if keys else ""
        raise UserError("policyzoo compare", f"{' and '.join(given)}{what} only go with --algos (they plan the runs to "
                        "make); without --algos the arguments are run folders to aggregate",
                        "add --algos A,B --output-dir D to make runs, or drop them to aggregate the folders given")
    return patterns


def _baseline_label(baseline: str | None, entries: list[str], specs: list[runs.RunSpec]) -> str | None:
    """The table's name of ``--baseline`` among the planned runs (an entry as given, or its label),
    checked before anything runs."""
    if baseline is None:
        return None
    names = labels([s.config.get("algorithm") for s in specs])
    by_entry = dict(zip([s.entry for s in specs], names))
    return by_entry.get(baseline) or resolve_baseline(baseline, list(dict.fromkeys(names)))


def _print_commands(specs: list[runs.RunSpec]) -> list[str]:
    """One ``policyzoo train`` line per run still to do on stdout; notes for the others on stderr."""
    lines = []
    for s in specs:
        if s.status in ("done", "stopped", "blocked"):  # a stopped run ended (its summary says why): not to do
            print(f"# {s.path}: {s.status}: {s.detail}", file=sys.stderr)
            continue
        line = s.command()
        if s.status in ("new", "resume") and s.detail:  # e.g. a file of the user's that stays beside the run's
            print(f"# {s.path}: {s.status}: {s.detail}", file=sys.stderr)
        if s.status == "restart":  # `policyzoo train` refuses a folder holding a run's files: the line removes them
            names = sorted(n for n in RUN_FILES if (s.path / n).exists() or (s.path / n).is_symlink())
            line = shlex.join(["rm", "-rf", "--", *(str(s.path / n) for n in names)]) + " && " + line
            print(f"# {s.path}: {s.detail.split(':')[0]}: its line removes the run files first", file=sys.stderr)
        lines.append(line)
        print(lines[-1])
    return lines


def _default_out(patterns: list[str], found: list, skipped: tuple = ()) -> Path:
    """One folder given (not itself a run): that folder; else the folder that holds all the runs
    given, those left out included (never a run's own folder)."""
    if len(patterns) == 1 and Path(patterns[0]).is_dir() and not (Path(patterns[0]) / "config.yaml").exists():
        return Path(patterns[0])
    paths = [str(r.path.absolute()) for r in [*found, *skipped]]
    if not paths:
        return Path(".")
    common = Path(os.path.commonpath(paths))
    return common.parent if (common / "config.yaml").exists() or len(paths) == 1 else common


def _recorded_baseline(patterns: list[str]) -> str | None:
    """The baseline of the ``compare.json`` in the one folder given (a table made before, e.g. a recorded
    one), so the table again has the same baseline; None otherwise (the first algorithm found)."""
    try:
        data = json.loads((Path(patterns[0]) / "compare.json").read_text()) if len(patterns) == 1 else None
    except (OSError, ValueError):
        return None
    return data.get("baseline") if isinstance(data, dict) and isinstance(data.get("baseline"), str) else None


def _aggregate(patterns: list[str], output_dir, baseline, allow_mixed, console: Console, command: str,
               left_out: list[Skipped] = ()) -> dict:
    found, skipped = find_runs(patterns)
    skipped = [*left_out, *skipped]
    for s in skipped:
        console.print(f"warning: {s.path} left out: {s.why}", markup=False, highlight=False, style="yellow",
                      soft_wrap=True)
    out = Path(output_dir) if output_dir else _default_out(patterns, found, skipped)
    recorded = None if baseline else _recorded_baseline(patterns)
    if recorded not in labels([r.config.get("algorithm") for r in found]):
        recorded = None
    result = aggregate(found, baseline or recorded, allow_mixed)
    result["equal"], result["equal_note"] = _equal_at_their_settings(found)
    files = report.write(result, skipped, out, command)
    files.append(plot.draw(result, out / "compare.png"))
    report.print_table(console, result, skipped)
    console.print("written: " + ", ".join(str(f) for f in files), highlight=False, soft_wrap=True)
    return {**result, "skipped": [{"path": str(s.path), "why": s.why} for s in skipped],
            "files": [str(f) for f in files]}


def _equal_at_their_settings(found: list) -> tuple[list[dict] | None, str]:
    """The pairs of the table's algorithms that were the same update at the settings their runs recorded
    (:func:`policyzoo.equivalence.equal_pairs` on each algorithm's first finished run's config: seconds), as
    ``[{"algorithm", "equals", "why"}]`` (None: fewer than two algorithms, or the probe failed), and the
    probe's one line when it claims nothing (``""`` otherwise).
    A fresh compare refuses such a pair; the table says so instead of a verdict for it (:func:`report.verdict`)."""
    names = labels([r.config.get("algorithm") for r in found])
    first = {}
    for name, run in zip(names, found):
        if not run.stopped:
            first.setdefault(name, {**run.config, "output_dir": str(run.path)})
    if len(first) < 2:
        return None, ""
    try:
        pairs = equal_pairs(first)
    except Exception as e:  # noqa: BLE001 - a recorded run's data or component gone or refusing: no claim
        return None, probe_failure(e)
    return [{"algorithm": a, "equals": b, "why": why} for a, b, why, _ in pairs], ""
