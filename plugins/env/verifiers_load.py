"""Loading a verifiers environment and scoring with its rubric (used by the ``verifiers`` env).

verifiers' environment API (the ``load_environment(**kwargs) -> vf.Environment`` modules of its
environment hub: ``SingleTurnEnv``, ``MultiTurnEnv``, ``ToolEnv``, ``StatefulToolEnv``, with a
dataset, a parser and a rubric) is ``verifiers.legacy`` in verifiers 0.3.x, addressable as
``verifiers.<name>``; verifiers 0.4.0 removed it, so the ``verifiers`` extra pins ``>=0.3.1,<0.4``.

Refused by name, before any model loads (each a ``UserError`` with the reason): environments that
need a service policyzoo does not run -- ``SandboxEnv`` / ``PythonEnv`` (a hosted sandbox),
``EnvGroup`` (several environments behind one), a ``JudgeRubric`` anywhere in the rubric (its own
OpenAI client for the judge model) -- and rubrics with group reward functions (plural arguments
such as ``completions``: they score a whole group at once, which the per-episode reward cannot).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import pkgutil
from typing import Any

from policyzoo.errors import UserError
from policyzoo.plugins.reward.aio import gather, is_async

EXTRA_FIX = "pip install 'policyzoo[verifiers]'  (verifiers >= 0.3.1, < 0.4)"
REFUSED = {"SandboxEnv": "runs tools in a hosted sandbox (Prime sandboxes), which policyzoo does not start",
           "PythonEnv": "runs Python in a hosted sandbox (Prime sandboxes), which policyzoo does not start",
           "EnvGroup": "routes rows to several environments; load each one as its own run",
           "JudgeRubric": "scores with its own OpenAI client (a judge model served elsewhere); use policyzoo's "
                          "llm_judge reward against a local server instead"}


class VerifiersError(UserError):
    """A verifiers environment that cannot load, is refused, or whose rubric fails."""


def import_verifiers(where: str):
    """``verifiers.legacy`` (the environment API); a :class:`VerifiersError` naming the extra."""
    try:
        import verifiers  # noqa: F401
    except ImportError:
        raise VerifiersError(where, "the verifiers package is not installed", EXTRA_FIX) from None
    try:
        return importlib.import_module("verifiers.legacy")
    except ImportError:
        import verifiers
        raise VerifiersError(where, f"verifiers {getattr(verifiers, '__version__', '?')} has no environment API "
                             "(verifiers.legacy: load_environment, Rubric, MultiTurnEnv; removed in 0.4.0)",
                             EXTRA_FIX) from None


def load(spec: str, args: dict[str, Any], where: str):
    """``module:function(**args)`` (``function`` defaults to ``load_environment``) -> the checked
    ``vf.Environment``. Raises :class:`VerifiersError` for a module that does not import (with the
    close names of installed modules), a missing function, arguments it does not take, a raising
    loader, a result that is not an Environment, and the refused features (module docstring)."""
    vf = import_verifiers(where)
    module_name, _, fn_name = spec.partition(":")
    fn_name = fn_name or "load_environment"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and e.name != module_name and not module_name.startswith(e.name + "."):
            raise VerifiersError(where, f"module {module_name!r} imports {e.name!r}, which is not installed",
                                 f"pip install the environment's dependencies ({e.name})") from None
        names = [m.name for m in pkgutil.iter_modules()]
        close = difflib.get_close_matches(module_name.replace("-", "_"), names, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise VerifiersError(where, f"no installed environment module {module_name!r}{hint}",
                             "install the environment (pip install -e ./environments/NAME, or vf-install NAME), "
                             "or put its folder on PYTHONPATH; algorithm.env.id is the module name") from None
    except Exception as e:
        raise VerifiersError(where, f"importing {module_name!r} raised {type(e).__name__}: {e}"[:400],
                             "fix the environment module") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise VerifiersError(where, f"module {module_name!r} has no function {fn_name!r}",
                             "a verifiers environment module defines load_environment(**kwargs); or name the "
                             "function as module:function")
    try:
        inspect.signature(fn).bind(**args)
    except TypeError as e:
        params = ", ".join(inspect.signature(fn).parameters)
        raise VerifiersError(f"{where}.args", f"{module_name}:{fn_name} does not take these arguments: {e}",
                             f"its parameters: {params or 'none'}") from None
    try:
        env = fn(**args)
    except KeyError as e:
        raise VerifiersError(where, f"{module_name}:{fn_name} raised KeyError {e} while building its data set "
                             "(verifiers reads a 'prompt' column, or makes one from 'question')",
                             "give the environment's dataset a 'prompt' (chat messages) or 'question' column") from None
    except Exception as e:
        raise VerifiersError(where, f"{module_name}:{fn_name}({', '.join(f'{k}={v!r}' for k, v in args.items())}) "
                             f"raised {type(e).__name__}: {e}"[:500], "fix the environment or its algorithm.env.args")
    if not isinstance(env, vf.Environment):
        raise VerifiersError(where, f"{module_name}:{fn_name} returned {type(env).__name__}, not a "
                             "verifiers Environment", "return vf.SingleTurnEnv(...), vf.ToolEnv(...) or another "
                             "vf.Environment")
    _refuse(vf, env, where)
    return env


def _refuse(vf, env, where: str) -> None:
    for cls in type(env).__mro__:
        if cls.__name__ in REFUSED:
            raise VerifiersError(where, f"{type(env).__name__} is a {cls.__name__}, which {REFUSED[cls.__name__]}",
                                 "use an environment that runs in this process (SingleTurnEnv, MultiTurnEnv, "
                                 "ToolEnv, StatefulToolEnv); see docs/environments.md")
    if not isinstance(env, vf.MultiTurnEnv):
        raise VerifiersError(where, f"{type(env).__name__} is not a MultiTurnEnv: its own rollout would need a model "
                             "client", "use SingleTurnEnv, MultiTurnEnv or ToolEnv")
    for rubric in flatten(vf, env.rubric):
        if type(rubric).__name__ in REFUSED or any(c.__name__ == "JudgeRubric" for c in type(rubric).__mro__):
            raise VerifiersError(where, f"the rubric holds a {type(rubric).__name__}, which {REFUSED['JudgeRubric']}",
                                 "drop the judge from the rubric")
        for func in rubric.funcs:
            if rubric._is_group_func(func):
                raise VerifiersError(where, f"reward function {_name(func)} scores a whole group (plural arguments "
                                     "or a list result)", "write it per rollout (prompt, completion, answer, state)")
    if env.requires_group_rollouts or env.provides_advantages:
        raise VerifiersError(where, f"{type(env).__name__} computes group rewards or its own advantages",
                             "use the algorithm's baseline component instead")


def flatten(vf, rubric) -> list:
    """The rubrics of ``rubric``: itself, or every member of a ``RubricGroup`` (recursively)."""
    if isinstance(rubric, vf.RubricGroup):
        return [r for sub in rubric.rubrics for r in flatten(vf, sub)]
    return [rubric]


def _name(func) -> str:
    return getattr(func, "__name__", repr(func))


def _kwargs(func, objects: dict) -> dict:
    params = inspect.signature(func).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(objects)
    return {k: v for k, v in objects.items() if k in params}


def score(vf, env, state, where: str) -> tuple[float, dict[str, float]]:
    """``(reward, scores)`` of one finished rollout ``state``: every function of the rubric called
    with the arguments it names (verifiers' score objects: prompt, completion, answer, state, info,
    parser, ...), the async ones awaited concurrently; ``reward = sum(weight x score)``; ``scores``
    by function name (weight-0 metrics included), as verifiers names them. A function that raises
    or returns a non-number or NaN is a :class:`VerifiersError` naming it (verifiers itself would log
    it and score 0.0; here it follows the reward error policy: the run stops)."""
    calls = []
    for rubric in flatten(vf, env.rubric):
        objects = rubric.score_objects(state)
        calls += [(func, w, _kwargs(func, objects)) for func, w in zip(rubric.funcs, rubric.weights)]
    values: dict[int, Any] = {}
    pending = [(i, f(**kw)) for i, (f, _, kw) in enumerate(calls) if is_async(f)]
    for i, (f, _, kw) in enumerate(calls):
        if not is_async(f):
            try:
                values[i] = f(**kw)
            except Exception as e:  # the environment's own code: any type
                values[i] = e
    for (i, _), got in zip(pending, gather([c for _, c in pending], None)):
        values[i] = got
    scores, total = {}, 0.0
    for i, (f, w, _) in enumerate(calls):
        v = values[i]
        if inspect.isawaitable(v):  # a plain function that returned an awaitable
            v = gather([v], None)[0]
        if isinstance(v, Exception):
            raise VerifiersError(f"{where}, reward function {_name(f)}", f"raised {type(v).__name__}: {v}"[:300],
                                 "fix the function, or return 0.0 where it cannot score")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise VerifiersError(f"{where}, reward function {_name(f)}", f"returned {v!r}, not a finite number",
                                 "return a float (verifiers' rubric functions return float)")
        scores[_name(f)] = float(v)
        total += float(w) * float(v)
    return total, scores
