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
:class:`~policyzoo.errors.ConfigError`); a run's assembly validates them once into ``Params`` and hands
the component that typed object. ``check(run)`` is the place for cross-slot rules.

State (controllers: an adaptive KL coefficient, an adaptive entropy coefficient). A component may
keep state across steps. It then overrides three methods together: :meth:`Component.update`, the
one place its state changes, called by the step once per training step after the batch's
optimizer step(s) with the step's metrics and the :class:`~policyzoo.contract.Collective` (so
every data-parallel rank updates identically); :meth:`Component.state_dict` (JSON values: saved
in every checkpoint's ``state.json``) and :meth:`Component.load_state_dict` (restores it exactly
on resume). Values the step reads from a component are declared accessors on the slot's base
(e.g. ``KL.beta``), which a stateful component overrides to read its state. ``stateful`` is True
for a class that overrides ``update``; the contract suite then checks that the hook methods leave
the state alone and that the state survives a JSON round trip.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any, ClassVar

import pydantic

from policyzoo.errors import ConfigError, PluginError, did_you_mean

from .ground import LOCAL, PROJECT, SLOTS, Collective, hookimpl


class Params(pydantic.BaseModel):
    """Base of every component's parameters: unknown keys are rejected, values are validated."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class Component(ABC):
    """Base class of every component. Derive from the slot's base class in :mod:`policyzoo.contract.slots`
    (``Reward``, ``Clip``, ...), which sets ``slot``; subclasses set ``name`` and ``Params``."""

    slot: ClassVar[str] = ""
    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get(cls.slot) if cls.slot else None
        abstract = getattr(fn, "__isabstractmethod__", False)
        if callable(fn) and not abstract and not hasattr(fn, f"{PROJECT}_impl"):  # @hookimpl is optional
            hookimpl(fn)

    def __init__(self, _params: Params | None = None, **params: Any):
        """``Component(**params)`` validates ``params`` into ``self.params`` (a ``Params``); assembly passes the
        object it validated once instead (``_params=``, keyword only through a subclass's ``**params``). Raises
        :class:`ConfigError` for bad parameters, ``TypeError`` for ``_params`` of another class or with keys."""
        if _params is None:
            self.params = validate_params(type(self), params, where=f"{self.slot}: {self.name}")
        elif type(_params) is not type(self).Params or params:
            raise TypeError(f"{self.name}: _params must be a {type(self).Params.__qualname__} given alone, got "
                            f"{type(_params).__qualname__}" + (f" with {sorted(params)}" if params else ""))
        else:
            self.params = _params

    def check(self, run) -> None:
        """Cross-slot compatibility; raise :class:`ConfigError` with the fix. ``run`` is the
        :class:`~policyzoo.assembly.Run` with every chosen component."""

    def notes(self) -> list[str]:
        """Lines the dry run prints about this component (e.g. the memory a sandbox may hold); the
        base has none."""
        return []

    @property
    def stateful(self) -> bool:
        """True for a component that keeps state: its class overrides :meth:`update`."""
        return type(self).update is not Component.update

    def update(self, metrics: dict, collective: Collective = LOCAL) -> None:
        """The once-per-step update of a stateful component: the only method that may change its
        state. Called by the step after the batch's optimizer step(s) (not on a skipped step) with
        the step's ``metrics`` of this rank (``{name: float}``, e.g. ``kl_ref_row_mean`` and
        ``rows``) and ``collective``: reduce every rank-local number through it so that every rank
        computes the same new state. The base does nothing (a stateless component)."""

    def state_dict(self) -> dict:
        """The component's state as JSON values (floats, ints, strings, lists, dicts), saved in
        every checkpoint and given back to :meth:`load_state_dict` on resume; ``{}`` when
        stateless."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned, exactly. The base accepts only ``{}``."""
        if state:
            raise ConfigError(f"{self.slot}: {self.name}", f"a saved state {sorted(state)} was given to a "
                              "component that keeps none", "resume with the components the checkpoint was "
                              "written with")

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


class _Inherit:
    """The value of a slot a bundle does not state: it takes its parent's."""

    def __repr__(self) -> str:
        return "INHERIT"


#: a slot left to the parent bundle (the default of every slot field of :class:`Bundle`).
INHERIT: Any = _Inherit()
SINGLE_SLOTS = ("sample", "baseline", "ratio", "clip", "reduce")
OPTIONAL_SLOTS = ("kl", "env")
COLLECT_SLOTS = ("reward", "filter", "term")


@dataclass(frozen=True)
class Bundle:
    """An algorithm: one component per single slot, tuples for the collect slots.

    A bundle with a ``parent`` states only the slots that differ; the others are taken from the
    parent when the catalog loads (``inherited`` then names them). A single slot that names the
    parent's component updates the parent's parameters (``clip=use("ppo_clip", eps_high=0.28)``
    under grpo keeps grpo's ``eps_low``); any other value replaces the parent's. ``kl=None``
    removes the parent's KL term. A bundle without a parent states every single slot (``kl``,
    ``env``, ``reward`` and ``filter`` default to none). No zoo bundle sets ``env``: a run adds
    one (``algorithm: {base: grpo, env: {use: calculator}}``) and every bundle trains unchanged.

    ``reward`` holds reward *extras* the algorithm adds to the task's rewards (e.g. DAPO's
    overlong penalty); ``filter`` its filters; ``term`` its additive per-token loss terms (e.g.
    an entropy bonus).
    """

    name: str
    paper: str = ""
    sample: Use = INHERIT
    baseline: Use = INHERIT
    ratio: Use = INHERIT
    clip: Use = INHERIT
    reduce: Use = INHERIT
    kl: Use | None = INHERIT
    env: Use | None = INHERIT
    reward: tuple[Use, ...] = INHERIT
    filter: tuple[Use, ...] = INHERIT
    term: tuple[Use, ...] = INHERIT
    parent: str | None = None
    summary: str = ""
    inherited: frozenset = frozenset()

    def __post_init__(self):
        if self.parent is None:  # a root bundle: unstated optional slots are empty
            for key, empty in (("kl", None), ("env", None), ("reward", ()), ("filter", ()), ("term", ())):
                if getattr(self, key) is INHERIT:
                    object.__setattr__(self, key, empty)
        for key in COLLECT_SLOTS:
            value = getattr(self, key)
            if isinstance(value, Use):
                object.__setattr__(self, key, (value,))
            elif isinstance(value, list):
                object.__setattr__(self, key, tuple(value))

    @property
    def complete(self) -> bool:
        """True when every slot is stated (nothing left to inherit)."""
        return not any(getattr(self, s) is INHERIT for s in (*SINGLE_SLOTS, *OPTIONAL_SLOTS, *COLLECT_SLOTS))

    def inherit(self, parent: "Bundle | None", where: str = "") -> "Bundle":
        """This bundle with every unstated slot filled from ``parent`` (a complete bundle), or,
        without a parent, with ``kl``/``reward``/``filter``/``term`` defaulting to none. Raises
        :class:`PluginError` for a root bundle that leaves a single slot unstated."""
        changes: dict[str, Any] = {}
        inherited = set()
        for slot in (*SINGLE_SLOTS, *OPTIONAL_SLOTS, *COLLECT_SLOTS):
            mine = getattr(self, slot)
            if parent is None:
                if mine is INHERIT and slot in SINGLE_SLOTS:
                    raise PluginError(where or f"algorithm {self.name!r}", f"the bundle states no {slot} component "
                                      "and has no parent to take it from",
                                      f"set {slot}=use(...), or parent='grpo' (or another bundle) to inherit it")
                if mine is INHERIT:
                    changes[slot] = None if slot in OPTIONAL_SLOTS else ()
                continue
            theirs = getattr(parent, slot)
            if mine is INHERIT:
                changes[slot] = theirs
                inherited.add(slot)
            elif isinstance(mine, Use) and isinstance(theirs, Use) and mine.name == theirs.name:
                changes[slot] = theirs.with_params(**mine.params)
        return dc_replace(self, **changes, inherited=frozenset(inherited))

    def replace(self, **changes: Any) -> "Bundle":
        """A hybrid: ``GRPO.replace(clip=use("cispo"))``. ``kl=None`` removes the KL term."""
        fields = {f for f in self.__dataclass_fields__} - {"inherited"}
        for key in changes:
            if key not in fields:
                raise ConfigError(f"{self.name}.replace", f"unknown slot {key!r}"
                                  f"{did_you_mean(key, fields)}",
                                  f"slots are: {', '.join(SLOTS)}")
        for key in COLLECT_SLOTS:
            if key in changes and isinstance(changes[key], Use):
                changes[key] = (changes[key],)
            elif key in changes:
                changes[key] = tuple(changes[key])
        if "name" not in changes:
            swapped = [f"{k}={_names(v)}" for k, v in changes.items() if _names(v) != _names(getattr(self, k))]
            changes["name"] = "+".join([self.name, *swapped])
            changes.setdefault("parent", self.name)
        changes.setdefault("inherited", frozenset(s for s in SLOTS if s not in changes))
        return dc_replace(self, **changes)

    def slots(self) -> dict[str, Use | tuple[Use, ...] | None]:
        return {slot: getattr(self, slot) for slot in SLOTS}
