"""Built-in components, one module per slot. Each module lists its classes in ``COMPONENTS``."""

from policyzoo.contract import hookimpl
from policyzoo.plugins import (
    baseline,
    clip,
    env,
    filter,
    kl,
    kl_adaptive,
    mismatch,
    ratio,
    reduce,
    reward,
    sample,
    term,
)

MODULES = (sample, env, reward, filter, kl, kl_adaptive, baseline, ratio, mismatch, clip, term, reduce)


@hookimpl
def register_components(register):
    for module in MODULES:
        for cls in module.COMPONENTS:
            register(cls)
