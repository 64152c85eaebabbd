"""Process set-up for the colocated engine: environment variables, threads, the process group.

Everything here must run before ``vllm`` or ``deepspeed`` is imported (they read the environment
at import time). Values already set by the user or a launcher (``torchrun`` sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``...) are kept.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from policyzoo.errors import ConfigError

from . import oplock
from .device import bind_visible_gpu
from .models import cache_dir, is_writable


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def extensions_dir() -> Path:
    """Where DeepSpeed's compiled op is cached: one folder per Python environment, because torch
    rebuilds an op whose source paths changed, and two virtual environments sharing one folder
    would rebuild it in turn (~90 s each time)."""
    tag = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:10]
    return cache_dir() / "torch_extensions" / f"py{sys.version_info.major}{sys.version_info.minor}-{tag}"


def vllm_cache_dir() -> Path:
    """``<cache>/vllm/<machine>-<vector ISA>``, e.g. ``vllm/x86_64-AVX2``: vLLM keys its compile cache by its
    config, source and versions but not by the CPU, and loads a cached graph without re-checking it, so a
    cache shared by two hosts (a network home, a CI cache) must not hand one the other's compiled kernels."""
    import platform

    import torch

    return cache_dir() / "vllm" / f"{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}"


def build_cache_env() -> str | None:
    """Set ``TORCH_EXTENSIONS_DIR`` (:func:`extensions_dir`) and ``VLLM_CACHE_ROOT`` (:func:`vllm_cache_dir`),
    a user's own value kept. Both must be writable: torch makes a ``lock`` file beside DeepSpeed's compiled op
    at every load, and vLLM writes its compile cache. Where the policyzoo cache is not (a shared cache mounted
    read-only) they go to a temporary folder of this process, removed at exit, holding a copy of what the
    cache has there (the compiled op is not built again). Returns the console line saying so, else None."""
    folders = {key: path for key, path in (("TORCH_EXTENSIONS_DIR", extensions_dir()),
                                           ("VLLM_CACHE_ROOT", vllm_cache_dir())) if key not in os.environ}
    moved = [key for key, path in folders.items() if not is_writable(path)]
    tmp = Path(tempfile.mkdtemp(prefix="policyzoo-cache-")) if moved else None
    if tmp is not None:
        atexit.register(shutil.rmtree, tmp, True)
    for key in moved:
        target = tmp / folders[key].relative_to(cache_dir())
        if folders[key].is_dir():
            shutil.copytree(folders[key], target, ignore=shutil.ignore_patterns("lock"))
            for path in [target, *target.rglob("*")]:  # the copy of a read-only tree is read-only too
                path.chmod(path.stat().st_mode | (0o700 if path.is_dir() else 0o600))
        folders[key] = target
    os.environ.update({key: str(path) for key, path in folders.items()})
    if tmp is None:
        return None
    return (f"policyzoo: the cache {cache_dir()} (POLICYZOO_CACHE) is not writable: {' and '.join(moved)} point to "
            f"{tmp} for this run (a copy of the cache's, removed at exit); make the cache writable, or set "
            f"{' and '.join(moved)} to writable folders, to keep what a run builds")


def build_deepspeed_op() -> str:
    """Compile DeepSpeed's one CPU op (its shared-memory all-reduce, ``deepspeed_shm_comm``) into the
    extensions cache now, so that no training run compiles it (~90 s, and a run killed while compiling
    used to leave a lock every later run waited on). ``make setup`` calls it. Returns what was done."""
    import torch

    if torch.cuda.is_available():
        return "no CPU op needed on CUDA"
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    oplock.install()
    oplock.clear_stale_build_lock(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    from deepspeed.comm.torch import build_shm_op

    return "built" if build_shm_op() is not None else "not compatible here (DeepSpeed falls back to gloo)"


def free_port() -> int:
    """A local TCP port free at the moment of asking, for a server given ``--port``. Another process may take it
    before the server binds it: process groups use ``MASTER_PORT=0``, torchrun ``--standalone`` or a file store
    instead, which bind at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def setup_process(threads: int | None = None, kv_cache_gb: float = 1.0) -> int:
    """Prepare this process for vLLM (in-process) + DeepSpeed (one rank without a launcher).

    * vLLM runs inside this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights can be
      pushed into it directly after each optimizer step; on CPU its KV cache gets
      ``kv_cache_gb`` GiB (``VLLM_CPU_KVCACHE_SPACE``, whole GiB in vLLM 0.32: rounded, at least 1).
    * vLLM-CPU's thread binding, made explicit: ``VLLM_CPU_OMP_THREADS_BIND=nobind``. vLLM 0.32
      binds OpenMP threads to cores (``OMP_PLACES``/``OMP_PROC_BIND``, ``auto`` by default) only
      in its multiprocess executor, for the worker processes it starts; in this in-process ("uni")
      executor it never reads the variable, so the rollout shares the trainer's OpenMP pool
      (``OMP_NUM_THREADS`` threads, placed by the OS). ``nobind`` states that, and keeps the
      rollout off cores other processes of a shared machine hold. A user's own
      ``VLLM_CPU_OMP_THREADS_BIND``, ``OMP_PLACES`` or ``OMP_PROC_BIND`` is kept.
    * DeepSpeed: ``DS_ACCELERATOR=cpu`` without a GPU; a single rank when no launcher set
      ``RANK``/``WORLD_SIZE``, its store on ``MASTER_PORT=0`` (the free port is taken at bind time, so two runs
      starting together never race for one); ``LOCAL_RANK=0`` when the launcher bound one GPU to the task
      (:func:`policyzoo.engine.device.bind_visible_gpu`). The one op DeepSpeed compiles on first use (~90 s) is
      cached in ``TORCH_EXTENSIONS_DIR``, by default :func:`extensions_dir` under the policyzoo
      cache (the Makefile points the cache into the project's ``.build/`` folder).
    * vLLM's own cache (``VLLM_CACHE_ROOT``; its compiled forward with ``engine.vllm_compile``) goes under
      the policyzoo cache too, beside the converted model it was compiled for (:func:`vllm_cache_dir`).
      A policyzoo cache that is not writable moves both to a temporary folder (:func:`build_cache_env`).
    * torch threads: ``threads`` or the usable cores shared out among the ranks of this node
      (``LOCAL_WORLD_SIZE`` from torchrun, ``LOCAL_SIZE`` from the deepspeed launcher). Returns the count used.
    """
    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gb)))))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # unless quiet_libraries(verbose=True) set INFO
    note = build_cache_env()  # DeepSpeed's op and vLLM's compile cache; elsewhere when the cache is read-only
    if note and os.environ.get("RANK", "0") == "0":
        print(note, file=sys.stderr)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        oplock.install()  # a lock a killed process left on DeepSpeed's op: removed, not waited on for ever
        oplock.clear_stale_build_lock(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        # port 0: the rendezvous store binds a free port itself. A port chosen here and then freed can be taken by
        # another process before DeepSpeed binds it (EADDRINUSE, seen with two test workers on one machine); one
        # rank has no peer that needs to know the number. DeepSpeed's CPU shared-memory op, which names its
        # segment after MASTER_PORT, is only opened when LOCAL_SIZE ranks share the node, never for one rank.
        os.environ.setdefault("MASTER_PORT", "0")
    bind_visible_gpu()  # one GPU bound per task: LOCAL_RANK=0 before DeepSpeed and vLLM read it (device.py)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or "1")  # torchrun / deepspeed
    n = threads or max(1, cpu_count() // local_ranks)
    torch.set_num_threads(n)
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    return n


def check_vllm_threads(threads: int | None) -> None:
    """vLLM's CPU attention checks its OpenMP pool, sized when the process started, against
    torch's thread count: a mismatch crashes in the first rollout. Raise a ConfigError first."""
    import torch

    omp = os.environ.get("OMP_NUM_THREADS")
    if threads and not torch.cuda.is_available() and threads != (int(omp) if omp else cpu_count()):
        raise ConfigError("engine.threads", f"engine.threads={threads} with the vllm rollout, but this process's "
                          f"OpenMP thread count is {omp or cpu_count()} (fixed at start-up, before the config is read)",
                          f"start the process with OMP_NUM_THREADS={threads} in the environment, drop "
                          "engine.threads, or use engine.rollout=transformers")


#: warnings that say nothing a user can act on, silenced unless --verbose (module regex, message regex)
NOISE = [
    (r"", r".*[Tt]riton.*"),  # "Triton is not installed / not supported on CPU" (vLLM, DeepSpeed on CPU)
    (r"", r".*reduce_op.*deprecated.*"),  # torch.distributed.reduce_op, still used by DeepSpeed
    (r"", r".*NUMA.*"),  # vLLM-CPU's thread binding without libnuma
]


def quiet_libraries(verbose: bool = False) -> None:
    """Silence library output that says nothing to the user (Triton missing on CPU, DeepSpeed's
    deprecated ``reduce_op``, vLLM's NUMA binding notes, transformers' and DeepSpeed's info logs).
    With ``verbose`` (``policyzoo train --verbose``, ``policyzoo.train(verbose=True)``) everything is
    shown: info-level logs of vLLM, transformers and DeepSpeed, and every warning."""
    import logging
    import warnings

    if verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info")
        logging.getLogger("DeepSpeed").setLevel(logging.INFO)
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)  # logged at import, before its config
    for module, message in NOISE:
        warnings.filterwarnings("ignore", message=message, module=module)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Loading weights", "Writing model shards"


@contextlib.contextmanager
def captured_output(log_file: Path, enabled: bool = True):
    """Send everything written to this process's stdout and stderr (file descriptors 1 and 2, so
    C++ and library prints too: DeepSpeed's op-build line, vLLM's NUMA notes and load bars) to
    ``log_file`` (appended) while loading models. Nothing is lost: on an exception the captured text
    is also written to stderr before the exception propagates."""
    if not enabled:
        yield
        return
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        ok, oplock.console_fd = False, saved[1]  # a wait on DeepSpeed's op lock is said on the console too
        try:
            yield
            ok = True
        finally:
            oplock.console_fd = None
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    if not ok:
        sys.stderr.write(log_file.read_text(errors="replace")[-20000:])
