"""Deprecated path: ``policyzoo.components`` moved into :mod:`policyzoo.contract`. It keeps working for one
release, with a DeprecationWarning; import from ``policyzoo.contract`` instead."""

import warnings

warnings.warn("policyzoo.components is deprecated: import from policyzoo.contract (this path goes in the next release)",
              DeprecationWarning, stacklevel=2)

from policyzoo.contract.components import *  # noqa: E402,F401,F403
