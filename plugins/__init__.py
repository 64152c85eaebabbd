"""Built-in components, one package per slot (``plugins/<slot>/``; a variant family in a module of its
own inside, e.g. ``kl/adaptive.py``, ``ratio/mismatch.py``). Each module lists its classes in ``COMPONENTS``."""

from policyzoo.contract import hookimpl
from policyzoo.plugins import (
    baseline,
    clip,
    env,
    filter,
    kl,
    ratio,
    reduce,
    reward,
    sample,
    term,
)
from policyzoo.plugins.kl import adaptive as kl_adaptive
from policyzoo.plugins.ratio import mismatch

MODULES = (sample, env, reward, filter, kl, kl_adaptive, baseline, ratio, mismatch, clip, term, reduce)


@hookimpl
def register_components(register):
    for module in MODULES:
        for cls in module.COMPONENTS:
            register(cls)
