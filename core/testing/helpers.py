"""Helpers for plugin authors: in-process plugins, temporary registration, a hook-call recorder.

``make_plugin(MyClip, my_bundle)`` turns component classes and bundles into a plugin object (a
module with ``register_components``/``register_bundles``), as an installed distribution's entry
point would provide. ``temporary_catalog(...)`` builds a fresh catalog (entry-point autoload off)
with those plugins and makes it the process catalog until the ``with`` block ends, so
``assemble("my_bundle")`` and the CLI see it. ``HookRecorder`` records every hook call of a run.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

from policyzoo.catalog import Catalog, get_catalog, load_catalog
from policyzoo.contract.components import Bundle, Component
from policyzoo.contract.ground import hookimpl

_counter = itertools.count()


def make_plugin(*items: Any, name: str | None = None) -> types.ModuleType:
    """A plugin module registering ``items`` (Component subclasses, Bundles, or modules/objects
    that already implement the registration hooks are returned unchanged when alone).

    Raises ``TypeError`` for anything else."""
    comps = [x for x in items if isinstance(x, type) and issubclass(x, Component)]
    bundles = [x for x in items if isinstance(x, Bundle)]
    other = [x for x in items if x not in comps and x not in bundles]
    if other:
        raise TypeError(f"make_plugin takes Component subclasses and Bundles, got {other!r}")
    mod = types.ModuleType(name or f"policyzoo_test_plugin_{next(_counter)}")

    @hookimpl
    def register_components(register):
        for cls in comps:
            register(cls)

    @hookimpl
    def register_bundles(register):
        for b in bundles:
            register(b)

    mod.register_components = register_components
    mod.register_bundles = register_bundles
    return mod


def _as_plugin(obj: Any) -> Any:
    if isinstance(obj, (types.ModuleType,)) or hasattr(obj, "register_components") or hasattr(
            obj, "register_bundles"):
        return obj
    return make_plugin(obj)


@contextlib.contextmanager
def temporary_catalog(*plugins: Any, autoload: bool = False, allow: list[str] | None = None):
    """Build a fresh catalog (built-ins, zoo, ``plugins``; entry points only if ``autoload``) and
    install it as the process-wide catalog for the duration of the block. Yields the Catalog.

    Every loaded ``policyzoo`` module that imported ``get_catalog`` by name sees the temporary one;
    the original is restored on exit, even on error."""
    catalog = load_catalog(autoload=autoload, allow=allow, extra=[_as_plugin(p) for p in plugins])
    original = get_catalog

    def temporary() -> Catalog:
        return catalog

    temporary.cache_clear = lambda: None  # type: ignore[attr-defined]
    patched = []
    for mod_name, mod in list(sys.modules.items()):
        if (mod_name == "policyzoo" or mod_name.startswith("policyzoo.")) and \
                getattr(mod, "get_catalog", None) is original:
            setattr(mod, "get_catalog", temporary)
            patched.append(mod)
    try:
        yield catalog
    finally:
        for mod in patched:
            setattr(mod, "get_catalog", original)


@dataclass
class HookCall:
    """One recorded call: hook name, keyword arguments as passed, and the result."""

    hook: str
    kwargs: dict
    result: Any = None
    component: str | None = None


@dataclass
class HookRecorder:
    """Records the hook calls of a :class:`~policyzoo.assembly.Run`.

    ``attach(run)`` hooks into the run's plugin manager through pluggy's call monitoring: one record
    per call of a single slot and per component of a collect slot (the step calls each on its own,
    :mod:`policyzoo.step.dispatch`; its record holds that component's own result). ``names()``
    gives the hook names in call order; ``of(hook)`` the calls of one hook."""

    calls: list[HookCall] = field(default_factory=list)
    _undo: list = field(default_factory=list)

    def attach(self, run) -> "HookRecorder":
        pending: dict[int, list[HookCall]] = {}  # per thread: collect components may run concurrently

        def before(hook_name, hook_impls, kwargs):
            pending.setdefault(threading.get_ident(), []).append(HookCall(hook_name, dict(kwargs)))

        def after(outcome, hook_name, hook_impls, kwargs):
            call = pending[threading.get_ident()].pop()
            try:
                call.result = outcome.get_result()
                if not getattr(run.pm.hook, hook_name).spec.opts.get("firstresult"):  # a collect slot: [result]
                    call.result = call.result[0] if call.result else None
            except BaseException as e:  # record the failure, the caller still sees it
                call.result = e
            impls = [i.plugin for i in hook_impls]
            call.component = repr(impls[-1]) if len(impls) == 1 else None
            self.calls.append(call)

        self._undo.append(run.pm.add_hookcall_monitoring(before, after))  # every call: the step dispatches
        return self  # each collect component through pluggy on its own (policyzoo.step.dispatch)

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    def names(self) -> list[str]:
        return [c.hook for c in self.calls]

    def of(self, hook: str) -> list[HookCall]:
        return [c for c in self.calls if c.hook == hook]
