"""Where a step's batch comes from: sampled by the step itself (:class:`SyncSource`), one step ahead
(:class:`OverlapSource`, ``engine.overlap: one_step``) or by a background sampler
(:class:`AsyncSource`, ``engine.max_staleness``). The loop chooses one with :func:`batch_source`
when it is made; every source answers the same calls, so the step has no ``if`` on the engine's mode."""

from __future__ import annotations

import contextlib

from policyzoo.data import rows_at
from policyzoo.engine import dist
from policyzoo.engine.ahead.async_sampler import AsyncAhead, AsyncSampler, discarded_at_resume, merge_in_flight
from policyzoo.engine.ahead.overlap import OverlapAhead, OverlapPolicy
from policyzoo.step import dispatch, round_seed, step_seed


class SyncSource:
    """Each step samples its own batch from ``policy`` (nothing ahead, nothing to stop)."""

    def __init__(self, policy):
        self.policy = policy

    def counters(self) -> dict:
        """The sampling counters (``tokens``, ``prompt_tokens``, ``seconds``) a step's delta is read from."""
        return self.policy.stats

    def begin(self, step: int, loop):
        """The step's :class:`~policyzoo.step.learn.Ahead`: None (the step samples from ``self.policy``)."""
        return None

    def after_step(self, metrics: dict) -> None:
        """Add what the source reports to a finished step's ``metrics`` (in place): nothing here."""

    def exclusive(self):
        """A context in which nothing samples in the background (an evaluation uses the engine)."""
        return contextlib.nullcontext()

    def in_flight(self) -> dict | None:
        """What was sampled ahead, merged over the ranks (a collective), for a checkpoint; None: nothing."""
        return None

    def stop(self) -> None:
        """End what samples in the background (nothing here); the source may begin again afterwards."""


class OverlapSource(SyncSource):
    """``engine.overlap: one_step``: step n+1's first round is sampled while step n trains, through an
    :class:`OverlapPolicy` (lag at most ``max_policy_lag`` optimizer steps). Nothing sampled ahead
    crosses a checkpoint, an evaluation or the last step."""

    def __init__(self, run, policy, max_policy_lag: int):
        super().__init__(OverlapPolicy(policy, max_policy_lag))
        self.run = run

    def begin(self, step: int, loop) -> OverlapAhead:
        """Sample step ``step + 1`` ahead unless it is past ``train.steps`` or ``step`` saves or evaluates."""
        t = loop.config.train
        boundary = any(every and step % every == 0 for every in (t.save_every, t.eval_every))
        next_seed = step_seed(t.seed, step + 1) if step < t.steps and not boundary else None
        return OverlapAhead(self.run, self.policy).begin(next_seed, loop.next_prompts)


class AsyncSource(SyncSource):
    """``engine.max_staleness``: a background :class:`AsyncSampler` (made at the first step, by
    :func:`async_sampler`; its thread ends at :meth:`stop`, and a later step starts a new one)."""

    def __init__(self, part):
        super().__init__(None)
        self.part = part
        self.discarded: dict = {}  # sampled ahead of the resumed checkpoint: reported on the first step

    def counters(self) -> dict:
        if self.policy is None:
            self.policy, self.discarded = async_sampler(self.part)
        return self.policy.stats

    def begin(self, step: int, loop) -> AsyncAhead:
        self.counters()
        return AsyncAhead(self.policy).begin(step, loop.rows_drawn)

    def after_step(self, metrics: dict) -> None:
        metrics.update(self.discarded)  # async_discarded_batches / _rows, once
        self.discarded = {}

    def exclusive(self):
        return self.policy.exclusive() if self.policy is not None else contextlib.nullcontext()

    def in_flight(self) -> dict | None:
        return None if self.policy is None else merge_in_flight(dist.gather(self.policy.in_flight()))

    def stop(self) -> None:
        if self.policy is not None:
            self.policy.stop()
            self.policy = None


def batch_source(part) -> SyncSource:
    """The source ``part.config.engine`` asks for (its overlap and staleness, checked before load); ``part``:
    the run's :class:`~policyzoo.engine.run.session.RunPart`."""
    engine = part.config.engine
    if engine.overlap == "one_step":
        return OverlapSource(part.run, part.policy, engine.max_policy_lag)
    if engine.max_staleness:
        return AsyncSource(part)
    return SyncSource(part.policy)


def async_sampler(part) -> tuple[AsyncSampler, dict]:
    """The background sampler of ``engine.max_staleness`` (its thread starts now) and what a resumed
    run had sampled ahead of its checkpoint (``{"async_discarded_batches": B, "async_discarded_rows": R}``
    or ``{}``; also a console line), sampled again now. ``part`` (the run's
    :class:`~policyzoo.engine.run.session.RunPart`): its ``config``, ``run``, ``task``, ``state``, ``share``
    (this rank's prompts per step), ``policy`` and ``console``."""
    c, P, sp, run = part.config, part.config.train.prompts_per_step, part.run.sample.params, part.run
    share, rank = part.share, dist.rank()

    def plan(step: int, cursor: int):  # the prompts and seed of the step's first round at ``cursor``
        rows = rows_at(part.task.train_rows, part.task.seed, cursor, P)
        return rows[rank * share:(rank + 1) * share], round_seed(step_seed(c.train.seed, step), 0)

    def sample(policy, prompts, seed):
        return dispatch.call(run, "sample", rows=len(prompts) * (sp.n + sp.greedy), policy=policy,
                             prompts=prompts, seed=seed, env=run.env)

    discarded, line = discarded_at_resume(part.state)
    if line:
        part.console.print(line, markup=False, highlight=False)
    sampler = AsyncSampler(part.policy, c.engine.max_staleness, sample, plan, stride=P, last_step=c.train.steps,
                           version=part.state["step"])
    return sampler, discarded
