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

import json
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


def override(current: Use | None, value: Any, where: str) -> Use:
    """One slot's new value, as a hybrid states it: ``use(NAME, **params)``, ``"NAME"`` or ``{use: NAME, **params}``
    names a component (``current``'s parameters are kept, the given ones merged in, when it is the same name, as a
    bundle's ``parent`` does);
    ``{**params}`` keeps ``current``'s component and merges the parameters (the override
    ``algorithm.clip.eps_high=0.28``). The parameters stay as written until assembly validates them. Raises
    :class:`ConfigError` at ``where`` for another value, or for parameters with no component to take them."""
    if isinstance(value, Use):
        return current.with_params(**value.params) if current is not None and value.name == current.name else value
    if isinstance(value, str):
        return current if current is not None and value == current.name else Use(value, {})
    if not isinstance(value, dict):
        raise ConfigError(where, f"expected a mapping like {{use: NAME, param: value}}, got {value!r}",
                          "see `policyzoo explain NAME` for parameters")
    value = dict(value)
    name = value.pop("use", None)
    if name is None:
        if current is None:
            raise ConfigError(where, "no component named", "add `use: NAME`")
        return current.with_params(**value)
    if current is not None and name == current.name:
        return current.with_params(**value)
    return Use(str(name), value)


def _text(value: Any) -> str:
    """A parameter value as a hybrid name writes it (and an override reads it back as YAML): text as it is,
    anything else as JSON (``0.28``, ``true``, ``null``)."""
    return value if isinstance(value, str) else json.dumps(value)


def slot_changes(slot: str, old: Any, new: Any) -> list[str]:
    """The parts of a hybrid's name for one slot changed from ``old`` to ``new``, in the form ``policyzoo compare
    --algos`` and ``--algo`` read back (:func:`policyzoo.resolve.parse_entry`): ``kl=null`` for a removed optional
    slot or an emptied collect slot, ``clip=cispo`` for another component, then ``clip.eps_high=0.28`` for each
    parameter it sets (another component) or changes (the same component). Collect slots name their components
    only (``filter=drop_truncated,nonconstant_groups``)."""
    if new == old:
        return []
    if new is None or new == ():
        return [f"{slot}=null"]
    if isinstance(new, tuple):
        return [f"{slot}={','.join(u.name for u in new)}"]
    if isinstance(old, Use) and old.name == new.name:
        missing = object()
        changed = {k: v for k, v in new.params.items() if old.params.get(k, missing) != v}
    else:
        changed = dict(new.params)
    head = [] if isinstance(old, Use) and old.name == new.name else [f"{slot}={new.name}"]
    return head + [f"{slot}.{k}={_text(v)}" for k, v in sorted(changed.items())]


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
        """A hybrid: ``GRPO.replace(clip=use("cispo"))``; ``clip={"eps_high": 0.28}`` keeps the clip component and
        merges the parameter (as the override ``algorithm.clip.eps_high=0.28`` does; :func:`override` reads each
        value); ``kl=None`` removes the KL term. The hybrid is named as ``policyzoo compare --algos`` and ``--algo``
        write it (``grpo+clip.eps_high=0.28``, ``grpo+kl=null``: :func:`slot_changes`), unless ``name`` is given.
        Raises :class:`ConfigError` for an unknown slot or a value :func:`override` refuses."""
        fields = {f for f in self.__dataclass_fields__} - {"inherited"}
        for key in changes:
            if key not in fields:
                raise ConfigError(f"{self.name}.replace", f"unknown slot {key!r}"
                                  f"{did_you_mean(key, fields)}",
                                  f"slots are: {', '.join(SLOTS)}")
        for key in SINGLE_SLOTS + OPTIONAL_SLOTS:
            if key in changes and changes[key] is not None:
                current = getattr(self, key)
                changes[key] = override(current if isinstance(current, Use) else None, changes[key],
                                        f"{self.name}.replace({key}=...)")
        for key in COLLECT_SLOTS:
            if key in changes:
                items = changes[key] if isinstance(changes[key], (list, tuple)) else (
                    () if changes[key] is None else (changes[key],))
                changes[key] = tuple(override(None, v, f"{self.name}.replace({key}=...)") for v in items)
        if "name" not in changes:
            parts = [p for k, v in changes.items() if k in SLOTS for p in slot_changes(k, getattr(self, k), v)]
            changes["name"] = "+".join([self.name, *parts])
            changes.setdefault("parent", self.name)
            if parts:  # the parent's one-line summary would describe slots the hybrid changed
                changes.setdefault("summary", f"{self.name} with {', '.join(parts)}"
                                   + (f"; {self.name} itself: {self.summary}" if self.summary else ""))
        changes.setdefault("inherited", frozenset(s for s in SLOTS if s not in changes))
        return dc_replace(self, **changes)

    def slots(self) -> dict[str, Use | tuple[Use, ...] | None]:
        return {slot: getattr(self, slot) for slot in SLOTS}
