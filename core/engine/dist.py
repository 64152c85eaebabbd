"""Data parallel training over ranks started by ``torchrun`` or the ``deepspeed`` launcher.

Every rank runs the whole engine (trainer + its own colocated rollout engine) on its share of
each step's prompts. The contract that makes N ranks equal one rank with the whole batch:

* **Shares.** The step's P prompts are cut into N consecutive slices of P / N whole prompts, so a
  group (the G samples of one prompt) never straddles ranks. P % N != 0 is a ``ConfigError``.
* **Sampling.** Prompt ``k`` of the step (global index, 0 <= k < P) samples with the seed of its
  global index on whichever rank holds it (``first_index`` of the rollout), so the samples do
  not depend on the number of ranks.
* **Normalisers.** ``StepTotals`` (tokens, sequences) are summed over ranks before the loss is
  reduced, so rank r's loss is its part of the full-batch loss: ``sum_r loss_r = loss``.
* **Gradient scale.** DeepSpeed *averages* gradients over the N ranks (divides the sum by N, at
  every ZeRO stage), so each rank back-propagates ``N * loss_r``:
  ``(1/N) * sum_r grad(N * loss_r) = grad(sum_r loss_r) = grad(loss)``.
* **Skips.** A rank that finds a non-finite reward, log-prob, loss or gradient skips; the flag
  is reduced with MAX, so every rank skips the same optimizer step (no rank waits in a collective
  the others never enter).
* **Metrics** are gathered to every rank and merged (:func:`merge_metrics`); rank 0 writes them.
* **No hangs.** Before every collective of the step the ranks agree on the work each will do
  (``policyzoo.step.agree``); what can still wait (a rank stuck or dead) is bounded by the process
  group's timeout ``engine.collective_timeout_s``, which :func:`phase` turns into a
  :class:`CollectiveTimeout` naming the rank and the phase of the step.

With one rank (no launcher) every function here is the identity.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta

from policyzoo.contract.ground import Collective
from policyzoo.errors import UserError

from .device import local_device, set_thread_device

#: metrics that add up over ranks; ``time_*`` and flags take the max; the rest are means
SUMMED = {"loss", "value_loss", "rows", "sampled_rows", "rollout_tokens", "prompt_tokens", "rollout_tokens_per_s",
          "shortfall_rows", "reward_unscorable", "unscorable_rows", "stale_dropped_rows"}
MAXED = {"skipped", "grad_norm", "sync_max_diff", "sync_mean_diff", "stop_requested", "policy_lag_max", "rss_gib",
         "peak_rss_gib", "gpu_peak_allocated_gib", "gpu_reserved_gib", "gpu_kv_cache_gib"}


class DistError(UserError):
    """Ranks of one run disagree (e.g. a plugin missing on one of them)."""


class CollectiveTimeout(UserError):
    """A rank waited longer than ``engine.collective_timeout_s`` in a collective (or its peer died)."""


#: seconds a collective may wait (``engine.collective_timeout_s``, set by :func:`init`)
TIMEOUT_S = [600.0]

#: what the messages of a failed gloo/NCCL collective hold (torch raises a plain RuntimeError for gloo)
_COLLECTIVE_FAILURES = ("Timed out", "timed out", "Connection closed by peer", "Connection reset", "NCCL",
                        "Broken pipe", "ProcessGroup")


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _dist():
    import torch.distributed as dist

    return dist if world_size() > 1 and dist.is_available() and dist.is_initialized() else None


def init(timeout_s: float = 600.0) -> None:
    """Join the process group of the launcher (gloo on CPU, NCCL on GPU) with a collective timeout
    of ``timeout_s`` seconds (``engine.collective_timeout_s``); no-op for one rank."""
    TIMEOUT_S[0] = float(timeout_s)
    if world_size() <= 1:
        return
    import deepspeed
    import torch

    set_thread_device()  # NCCL binds each rank's communicator to the current device
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo",
                               timeout=timedelta(seconds=timeout_s))


def close() -> None:
    """Leave the launcher's process group (the end of a run; no-op for one rank). A gloo group left to
    the interpreter's exit can abort the process after its work is done ("terminate called without an
    active exception": gloo's worker threads still hold tensors while Python tears down; pytorch issue
    190489), which made torchrun report a finished run as failed."""
    d = _dist()
    if d is not None:
        d.destroy_process_group()


def is_collective_failure(error: BaseException) -> bool:
    """True for the error of a collective that timed out or lost its peer (gloo's RuntimeError,
    NCCL's ``DistBackendError``)."""
    if type(error).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    return isinstance(error, RuntimeError) and any(k in str(error) for k in _COLLECTIVE_FAILURES)


@contextmanager
def phase(name: str):
    """Name the phase of the step for the collectives inside: a collective that times out (or
    whose peer died) in it becomes a :class:`CollectiveTimeout` naming this rank and ``name``.
    The innermost phase names it; nothing is written by the failed step, so the last checkpoint
    stays the last complete one."""
    try:
        yield
    except CollectiveTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - only collective failures are converted
        if not is_collective_failure(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CollectiveTimeout(
            f"rank {rank()} of {world_size()}, {name}",
            f"a collective with the other ranks failed after waiting up to engine.collective_timeout_s = "
            f"{TIMEOUT_S[0]:g} s ({first[:200]}): another rank is stuck, died, or ran different work",
            "no partial step was written: the last checkpoint is intact, resume with policyzoo train --resume "
            "RUN_DIR; see the other ranks' messages for the cause; if one phase legitimately takes longer on "
            "one rank (a slow reward or environment), raise engine.collective_timeout_s") from e


def barrier() -> None:
    d = _dist()
    if d is not None:
        d.barrier()


def gather(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` for one rank)."""
    d = _dist()
    if d is None:
        return [obj]
    out = [None] * world_size()
    d.all_gather_object(out, obj)
    return out


def broadcast(obj):
    """Rank 0's ``obj`` on every rank."""
    d = _dist()
    if d is None:
        return obj
    box = [obj]
    d.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any rank (a MAX all-reduce)."""
    d = _dist()
    if d is None:
        return bool(flag)
    import torch

    t = torch.tensor([1.0 if flag else 0.0], device=local_device())
    d.all_reduce(t, op=d.ReduceOp.MAX)
    return bool(t.item() > 0)


def sum_ints(values: list[int]) -> list[int]:
    d = _dist()
    if d is None:
        return list(values)
    import torch

    t = torch.tensor(values, dtype=torch.float64, device=local_device())
    d.all_reduce(t)
    return [int(round(v)) for v in t.tolist()]


class DistCollective(Collective):
    """:class:`~policyzoo.contract.Collective` over the launcher's process group (float64 sums,
    object gathers of CPU tensors); the identity for one rank."""

    @property
    def world_size(self) -> int:
        return world_size()

    def phase(self, name: str):
        return phase(name)

    @property
    def rank(self) -> int:
        return rank()

    def sum(self, x):
        d = _dist()
        if d is None:
            return x
        import torch

        t = x.detach().to(device=local_device(), dtype=torch.float64, copy=True)
        d.all_reduce(t)
        return t.to(device=x.device, dtype=x.dtype)

    def gather(self, x):
        d = _dist()
        if d is None:
            return x
        import torch

        parts = gather(x.detach().cpu())
        return torch.cat(parts, dim=0).to(x.device)


def check_same_catalog(catalog) -> None:
    """Compare the catalog (slot/name -> source) of every rank with rank 0's; every rank raises
    the same :class:`DistError` naming the first rank and component that differ."""
    mine = {f"{slot}/{name}": str(src) for slot, comps in catalog.components.items()
            for name, (_, src) in comps.items()}
    mine.update({f"algorithm/{name}": str(src) for name, (_, src) in catalog.bundles.items()})
    all_ = gather(mine)
    ref = all_[0]
    for r, other in enumerate(all_[1:], start=1):
        for key in sorted(set(ref) | set(other)):
            if ref.get(key) == other.get(key):
                continue
            why = (f"rank {r} has no component {key} (rank 0: {ref[key]})" if key not in other else
                   f"rank 0 has no component {key} (rank {r}: {other[key]})" if key not in ref else
                   f"component {key} comes from {other[key]} on rank {r} but {ref[key]} on rank 0")
            raise DistError("plugins across ranks", why,
                            "install the same plugin distributions (same versions) on every node, "
                            "and set the same POLICYZOO_PLUGINS on every rank")


def merge_metrics(records: list[dict]) -> dict:
    """One record from every rank's: values equal on all ranks are kept, :data:`SUMMED` keys add
    up, :data:`MAXED` and ``time_*`` keys take the max, other numbers are the mean over the ranks
    that report them (ranks hold equal numbers of prompts), anything else is rank 0's (lists are joined)."""
    if len(records) == 1:
        return records[0]
    out: dict = {}
    for key in dict.fromkeys(k for r in records for k in r):
        vals = [r[key] for r in records if key in r]
        if all(v == vals[0] for v in vals) and key not in SUMMED:
            out[key] = vals[0]
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            if key in SUMMED or key.startswith(("filtered/", "unscorable/")):
                out[key] = sum(vals)
            elif key in MAXED or key.startswith("time_"):
                out[key] = max(vals)
            else:
                out[key] = sum(vals) / len(vals)
        elif all(isinstance(v, list) for v in vals):
            out[key] = [x for v in vals for x in v]
        else:
            out[key] = vals[0]
    return out
