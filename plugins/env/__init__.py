"""``env`` components: environments for multi-turn, tool-using episodes (see :mod:`policyzoo.step.episodes`).

* :mod:`~policyzoo.plugins.env.calculator`: ``calculator`` and ``gsm8k_calculator`` (a safe
  arithmetic tool, no ``eval``).
* :mod:`~policyzoo.plugins.env.code`: ``python_sandbox`` (model-written Python run in a
  bubblewrap sandbox, :mod:`~policyzoo.plugins.env.sandbox`).
* :mod:`~policyzoo.plugins.env.verifiers_env`: ``verifiers`` (an environment of the verifiers
  package: its dataset, rubric, stop conditions and ``env_response``; docs/environments.md).
"""

from policyzoo.plugins.env import calculator, code, verifiers_env
from policyzoo.plugins.env.calculator import (
    CALC_EXAMPLE,
    CALC_SYSTEM,
    GSM8K_CALC_SYSTEM,
    MAX_DEPTH,
    MAX_EXPR_CHARS,
    CalcEpisode,
    CalcError,
    Calculator,
    GSM8KCalculator,
    calc,
    find_call,
)
from policyzoo.plugins.env.code import CodeEpisode, PythonSandbox, find_code
from policyzoo.plugins.env.sandbox import SandboxError, SandboxResult, run_python
from policyzoo.plugins.env.verifiers_env import Verifiers, VerifiersEpisode, parse_tool_calls
from policyzoo.plugins.env.verifiers_load import VerifiersError

COMPONENTS = calculator.COMPONENTS + code.COMPONENTS + verifiers_env.COMPONENTS
__all__ = ["CALC_EXAMPLE", "CALC_SYSTEM", "COMPONENTS", "GSM8K_CALC_SYSTEM", "MAX_DEPTH", "MAX_EXPR_CHARS",
           "CalcEpisode", "CalcError", "Calculator", "CodeEpisode", "GSM8KCalculator", "PythonSandbox", "SandboxError",
           "SandboxResult", "Verifiers", "VerifiersEpisode", "VerifiersError", "calc", "find_call", "find_code",
           "parse_tool_calls", "run_python"]
