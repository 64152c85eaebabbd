"""The zoo: one short declarative file per algorithm bundle, each exporting ``BUNDLE``."""

from policyzoo.hookspecs import hookimpl

from . import cispo, dapo, dr_grpo, grpo, gspo, ppo, reinforce_pp, rloo

MODULES = (ppo, grpo, rloo, reinforce_pp, dapo, dr_grpo, gspo, cispo)


@hookimpl
def register_bundles(register):
    for module in MODULES:
        register(module.BUNDLE)
