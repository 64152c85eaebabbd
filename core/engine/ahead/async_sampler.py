"""Asynchronous training with a staleness bound (``engine.max_staleness: s``, ``s >= 1``).

A background thread samples the coming steps' first sampling round continuously into a queue
while the trainer trains; the trainer takes each step's batch from the queue when it is there.

Versions and staleness. The *version* is the number of weight pushes into the rollout engine
(``sync``) since step 0, i.e. the step whose weights sample (a resumed run starts at the
checkpoint's step; a skipped update pushes nothing). A batch is sampled whole by one version:
the ``sample`` component's whole call (all its ``generate`` calls: the groups, and the greedy
rows of ``sample.greedy``) runs under the engine lock, which the push also takes, so no group is
ever split across versions. The staleness (``Rollout.policy_lag``) of a row trained at version V
and sampled at version v is V - v.

The bound. The thread may start sampling step m only while ``m <= version + 1 + s``: step m trains
at version m - 1 at the latest, so its staleness is at most s by construction, and the queue
holds at most s batches ahead of the one the trainer is on. A batch found staler than s anyway
(a safety net: e.g. more pushes than steps) is **dropped and the step samples afresh** (staleness
0), as is a batch asked with other arguments than the step asks (another dynamic-sampling round
moved the prompt stream: every queued prediction is dropped and re-sampled from the new
position). Drops are counted (``stale_dropped`` batches, ``stale_dropped_rows`` rows).

Who samples. When the trainer starts step n and its batch is neither queued nor being sampled, it
claims it and samples it itself (staleness 0), the thread moves on to n + 1; when it is being
sampled, the trainer waits for it. The engine lock serialises every use of the rollout engine:
the thread's sampling, the trainer's own sampling, the push (which therefore waits for the
sampling in flight, as vLLM's weights must not change under a running generation) and, through
:meth:`AsyncSampler.exclusive`, the held-out evaluation.

The step's side. :class:`AsyncAhead` is ``engine.max_staleness`` as the step's ``Ahead``; what a
checkpoint records of the batches sampled ahead of it is :func:`merge_in_flight` (over the ranks) and
what a resumed run discards of them :func:`discarded_at_resume`.

Any rollout backend plugs in: the inner policy needs ``generate(prompts, n, max_tokens,
temperature, seed, **options) -> Rollout`` (whole groups, ``rollout_logprobs`` of the sampling
policy), ``sync()`` (push the trained weights; returns metrics) and an optional ``stats`` dict of
counters (``tokens``, ``prompt_tokens``, ``seconds``). Peers: TRL's async GRPO ``max_staleness``,
AReaL ``max_head_offpolicyness``, verl ``staleness_threshold``, prime-rl ``max_off_policy_steps`` /
``max_async_level``, NeMo-RL ``max_trajectory_age_steps``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch

from policyzoo.contract import Rollout
from policyzoo.engine.device import on_device

from .passthrough import PassThrough

__all__ = ["AsyncAhead", "AsyncSampler", "Batch", "discarded_at_resume", "merge_in_flight"]

COUNTERS = ("tokens", "prompt_tokens", "seconds")


@dataclass
class Batch:
    """One step's first sampling round, sampled (or being sampled) ahead by one version."""

    step: int
    cursor: int  # the prompt-stream position it was planned at
    version: int | None = None  # the version that sampled it (None: not started)
    calls: list = field(default_factory=list)  # [(generate arguments, Rollout, counters)] in call order
    error: BaseException | None = None
    done: bool = False
    valid: bool = True  # False once dropped while being sampled
    served: int = 0  # calls handed to the trainer so far

    def rows(self) -> int:
        return sum(len(r) for _, r, _ in self.calls)


class AsyncSampler(PassThrough):
    """A Policy over ``inner`` that serves each step's first round from a queue sampled ahead, at most
    ``max_staleness`` versions stale (see the module docstring): ``generate`` and ``sync`` are its own,
    every other method of the protocol passes to ``inner`` (:class:`PassThrough`).

    ``sample(policy, prompts, seed)`` runs the ``sample`` component with ``policy``;
    ``plan(step, cursor)`` returns that step's ``(prompts, seed)`` when the prompt stream stands at
    ``cursor``; ``stride``: rows the stream advances per step; ``last_step``: nothing is sampled
    past it; ``version``: the version the engine holds now. ``background=False`` starts no thread
    (tests call :meth:`sample_next` themselves)."""

    def __init__(self, inner, max_staleness: int, sample: Callable, plan: Callable, stride: int, last_step: int,
                 version: int = 0, background: bool = True):
        if max_staleness < 1:
            raise ValueError("AsyncSampler needs max_staleness >= 1 (0 is the synchronous step)")
        super().__init__(inner)
        self.s, self._sample, self._plan = max_staleness, sample, plan
        self.stride, self.last_step, self.version = stride, last_step, version
        self.queue: dict[int, Batch] = {}
        self.step, self.cursor = None, 0  # the trainer's step (the thread never starts it) and its stream position
        self.stale_dropped = self.stale_dropped_rows = 0
        #: counters of the batches served, booked to the step that trains on them (as ``OverlapPolicy``'s)
        self.stats = dict.fromkeys(COUNTERS, 0)
        self.stats["seconds"] = 0.0
        self._engine = threading.Lock()  # one user of the rollout engine at a time
        self._cond = threading.Condition()  # guards the bookkeeping above
        self._stop = False
        self._thread = None
        if background:
            self._thread = threading.Thread(target=on_device(self._run), name="policyzoo-async-sampler", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ the trainer's side
    def begin(self, step: int, cursor: int) -> None:
        """The trainer starts ``step`` with the prompt stream at ``cursor``: batches of earlier steps
        and batches planned at another position are dropped (the thread samples them again)."""
        with self._cond:
            self.step, self.cursor = step, cursor
            for m, b in list(self.queue.items()):
                if m < step or b.cursor != self._cursor(m):
                    self._drop(m)
            self._cond.notify_all()

    def generate(self, prompts: list[dict], n: int, max_tokens: int, temperature: float, seed: int,
                 **options) -> Rollout:
        """The queued call when this step's batch was sampled ahead with these arguments and is at
        most ``max_staleness`` versions behind (``policy_lag`` = its staleness), else sampled now
        (``policy_lag`` 0); ``policy_version [B]``: the version that sampled each row."""
        call = (prompts, n, max_tokens, temperature, seed, options)
        with self._cond:
            b = self.queue.get(self.step)
            if b is not None and b.valid:  # sampled ahead, or being sampled: wait for it
                while not b.done:
                    self._cond.wait()
                lag = self.version - b.version
                if b.valid and b.error is None and b.served < len(b.calls) and b.calls[b.served][0] == call \
                        and lag <= self.s:
                    _, out, delta = b.calls[b.served]
                    b.served += 1
                    if b.served == len(b.calls):
                        del self.queue[self.step]
                    self._book(delta)
                    return _stamp(out, b.version, lag)
                self._drop(self.step)
        with self._engine:
            out, delta = self._counted(lambda: self.inner.generate(prompts, n, max_tokens, temperature, seed,
                                                                   **options))
            version = self.version
        self._book(delta)
        return _stamp(out, version, 0)

    def sync(self) -> dict:
        """Wait for the sampling in flight (it holds the engine), push, count a version."""
        with self._engine:
            out = self.inner.sync()
            with self._cond:
                self.version += 1
                self._cond.notify_all()
        return out

    @contextmanager
    def exclusive(self):
        """Hold the rollout engine (e.g. for the held-out evaluation): the thread pauses."""
        with self._engine:
            yield

    def in_flight(self) -> dict:
        """Batches sampled (or being sampled) ahead of the trainer's step and their rows so far:
        what a checkpoint written now does not hold (a resumed run samples those steps again)."""
        with self._cond:
            ahead = [b for m, b in self.queue.items() if self.step is None or m > self.step]
            return {"batches": len(ahead), "rows": sum(b.rows() for b in ahead)}

    def stop(self) -> None:
        """Stop the thread (after the sampling in flight) and drop the queue; idempotent."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cond:
            self.queue.clear()

    # ------------------------------------------------------------------ the sampler's side
    def next_step(self) -> int | None:
        """The step the thread may sample now: the first after the trainer's that is not queued,
        within the bound and the run; None when there is none."""
        if self.step is None:
            return None
        top = min(self.last_step, self.version + 1 + self.s)
        return next((m for m in range(self.step + 1, top + 1) if m not in self.queue), None)

    def sample_next(self) -> int | None:
        """Sample the batch of :meth:`next_step` now (in the calling thread); returns its step."""
        with self._cond:
            m = self.next_step()
            if m is None:
                return None
            b = self.queue[m] = Batch(m, self._cursor(m))
        prompts, seed = self._plan(m, b.cursor)
        with self._engine:
            with self._cond:
                b.version = self.version
            try:
                self._sample(_Recorder(self, b), prompts, seed)
            except BaseException as e:  # noqa: BLE001 - dropped; the trainer samples the step itself
                b.error = e
        with self._cond:
            b.done = True
            if not b.valid and self.queue.get(m) is b:
                del self.queue[m]
            self._cond.notify_all()
        return m

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and self.next_step() is None:
                    self._cond.wait()
                if self._stop:
                    return
            self.sample_next()

    # ------------------------------------------------------------------ bookkeeping
    def _cursor(self, m: int) -> int:
        return self.cursor + (m - self.step) * self.stride

    def _drop(self, m: int) -> None:
        """Drop step m's batch (counted); one being sampled is marked and removed when done."""
        b = self.queue[m]
        self.stale_dropped += 1
        self.stale_dropped_rows += sum(len(r) for _, r, _ in b.calls[b.served:])
        if b.done:
            del self.queue[m]
        else:
            b.valid = False

    def _counted(self, generate):
        before = dict(getattr(self.inner, "stats", {}))
        out = generate()
        after = getattr(self.inner, "stats", {})
        return out, {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}

    def _book(self, delta: dict) -> None:
        for k, v in delta.items():
            self.stats[k] += v


class _Recorder(PassThrough):
    """The policy the ``sample`` component sees in the thread: the sampler's inner policy, with each
    ``generate`` call recorded with its rollout (sampled by the engine's current weights) into ``batch``."""

    def __init__(self, sampler: AsyncSampler, batch: Batch):
        super().__init__(sampler.inner)
        self._sampler, self._batch = sampler, batch

    def generate(self, prompts, n, max_tokens, temperature, seed, **options):
        s = self._sampler
        out, delta = s._counted(lambda: s.inner.generate(prompts, n, max_tokens, temperature, seed, **options))
        self._batch.calls.append(((prompts, n, max_tokens, temperature, seed, options), out, delta))
        return out


def _stamp(out: Rollout, version: int, lag: int) -> Rollout:
    out.policy_version = torch.full((len(out),), version, dtype=torch.long)
    out.policy_lag = torch.full((len(out),), lag, dtype=torch.long)
    return out


# ---------------------------------------------------------------------- the step's side, and checkpoints
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
