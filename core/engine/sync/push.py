"""The weight sync of a run (:class:`WeightSync`): the trainer's full weights pushed into the rollout engine
after every optimizer step, then (``engine.sync_check``) checked; and vLLM's sleep mode kept in step with
who runs (the trainer, the sampler). The one direction: this module calls the trainer (its gather and its
scoring) and the rollout engine (``load_weights``, ``score``, its sleeper); neither calls back into it."""

from __future__ import annotations

import time

from policyzoo.engine.device import release_cached_memory

from .check import check_weights, run_with_timeout


def cached_prefix(check_ids: list[int], max_model_len: int) -> list[int]:
    """``check_ids`` repeated up to ``max_model_len - 1`` tokens: the prefix the check scores through the
    generation path, so that every cached block of it is read (``max_model_len``: tokens)."""
    return (check_ids * (max_model_len // len(check_ids) + 1))[:max_model_len - 1]


class WeightSync:
    """Pushes ``trainer``'s weights (``full_weights()``: :mod:`policyzoo.engine.sync.gather`) into ``rollout``
    (``load_weights``: vLLM, a server or transformers) and checks them.

    ``check`` (``engine.sync_check``): after each push :func:`~policyzoo.engine.sync.check.check_weights`
    compares both sides' log-probs on ``check_ids`` (e.g. the first held-out prompt and its answer) and
    on the next tokens after ``cached_ids`` (default ``check_ids``) within ``tolerance`` nats (max) and
    ``mean_tolerance`` (mean; None: ``tolerance``). ``timeout_s`` (``engine.sync_timeout_s``) bounds the
    push and each of the check's calls. ``rollout.sleeper`` (vLLM's sleep mode, :mod:`.sleep`), when the
    engine has one, is told when the trainer takes over (:meth:`for_training`) and woken for the push."""

    def __init__(self, rollout, trainer, *, check: bool, tolerance: float, timeout_s: float,
                 check_ids: list[int], cached_ids: list[int] | None = None, mean_tolerance: float | None = None):
        self.rollout, self.trainer = rollout, trainer
        self.check, self.tolerance, self.timeout_s = check, tolerance, timeout_s
        self.mean_tolerance = mean_tolerance
        self.check_ids = check_ids
        #: the prefix scored through the generation path (default: ``check_ids``)
        self.cached_ids = cached_ids or check_ids
        #: mean |difference| of the last sync check (nats; the max is its return value)
        self.last_mean_diff: float | None = None
        self.sleeper = getattr(rollout, "sleeper", None)  # vLLM's sleep mode (GPU, engine.vllm_sleep)

    def sync(self) -> dict:
        """Push the trainer's weights into the rollout engine (within ``timeout_s``), release the CUDA
        allocator's cached blocks, and with the check on compare log-probs; returns the metrics
        ``sync_seconds`` (s) and, with the check, ``sync_max_diff`` / ``sync_mean_diff`` (nats).
        Raises :class:`~policyzoo.engine.sync.check.SyncError` on a timeout or a failed check."""
        t0 = time.perf_counter()
        run_with_timeout(self.push, self.timeout_s, "pushing weights into the rollout engine")
        release_cached_memory()  # the gathered copies' blocks, back to the GPU for vLLM's KV cache
        out = {"sync_seconds": time.perf_counter() - t0}
        if self.check:
            out["sync_max_diff"] = self.check_now()
            out["sync_mean_diff"] = self.last_mean_diff
        return out

    def push(self) -> None:
        """The trainer's full weights, consumed by the rollout engine's ``load_weights`` (every rank: a
        ZeRO-3 gather is collective)."""
        with self.trainer.full_weights() as weights:
            self.rollout.load_weights(weights)

    def check_now(self) -> float:
        """The sync check now: its max |difference| (nats; the mean in :attr:`last_mean_diff`); raises
        :class:`~policyzoo.engine.sync.check.SyncError` above the tolerances."""
        mean_bound = self.tolerance if self.mean_tolerance is None else self.mean_tolerance
        diff, self.last_mean_diff = check_weights(self.trainer, self.rollout, self.check_ids, self.cached_ids,
                                                  self.tolerance, mean_bound, self.timeout_s)
        return diff

    def for_training(self) -> None:
        """The trainer is about to run: vLLM sleeps (when its sleep mode is on)."""
        if self.sleeper is not None:
            self.sleeper.for_training()

    def before_sampling(self) -> None:
        """The policy is about to sample: a level-2 engine that dropped its weights with no push since
        (e.g. after a skipped update) gets the trainer's weights pushed first; waking alone would sample
        from garbage (:meth:`policyzoo.engine.sync.sleep.Sleeper.weights_dropped`)."""
        if self.sleeper is not None and self.sleeper.weights_dropped():
            self.push()
