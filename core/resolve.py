"""Resolving an algorithm spec: a zoo name, a mapping of slot overrides or the resolved view that
``--dry-run`` prints -> a :class:`~policyzoo.contract.Bundle` (components named, parameters as the
spec states them); and back, the resolved view of an assembled run. The parameters are validated into
each component's typed ``Params`` once, when :mod:`policyzoo.assembly` builds the run.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import Any

import yaml

from . import conventions
from .catalog import Catalog, get_catalog
from .contract import SLOTS, Bundle
from .contract.components import Use, override
from .errors import ConfigError, did_you_mean

DEFAULT_ALGORITHM = "grpo"
#: the keys of an algorithm mapping that are not slots: the algorithm it modifies, the peer's conventions
NOT_SLOTS = ("base", "conventions")


def resolve_algorithm(spec: str | dict | Bundle, catalog: Catalog | None = None,
                      where: str = "algorithm") -> Bundle:
    """``"grpo"``, an entry ``"grpo+clip=cispo"`` (:func:`parse_entry`) or
    ``{"base": "grpo", "clip": {"use": "cispo", "eps_high": 5.0}}`` -> Bundle.

    Per-slot override forms: ``{use: NAME, **params}`` replaces the component;
    ``{**params}`` (no ``use``) keeps the bundle's component and overrides parameters;
    ``null`` (or ``none``, :func:`removes`) removes an optional slot (``kl``, ``env``) or empties a collect slot;
    ``reward``/``filter``/``term`` take a list of those. Raises ConfigError naming the key for an unknown
    algorithm, slot or component, or a single slot left empty."""
    catalog = catalog or get_catalog()
    if isinstance(spec, Bundle):
        return catalog.resolve(spec)
    if isinstance(spec, str) and "+" in spec:  # an entry: grpo+clip=cispo
        return resolve_algorithm(expand_entry(spec), catalog, where)
    if isinstance(spec, str):
        return catalog.bundle(spec, where)
    if not isinstance(spec, dict):
        raise ConfigError(where, f"expected an algorithm name or a mapping with 'base', got {spec!r}",
                          "write `algorithm: grpo` or `algorithm: {base: grpo, clip: {use: cispo}}`")
    if "+" in entry_name(spec):  # {base: grpo+clip=cispo, ...}
        spec = expand_entry(spec)
    if "base" not in spec:  # slot overrides alone modify the default algorithm
        spec = {"base": DEFAULT_ALGORITHM, **spec}
    named = None
    if "slots" in spec:  # every parameter stated: the name the view holds, not one listing them all
        named = spec.get("name") if isinstance(spec.get("name"), str) else None
        spec = _from_resolved_view(spec, where)
    if "conventions" in spec:  # the peer's convention switches, filled where nothing else states them
        spec = dict(spec)
        name = conventions.check_name(spec.pop("conventions"), f"{where}.conventions")
        bundle = conventions.apply(resolve_algorithm(spec, catalog, where), name, catalog)[0]
        return dc_replace(bundle, name=named) if named and named != bundle.name else bundle
    base = catalog.bundle(spec["base"], f"{where}.base")
    changes = _changes(base, spec, catalog, where)
    hybrid = base.replace(**changes) if changes else base
    if changes and not named:  # named without the parameters that change nothing (the components keep them)
        plain = base.replace(**{slot: _without_defaults(v, getattr(base, slot), catalog.components.get(slot, {}))
                                if isinstance(v, Use) else v for slot, v in changes.items()})
        hybrid = dc_replace(hybrid, name=plain.name, summary=plain.summary)
    if named and changes:
        hybrid = dc_replace(hybrid, name=named, parent=base.name)
    return hybrid


def _changes(base: Bundle, spec: dict, catalog: Catalog, where: str) -> dict[str, Any]:
    """``{slot: new value}`` of ``spec``'s slot keys over ``base`` (the forms of :func:`resolve_algorithm`)."""
    changes: dict[str, Any] = {}
    for slot, value in spec.items():
        if slot == "base":
            continue
        if slot not in SLOTS:  # the keys beside the slots count for the guess: `bse` is a typo of base
            guess = did_you_mean(slot, [*SLOTS, *NOT_SLOTS])
            raise ConfigError(f"{where}.{slot}", f"unknown key {slot!r}: not a slot{guess}",
                              f"slots are: {', '.join(SLOTS)}; beside them: {', '.join(NOT_SLOTS)}")
        if SLOTS[slot] != "single" and removes(slot, value, catalog):
            changes[slot] = None if SLOTS[slot] == "optional" else ()
        elif SLOTS[slot] == "collect":
            items = value if isinstance(value, list) else [value]
            changes[slot] = tuple(override(None, v, f"{where}.{slot}[{i}]") for i, v in enumerate(items))
        elif value is None:
            real = " (`none` is the component that leaves it out)" if "none" in catalog.components[slot] else ""
            raise ConfigError(f"{where}.{slot}", f"the {slot} slot cannot be empty",
                              f"name a {slot} component with `use:`{real}")
        else:
            changes[slot] = override(getattr(base, slot), value, f"{where}.{slot}")
    return changes


def _without_defaults(new: Use, old: Use | None, classes: dict) -> Use:
    """``new`` without the parameters that change nothing: ``old`` (the base's value of the slot) is the same
    component, states no value for them, and they are set to the component's own default. A TRL config's
    ``temperature: 1.0`` on grpo's sampler trains as without it, so the run's name leaves it out (for the name
    only: the resolved components keep every parameter as written). Another component's parameters are named as
    written (``clip=cispo+clip.eps_high=5.0``), as :meth:`Bundle.replace` names them."""
    if old is None or old.name != new.name:  # another component: its parameters are named as written
        return new
    cls = classes.get(new.name, (None,))[0]  # {name: (class, source)}; an unknown name is refused at assembly
    fields = getattr(getattr(cls, "Params", None), "model_fields", {})
    kept = {k: v for k, v in new.params.items()
            if k in old.params or k not in fields or fields[k].is_required() or fields[k].default != v}
    return new if kept == new.params else Use(new.name, kept)


def removes(slot: str, value: Any, catalog: Catalog) -> bool:
    """True when ``value`` empties the optional or collect ``slot``: ``null``, ``{use: null}``, or the name ``none``
    (``kl: none``, ``grpo+kl=none``: the word older run names printed) unless a component of that slot is named
    ``none``. A single slot is never emptied (``clip: none`` is the component named ``none``)."""
    if SLOTS[slot] == "single":
        return False
    name = value.get("use", "") if isinstance(value, dict) and set(value) == {"use"} else value
    return name is None or (name == "none" and "none" not in catalog.components.get(slot, {}))


def parse_entry(entry: str, where: str | None = None) -> tuple[str, list[str]]:
    """An entry, the one-line name of a hybrid that ``compare --algos``, ``--algo``, ``explain``, a config's
    ``algorithm:`` and :meth:`Bundle.replace`'s names share: ``"grpo+clip=cispo"`` ->
    ``("grpo", ["algorithm.clip.use=cispo"])``. ``SLOT=NAME`` names the slot's component (``SLOT=A,B`` the
    components of a collect slot), ``SLOT=null`` (or ``none``, :func:`removes`) empties an optional or collect
    slot, ``SLOT.PARAM=VALUE`` and ``KEY=VALUE`` set a key under ``algorithm`` (VALUE read as YAML). Raises
    ConfigError at ``where`` (default ``--algos ENTRY``) for a malformed entry; the names are checked against the
    catalog when the algorithm resolves."""
    base, *changes = [p.strip() for p in entry.strip().split("+")]
    where = where or f"--algos {entry}"
    if not base or "=" in base or "/" in entry:
        raise ConfigError(where, "an entry starts with a zoo name and holds no '/'",
                          "e.g. grpo, dr_grpo or grpo+clip=cispo (`policyzoo zoo` lists the names)")
    out = []
    for change in changes:
        key, eq, value = change.partition("=")
        if not eq or not key:
            raise ConfigError(where, f"{change!r} is not SLOT=COMPONENT, SLOT.PARAM=VALUE or KEY=VALUE",
                              "e.g. grpo+clip=cispo or grpo+clip.eps_high=0.28")
        if key in SLOTS and SLOTS[key] == "collect" and "," in value:
            out.append(f"algorithm.{key}=[{', '.join('{use: ' + v.strip() + '}' for v in value.split(','))}]")
        elif key in SLOTS and value not in ("null", "~", ""):
            out.append(f"algorithm.{key}.use={value}")
        else:
            out.append(f"algorithm.{key}={value}")
    keys = [c.split("=", 1)[0] for c in out]  # algorithm.clip.use, algorithm.clip.eps_high, algorithm.kl (null)
    for i, a in enumerate(keys):
        for j in range(i + 1, len(keys)):
            b = keys[j]
            if a == b or b.startswith(a + ".") or a.startswith(b + "."):
                what = min(a, b, key=len).removeprefix("algorithm.").removesuffix(".use")
                raise ConfigError(where, f"{changes[i]!r} and {changes[j]!r} both set {what}: one would silently "
                                  "replace the other",
                                  "state each slot once: its component (SLOT=NAME), then its parameters "
                                  "(SLOT.PARAM=VALUE); or SLOT=null alone")
    return base, out


def entry_name(algo: Any) -> str:
    """The algorithm's name (``algorithm: NAME`` or its ``base``), ``""`` when there is none."""
    base = algo.get("base") if isinstance(algo, dict) else algo
    return base if isinstance(base, str) else ""


def expand_entry(algo: str | dict) -> dict:
    """An algorithm written as an entry (``--algo grpo+clip=cispo``, ``algorithm: grpo+kl=null``, the Python API's
    ``algo=``; :func:`policyzoo.resolve.parse_entry` reads it, as for ``compare --algos``) -> the mapping
    ``{base: grpo, clip: {use: cispo}}``. Keys the config sets beside it (``algorithm.kl.beta=0.01``) are merged in.
    Raises ConfigError when one of them sets a key the entry sets, or a key inside it: one would silently win."""
    entry = entry_name(algo)
    base, changes = parse_entry(entry, where=f"algorithm {entry}")
    out: dict[str, Any] = {"algorithm": {"base": base}}
    for change in changes:
        key, raw = change.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError as e:
            raise ConfigError(f"algorithm {entry}", f"the value {raw!r} of {key} is not valid YAML "
                              f"({getattr(e, 'problem', e)})", "e.g. grpo+clip.eps_high=0.28") from None
        _set(out, key, value, f"algorithm {entry}")
    beside = {k: v for k, v in algo.items() if k != "base"} if isinstance(algo, dict) else {}
    mine = [c.split("=", 1)[0].removeprefix("algorithm.") for c in changes]
    for key in _dotted_keys(beside):
        both = [m for m in mine if m == key or m.startswith(key + ".") or key.startswith(m + ".")]
        if both:
            raise ConfigError(f"algorithm {entry}", f"the entry sets {both[0]} and the config also sets "
                              f"algorithm.{key}: one would silently replace the other",
                              f"state it once: in the entry ({entry.split('+')[0]}+...) or as algorithm.{key}")
        _set(out, f"algorithm.{key}", _dotted_value(beside, key), f"algorithm {entry}")
    return out["algorithm"]


def _dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    """``{"clip": {"eps_high": 0.3}, "kl": None}`` -> ``["clip.eps_high", "kl"]`` (an empty mapping is a leaf)."""
    out = []
    for k, v in tree.items():
        out += _dotted_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


def _dotted_value(tree: dict, key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def _set(tree: dict, key: str, value: Any, where: str) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
        if not isinstance(tree, dict):
            raise ConfigError(where, f"{key} sets a key inside {part}, which is set to {tree!r}",
                              f"set {part} once: a component (SLOT=NAME) with its parameters (SLOT.PARAM=VALUE)")
    tree[leaf] = value


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
