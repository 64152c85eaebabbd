"""The catalog: every component and bundle this process can use, with where it came from.

One catalog plugin manager per process loads, in order: the built-in components
(``policyzoo.plugins``), the zoo (``policyzoo.zoo``), then every installed distribution's
``policyzoo`` entry point. Each registers through the ``register_components`` and
``register_bundles`` hooks. A name registered twice in a slot fails loudly naming both sources, and a
component class that breaks its slot's contract (:func:`component_problem`: base class, ``Params``,
name, hook method's arguments) is refused when it registers; the contract suite checks the same.

Environment switches
--------------------
``POLICYZOO_DISABLE_PLUGIN_AUTOLOAD=1``  load only built-ins and the zoo (no entry points).
``POLICYZOO_PLUGINS=dist-a,dist-b``       load entry points only from these distributions (names
                                          compared as pip does: ``_``/``.``/``-`` and case alike;
                                          a name that matches no installed plugin is an error).
``POLICYZOO_TRACE=1``                     print every hook call of a run (name and arguments).
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import inspect
import os
import re
from dataclasses import dataclass, field

import pluggy

from .contract import BASES, PROJECT, SLOTS, Bundle, Component, Spec
from .errors import ConfigError, PluginError, did_you_mean

ENTRY_POINT_GROUP = "policyzoo"


@dataclass(frozen=True)
class Source:
    """Where a name came from: distribution, version and module."""

    dist: str
    version: str
    module: str

    def __str__(self) -> str:
        return f"{self.dist} {self.version} ({self.module})" if self.version else f"{self.dist} ({self.module})"


@dataclass
class PluginInfo:
    dist: str
    version: str
    module: str
    hooks: list[str] = field(default_factory=list)
    components: list[str] = field(default_factory=list)
    bundles: list[str] = field(default_factory=list)


@dataclass
class BrokenPlugin:
    """A distribution whose entry point could not be imported or registered (``policyzoo plugins``)."""

    dist: str
    version: str
    entry_point: str
    error: str


@dataclass
class Catalog:
    """``components[slot][name] = (cls, source)``; ``bundles[name] = (bundle, source)``;
    ``broken``: distributions left out (only with ``load_catalog(keep_broken=True)``)."""

    components: dict[str, dict[str, tuple[type[Component], Source]]]
    bundles: dict[str, tuple[Bundle, Source]]
    plugins: list[PluginInfo]
    broken: list[BrokenPlugin] = field(default_factory=list)

    def component(self, slot: str, name: str, where: str = "") -> type[Component]:
        names = self.components.get(slot, {})
        if name not in names:
            other = [s for s, comps in self.components.items() if name in comps]
            hint = f"; {name!r} is a {other[0]} component" if other else ""
            if name in ("none", "null") and SLOTS.get(slot) != "single":
                hint += f"; to leave the {slot} slot out write null ({slot}: null, grpo+{slot}=null), no parameters"
            raise ConfigError(where or slot, f"no {slot} component named {name!r}"
                              f"{did_you_mean(name, names)}{hint}",
                              f"choose one of: {', '.join(sorted(names))} "
                              "(`policyzoo components` lists them with their sources)")
        return names[name][0]

    def bundle(self, name: str, where: str = "algorithm") -> Bundle:
        if name not in self.bundles:
            raise ConfigError(where, f"no algorithm named {name!r}{did_you_mean(name, self.bundles)}",
                              f"choose one of: {', '.join(sorted(self.bundles))} (`policyzoo zoo`)")
        return self.bundles[name][0]

    def resolve(self, bundle: Bundle) -> Bundle:
        """A bundle built in Python (not registered) with its parent's slots filled in."""
        if bundle.complete:
            return bundle
        parent = self.bundle(bundle.parent, f"algorithm {bundle.name!r}.parent") if bundle.parent else None
        return bundle.inherit(parent)


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "0+local"


def _normalise(dist: str) -> str:
    """PEP 503 name: ``policyzoo_tis`` and ``PolicyZoo.TIS`` both mean ``policyzoo-tis``."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def _entry_points():
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else ep.module
        yield dist, ep


def load_catalog(autoload: bool | None = None, allow: list[str] | None = None,
                 extra: list = (), keep_broken: bool = False) -> Catalog:
    """Build a fresh catalog. ``autoload``/``allow`` default to the environment switches;
    ``extra`` adds plugin objects (modules or instances) as if they were installed. A distribution
    that fails to import or to register raises :class:`PluginError`, or with ``keep_broken`` is
    left out and listed in ``Catalog.broken`` with its error (what ``policyzoo plugins`` shows)."""
    import policyzoo.plugins
    import policyzoo.zoo

    if autoload is None:
        autoload = os.environ.get("POLICYZOO_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0")
    if allow is None and os.environ.get("POLICYZOO_PLUGINS"):
        allow = [d.strip() for d in os.environ["POLICYZOO_PLUGINS"].split(",") if d.strip()]

    own = _version("policyzoo")
    loaded = [(module, PluginInfo("policyzoo", own, module.__name__)) for module in (policyzoo.plugins, policyzoo.zoo)]
    broken: list[BrokenPlugin] = []
    if autoload:
        loaded += _load_entry_points(allow, keep_broken, broken)
    loaded += [(obj, PluginInfo("(in-process)", "", getattr(obj, "__name__", repr(obj)))) for obj in extra]
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(Spec)
    components: dict[str, dict] = {slot: {} for slot in SLOTS}
    bundles: dict[str, tuple[Bundle, Source]] = {}
    kept = []
    for obj, info in loaded:
        try:
            _register(pm, obj, info, components, bundles)
            kept.append(info)
        except PluginError as e:
            if not keep_broken or info.dist == "policyzoo":
                raise
            if pm.get_plugin(f"{info.dist}:{info.module}") is not None:
                pm.unregister(name=f"{info.dist}:{info.module}")
            broken.append(BrokenPlugin(info.dist, info.version, info.module, f"{e.why} ({e.where})"))
    return Catalog(components, resolve_bundles(bundles), kept, broken)


def _load_entry_points(allow: list[str] | None, keep_broken: bool, broken: list) -> list[tuple[object, PluginInfo]]:
    """The installed distributions' entry points (only those in ``allow`` when given): ``(object, info)``
    each. One that fails to import raises :class:`PluginError`, or with ``keep_broken`` is appended to
    ``broken``; an ``allow`` name that matches no installed plugin raises :class:`PluginError`."""
    loaded = []
    wanted = None if allow is None else {_normalise(a) for a in allow}
    seen: set[str] = set()
    for dist, ep in _entry_points():
        seen.add(_normalise(dist))
        if wanted is not None and _normalise(dist) not in wanted:
            continue
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin is reported by name, not by traceback
            if keep_broken:
                broken.append(BrokenPlugin(dist, _version(dist), ep.value, f"{type(e).__name__}: {e}"))
                continue
            raise PluginError(f"plugin distribution {dist!r} (entry point {ep.value})",
                              f"importing it raised {type(e).__name__}: {e}",
                              f"fix or uninstall {dist!r}, or run with POLICYZOO_PLUGINS set "
                              "to the distributions you need (POLICYZOO_DISABLE_PLUGIN_AUTOLOAD=1 "
                              "loads none)") from None
        loaded.append((obj, PluginInfo(dist, _version(dist), getattr(obj, "__name__", ep.value))))
    if wanted is not None and wanted - seen:
        raise PluginError("POLICYZOO_PLUGINS (plugin allowlist)",
                          f"no installed distribution with a {ENTRY_POINT_GROUP!r} entry point is called "
                          f"{', '.join(sorted(wanted - seen))}",
                          f"installed plugin distributions: {', '.join(sorted(seen)) or 'none'} "
                          "(`policyzoo plugins`)")
    return loaded


REGISTER_HOOKS = ("register_components", "register_bundles")


def _register(pm, obj, info: PluginInfo, components: dict, bundles: dict) -> bool:
    """Register one plugin object's hooks, components and bundles; False for a repeat."""
    try:
        pm.register(obj, name=f"{info.dist}:{info.module}")
    except ValueError:  # the same module object listed twice (e.g. an entry point to the zoo)
        return False
    except pluggy.PluginValidationError as e:
        raise PluginError(f"plugin distribution {info.dist!r} ({info.module})", str(e),
                          "hook implementations must match policyzoo.contract") from None
    src = Source(info.dist, info.version, info.module)
    info.hooks = sorted(name for name in REGISTER_HOOKS
                        if any(impl.plugin is obj for impl in getattr(pm.hook, name).get_hookimpls()))
    for name in REGISTER_HOOKS:
        if callable(getattr(obj, name, None)) and name not in info.hooks:  # pluggy would never call it
            pm.unregister(obj)
            raise PluginError(f"plugin distribution {info.dist!r} ({info.module}).{name}",
                              "a register function without the hook marker is never called by the plugin manager",
                              f"decorate it: from policyzoo.contract import hookimpl; @hookimpl def {name}(register)")
    add = {"register_components": functools.partial(_add_component, components, src, info),
           "register_bundles": functools.partial(_add_bundle, bundles, src, info)}
    for name in info.hooks:  # the implementations pluggy found (marked ones only), this plugin's alone
        for impl in getattr(pm.hook, name).get_hookimpls():
            if impl.plugin is obj:
                impl.function(register=add[name])
    return True


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


def _add_component(table, src: Source, info: PluginInfo, cls) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Component)):
        raise PluginError(str(src), f"register() got {cls!r}, not a Component subclass",
                          "pass the class: register(MyComponent)")
    problem = component_problem(cls)
    if problem:
        raise PluginError(f"{src}: {cls.__qualname__}", *problem)
    if cls.name in table[cls.slot]:
        prev = table[cls.slot][cls.name][1]
        raise PluginError(f"{cls.slot} component {cls.name!r}",
                          f"registered twice: by {prev} and by {src}",
                          "rename one of them (names are unique per slot), or uninstall one distribution")
    table[cls.slot][cls.name] = (cls, src)
    info.components.append(f"{cls.slot}:{cls.name}")


def _add_bundle(table, src: Source, info: PluginInfo, bundle) -> None:
    if not isinstance(bundle, Bundle):
        raise PluginError(str(src), f"register() got {bundle!r}, not a Bundle",
                          "pass a policyzoo.Bundle")
    if bundle.name in table:
        raise PluginError(f"algorithm {bundle.name!r}", f"registered twice: by {table[bundle.name][1]} "
                          f"and by {src}", "rename one of them, or uninstall one distribution")
    table[bundle.name] = (bundle, src)
    info.bundles.append(bundle.name)


def resolve_bundles(table: dict[str, tuple[Bundle, Source]]) -> dict[str, tuple[Bundle, Source]]:
    """Every bundle with its parent's slots filled in (parents first). Raises
    :class:`PluginError` for an unknown parent or a cycle of parents."""
    done: dict[str, tuple[Bundle, Source]] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> Bundle:
        if name in done:
            return done[name][0]
        bundle, src = table[name]
        where = f"algorithm {name!r} from {src}"
        parent = None
        if bundle.parent is not None and not bundle.complete:
            if bundle.parent in chain:
                raise PluginError(where, "its parents form a cycle: " + " -> ".join((*chain, name, bundle.parent)),
                                  "a bundle cannot inherit from itself through its parents")
            if bundle.parent not in table:
                raise PluginError(where, f"parent {bundle.parent!r} is not a registered algorithm"
                                  f"{did_you_mean(bundle.parent, table)}",
                                  "name a bundle from `policyzoo zoo`, or install the distribution providing it")
            parent = resolve(bundle.parent, (*chain, name))
        done[name] = (bundle.inherit(parent, where) if not bundle.complete else bundle, src)
        return done[name][0]

    for name in table:
        resolve(name, ())
    return {name: done[name] for name in table}


@functools.lru_cache(maxsize=1)
def get_catalog() -> Catalog:
    """The process-wide catalog (built once; environment switches read at first use)."""
    return load_catalog()
