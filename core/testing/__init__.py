"""policyzoo.testing: what a plugin author needs to test components.

* a pytest plugin (``policyzoo.testing.plugin``, loaded automatically through ``pytest11``) with
  the fixtures ``pz_catalog``, ``pz_toy_batch``, ``pz_register``, ``pz_hook_recorder`` and
  ``pz_tiny_run``;
* :func:`toy_batch`, a deterministic batch with ragged masks;
* :func:`make_plugin` / :func:`temporary_catalog`, in-process plugin registration;
* :class:`HookRecorder`, a record of the hook calls of a run;
* the contract suite :mod:`policyzoo.testing.contract` every component must pass
  (``check_component(cls)``).

Imports are lazy so that ``import policyzoo.testing`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "toy_batch": "toys", "ToyBatch": "toys", "ragged_mask": "toys",
    "make_plugin": "helpers", "temporary_catalog": "helpers", "HookRecorder": "helpers",
    "HookCall": "helpers",
    "check_component": "contract", "ContractFailure": "contract", "contract_cases": "contract",
    "tiny_run": "training",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
