"""policyzoo-tis: a worked plugin example for the rollout/trainer mismatch.

Adds the ``ratio`` component ``geo_tis`` (:class:`GeometricTIS`): truncated importance sampling
with the geometric mean of the token weights of a response. The built-in ``tis``, ``mis``,
``icepop`` and ``opsm`` (``policyzoo.plugins.ratio.mismatch``) cover the token and sequence levels; this
distribution shows how a variant of them is written against the public contract alone.
Sources: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training"; Liu, Li et al. 2025, "When Speed Kills Stability".
"""

from policyzoo.contract import hookimpl

from .geometric import GeometricTIS

__version__ = "0.2.0"
COMPONENTS = (GeometricTIS,)


@hookimpl
def register_components(register):
    for cls in COMPONENTS:
        register(cls)
