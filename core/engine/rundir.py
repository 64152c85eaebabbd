"""The run directory: what a training run leaves behind, and how it is resumed.

Layout::

    RUN_DIR/config.yaml          the config as given (reloaded by --resume)
    RUN_DIR/resolved.yaml        resolved config (every slot's component, parameters, source)
    RUN_DIR/metrics.jsonl        one JSON object per optimizer step (and eval records)
    RUN_DIR/checkpoints/step-000010/   DeepSpeed checkpoint (policy, critic) + state.json
    RUN_DIR/checkpoints/step-000010/hf/   save_pretrained export (train.export_every, Ctrl-C)
    RUN_DIR/checkpoints/latest.json    {"step": 10, "path": "step-000010"}: the last complete one
    RUN_DIR/final/               save_pretrained export (safetensors + tokenizer)
    RUN_DIR/run.pid              the process that runs here (host, pid, start): a second run is refused
                                 (removed when the run ends: finished or stopped by itself)
    RUN_DIR/summary.json         held-out accuracy before/after, steps, timings, the run's warnings,
                                 stopped_early / stop_reason, unscorable rows

Checkpoints are written under a temporary name (``.tmp-step-000010``), renamed when complete,
and only then recorded in ``latest.json`` (itself replaced atomically). A run killed while
writing leaves the previous checkpoint as the latest one; leftover temporary folders are removed
on resume.

Data parallel: only rank 0 writes files here (config, metrics, summary, ``latest.json``); every
rank writes its own DeepSpeed shards into the checkpoint folder, so on several nodes the run
directory must be on a filesystem all nodes share.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import yaml

from policyzoo.errors import UserError

from . import dist


class ResumeError(UserError):
    """A run directory cannot be resumed (no complete checkpoint, or a different config)."""


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def _fs_type(path: Path) -> str | None:
    """The type of the filesystem that holds ``path`` (``proc``, ``sysfs``, ``ext4`` ...) from
    ``/proc/self/mounts`` (the longest mount point above it); None where that cannot be read."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return None
    here = str(path.resolve())
    above = [(point, kind) for point, kind in mounts
             if here == point or here.startswith(point.rstrip("/") + "/")]
    return max(above, key=lambda m: len(m[0]))[1] if above else None


def unwritable(folder: Path) -> str | None:
    """Why no file can be created in the existing ``folder`` (its permissions, a read-only or
    virtual filesystem such as ``/proc``, a file in the way), or None when it can. Tried, not
    guessed: a probe file is created there and removed at once (``os.access`` answers "writable"
    for root on ``/proc``, where no file can be made)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".policyzoo-probe-", dir=folder)
    except OSError as e:
        kind = _fs_type(folder)
        on = f", on a {kind} filesystem" if kind else ""
        return f"{folder} takes no new files (creating a probe file there failed: {e.strerror}{on})"
    os.close(fd)
    os.unlink(probe)
    return None


#: every name a run writes into its folder (the layout above; ``tensorboard``/``wandb`` with train.report_to)
RUN_WRITES = ("config.yaml", "resolved.yaml", "metrics.jsonl", "summary.json", "completions.jsonl", "plugins.json",
              "run.pid", "startup.log", "checkpoints", "tensorboard", "wandb", "final")
#: the ones nobody but a run makes: a folder holding one holds a run (``config.yaml``, ``final`` or ``checkpoints``
#: alone may be the user's own)
RUN_MARKS = ("resolved.yaml", "metrics.jsonl", "summary.json", "completions.jsonl", "plugins.json", "run.pid",
             "startup.log")


def _looked_at(names: tuple[str, ...]) -> tuple[str, ...]:
    """The names whose presence refuses the folder: all of ``names`` on rank 0, none on the other ranks. Rank 0
    of a launch writes its claim (``run.pid``), its library log and its config into the folder as it starts, and
    another rank checking a moment later would take them for another run's or a user's files (seen on two ranks
    under load); a refusal on rank 0 ends the launch (``check_live`` reasons the same way)."""
    return names if dist.rank() == 0 else ()


def written_by_run(path: str | os.PathLike) -> list[str]:
    """The names of :data:`RUN_WRITES` in the folder ``path``, sorted (what removing a run's files removes)."""
    return sorted(n for n in RUN_WRITES if (Path(path) / n).exists() or (Path(path) / n).is_symlink())


def remove_hint(path: str | os.PathLike) -> str:
    """How to start over in ``path``, whose run stopped without a checkpoint: remove the run's own files (only
    those: anything else in the folder is the user's) and run the same command again."""
    names = written_by_run(path)
    if not names:
        return "run the same command again"
    return f"remove the run's files from {path} ({', '.join(names)}), then run the same command again"


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.ckpt = self.path / "checkpoints"

    def check_new(self, create: bool = True) -> None:
        """Before any model loads: the folder can hold a new run. Refused: a file; a folder holding another run's
        files (:data:`RUN_MARKS`: a new run would mix its metrics into them); a folder holding something else under
        a name the run writes (:data:`RUN_WRITES`: a user's own ``config.yaml``, a ``final`` folder), which the run
        would replace or stop on. Other content stays beside the run's files. Rank 0 checks the content (the
        other ranks would see rank 0's own first files, :func:`_looked_at`; its refusal ends the launch); every
        rank checks that the path is a writable folder. ``create`` False (a dry run) gives the same
        verdict, creates nothing and checks that a file can be created in the nearest existing folder on the path
        (:func:`unwritable`). Raises :class:`UserError`; no fix deletes anything."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"output_dir {self.path}", "exists and is a file, not a directory",
                            "choose another --output-dir")
        theirs, clash = self.run_files(), self.clashes()
        if theirs:
            raise UserError(f"output_dir {self.path}", f"already holds another run's files ({', '.join(theirs)}) "
                            "without a complete checkpoint to resume from; a new run would mix its metrics into them",
                            "choose another --output-dir (that run's files stay as they are)")
        if clash:
            config = (f"; to train with that config: --config {self.path / 'config.yaml'} --output-dir "
                      f"{self.path / 'run'}") if "config.yaml" in clash else ""
            raise UserError(f"output_dir {self.path}", f"holds {', '.join(clash)}, not written by a run (no "
                            f"{' or '.join(RUN_MARKS[:2])} beside {'it' if len(clash) == 1 else 'them'}): the run "
                            "writes its own under the same name and would replace or stop on "
                            f"{'it' if len(clash) == 1 else 'them'}",
                            f"choose a new folder, e.g. --output-dir {self.path / 'run'}{config}")
        if not create:
            parent = next(p for p in (self.path.absolute(), *self.path.absolute().parents) if p.exists())
            why = unwritable(parent)
            if why:
                raise UserError(f"output_dir {self.path}", f"cannot be created: {why}; the run would stop there "
                                "before its first step", "choose a writable --output-dir")
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"output_dir {self.path}", f"cannot be created: {e.strerror}",
                            "choose a writable --output-dir") from None

    def run_files(self) -> list[str]:
        """The names in the folder that only a run writes (:data:`RUN_MARKS`), sorted; ``[]`` for none."""
        return sorted(n for n in _looked_at(RUN_MARKS) if (self.path / n).exists() or (self.path / n).is_symlink())

    def clashes(self) -> list[str]:
        """The names in a folder without a run's files that a run would write over (:data:`RUN_WRITES`), sorted."""
        if self.run_files():
            return []
        return [n for n in written_by_run(self.path) if n in _looked_at(RUN_WRITES)]

    def check_live(self) -> None:
        """Raise :class:`UserError` when ``RUN_DIR/run.pid`` names a process of this host that is
        still alive (another run writes here: deleting or resuming the folder would corrupt it). A
        pid file left by a killed run names a dead process and is ignored. Rank 0 checks, as rank 0
        claims: another rank of the same launch would take rank 0's fresh claim for another run (a
        refusal on rank 0 ends the launch, so the other ranks never train into the folder)."""
        if dist.rank() != 0:
            return
        owner = self.live_owner()
        if owner is not None:
            raise UserError(f"output_dir {self.path}", f"a live run (pid {owner['pid']} on {owner['host']}, started "
                            f"{owner.get('started', '?')}) is using this folder",
                            f"wait for it to end or stop it (Ctrl-C saves a checkpoint; then `policyzoo train "
                            f"--resume {self.path}`), or choose another --output-dir")

    def live_owner(self) -> dict | None:
        """The ``run.pid`` record if its process is alive on this host and is not this process."""
        try:
            rec = json.loads((self.path / "run.pid").read_text())
            pid = int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if rec.get("host") != os.uname().nodename or pid == os.getpid():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # alive, owned by another user
            pass
        return rec

    def release(self) -> None:
        """Remove ``run.pid`` (rank 0) when it names this process: the run has ended (finished, or
        stopped by itself with its work kept), so the folder holds no live run."""
        if dist.rank() != 0:
            return
        try:
            rec = json.loads((self.path / "run.pid").read_text())
        except (OSError, ValueError):
            return
        if isinstance(rec, dict) and rec.get("pid") == os.getpid() and rec.get("host") == os.uname().nodename:
            (self.path / "run.pid").unlink(missing_ok=True)

    def claim(self) -> None:
        """Write ``run.pid`` (rank 0): this process, host and start time, read by :meth:`check_live`."""
        if dist.rank() == 0:
            from datetime import datetime, timezone

            self.path.mkdir(parents=True, exist_ok=True)
            started = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
            _atomic_write(self.path / "run.pid", json.dumps({"pid": os.getpid(), "host": os.uname().nodename,
                                                             "started": started}))

    def create(self, config: dict, resolved: dict) -> None:
        """Write ``config.yaml`` (the config as given, reloadable) and ``resolved.yaml`` (every
        slot's component with all parameters and the distribution it came from)."""
        if dist.rank() != 0:
            dist.barrier()
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self.ckpt.mkdir(exist_ok=True)
        _atomic_write(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))
        _atomic_write(self.path / "resolved.yaml", yaml.safe_dump(resolved, sort_keys=False))
        dist.barrier()

    def write_plugins(self, plugins: list[dict]) -> None:
        """``plugins.json``: every plugin distribution active in the run (name, version, module)."""
        if dist.rank() == 0:
            _atomic_write(self.path / "plugins.json", json.dumps(plugins, indent=2))

    # ------------------------------------------------------------------ metrics
    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def log(self, record: dict) -> None:
        if dist.rank() != 0:
            return
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_metrics(self) -> list[dict]:
        if not self.metrics_file.is_file():
            return []
        out = []
        for line in self.metrics_file.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill
                break
        return out

    def truncate_metrics(self, step: int) -> None:
        """Keep the records of steps <= ``step`` (a killed run may have logged later steps)."""
        keep = [r for r in self.read_metrics() if r.get("step", 0) <= step]
        if dist.rank() == 0:
            _atomic_write(self.metrics_file, "".join(json.dumps(r) + "\n" for r in keep))

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, trainer, step: int, state: dict, keep: int, export: bool = False) -> Path:
        """Write ``checkpoints/step-N`` (DeepSpeed files + ``state.json``; with ``export`` also
        ``hf/``, a save_pretrained export that transformers and vLLM load), atomically: it is
        written under a temporary name and renamed when complete. Keeps the last ``keep``."""
        name = f"step-{step:06d}"
        tmp = self.ckpt / f".tmp-{name}"
        final = self.ckpt / name
        if dist.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        trainer.save(str(tmp), client_state={"policyzoo": state})  # every rank writes its shards
        if export:
            trainer.export(str(tmp / "hf"))  # every rank takes part in the ZeRO-3 gather, rank 0 writes
        dist.barrier()
        if dist.rank() != 0:
            dist.barrier()
            return final
        _atomic_write(tmp / "state.json", json.dumps(state))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _atomic_write(self.ckpt / "latest.json", json.dumps({"step": step, "path": name}))
        done = sorted(p for p in self.ckpt.iterdir() if p.is_dir() and p.name.startswith("step-"))
        for old in done[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

    def latest(self) -> tuple[Path, dict] | None:
        rec = self.ckpt / "latest.json"
        if not rec.is_file():
            return None
        info = json.loads(rec.read_text())
        folder = self.ckpt / info["path"]
        state_file = folder / "state.json"
        if not state_file.is_file():
            raise ResumeError(str(rec), f"it names {folder.name}, which is incomplete or missing",
                              "delete latest.json to start over, or restore the checkpoint folder")
        return folder, json.loads(state_file.read_text())

    def remove_partial(self) -> None:
        if dist.rank() == 0:
            for p in self.ckpt.glob(".tmp-*"):
                shutil.rmtree(p, ignore_errors=True)
        dist.barrier()

    def write_summary(self, summary: dict) -> None:
        if dist.rank() == 0:
            _atomic_write(self.path / "summary.json", json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2))


def weights_only_load(path: str, map_location=None):
    """``torch.load(weights_only=True)`` allowing only the non-tensor classes DeepSpeed's own
    checkpoints hold (ZeRO stage enum, loss-scaler state, fragment addresses)."""
    import pickle

    import torch
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    try:
        with torch.serialization.safe_globals([ZeroStageEnum, LossScaler, fragment_address]):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        why = str(e).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
        raise ResumeError(str(path), f"the file holds objects that are not weights or optimizer state ({why}); "
                          "it was not loaded (loading it could run code)",
                          "resume only checkpoints written by policyzoo, or start a new run") from None
