"""Resolving an algorithm spec: a zoo name, a mapping of slot overrides or the resolved view that
``--dry-run`` prints -> a :class:`~policyzoo.contract.Bundle` (components named, parameters as the
spec states them); and back, the resolved view of an assembled run. The parameters are validated into
each component's typed ``Params`` once, when :mod:`policyzoo.assembly` builds the run.
"""

from __future__ import annotations

from typing import Any

from . import conventions
from .catalog import Catalog, get_catalog
from .contract import SLOTS, Bundle, Use
from .errors import ConfigError, did_you_mean

DEFAULT_ALGORITHM = "grpo"


def resolve_algorithm(spec: str | dict | Bundle, catalog: Catalog | None = None,
                      where: str = "algorithm") -> Bundle:
    """``"grpo"`` or ``{"base": "grpo", "clip": {"use": "cispo", "eps_high": 5.0}}`` -> Bundle.

    Per-slot override forms: ``{use: NAME, **params}`` replaces the component;
    ``{**params}`` (no ``use``) keeps the bundle's component and overrides parameters;
    ``null`` removes an optional slot (``kl``, ``env``); ``reward``/``filter`` take a list of those."""
    catalog = catalog or get_catalog()
    if isinstance(spec, Bundle):
        return catalog.resolve(spec)
    if isinstance(spec, str):
        return catalog.bundle(spec, where)
    if not isinstance(spec, dict):
        raise ConfigError(where, f"expected an algorithm name or a mapping with 'base', got {spec!r}",
                          "write `algorithm: grpo` or `algorithm: {base: grpo, clip: {use: cispo}}`")
    if "base" not in spec:  # slot overrides alone modify the default algorithm
        spec = {"base": DEFAULT_ALGORITHM, **spec}
    if "slots" in spec:
        spec = _from_resolved_view(spec, where)
    if "conventions" in spec:  # the peer's convention switches, filled where nothing else states them
        spec = dict(spec)
        name = conventions.check_name(spec.pop("conventions"), f"{where}.conventions")
        return conventions.apply(resolve_algorithm(spec, catalog, where), name, catalog)[0]
    base = catalog.bundle(spec["base"], f"{where}.base")
    changes: dict[str, Any] = {}
    for slot, value in spec.items():
        if slot == "base":
            continue
        if slot not in SLOTS:
            raise ConfigError(f"{where}.{slot}", f"unknown slot {slot!r}{did_you_mean(slot, SLOTS)}",
                              f"slots are: {', '.join(SLOTS)}")
        current = getattr(base, slot)
        if SLOTS[slot] == "collect":
            items = value if isinstance(value, list) else ([] if value is None else [value])
            changes[slot] = tuple(override(None, v, f"{where}.{slot}[{i}]") for i, v in enumerate(items))
        elif value is None:
            if SLOTS[slot] != "optional":
                raise ConfigError(f"{where}.{slot}", f"the {slot} slot cannot be empty",
                                  f"name a {slot} component with `use:`")
            changes[slot] = None
        else:
            changes[slot] = override(current, value, f"{where}.{slot}")
    hybrid = base.replace(**changes) if changes else base
    return hybrid


def _from_resolved_view(spec: dict, where: str) -> dict:
    """Read back the resolved form that ``--dry-run`` prints and ``resolved.yaml`` holds
    (``{base, name, paper, slots: {SLOT: {from, components}}, sources}``): every slot is set
    explicitly; ``name``, ``paper``, ``from`` and ``sources`` are information only."""
    extra = set(spec) - {"base", "name", "paper", "slots", "sources", "conventions"}
    if extra:
        raise ConfigError(f"{where}.{sorted(extra)[0]}", "unknown key in a resolved algorithm",
                          "a resolved algorithm has base, name, paper, slots and sources only")
    out: dict[str, Any] = {"base": spec.get("base")}
    if isinstance(spec.get("conventions"), dict):  # what --dry-run printed: the values are in the slots already
        out["conventions"] = spec["conventions"]["name"]
    for slot, entry in (spec.get("slots") or {}).items():
        comps = entry.get("components", []) if isinstance(entry, dict) else entry
        out[slot] = comps if SLOTS.get(slot) == "collect" else (comps[0] if comps else None)
    return out


def override(current: Use | None, value: Any, where: str) -> Use:
    """One slot's override: ``"NAME"`` or ``{use: NAME, **params}`` names a component (the current one's
    parameters are kept when it is the same name), ``{**params}`` updates ``current``'s. The parameters stay
    as written (a mapping) until assembly validates them. Raises :class:`ConfigError` at ``where`` for
    another value or parameters with no component named."""
    if isinstance(value, str):
        return Use(value, {})
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


def resolved_view(config, run) -> dict:
    """The fully resolved config: every slot's component with all parameters, whether it is the
    base algorithm's choice or an override, and which distribution provides it."""
    view = config.model_dump()
    algo = config.algorithm
    base_name = algo if isinstance(algo, str) else algo.get("base", DEFAULT_ALGORITHM)
    base = get_catalog().bundle(base_name)
    view["algorithm"] = {"name": run.bundle.name, "base": base_name, "paper": run.bundle.paper, "slots": {}}
    for slot in SLOTS:
        comps = getattr(run, slot)
        comps = comps if isinstance(comps, list) else ([] if comps is None else [comps])
        if slot == "reward":  # the task's rewards go to `rewards:`, the algorithm keeps its extras
            n_task = len(comps) - len(run.bundle.reward)
            view["rewards"] = [{"use": c.name, **c.params.model_dump()} for c in comps[:n_task]]
            comps = comps[n_task:]
        origin = f"{base_name} default" if getattr(run.bundle, slot) == getattr(base, slot) else "override"
        view["algorithm"]["slots"][slot] = {"from": origin, "components": [
            {"use": c.name, **c.params.model_dump()} for c in comps]}
    view["algorithm"]["sources"] = run.sources
    name = algo.get("conventions") if isinstance(algo, dict) else None
    if name is not None:  # which keys came from the preset (explicit settings won where they are absent)
        plain = resolve_algorithm({k: v for k, v in algo.items() if k != "conventions"})
        _, applied = conventions.apply(plain, name, get_catalog())
        train = {f"train.{k}": v for k, v in conventions.train_defaults(name).items() if getattr(config.train, k) == v}
        view["algorithm"]["conventions"] = {"name": name, "set": {**applied, **train}}
    return view
