"""policyzoo-sapo: Soft Adaptive Policy Optimization as a policyzoo plugin.

Adds the ``clip`` component ``sapo`` (:class:`SoftGate`) and the bundle ``sapo`` (parent
``grpo``). Source: Gao et al. 2025, "Soft Adaptive Policy Optimization" (arXiv:2511.20347).
"""

from policyzoo.contract import hookimpl

from .bundle import BUNDLE
from .gate import SoftGate

__version__ = "0.1.0"
COMPONENTS = (SoftGate,)


@hookimpl
def register_components(register):
    for cls in COMPONENTS:
        register(cls)


@hookimpl
def register_bundles(register):
    register(BUNDLE)
