"""The runs of ``policyzoo compare --algos A,B --seeds N``: one ``policyzoo train`` run per (algorithm, seed)
in ``OUTPUT_DIR/<entry>/seed<s>``, each with the same overrides.

Paired design: seed ``s`` sets ``train.seed=s`` (sampling streams, the LoRA adapter's or critic's
initial draw) and ``data.seed=s`` (the generated task, the held-out rows and the prompt order) for
every algorithm, so the algorithms of one seed see the same rows in the same order from the same
weights. ``data.seed=K`` among the overrides pins the data for all seeds (then seeds vary sampling
only); ``train.seed`` and ``output_dir`` are set here and refused as overrides.

The status of each run's folder (:func:`status`): ``new``; ``done`` (a complete summary.json at the
planned ``train.steps``, its config.yaml the planned run's: skipped); ``resume`` (a checkpoint:
``policyzoo train --resume DIR``); ``restart`` (a started run without a checkpoint, so nothing to
resume: its run files are removed before it starts again); ``stopped`` (summary.json says the run
stopped early, with its reason: not run again, shown in the table); ``blocked`` (another live run
writes there, a config.yaml (final/, checkpoints/) no run wrote, a config.yaml that does not parse or differs from the
planned run's in more than ``train.steps``, ``output_dir``, ``engine.threads`` and what is kept on
disk (:data:`policyzoo.compare.lean.OUTPUT_KEYS`), a run of more steps). Other files of the user's stay beside a
run's files, as ``policyzoo train`` keeps them (:mod:`policyzoo.engine.rundir`): the status is the run's, noted.

Each run is lean (:mod:`.lean`): no checkpoint kept once finished, no ``final/`` export unless ``export``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from policyzoo.assembly import assemble
from policyzoo.catalog import get_catalog
from policyzoo.contract.ground import SLOTS
from policyzoo.data import load_task
from policyzoo.engine.models import resolve_model
from policyzoo.engine.rundir import RunDir
from policyzoo.errors import ConfigError, UserError
from policyzoo.resolve import parse_entry
from policyzoo.run_config import load_config

from . import lean
from .aggregate import config_differences
from .entries import check_clashes
from .rundirs import RUN_FILES, not_a_run, read_jsonl, read_summary, start_over, summary_steps

if TYPE_CHECKING:  # rich loads when something is printed, not with `import policyzoo`
    from rich.console import Console

TRAIN = [sys.executable, "-m", "policyzoo.cli", "train"]


@dataclass
class RunSpec:
    """One planned run: ``entry`` (as in --algos), ``seed``, folder ``path``, the zoo name ``base``,
    every override it gets, the configured ``steps``, the folder's ``status`` with ``detail``, and the
    planned ``config`` (as ``config.yaml`` will hold it)."""

    entry: str
    seed: int
    path: Path
    base: str
    overrides: list[str]
    steps: int
    status: str = "new"
    detail: str = ""
    config: dict = field(default_factory=dict, repr=False)

    def train_args(self) -> list[str]:
        """The arguments after ``policyzoo train``: a new run, or ``--resume`` with the same overrides."""
        if self.status == "resume":
            return ["--resume", str(self.path), *self.overrides]
        return ["--algo", self.base, "--output-dir", str(self.path), *self.overrides]

    def command(self) -> str:
        return shlex.join(["policyzoo", "train", *self.train_args()])


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" not in item:
            raise ConfigError(item, "an override must look like key=value (with --algos the positional "
                              "arguments are train overrides)", "e.g. train.steps=20; to aggregate run "
                              "directories, drop --algos: policyzoo compare runs/cmp")
        if key in ("train.seed", "output_dir"):
            raise ConfigError(key, f"{key} is set by policyzoo compare for each run (seed s -> train.seed=s, "
                              "OUTPUT_DIR/ALGO/seedS)", "drop it; use --seeds and --output-dir")


def plan(algos: list[str], seeds: list[int], output_dir: str | Path, overrides: list[str] = (),
         threads: int | None = None, export: bool = False) -> list[RunSpec]:
    """Every run, checked before any starts: each entry's config validates and its names resolve
    (an unknown name raises the ConfigError ``--algo`` gives, with the close matches), the data and the
    model load as ``policyzoo train --dry-run`` loads them (:func:`check_inputs`), and no two entries
    resolve to the same algorithm (the same components with the same parameters). Each run gets
    :func:`policyzoo.compare.lean.overrides` (``export``: keep ``final/``)."""
    overrides = list(overrides)
    _check_overrides(overrides)
    keys = {item.split("=", 1)[0].strip() for item in overrides}
    extra = [f"engine.threads={threads}"] if threads and "engine.threads" not in keys else []
    extra += lean.overrides(overrides, export)
    catalog = get_catalog()
    out, same = [], {}
    for entry in algos:
        base, changes = parse_entry(entry)
        check_clashes(entry, changes, overrides)
        catalog.bundle(base, f"--algos {entry}")
        for seed in seeds:
            path = Path(output_dir) / entry / f"seed{seed}"
            given = [*overrides, *changes, *extra, f"train.seed={seed}",
                     *([] if "data.seed" in keys else [f"data.seed={seed}"])]
            config = load_config(None, base, [*given, f"output_dir={path}"])
            if not out:  # the entries change only algorithm.*: one run's data and model are every run's
                check_inputs(config)
            try:  # the components are built as a run builds them (names, parameters), no model loaded
                built = assemble(config.algorithm, catalog=catalog)
            except UserError as e:
                raise type(e)(f"--algos {entry}: {e.where}", e.why, e.fix) from None
            spec = RunSpec(entry, seed, path, base, given, config.train.steps, config=config.model_dump())
            spec.status, spec.detail = status(path, spec.steps, spec.config)
            out.append(spec)
        other = same.setdefault(_components(built), entry)
        if other != entry:
            raise ConfigError(f"--algos {other},{entry}", f"{other!r} and {entry!r} are the same algorithm (the same "
                              "components with the same parameters): their runs would be one experiment twice",
                              f"name it once: drop {entry!r} or {other!r}")
    return out


def check_inputs(config) -> None:
    """The data and the model of a planned run, checked as ``policyzoo train --dry-run`` checks them
    (:func:`policyzoo.data.load_task`: the file, its columns, the rows; :func:`policyzoo.engine.models.resolve_model`:
    the folder, config.json, weights, tokenizer). Raises their :class:`~policyzoo.errors.UserError`
    (``DataError``, ``ModelError``: exit 2) before any command is printed or run. The embedded default model
    (``model.path`` null) is not resolved here: the run converts it on first use."""
    load_task(config.data)
    if config.model.path is not None:
        resolve_model(config.model.path, config.model.trust_remote_code)


def _components(run) -> str:
    """What a run computes, as text: every slot's components with their parameters."""
    slots = {}
    for slot in SLOTS:
        comps = getattr(run, slot)
        comps = comps if isinstance(comps, list) else ([] if comps is None else [comps])
        slots[slot] = [[c.name, c.params.model_dump()] for c in comps]
    return json.dumps(slots, sort_keys=True, default=str)


def _live_owner(path: Path) -> dict | None:
    """``run.pid``'s record when it names a live process on this host (as the engine's own check)."""
    try:
        rec = json.loads((path / "run.pid").read_text())
        pid = int(rec["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if rec.get("host") != os.uname().nodename or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return rec


def status(path: Path, steps: int, planned: dict | None = None) -> tuple[str, str]:
    """``(status, detail)`` of a planned run's folder (module docstring); ``planned``, the run's config
    (``config.model_dump()``): a folder made with other settings is ``blocked``, not ``done``."""
    if not path.is_dir() or not any(path.iterdir()):
        return "new", ""
    owner = _live_owner(path)
    if owner is not None:
        return "blocked", f"a live run (pid {owner['pid']}) is writing here: wait for it, or stop it"
    names = {p.name for p in path.iterdir()}
    other = sorted(names - RUN_FILES)  # the user's: they stay beside the run's files (as `policyzoo train` keeps them)
    kept = f"{', '.join(other[:3])}{' ...' if len(other) > 3 else ''}: not a run's, kept beside the run's files"
    beside = f" ({kept})" if other else ""
    foreign = not_a_run(path)  # a config.yaml (final/, checkpoints/) of the user's, no run's files beside it
    if foreign:
        return "blocked", foreign
    if not RunDir(path).run_files():
        return "new", f"holds {kept}" if other else ""
    summary, latest = read_summary(path), _latest(path)
    if summary is None and latest is None:
        return "restart", "started before without a checkpoint (nothing to resume): its run files are removed" + beside
    why, again = _config_mismatch(path, planned), start_over(path)
    if why:
        return "blocked", f"{why}: {again} (or choose another --output-dir) to run the planned one"
    if summary is not None and summary.get("stopped_early") is True:
        return "stopped", (f"stopped early at step {summary['steps']}: {summary.get('stop_reason') or 'no reason'}"
                           f" ({again} to run it again)")
    done_at = None if summary is None else summary_steps(summary)
    if summary is not None and done_at is None:
        return "blocked", f"summary.json's steps is {summary['steps']!r}, not a step count: {again}"
    if done_at == steps:
        return "done", f"finished at step {done_at}{beside}"
    if done_at is not None and done_at > steps:
        return "blocked", (f"finished at step {done_at}, the plan has train.steps {steps}: another experiment (its "
                           f"last-20% window and schedule differ): {again} or choose another --output-dir")
    if latest is not None and latest < steps:
        return "resume", f"from the checkpoint of step {latest}{beside}"
    if latest is None:
        return "blocked", (f"finished at step {done_at} (train.steps is {steps}) without a checkpoint to "
                           f"continue from: {again} to run it again")
    return "blocked", (f"a checkpoint of step {latest} but no summary.json (stopped while finishing): run "
                       f"`policyzoo train --resume {path} train.steps={latest + 1}` or {again}")


def _latest(path: Path) -> int | None:
    try:
        step = json.loads((path / "checkpoints" / "latest.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _config_mismatch(path: Path, planned: dict | None) -> str:
    """Why the folder's config.yaml is not the planned run's (``train.steps``, ``output_dir`` and
    ``engine.threads`` may differ: a run is extended, moved, given other cores), or ``""``."""
    try:
        config = yaml.safe_load((path / "config.yaml").read_text())
    except FileNotFoundError:
        return "a summary.json or checkpoint but no config.yaml: not a run of `policyzoo train`"
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return f"config.yaml does not parse ({type(e).__name__}): not a run compare can use"
    if not isinstance(config, dict):
        return "config.yaml is not a mapping: not a run compare can use"
    diff = {} if planned is None else config_differences(config, planned, ("output_dir", "engine.threads",
                                                                            "train.steps", *lean.OUTPUT_KEYS))
    if not diff:
        return ""
    keys = "; ".join(f"{k} {a!r} here, {b!r} planned" for k, (a, b) in list(diff.items())[:5])
    return f"made with other settings than the planned run: {keys}" + (" ..." if len(diff) > 5 else "")


def clear(path: Path) -> None:
    """Remove a ``restart`` folder's run files (only the names a run writes)."""
    for name in RUN_FILES:
        p = path / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def measured_seconds(path: Path) -> float | None:
    """A finished run's seconds from process start: ``process_to_ready_seconds`` plus its steps'
    ``time_step`` and evaluations' ``time_eval`` (checkpoints and export not counted)."""
    summary = read_summary(path)
    if summary is None or summary.get("process_to_ready_seconds") is None:
        return None
    records = read_jsonl(path / "metrics.jsonl")
    try:  # a value that is not a number: no measurement (the table leaves that run out, saying why)
        return float(summary["process_to_ready_seconds"]) + sum(
            float(r.get("time_step") or r.get("time_eval") or 0.0) for r in records)
    except (TypeError, ValueError):
        return None


def eta_line(specs: list[RunSpec], parallel: int) -> str:
    todo = [s for s in specs if s.status in ("new", "resume", "restart")]
    if not todo:
        return "nothing to run: every run is finished or blocked"
    measured = sorted(x for x in (measured_seconds(s.path) for s in specs if s.status == "done") if x is not None)
    if not measured:
        return ("ETA: none yet (`policyzoo plan`'s cost model counts a step's FLOPs and memory, not seconds on this "
                "machine); an estimate follows from the first finished run")
    per_run = measured[len(measured) // 2]
    waves = -(-len(todo) // parallel)
    return f"ETA: about {per_run * waves / 60:.1f} min ({len(todo)} runs at {per_run:.0f} s, the finished runs' median)"


def print_plan(console: Console, specs: list[RunSpec], output_dir, parallel: int, threads: int | None) -> None:
    algos = list(dict.fromkeys(s.entry for s in specs))
    seeds = list(dict.fromkeys(s.seed for s in specs))
    counts = {k: sum(s.status == k for s in specs) for k in ("done", "stopped", "resume", "restart", "new",
                                                             "blocked")}
    told = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    plural = lambda n, word: f"{n} {word}" + ("" if n == 1 else "s")  # noqa: E731
    console.print(f"policyzoo compare: {plural(len(algos), 'algorithm')} x {plural(len(seeds), 'seed')} = "
                  f"{plural(len(specs), 'run')} in "
                  f"{output_dir} ({told})", highlight=False, soft_wrap=True)
    if len(algos) == 1:  # a seed study: allowed, and said, since nothing is compared
        console.print(f"one algorithm ({algos[0]}): the table gives its spread over seeds, no paired difference; "
                      "name two or more entries in --algos to compare them", highlight=False, soft_wrap=True)
    n = cores()
    if parallel == 1:
        console.print(f"one run at a time: this machine gives {n} core(s) and each run uses them all "
                      f"(--parallel N runs N at once, {n} // N threads each)", highlight=False, soft_wrap=True)
    else:
        console.print(f"{parallel} runs at once, {threads} thread(s) each ({n} cores // {parallel}); each run's "
                      f"output goes to {Path(output_dir) / 'logs'}", highlight=False, soft_wrap=True)
    from rich.table import Table

    table = Table()
    for col in ("algorithm", "seed", "status", "run directory"):
        table.add_column(col, overflow="fold")
    for s in specs:
        table.add_row(s.entry, str(s.seed), s.status + (f": {s.detail}" if s.detail else ""), str(s.path))
    console.print(table)
    console.print(eta_line(specs, parallel), highlight=False, soft_wrap=True)
    disk = lean.plan_line([s.config for s in specs if s.status in ("new", "resume", "restart")], parallel)
    if disk:
        console.print(disk, highlight=False, soft_wrap=True)
