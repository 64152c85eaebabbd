"""policyzoo.contract: everything a component author uses, and nothing else of policyzoo.

Built-in components (``policyzoo.plugins``), the zoo and third-party plugins import from here
only (plus :mod:`policyzoo.errors`, and :mod:`policyzoo.data` for the answer extractors)::

    from policyzoo.contract import Clip, Surrogate, hookimpl

Inside, imports run one way (a test walks them): the ground (:mod:`.ground`: markers, the slot
table, result types, :class:`Collective`; :mod:`.stats`: statistics over ranks) <- the batch
types (:mod:`.batch`), the :class:`Policy` protocol (:mod:`.policy`) and components and bundles
(:mod:`.components`) <- the slot bases (:mod:`.slots`; :mod:`.baselines`, the helpers a baseline is
built from: scores, group statistics, :class:`GroupBaseline`) <- the hook specifications
(:mod:`.hookspecs`, the roof). :mod:`.runstate` is the run's progress handed to reward functions.
This package imports nothing of policyzoo but :mod:`policyzoo.errors`.
"""

from . import runstate, untrusted
from .baselines import GroupBaseline, broadcast_rows, group_stats, reward_tokens, token_returns, valid_scores
from .batch import Rollout, StepBatch, token_budget_bounds
from .components import INHERIT, Bundle, Component, Params, Use, use, validate_params
from .ground import (
                     LOCAL,
                     PROJECT,
                     SLOTS,
                     Advantages,
                     Collective,
                     Episode,
                     Importance,
                     Keep,
                     Observation,
                     StepTotals,
                     Surrogate,
                     hookimpl,
                     hookspec,
)
from .hookspecs import Spec
from .policy_protocol import SAMPLING_OPTIONS, Generated, Policy, TokenPolicy
from .slots import BASES, KL, Baseline, Clip, Env, Filter, Ratio, Reduce, Reward, Sample, Term
from .stats import moments, rank_mean, std_of, whiten

__all__ = [
    "BASES", "INHERIT", "KL", "LOCAL", "PROJECT", "SAMPLING_OPTIONS", "SLOTS", "Advantages", "Baseline", "Bundle",
    "Clip", "Collective", "Component", "Env", "Episode", "Filter", "Generated", "GroupBaseline", "Importance", "Keep",
    "Observation", "Params", "Policy", "Ratio", "Reduce", "Reward", "Rollout", "Sample", "Spec", "StepBatch",
    "StepTotals", "Surrogate", "Term", "TokenPolicy", "Use", "broadcast_rows", "group_stats", "hookimpl", "hookspec",
    "moments", "rank_mean", "reward_tokens", "runstate", "std_of", "token_budget_bounds", "token_returns", "untrusted",
    "use", "valid_scores", "validate_params", "whiten",
]
