"""``policyzoo.compare(...)``: the Python twin of ``policyzoo compare``.

::

    import policyzoo

    table = policyzoo.compare(algos=["grpo", "dr_grpo", "grpo+clip=cispo"], seeds=3, output_dir="runs/cmp",
                              train={"steps": 20})          # runs what is missing, then aggregates
    table = policyzoo.compare("runs/cmp", baseline="grpo")    # aggregates runs that exist

Run mode (``algos`` given) plans one run per (algorithm, seed) (:mod:`.runs`), skips finished ones,
resumes interrupted ones, runs the rest one at a time (``parallel=N``: N at once, the cores split) and
aggregates them into ``output_dir``. Aggregate mode (``runs``: folders or globs) reads finished runs
wherever they were made. Both write ``compare.md``, ``compare.json`` and ``compare.png``, print the
table and return it: :func:`policyzoo.compare.aggregate.aggregate`'s dict plus ``skipped`` and
``files``. ``print_commands=True`` returns ``{"commands": [...]}`` (one ``policyzoo train`` line per
run still to do) and runs nothing. Extra keywords are config keys, as for :func:`policyzoo.train`
(``**{"train.steps": 2}`` or ``train={"steps": 2}``); ``overrides`` takes ``key=value`` strings.
Mistakes raise :class:`~policyzoo.errors.UserError` before anything runs.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from policyzoo.errors import UserError

from . import launch, plot, report, runs
from .aggregate import aggregate
from .entries import parse_algos, parse_seeds, settings_overrides
from .rundirs import find_runs

if TYPE_CHECKING:  # rich loads when something is printed, not with `import policyzoo`
    from rich.console import Console


def _seeds_text(seeds: list[int]) -> str:
    return str(len(seeds)) if seeds == list(range(len(seeds))) else ",".join(map(str, seeds))


def compare(dirs: str | list[str] | None = None, *, algos: str | list[str] | None = None,
            seeds: int | str | list[int] = 3, output_dir: str | None = None, baseline: str | None = None,
            allow_mixed: bool = False, parallel: int = 1, print_commands: bool = False,
            overrides: list[str] = (), console: Console | None = None,
            start: Callable | None = None, **settings: Any) -> dict:
    """See the module docstring. ``console`` receives the plan, progress and table (default: stdout);
    ``start`` replaces :func:`policyzoo.compare.launch.popen` (tests)."""
    if console is None:
        from rich.console import Console

        console = Console()
    if algos is None:
        if dirs is None:
            raise UserError("policyzoo compare", "nothing to compare", "give run directories (policyzoo compare "
                            "runs/cmp) or algorithms to run (policyzoo compare --algos grpo,dr_grpo --output-dir D)")
        if settings or overrides:
            raise UserError("policyzoo compare", "key=value overrides only go with --algos (they configure the "
                            "runs to make)", "drop them, or add --algos to make new runs")
        patterns = [dirs] if isinstance(dirs, (str, Path)) else list(dirs)
        return _aggregate([str(p) for p in patterns], output_dir, baseline, allow_mixed, console,
                          "policyzoo compare " + shlex.join([str(p) for p in patterns]))
    if dirs is not None:
        raise UserError("policyzoo compare", "run directories and --algos were both given",
                        "give --algos to make runs, or directories to aggregate runs that exist")
    if not output_dir:
        raise UserError("--output-dir", "the runs need a folder (they go to OUTPUT_DIR/ALGO/seedS, and the same "
                        "folder resumes them)", "e.g. --output-dir runs/cmp")
    if int(parallel) < 1:
        raise UserError("--parallel", f"{parallel}: give 1 or more runs at once", "e.g. --parallel 2")
    entries, seed_list = parse_algos(algos), parse_seeds(seeds)
    given = [*overrides, *settings_overrides(settings)]
    user_threads = [item.split("=", 1)[1] for item in given if item.split("=", 1)[0].strip() == "engine.threads"]
    threads = (int(user_threads[-1]) if user_threads and user_threads[-1].strip().isdigit() else
               max(1, runs.cores() // parallel) if parallel > 1 and not print_commands else None)
    specs = runs.plan(entries, seed_list, output_dir, given, threads)
    if print_commands:
        return {"commands": _print_commands(specs)}
    again = shlex.join(["policyzoo", "compare", "--algos", ",".join(entries), "--seeds", _seeds_text(seed_list),
                        "--output-dir", str(output_dir), *(["--parallel", str(parallel)] if parallel > 1 else []),
                        *(["--baseline", baseline] if baseline else []), *given])
    runs.print_plan(console, specs, output_dir, parallel, threads)
    jobs = launch.jobs_for(specs, output_dir, parallel, threads)
    launch.launch(jobs, parallel, console, again, **({"start": start} if start else {}))
    return _aggregate([str(s.path) for s in specs], output_dir, baseline, allow_mixed, console, again)


def _print_commands(specs: list[runs.RunSpec]) -> list[str]:
    """One ``policyzoo train`` line per run still to do on stdout; notes for the others on stderr."""
    lines = []
    for s in specs:
        if s.status in ("done", "blocked"):
            print(f"# {s.path}: {s.status}: {s.detail}", file=sys.stderr)
            continue
        if s.status == "restart":
            print(f"# {s.path}: {s.detail.split(':')[0]}: delete the folder before running its line", file=sys.stderr)
        lines.append(s.command())
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


def _aggregate(patterns: list[str], output_dir, baseline, allow_mixed, console: Console, command: str) -> dict:
    found, skipped = find_runs(patterns)
    for s in skipped:
        console.print(f"warning: {s.path} left out: {s.why}", markup=False, highlight=False, style="yellow",
                      soft_wrap=True)
    result = aggregate(found, baseline, allow_mixed)
    out = Path(output_dir) if output_dir else _default_out(patterns, found, skipped)
    files = report.write(result, skipped, out, command)
    files.append(plot.draw(result, out / "compare.png"))
    report.print_table(console, result, skipped)
    console.print("written: " + ", ".join(str(f) for f in files), highlight=False, soft_wrap=True)
    return {**result, "skipped": [{"path": str(s.path), "why": s.why} for s in skipped],
            "files": [str(f) for f in files]}
