"""The zoo: one short declarative file per algorithm bundle, each exporting ``BUNDLE``."""

from policyzoo.contract import hookimpl
from policyzoo.zoo import (
    cispo,
    clip_cov,
    dapo,
    distill,
    dppo,
    dr_grpo,
    gdpo,
    gmpo,
    gpg,
    grpo,
    gspo,
    kl_cov,
    luspo,
    opo,
    ppo,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
)

MODULES = (ppo, grpo, rloo, reinforce_pp, dapo, dr_grpo, gspo, cispo, luspo, gmpo, dppo, clip_cov, kl_cov,
           reinforce_pp_baseline, gpg, gdpo, remax, opo, distill)


@hookimpl
def register_bundles(register):
    for module in MODULES:
        register(module.BUNDLE)
