"""The pytest plugin ``policyzoo.testing`` (registered through the ``pytest11`` entry point).

Installed with policyzoo, so a plugin distribution's tests can use these fixtures with no
conftest:

``pz_catalog``        a fresh catalog: built-ins and the zoo, entry-point autoload off.
``pz_toy_batch``      the deterministic ragged toy batch (:func:`policyzoo.testing.toy_batch`).
``pz_register``       ``pz_register(MyClip, my_bundle, plugin_module, ...) -> Catalog``: a fresh
                      catalog with these added, installed as the process catalog for the test.
``pz_hook_recorder``  ``rec = pz_hook_recorder(run)``: records every hook call of a run
                      (``.names()``, ``.of(hook)``).
``pz_tiny_run``       ``pz_tiny_run("grpo", steps=2) -> TinyRun`` (``.history``, ``.run``): trains the tabular
                      bandit policy (CPU, seconds) through the real training step.

Heavy imports (torch) happen inside the fixtures, so loading the plugin costs nothing for test
suites that do not use it.
"""

from __future__ import annotations

import contextlib

import pytest


@pytest.fixture
def pz_catalog():
    """A fresh :class:`policyzoo.catalog.Catalog` with built-ins and zoo only (no entry points)."""
    from policyzoo.catalog import load_catalog

    return load_catalog(autoload=False)


@pytest.fixture
def pz_toy_batch():
    """The deterministic toy batch (B=6 in 2 interleaved groups, T=5, lengths 5,3,1,4,0,2)."""
    from .toys import toy_batch

    return toy_batch()


@pytest.fixture
def pz_register():
    """``pz_register(*components_bundles_or_plugins, autoload=False) -> Catalog``.

    The returned catalog is the process catalog until the test ends (``assemble(...)``,
    ``resolve_algorithm(...)`` and the CLI use it). Calling it again replaces the previous one."""
    from .helpers import temporary_catalog

    stack = contextlib.ExitStack()

    def register(*items, autoload: bool = False, allow=None):
        stack.close()
        return stack.enter_context(temporary_catalog(*items, autoload=autoload, allow=allow))

    yield register
    stack.close()


@pytest.fixture
def pz_hook_recorder():
    """``pz_hook_recorder(run) -> HookRecorder`` attached to ``run``; ``pz_hook_recorder()`` an
    unattached one (pass it as ``pz_tiny_run(..., recorder=rec)``). Detached when the test ends."""
    from .helpers import HookRecorder

    recorders = []

    def attach(run=None):
        rec = HookRecorder() if run is None else HookRecorder().attach(run)
        recorders.append(rec)
        return rec

    yield attach
    for rec in recorders:
        rec.detach()


@pytest.fixture
def pz_tiny_run():
    """``pz_tiny_run(algorithm, steps=2, seed=0, plugins=(), **options) -> TinyRun``: trains the
    tabular bandit through :func:`policyzoo.step.train_step`; ``.history`` holds each step's
    metrics, ``.run.sources`` where each slot came from, ``.weights_changed`` whether it learned.
    ``algorithm`` is anything :func:`policyzoo.assemble` takes (a name, a hybrid mapping, a
    Bundle); see :func:`policyzoo.testing.training.tiny_run`."""
    from .training import tiny_run

    return tiny_run
