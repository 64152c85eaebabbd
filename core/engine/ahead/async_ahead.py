"""``engine.max_staleness`` as the step's ``Ahead`` (:class:`AsyncAhead`), and what a checkpoint records of
the batches sampled ahead of it (:func:`merge_in_flight`, :func:`discarded_at_resume`); the sampler thread
itself is :mod:`policyzoo.engine.ahead.async_sampler`."""

from __future__ import annotations


def merge_in_flight(ranks: list[dict]) -> dict:
    """What every rank had sampled ahead (``AsyncSampler.in_flight()`` per rank): the batches (each rank
    holds its share of the same steps: the max) and their rows (summed)."""
    return {"batches": max(a["batches"] for a in ranks), "rows": sum(a["rows"] for a in ranks)}


def discarded_at_resume(state: dict) -> tuple[dict, str | None]:
    """For a run resumed from a checkpoint with ``state`` (its ``state.json``): the metrics of what
    was sampled ahead of it and is discarded (``async_discarded_batches`` / ``_rows``) and the line
    saying so; ``({}, None)`` for a new run or when nothing was ahead. Removes the record from ``state``."""
    lost = state.pop("async_in_flight", None) if state.get("step") else None
    if not lost or not lost.get("batches"):
        return {}, None
    return ({"async_discarded_batches": lost["batches"], "async_discarded_rows": lost["rows"]},
            f"engine.max_staleness: {lost['batches']} batch(es) ({lost['rows']} rows sampled) were ahead of the "
            "checkpoint and are discarded; those steps are sampled again")


class AsyncAhead:
    """``engine.max_staleness`` as the step's :class:`~policyzoo.step.learn.Ahead`: before step
    ``step`` collects, the sampler is told which step it is and where the prompt stream stands
    (``cursor``), so the step's first round comes from the queue when it was sampled ahead; the
    thread samples on while the step trains. Adds ``stale_dropped`` / ``stale_dropped_rows`` (this
    step's). ``policy`` is the
    :class:`~policyzoo.engine.ahead.async_sampler.AsyncSampler` the step samples from."""

    def __init__(self, policy):
        self.policy, self.step, self.cursor, self._dropped = policy, 0, 0, (0, 0)

    def begin(self, step: int, cursor: int) -> "AsyncAhead":
        self.step, self.cursor = step, cursor
        return self

    def before(self) -> None:
        self._dropped = (self.policy.stale_dropped, self.policy.stale_dropped_rows)
        self.policy.begin(self.step, self.cursor)

    def collected(self) -> None:
        pass

    def learned(self) -> dict:
        return {"stale_dropped": self.policy.stale_dropped - self._dropped[0],
                "stale_dropped_rows": self.policy.stale_dropped_rows - self._dropped[1]}
