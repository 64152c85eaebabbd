"""What ``policyzoo compare --algos`` takes, and the algorithm label of a run's config.

An entry is a zoo name with optional slot changes joined by ``+`` (the name
:meth:`~policyzoo.contract.Bundle.replace` gives a hybrid)::

    grpo                      --algo grpo
    grpo+clip=cispo           --algo grpo algorithm.clip.use=cispo
    grpo+clip.eps_high=0.28   --algo grpo algorithm.clip.eps_high=0.28
    dapo+kl=k3+kl.beta=0.01   --algo dapo algorithm.kl.use=k3 algorithm.kl.beta=0.01
    grpo+kl=null              --algo grpo algorithm.kl=null   (removes an optional slot)
    grpo+conventions=trl      --algo grpo algorithm.conventions=trl

``SLOT=NAME`` swaps the slot's component, ``SLOT.PARAM=VALUE`` sets a parameter (VALUE read as YAML,
as in any override), ``KEY=VALUE`` for a key under ``algorithm`` that is not a slot. The label of a
run is rebuilt from its ``config.yaml`` the same way (:func:`labels`), so ``grpo+clip=cispo`` names
both the command and the row of the table.
"""

from __future__ import annotations

import json
from typing import Any

from policyzoo.contract import Bundle
from policyzoo.contract.ground import SLOTS
from policyzoo.errors import ConfigError, UserError
from policyzoo.resolve import parse_entry, resolve_algorithm

DEFAULT_BASE = "grpo"  # what a config's algorithm mapping without `base` modifies (policyzoo.assembly)


def check_clashes(entry: str, changes: list[str], overrides: list[str]) -> None:
    """Raise ConfigError when a ``key=value`` override and one of ``entry``'s changes (:func:`parse_entry`) set
    the same key, or one sets a key inside the other's (``algorithm.clip={use: ppo_clip}`` and
    ``algorithm.clip.use=cispo``): one would silently win over the other."""
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        for change in changes:
            mine = change.split("=", 1)[0]
            if key == mine or mine.startswith(key + ".") or key.startswith(mine + "."):
                own = key.removeprefix("algorithm.")
                example = f", e.g. --algos {entry},{entry.split('+')[0].strip()}+{render(own, item.split('=', 1)[1])}"
                raise ConfigError(f"--algos {entry}", f"the override {item!r} and the entry's change {change!r} "
                                  f"both set {min(key, mine, key=len)}: one would silently replace the other",
                                  "drop the override (the entry sets it for its own runs); to compare both values, "
                                  "give each its own entry" + (example if own != key else ""))


def entry_of(algo: Any, where: str) -> Any:
    """A :class:`~policyzoo.contract.Bundle` given where the Python API takes an algorithm name
    (``policyzoo.train(algo=...)``, ``policyzoo.compare(algos=[...])``) as its ``.name``, the entry that reads
    back to it (``GRPO.replace(clip=use("cispo"))`` -> ``"grpo+clip=cispo"``); anything else unchanged.
    Raises :class:`UserError` (at ``where``) for a Bundle its name does not read back to (one built by hand and
    not registered): a run's ``config.yaml`` records a name, so the run could not be resumed or compared."""
    if not isinstance(algo, Bundle):
        return algo
    try:
        back = resolve_algorithm(algo.name)
    except UserError:
        back = None
    if back != algo:
        raise UserError(where, f"the Bundle named {algo.name!r} is not the algorithm that name reads back to (a "
                        "Bundle built by hand, not in the catalog): a run records its algorithm by name",
                        "register the bundle (a plugin's `policyzoo` entry point, docs/writing-a-plugin.md) and pass "
                        "its name, or build it with Bundle.replace from a zoo bundle and pass that (or its .name)")
    return algo.name


def parse_algos(algos: str | list) -> list[str]:
    """The entries of ``--algos`` (a comma-separated string, or a list of entries and
    :class:`~policyzoo.contract.Bundle` objects, each read by :func:`entry_of`), each once, in order."""
    items = algos.split(",") if isinstance(algos, str) else [entry_of(a, "policyzoo.compare(algos=...)")
                                                             for a in algos]
    wrong = [a for a in items if not isinstance(a, str)]
    if wrong:
        raise ConfigError("policyzoo.compare(algos=...)", f"{type(wrong[0]).__name__} {wrong[0]!r} is not an "
                          "algorithm", "give names or entries (\"grpo\", \"grpo+clip=cispo\") or Bundle objects")
    items = [a.strip() for a in items if a and a.strip()]
    if not items:
        raise ConfigError("--algos", "no algorithm given", "e.g. --algos grpo,dr_grpo")
    dup = sorted({a for a in items if items.count(a) > 1})
    if dup:
        raise ConfigError("--algos", f"{', '.join(dup)} given twice", "name each algorithm once")
    for a in items:
        parse_entry(a)
    return items


MAX_SEEDS = 1000  # more runs than any comparison needs; a typo (--seeds 30000) is refused before the plan
MAX_SEED = 2**32 - 1  # the largest seed the sampling streams take (numpy's)


def parse_seeds(seeds: int | str | list[int]) -> list[int]:
    """``3`` -> ``[0, 1, 2]``; ``"0,5,7"`` or ``[0, 5, 7]`` -> those seeds; ``"5,"`` -> ``[5]`` (one seed, 5).
    A count is 1 .. MAX_SEEDS, a seed 0 .. MAX_SEED."""
    if isinstance(seeds, str):
        text = seeds.strip()
        try:
            seeds = [int(x) for x in text.split(",") if x.strip()] if "," in text else int(text)
        except ValueError:
            raise ConfigError("--seeds", f"{text!r} is neither a count nor a list of seeds",
                              "e.g. --seeds 3 (seeds 0, 1, 2) or --seeds 0,5,7") from None
    items = [seeds] if isinstance(seeds, int) else seeds
    if not isinstance(items, (list, tuple)) or any(isinstance(s, bool) or not isinstance(s, int) for s in items):
        raise ConfigError("--seeds", f"{seeds!r}: give a count (an integer) or a list of integer seeds",
                          "e.g. --seeds 3 (seeds 0, 1, 2) or --seeds 0,5,7 (Python: seeds=3 or seeds=[0, 5, 7])")
    if isinstance(seeds, int) and not 1 <= seeds <= MAX_SEEDS:
        raise ConfigError("--seeds", f"{seeds}: a count is 1 to {MAX_SEEDS} seeds (one run per algorithm each)",
                          "e.g. --seeds 3 (seeds 0, 1, 2); to name one seed: --seeds 5,")
    out = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not out or len(set(out)) != len(out) or len(out) > MAX_SEEDS:
        raise ConfigError("--seeds", f"{seeds!r}: give a count >= 1 or distinct seeds (at most {MAX_SEEDS})",
                          "e.g. --seeds 3")
    wrong = [s for s in out if not 0 <= s <= MAX_SEED]
    if wrong:
        raise ConfigError("--seeds", f"seed {wrong[0]} is out of range: a seed is 0 to {MAX_SEED}",
                          "e.g. --seeds 0,5,7")
    return out


def settings_overrides(settings: dict[str, Any]) -> list[str]:
    """Python keywords (``**{"train.steps": 2}`` or ``train={"steps": 2}``) as ``key=value`` overrides
    (values as JSON, which the config reads as YAML)."""
    out = []
    for key, value in settings.items():
        if isinstance(value, dict) and value:  # a section merges key by key, as in policyzoo.train
            out += settings_overrides({f"{key}.{k}": v for k, v in value.items()})
        else:
            out.append(f"{key}={value if isinstance(value, str) else json.dumps(value)}")
    return out


def algorithm_tree(algo: Any) -> dict:
    """A config's ``algorithm`` as a mapping with a ``base`` (a name ``x`` becomes ``{base: x}``)."""
    if isinstance(algo, str):
        return {"base": algo}
    tree = dict(algo or {})
    tree.setdefault("base", DEFAULT_BASE)
    return tree


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1]}`` -> ``{"a.b": 1, "c": [1]}`` (lists and empty mappings are leaves)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def render(key: str, value: Any) -> str:
    """One change of a label: (``clip.use``, ``cispo``) -> ``clip=cispo``; (``clip.eps``, 0.2) -> ``clip.eps=0.2``."""
    text = value if isinstance(value, str) else json.dumps(value)
    slot, _, rest = key.partition(".")
    if rest == "use" and slot in SLOTS:
        return f"{slot}={text}"
    return f"{key}={text}"


def labels(algorithms: list[Any]) -> list[str]:
    """One label per run from the runs' ``algorithm`` configs: the base name, then ``+change`` for
    every key under ``algorithm`` whose value is not the same in all the runs (sorted by key)."""
    flat = [flatten({k: v for k, v in algorithm_tree(a).items() if k != "base"}) for a in algorithms]
    keys = sorted({k for f in flat for k in f})
    missing = object()
    varying = [k for k in keys if len({json.dumps(f.get(k, missing), default=str) for f in flat}) > 1]
    return ["+".join([algorithm_tree(a)["base"], *(render(k, f[k]) for k in varying if k in f)])
            for a, f in zip(algorithms, flat)]


def canonical(entry: str) -> str:
    """The label an entry's runs get when the other runs hold none of its changes (sorted keys)."""
    base, changes = parse_entry(entry)
    flat = dict(c.removeprefix("algorithm.").split("=", 1) for c in changes)
    return "+".join([base, *(render(k, v) for k, v in sorted(flat.items()))])
