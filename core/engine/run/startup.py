"""Start-up helpers: a background start, and how long and how much memory the process took."""

from __future__ import annotations

import threading
import time

from policyzoo.engine.device import on_device


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (``ru_maxrss``: KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def trim_heap() -> None:
    """Return the C heap's free memory to the OS (glibc's ``malloc_trim``; nothing elsewhere).

    A step frees gigabytes of activations, gradients and (LoRA) merged weights in pieces of a few
    MB; glibc keeps freed pieces below its adaptive mmap threshold in its arenas, so without a trim
    the resident memory grows for many steps (a LoRA run at the demo settings: 5.7 -> 7.3 GiB in 10
    steps) and stays far above what the process holds (3.2 GiB measured with small pieces mmapped)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def freeze_heap(collect: bool = False) -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze``; after a full
    collection with ``collect``), so later full collections stop scanning the imports' heap.

    A warm start of the default model ran 14 full collections at 0.2-0.4 s each over the heap of transformers',
    DeepSpeed's and vLLM's imports, finding at most 313 objects to free: ~3.2 s of the start on a 2-core CPU.
    Freezing at :func:`~policyzoo.engine.run.session.prepare`, :func:`~policyzoo.engine.run.session.start` and
    before the rollout engine starts cut that to ~1.9 s (measured with ``gc.callbacks``; with the remembered
    shared-prompt check, a warm start on another host went from 10.05 to 7.97 s: docs/benchmarks.md). Reference
    counting still frees frozen objects; only reference cycles among them are never collected, which is what vLLM
    does with the whole heap at the end of its own start (``vllm.utils.gc_utils.freeze_gc_heap``: a collection, then
    a freeze). ``collect`` first frees the cycles that died already (after a model load: a temporary copy
    of weights in a cycle would otherwise stay)."""
    import gc

    if collect:
        gc.collect()
    gc.freeze()


def rss_gib() -> float:
    """This process's resident memory now, GiB (vLLM's weights and KV cache included)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**30


def process_age_s() -> float | None:
    """Seconds since this process started (interpreter start, imports and model loading), or None
    where the process start time cannot be read."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - an optional measurement
        return None


class Background:
    """``fn()`` run in a thread from now; :meth:`result` joins it and returns or re-raises."""

    def __init__(self, fn):
        self.box: dict = {}

        def run():
            try:
                self.box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                self.box["error"] = e

        self.thread = threading.Thread(target=on_device(run), name="policyzoo-start", daemon=True)
        self.thread.start()

    def result(self):
        self.thread.join()
        if "error" in self.box:
            raise self.box["error"]
        return self.box["value"]
