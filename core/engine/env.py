"""Process set-up for the colocated engine: environment variables, threads, the process group.

Everything here must run before ``vllm`` or ``deepspeed`` is imported (they read the environment
at import time). Values already set by the user or a launcher (``torchrun`` sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``...) are kept.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from pathlib import Path

from .models import cache_dir


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def setup_process(threads: int | None = None, kv_cache_gb: float = 1.0) -> int:
    """Prepare this process for vLLM (in-process) + DeepSpeed (one rank without a launcher).

    * vLLM runs inside this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights can be
      pushed into it directly after each optimizer step; on CPU its KV cache gets
      ``kv_cache_gb`` GiB (``VLLM_CPU_KVCACHE_SPACE``).
    * DeepSpeed: ``DS_ACCELERATOR=cpu`` without a GPU; a single rank on a free local port when no
      launcher set ``RANK``/``WORLD_SIZE``. The one op DeepSpeed compiles on first use (~90 s) is
      cached in ``TORCH_EXTENSIONS_DIR``, by default :func:`extensions_dir` under the policyzoo
      cache (the Makefile points the cache into the project's ``.build/`` folder).
    * torch threads: ``threads`` or the usable cores shared out among the ranks of this node
      (``LOCAL_WORLD_SIZE`` from torchrun, ``LOCAL_SIZE`` from the deepspeed launcher). Returns the count used.
    """
    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gb)))))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
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
        from ..errors import ConfigError

        raise ConfigError("engine.threads", f"engine.threads={threads} with the vllm rollout, but this process's "
                          f"OpenMP thread count is {omp or cpu_count()} (fixed at start-up, before the config is read)",
                          f"start the process with OMP_NUM_THREADS={threads} in the environment, drop "
                          "engine.threads, or use engine.rollout=transformers")
