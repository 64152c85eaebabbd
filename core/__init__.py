"""policyzoo: online RL post-training of LLMs from composable, exactly specified parts.

Public API::

    from policyzoo import hookimpl, use, Bundle, assemble
    from policyzoo.slots import Sample, Env, Reward, Filter, KL, Baseline, Ratio, Clip, Reduce
    from policyzoo import train, Trainer        # the Python twin of `policyzoo train` (policyzoo.api)

A component derives from its slot's base class (:mod:`policyzoo.slots`, also importable from here).
"""

from .api import Trainer, train
from .assembly import Run, assemble, resolve_algorithm
from .batch import Rollout, StepBatch
from .catalog import get_catalog, load_catalog
from .components import Bundle, Component, Params, Use, use
from .errors import ConfigError, DataError, PluginError, UserError
from .hookspecs import Advantages, Episode, Importance, Keep, Observation, StepTotals, Surrogate, hookimpl
from .slots import KL, Baseline, Clip, Env, Filter, Ratio, Reduce, Reward, Sample

__version__ = "0.1.0"
__all__ = [
    "KL", "Advantages", "Baseline", "Bundle", "Clip", "Component", "ConfigError", "DataError", "Env", "Episode",
    "Filter", "Importance", "Keep", "Observation", "Params", "PluginError", "Ratio", "Reduce", "Reward", "Rollout",
    "Run", "Sample", "StepBatch", "StepTotals", "Surrogate", "Trainer", "Use", "UserError", "assemble", "get_catalog",
    "hookimpl", "load_catalog", "resolve_algorithm", "train", "use",
]
