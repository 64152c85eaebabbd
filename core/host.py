"""What this machine computes natively, for the settings whose default depends on it
(``engine.rollout_dtype: auto``, resolved when the config is made).

Read from ``/proc/cpuinfo`` (no torch import: configs load before the engine). The test suite sets
``POLICYZOO_NATIVE_BF16=0`` so that its runs do not depend on the host they run on.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from .errors import ConfigError

#: CPU flags of bf16 matrix instructions (Intel AMX-BF16, AVX512-BF16; AMD Zen 4 has the latter)
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
#: ``0`` or ``1`` overrides the probe (:func:`native_bf16`)
NATIVE_BF16_ENV = "POLICYZOO_NATIVE_BF16"


@functools.lru_cache(maxsize=None)
def _cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(set(line.partition(":")[2].split()) & set(BF16_FLAGS))
    return False


def native_bf16() -> bool:
    """True when the CPU has bf16 matrix instructions (:data:`BF16_FLAGS` among ``/proc/cpuinfo``'s flags;
    ``POLICYZOO_NATIVE_BF16`` = 1/true/yes/on or 0/false/no/off decides instead). With them vLLM-CPU's bf16
    forward is faster than its fp32 one (a 576 x 576 x 1536 matmul on 2 cores of a Xeon with AMX: 2650 vs
    376 GFLOP/s); without them every bf16 matmul converts, and bf16 sampling was ~7x slower than fp32 (an
    AVX2-only EPYC: bench/results/bf16_rollout_avx2). Raises :class:`~policyzoo.errors.ConfigError` for
    another value of the variable (an unread switch would leave the probe deciding)."""
    forced = os.environ.get(NATIVE_BF16_ENV, "").strip().lower()
    if not forced:
        return _cpu_has_bf16()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    raise ConfigError(NATIVE_BF16_ENV, f"{forced!r} is not a switch (engine.rollout_dtype: auto reads it)",
                      f"set it to 1 or 0, or unset it to let the CPU's flags decide: unset {NATIVE_BF16_ENV}")


def auto_rollout_dtype(model_dtype: str, rollout: str) -> str:
    """``engine.rollout_dtype: auto``: ``bfloat16`` for an fp32 trainer's own vLLM engine
    (``engine.rollout: vllm``) on a machine with native bf16 (:func:`native_bf16`), else ``model_dtype``
    (a rollout server keeps the dtype it was started with; the transformers rollout samples as trained)."""
    if model_dtype == "float32" and rollout == "vllm" and native_bf16():
        return "bfloat16"
    return model_dtype
