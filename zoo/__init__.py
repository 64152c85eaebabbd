"""The zoo: one short declarative file per algorithm bundle, each exporting ``BUNDLE``."""

from policyzoo.hookspecs import hookimpl

from . import cispo, clip_cov, dapo, dppo, dr_grpo, gmpo, grpo, gspo, kl_cov, luspo, ppo, reinforce_pp, rloo

MODULES = (ppo, grpo, rloo, reinforce_pp, dapo, dr_grpo, gspo, cispo, luspo, gmpo, dppo, clip_cov, kl_cov)


@hookimpl
def register_bundles(register):
    for module in MODULES:
        register(module.BUNDLE)
