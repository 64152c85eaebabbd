"""policyzoo: online RL post-training of LLMs from composable, exactly specified parts.

Public API::

    from policyzoo import hookimpl, Component, Params, use, Bundle, assemble
"""

from .assembly import Run, assemble, resolve_algorithm
from .batch import Rollout, StepBatch
from .catalog import get_catalog, load_catalog
from .components import Bundle, Component, Params, Use, use
from .errors import ConfigError, DataError, PluginError, UserError
from .hookspecs import Advantages, Keep, StepTotals, Surrogate, hookimpl

__version__ = "0.1.0"
__all__ = [
    "Advantages", "Bundle", "Component", "ConfigError", "DataError", "Keep", "Params", "PluginError",
    "Rollout", "Run", "StepBatch", "StepTotals", "Surrogate", "Use", "UserError", "assemble",
    "get_catalog", "hookimpl", "load_catalog", "resolve_algorithm", "use",
]
