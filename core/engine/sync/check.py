"""The sync's bounds: its time (:func:`run_with_timeout`, ``engine.sync_timeout_s``) and the check that the
rollout engine samples from the trainer's weights (:func:`check_weights`, ``engine.sync_check``), with the
default tolerances per dtype pair (:data:`SYNC_TOLERANCE`, :data:`SYNC_MEAN_TOLERANCE`). Either failing
raises :class:`SyncError`."""

from __future__ import annotations

import threading

import torch

from policyzoo.engine.device import on_device
from policyzoo.errors import UserError

#: default sync-check bound (nats, max over the checked tokens) per trainer dtype, or per "trainer+sampler" pair
#: when the rollout engine holds other weights. fp32: SmolLM2 measured up to 6e-5 on CPU, one missed sync moves
#: it by > 1e-2. bf16 (trainer and sampler): vLLM's kernels and transformers' round differently by 1e-2..1e-1
#: nats (reported for bf16 on GPUs; 0.0039 in `policyzoo doctor --gpu --device cpu`, tiny model); a stale or
#: wrong weight moves log-probs by far more (a tied lm_head left stale: > 1 nat). fp32 training with bf16 sampling
#: (SmolLM2, vLLM-CPU on AMX, 200 checks over 4 runs x 50 steps, bench/results/bf16_rollout_amx): max
#: 0.17-0.86 per check, on a few low-probability tokens where rounding moves the logits most, so the max alone
#: cannot tell rounding from a bad push; the mean bound below can
SYNC_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25, "float32+bfloat16": 1.5}
#: default bound of the mean |difference| over the checked tokens (nats), keyed as :data:`SYNC_TOLERANCE`.
#: fp32 training with bf16 sampling: 0.029-0.059 per check in the same 200 checks. A sampler left at the initial
#: weights while the trainer took 50 steps (a push that silently did nothing) differs from it by a mean of
#: 0.19-0.21 and a max of 1.6-2.1 nats (fp32, 53-token prompt, both seeds' trained models): the bf16 bounds
#: catch that, not one missed push (below bf16's own rounding)
SYNC_MEAN_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25, "float32+bfloat16": 0.12}


def _pair(dtype: str, rollout_dtype: str | None) -> str:
    """The tolerance tables' key: the trainer's dtype, or "trainer+sampler" (a pair without an entry: bf16's)."""
    if rollout_dtype in (None, dtype):
        return dtype
    key = f"{dtype}+{rollout_dtype}"
    return key if key in SYNC_TOLERANCE else "bfloat16"


def sync_tolerance(dtype: str, configured: float | None = None, rollout_dtype: str | None = None) -> float:
    """``configured`` (``engine.sync_tolerance``) or the default (:data:`SYNC_TOLERANCE`) of the trainer's
    ``dtype`` with the sampler's ``rollout_dtype``."""
    return configured if configured is not None else SYNC_TOLERANCE[_pair(dtype, rollout_dtype)]


def sync_mean_tolerance(dtype: str, configured: float | None = None, rollout_dtype: str | None = None) -> float:
    """The bound of the check's mean |difference|: ``configured`` (``engine.sync_tolerance``, which bounds the max
    and so the mean) or :data:`SYNC_MEAN_TOLERANCE` of the pair."""
    return configured if configured is not None else SYNC_MEAN_TOLERANCE[_pair(dtype, rollout_dtype)]


class SyncError(UserError):
    """The rollout engine's weights could not be brought in line with the trainer's."""


def run_with_timeout(fn, timeout_s: float, what: str):
    """Run ``fn()`` in a helper thread; raise :class:`SyncError` if it takes over ``timeout_s``."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=on_device(target), name=f"policyzoo-{what}", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise SyncError("weight sync", f"{what} did not finish within {timeout_s:g} s",
                        "raise engine.sync_timeout_s if the model is very large; otherwise the rollout engine "
                        "is stuck (check memory and other processes) and the run must be restarted with --resume")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def check_weights(trainer, rollout, check_ids: list[int], cached_ids: list[int], tolerance: float,
                  mean_tolerance: float, timeout_s: float) -> tuple[float, float]:
    """``(max, mean)`` |trainer - rollout engine| log-prob (nats) over ``check_ids`` (prompt log-probs,
    ``[len(check_ids) - 1]`` per engine) and over the top next tokens after ``cached_ids`` (the generation
    path, which reads vLLM's prefix cache first); each of a rollout's ``replicas()`` (servers) is checked.
    Raises :class:`SyncError` when the max exceeds ``tolerance`` or the mean ``mean_tolerance`` (NaN too)."""
    b = trainer.score_sequence(check_ids)
    full = trainer.next_logprobs(cached_ids)
    diffs = []
    for engine in getattr(rollout, "replicas", lambda: [rollout])():  # several rollout servers: each
        nxt = run_with_timeout(lambda: engine.score_next(cached_ids), timeout_s, "the sync check")
        a = run_with_timeout(lambda: engine.score(check_ids), timeout_s, "the sync check")
        cached = torch.tensor([v - float(full[t]) for t, v in nxt.items()])
        diffs += [(a - b).abs(), cached.abs()]
    diffs = torch.cat(diffs)
    diff, mean = float(diffs.max()), float(diffs.mean())  # NaN propagates
    if not (diff <= tolerance and mean <= mean_tolerance):  # also catches NaN
        raise SyncError("weight sync check", f"after the sync the rollout engine's log-probs differ from the "
                        f"trainer's by up to {diff:.3g} nats (mean {mean:.3g}) on a fixed "
                        f"{len(check_ids)}-token sequence (tolerance {tolerance:g}, of the mean {mean_tolerance:g})",
                        "if engine.sync_tolerance is set below the sampler's own rounding (a bf16 sampler: "
                        "up to ~0.9 nats max, ~0.06 mean), unset it to use the defaults; otherwise the rollout "
                        "engine is sampling from other weights than the ones trained: report it with the model "
                        "folder; engine.rollout: transformers avoids vLLM meanwhile")
    return diff, mean
