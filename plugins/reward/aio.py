"""Awaiting reward callables from the synchronous step: coroutine functions, objects with
``async def __call__``, and plain functions that return an awaitable.

Each awaitable runs to completion in its own event loop (``asyncio.run``), in the calling thread,
or in a helper thread when that thread already runs a loop (a notebook). Concurrency between the
reward components of one step comes from the step running every component whose ``concurrent``
attribute is True in its own thread (:meth:`policyzoo.assembly.Run.call_each`), so two async
rewards that each wait 0.5 s on I/O take ~0.5 s together, not 1 s.
"""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import ThreadPoolExecutor


class RewardTimeout(TimeoutError):
    """An awaited reward call ran longer than its ``timeout`` (seconds); it was cancelled."""


def is_async(fn) -> bool:
    """True for a coroutine function and for an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(type(fn), "__call__", None))


def resolve(result, timeout: float | None):
    """``result`` itself, or, when it is awaitable, its awaited value; raises :class:`RewardTimeout`
    after ``timeout`` seconds (None: no limit), the awaitable cancelled."""
    if not inspect.isawaitable(result):
        return result

    async def main():
        try:
            return await asyncio.wait_for(result, timeout)
        except asyncio.TimeoutError:
            raise RewardTimeout(f"no result within {timeout} s (cancelled)") from None

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with ThreadPoolExecutor(1) as pool:  # this thread runs a loop already: run ours beside it
        return pool.submit(asyncio.run, main()).result()


def gather(calls: list, timeout: float | None) -> list:
    """Await the awaitables ``calls`` concurrently, each with ``timeout``; returns, per call, its
    value or the exception it raised (a :class:`RewardTimeout` when it ran out of time)."""

    async def one(c):
        try:
            return await asyncio.wait_for(c, timeout)
        except asyncio.TimeoutError:
            return RewardTimeout(f"no result within {timeout} s (cancelled)")
        except Exception as e:  # reported per call
            return e

    async def main():
        return await asyncio.gather(*(one(c) for c in calls))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()
