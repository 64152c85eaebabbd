"""policyzoo: online RL post-training of LLMs from composable, exactly specified parts.

Public API::

    from policyzoo import hookimpl, use, Bundle, assemble
    from policyzoo.contract import Sample, Env, Reward, Filter, KL, Baseline, Ratio, Clip, Term, Reduce
    from policyzoo import train, Trainer        # the Python twin of `policyzoo train` (policyzoo.api)
    from policyzoo import from_trl              # a TRL GRPOConfig as a policyzoo config (policyzoo.trl_port)
    from policyzoo import compare               # algorithms x seeds, one table with intervals (policyzoo.compare)

A component derives from its slot's base class (:mod:`policyzoo.contract`, also importable from
here). Where things are: ``docs/engine.md`` ("Where things are").
"""

from .api import Trainer, train
from .assembly import Run, assemble
from .catalog import get_catalog, load_catalog
from .compare import compare  # after this the name is the function (a submodule import sets it only once)
from .contract import (
                       KL,
                       Advantages,
                       Baseline,
                       Bundle,
                       Clip,
                       Component,
                       Env,
                       Episode,
                       Filter,
                       Importance,
                       Keep,
                       Observation,
                       Params,
                       Ratio,
                       Reduce,
                       Reward,
                       Rollout,
                       Sample,
                       StepBatch,
                       StepTotals,
                       Surrogate,
                       Term,
                       Use,
                       hookimpl,
                       use,
)
from .errors import ConfigError, DataError, PluginError, UserError
from .resolve import resolve_algorithm
from .trl_port import from_trl

__version__ = "0.1.0"
__all__ = [
    "KL", "Advantages", "Baseline", "Bundle", "Clip", "Component", "ConfigError", "DataError", "Env", "Episode",
    "Filter", "Importance", "Keep", "Observation", "Params", "PluginError", "Ratio", "Reduce", "Reward", "Rollout",
    "Run", "Sample", "StepBatch", "StepTotals", "Surrogate", "Term", "Trainer", "Use", "UserError", "assemble",
    "compare", "from_trl", "get_catalog", "hookimpl", "load_catalog", "resolve_algorithm", "train", "use",
]
