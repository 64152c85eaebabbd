"""``policyzoo zoo``, ``components``, ``plugins`` and ``explain``: the catalog's tables (sub-commands of
:mod:`policyzoo.cli`, which registers them)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from policyzoo.contract.ground import SLOTS

from .catalog import get_catalog, load_catalog
from .equivalence import run_warnings, task_reward_classes
from .resolve import resolve_algorithm
from .run_config import load_config


def _first_line(obj) -> str:
    return ((obj.__doc__ or "").strip().splitlines() or [""])[0]


def _fmt(u) -> str:
    if u is None:
        return "-"
    if isinstance(u, tuple):
        return ", ".join(_fmt(x) for x in u) or "-"
    args = ", ".join(f"{k}={v}" for k, v in u.params.items())
    return f"{u.name}({args})" if args else u.name


def _names(u) -> str:
    if u is None or u == ():
        return "-"
    return ", ".join(x.name for x in u) if isinstance(u, tuple) else u.name


def cmd_zoo(args, out: Console) -> None:
    """One row per bundle, component names per slot (``explain NAME`` shows the parameters)."""
    cat = get_catalog()
    table = Table(title="policyzoo algorithms (parameters: policyzoo explain NAME)")
    for col in ["name", "from", *SLOTS]:
        table.add_column(col, overflow="fold")
    for name, (bundle, src) in sorted(cat.bundles.items()):
        table.add_row(name, src.dist, *[_names(getattr(bundle, s)) for s in SLOTS])
    out.print(table)


def cmd_components(args, out: Console) -> None:
    cat = get_catalog()
    table = Table(title="policyzoo components")
    for col in ("slot", "name", "source", "summary"):
        table.add_column(col)
    for slot in SLOTS:
        if args.slot and slot != args.slot:
            continue
        for name, (cls, src) in sorted(cat.components[slot].items()):
            table.add_row(slot, name, f"{src.dist} {src.version}", _first_line(cls))
    out.print(table)


def cmd_plugins(args, out: Console) -> None:
    """Every plugin distribution; broken ones (import or registration failed) are listed with their
    error instead of stopping the command (a run refuses them; ``POLICYZOO_PLUGINS`` leaves them out)."""
    cat = load_catalog(keep_broken=True)
    table = Table(title="plugin distributions")
    for col in ("distribution", "version", "module", "hooks", "components", "bundles"):
        table.add_column(col)
    for p in cat.plugins:
        table.add_row(p.dist, p.version, p.module, ", ".join(p.hooks), ", ".join(p.components) or "-",
                      ", ".join(p.bundles) or "-")
    out.print(table)
    if cat.broken:
        bad = Table(title="broken plugin distributions (a run refuses them: fix or uninstall them, or set "
                    "POLICYZOO_PLUGINS to the distributions you need)")
        for col in ("distribution", "version", "entry point", "error"):
            bad.add_column(col, overflow="fold")
        for b in cat.broken:
            bad.add_row(b.dist, b.version, b.entry_point, b.error)
        out.print(bad)


def cmd_explain(args, out: Console) -> None:
    """A bundle's slots and parameters (``key=value`` overrides make it the run's algorithm), then what the
    gradient probe finds at the run's settings: equal to its base, slots that do nothing there
    (:func:`policyzoo.equivalence.run_warnings`)."""
    cat = get_catalog()
    if "+" not in args.name:  # an entry (grpo+clip=cispo) is read with the config, as --algo reads it
        cat.bundle(args.name, "explain")
    config = load_config(None, args.name, list(getattr(args, "overrides", None) or []))
    bundle = resolve_algorithm(config.algorithm)
    out.print(f"[bold]{bundle.name}[/bold]: {bundle.summary}")
    out.print(f"paper: {bundle.paper}")
    if bundle.parent:
        out.print(f"parent: {bundle.parent} (slots marked 'inherited' come from it unchanged)")
    for slot in SLOTS:
        uses = getattr(bundle, slot)
        uses = uses if isinstance(uses, tuple) else (() if uses is None else (uses,))
        origin = f"   (inherited from {bundle.parent})" if slot in bundle.inherited else ""
        if not uses and slot == "reward":
            out.print(f"  {slot:9s} -  (no extras: the task's reward comes from `rewards:` or the data task's "
                      f"default){origin}", markup=False)
        elif not uses:
            out.print(f"  {slot:9s} -  (absent){origin}", markup=False)
        for u in uses:
            cls = cat.component(slot, u.name)
            params = cls(**u.params).params.model_dump()
            out.print(f"  {slot:9s} {u.name}  [{cat.components[slot][u.name][1]}]{origin}", markup=False)
            for k, v in params.items():
                mark = "" if k in u.params else "   (component default)"
                out.print(f"              {k} = {v!r}{mark}", markup=False)
    lines = run_warnings(config, bundle, task_reward_classes(config, bundle))
    if lines:
        out.print("at these settings (policyzoo explain NAME key=value ... to change them):", markup=False)
    for line in lines:
        out.print(f"  {line}", markup=False)
