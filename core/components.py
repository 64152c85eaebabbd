"""Components (one filled slot) and bundles (an algorithm: a component per slot).

A component is a class with a ``slot``, a ``name``, a pydantic ``Params`` model and one method
named after its slot, decorated with ``@hookimpl``::

    class Sqrt(Component):
        '''sqrt-shaped reward. Source: none, an example.'''
        slot, name = "reward", "sqrt_len"
        class Params(Component.Params):
            weight: float = 1.0

        @hookimpl
        def reward(self, rollout):
            return rollout.response_mask.sum(-1).float().sqrt()

``Component(**params)`` validates the parameters (unknown keys and out-of-range values raise
:class:`~policyzoo.errors.ConfigError`). ``check(run)`` is the place for cross-slot rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace as dc_replace
from typing import Any, ClassVar

import pydantic

from .errors import ConfigError, did_you_mean


class Params(pydantic.BaseModel):
    """Base of every component's parameters: unknown keys are rejected, values are validated."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class Component:
    """Base class of every component. Subclasses set ``slot``, ``name``, ``Params``."""

    slot: ClassVar[str] = ""
    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params

    def __init__(self, **params: Any):
        self.params = validate_params(type(self), params, where=f"{self.slot}: {self.name}")

    def check(self, run) -> None:
        """Cross-slot compatibility; raise :class:`ConfigError` with the fix. ``run`` is the
        :class:`~policyzoo.assembly.Run` with every chosen component."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.model_dump().items())
        return f"{self.name}({args})"


def validate_params(cls: type[Component], params: dict, where: str) -> Params:
    try:
        return cls.Params(**params)
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err["loc"]) or "(parameters)"
        fields = list(cls.Params.model_fields)
        if err["type"] == "extra_forbidden":
            why = f"unknown parameter {key!r}{did_you_mean(key, fields)}"
            fix = f"'{cls.name}' takes: {', '.join(fields) or 'no parameters'}"
        elif err["type"] == "missing":
            why = f"the required parameter {key!r} is missing"
            info = cls.Params.model_fields.get(key)
            fix = f"set {key}: {info.description}" if info is not None and info.description else f"set {key}"
        else:
            why = f"{key} = {err.get('input')!r}: {err['msg']}"
            info = cls.Params.model_fields.get(key)
            fix = f"{key}: {info.description}" if info is not None and info.description else (
                f"see `policyzoo explain` or the docstring of {cls.__module__}.{cls.__qualname__}")
        raise ConfigError(f"{where}.{key}", why, fix) from None


@dataclass(frozen=True)
class Use:
    """A reference to a component by name with parameters: ``use("ppo_clip", eps_high=0.28)``."""

    name: str
    params: dict = field(default_factory=dict)

    def with_params(self, **params) -> "Use":
        return Use(self.name, {**self.params, **params})

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"use({self.name!r}{args})"


def use(name: str, **params: Any) -> Use:
    """Name a component for a bundle or hybrid: ``use("cispo", eps_high=5.0)``."""
    return Use(name, params)


def _names(value) -> str:
    """Component names of a slot value: ``"cispo"``, ``"a,b"`` for a list, ``"none"`` if empty."""
    if isinstance(value, Use):
        return value.name
    if isinstance(value, tuple):
        return ",".join(u.name for u in value) or "none"
    return "none"


@dataclass(frozen=True)
class Bundle:
    """An algorithm: one component per single slot, lists for the collect slots.

    ``reward`` holds reward *extras* the algorithm adds to the task's rewards (e.g. DAPO's
    overlong penalty); ``filter`` its filters. ``settings`` holds step defaults the algorithm
    needs (e.g. ``max_sample_rounds`` for dynamic sampling).
    """

    name: str
    paper: str
    sample: Use
    baseline: Use
    ratio: Use
    clip: Use
    reduce: Use
    kl: Use | None = None
    reward: tuple[Use, ...] = ()
    filter: tuple[Use, ...] = ()
    parent: str | None = None
    summary: str = ""
    settings: dict = field(default_factory=dict)

    def replace(self, **changes: Any) -> "Bundle":
        """A hybrid: ``GRPO.replace(clip=use("cispo"))``. ``kl=None`` removes the KL term."""
        for key in changes:
            if key not in {f for f in self.__dataclass_fields__}:
                raise ConfigError(f"{self.name}.replace", f"unknown slot {key!r}"
                                  f"{did_you_mean(key, self.__dataclass_fields__)}",
                                  "slots are: sample, reward, filter, kl, baseline, ratio, clip, reduce")
        for key in ("reward", "filter"):
            if key in changes and isinstance(changes[key], Use):
                changes[key] = (changes[key],)
            elif key in changes:
                changes[key] = tuple(changes[key])
        if "name" not in changes:
            swapped = [f"{k}={_names(v)}" for k, v in changes.items() if _names(v) != _names(getattr(self, k))]
            changes["name"] = "+".join([self.name, *swapped])
            changes.setdefault("parent", self.name)
        return dc_replace(self, **changes)

    def slots(self) -> dict[str, Use | tuple[Use, ...] | None]:
        from .hookspecs import SLOTS

        return {slot: getattr(self, slot) for slot in SLOTS}
