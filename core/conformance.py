"""Conformance: a component class against its slot's contract (base class, ``Params``, name, hook
method's arguments), checked by the catalog when a plugin registers it and by the contract suite."""

from __future__ import annotations

import inspect

from .contract import BASES, Spec
from .errors import did_you_mean


def component_problem(cls) -> tuple[str, str] | None:
    """(why, fix) when the Component subclass ``cls`` breaks the slot contract, else None: it must
    derive from its slot's base class in :mod:`policyzoo.contract.slots`, its ``Params`` must extend the
    base's ``Params``, it must have a ``name`` and a hook method taking only arguments the spec
    passes."""
    if cls.slot not in BASES:
        return (f"unknown slot {cls.slot!r}{did_you_mean(cls.slot, BASES)}",
                f"derive from one of policyzoo.contract: {', '.join(b.__name__ for b in BASES.values())}")
    base = BASES[cls.slot]
    if not issubclass(cls, base):
        return (f"the {cls.slot} component {cls.name!r} does not derive from policyzoo.contract.{base.__name__}, "
                f"which declares what the step reads from a {cls.slot} component",
                f"write `class {cls.__name__}(policyzoo.contract.{base.__name__})`")
    if not issubclass(cls.Params, base.Params):
        missing = sorted(set(base.Params.model_fields) - set(cls.Params.model_fields))
        return (f"its Params does not extend {base.__name__}.Params" + (f" (it lacks {', '.join(missing)})"
                                                                        if missing else ""),
                f"write `class Params({base.__name__}.Params):` (or `{cls.__name__}.Params` of a parent)")
    if cls.slot == "baseline" and cls.needs_values and cls.value_loss is base.value_loss:
        return ("needs_values is True but the class has no value_loss()",
                "implement value_loss(values, old_values, returns, response_mask, totals)")
    fn = getattr(cls, cls.slot, None)
    if not callable(fn) or getattr(fn, "__isabstractmethod__", False) or not cls.name:
        what = "no name" if not cls.name else f"no method {cls.slot}()"
        return f"has {what}", f"set `name = '...'` and implement `def {cls.slot}(self, ...)`"
    spec = [p for p in inspect.signature(getattr(Spec, cls.slot)).parameters if p != "self"]
    extra = [p for p in inspect.signature(fn).parameters if p != "self" and p not in spec]
    if extra:
        return (f"{cls.slot}() takes {', '.join(map(repr, extra))}, which the hook does not pass",
                f"a {cls.slot} hook may take any of: {', '.join(spec)}")
    return None
