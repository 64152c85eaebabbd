"""The step calls its hooks: step -> pluggy -> the run's component -> the boundary check -> step.

``run`` is the assembled run (:class:`policyzoo.assembly.Run`): its plugin manager ``pm`` holds
exactly the chosen components, one per single slot (assembly decides which, never hook order), and
its slot attributes name them. Both functions go through pluggy, so hook-call monitoring and
``POLICYZOO_TRACE=1`` see every call, the collect slots' per-component calls included.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from policyzoo.errors import ComponentError, UserError

from . import boundary


def call(run, slot: str, rows: int, width: int | None = None, **kwargs) -> Any:
    """Call the single slot ``slot``'s hook with ``kwargs``, then check its result for ``rows``
    rows (B) and ``width`` response columns (T) (:func:`policyzoo.step.boundary.check`, which raises
    :class:`~policyzoo.errors.ComponentError` naming the component)."""
    return boundary.check(slot, getattr(run, slot), getattr(run.pm.hook, slot)(**kwargs), rows, width)


def call_each(run, slot: str, rows: int | None = None, width: int | None = None, **kwargs) -> list[tuple[Any, Any]]:
    """Call every component of the collect slot ``slot``, each through pluggy on its own; returns
    ``[(component, result)]`` in config order, so results can be weighted and reported per
    component. With ``rows`` each result is checked at the boundary (rewards come back as ``[B]``
    float32). Components whose ``concurrent`` attribute is True (async reward functions, remote
    rewards: I/O-bound) run at the same time, each in its own thread, while the others run one
    after the other in this thread; the first error in config order is raised, a component's own
    exception as a :class:`~policyzoo.errors.ComponentError` naming it (its cause chained)."""
    comps = list(getattr(run, slot))
    plugins = run.pm.get_plugins()

    def one(comp):
        if run.trace:
            sys.stderr.write(f"[policyzoo trace] {slot} -> {comp!r}\n")
        hook = run.pm.subset_hook_caller(slot, remove_plugins=[p for p in plugins if p is not comp])
        try:
            return hook(**kwargs)
        except UserError:
            raise
        except Exception as e:  # name the component that failed, keep the cause chained
            raise ComponentError(f"{slot} component {comp!r}", f"raised {type(e).__name__}: {e}",
                                 f"fix the component or remove it from `{slot}`; rerun with "
                                 "POLICYZOO_TRACE=1 to see the hook calls") from e

    def result(comp, value):
        value = value[0] if value else None  # a collect hook returns a list: one impl's result (pluggy drops a None)
        return (comp, boundary.check(slot, comp, value, rows, width) if rows is not None else value)

    together = [c for c in comps if getattr(c, "concurrent", False) is True]
    with ThreadPoolExecutor(max(1, len(together))) as pool:
        futures = {id(c): pool.submit(one, c) for c in together} if len(together) > 1 else {}
        inline = {id(c): one(c) for c in comps if id(c) not in futures}
        return [result(c, futures[id(c)].result() if id(c) in futures else inline[id(c)]) for c in comps]
