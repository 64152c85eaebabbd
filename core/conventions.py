"""``algorithm.conventions: policyzoo | trl | verl``: one key that sets every convention switch to a
peer's default (docs/glossary.md, "Conventions").

A preset fills only the parameters that neither the bundle nor the user states: a value written
in the config (``algorithm: {conventions: trl, baseline: {eps: 1e-6}}``) or stated by the bundle
wins. Each entry names the slot, the component (``*``: every component declaring the parameter,
which then means the same thing) and the parameter; ``train.*`` entries fill config keys the
config file does not set. :func:`apply` returns the bundle and what the preset set, which
``--dry-run`` prints under ``algorithm.conventions``.

Sources of the values: TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` (std + 1e-4,
``nanstd`` = sample std, ``nansum`` over reward functions) and ``_compute_loss`` (``loss_type``
grpo divides by every row); verl 0.9 ``core_algos`` (``compute_grpo_outcome_advantage`` epsilon
1e-6, a group of one has mean 0 and std 1; ``clip_ratio_c`` 3.0 on A < 0; ``low_var_kl`` clamped
to +-10; ``masked_whiten`` with the unbiased variance).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .contract import SLOTS, Bundle, Use
from .errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from .catalog import Catalog

#: preset -> {(slot or "train", component or "*", parameter): value}
PRESETS: dict[str, dict[tuple[str, str, str], Any]] = {
    "policyzoo": {},
    "trl": {
        ("baseline", "group_norm", "eps"): 1e-4,        # (std + 1e-4)
        ("baseline", "gdpo", "eps"): 1e-4,
        ("baseline", "*", "whiten_std"): "sample",      # nanstd
        ("baseline", "*", "whiten_eps"): 1e-4,
        ("reduce", "*", "empty_rows"): "count",         # loss_type grpo / dr_grpo divide by every row
        ("train", "*", "reward_nan"): "nansum",         # nansum over reward functions
    },
    "verl": {
        ("baseline", "group_norm", "eps"): 1e-6,        # epsilon 1e-6
        ("baseline", "*", "singleton"): "reward",       # a group of one: mean 0, std 1
        ("baseline", "*", "whiten_std"): "sample",      # masked_whiten: unbiased variance
        ("clip", "ppo_clip", "dual_clip"): 3.0,         # clip_ratio_c 3.0, always on for A < 0
        ("kl", "k3", "clamp"): 10.0,                    # low_var_kl clamped to +-10
    },
}


def check_name(name: Any, where: str = "algorithm.conventions") -> str:
    if name not in PRESETS:
        raise ConfigError(where, f"unknown conventions {name!r}{did_you_mean(str(name), PRESETS)}",
                          f"use one of: {', '.join(PRESETS)}")
    return name


def apply(bundle: Bundle, name: str, catalog: "Catalog") -> tuple[Bundle, dict[str, Any]]:
    """``bundle`` with the preset's values filled into every component that declares the parameter
    and does not state it, and ``{"slot.param" (or "slot[i].param"): value}`` of what was set."""
    preset = PRESETS[check_name(name)]
    changes: dict[str, Any] = {}
    applied: dict[str, Any] = {}
    for slot in SLOTS:
        value = getattr(bundle, slot)
        uses = list(value) if isinstance(value, tuple) else ([] if value is None else [value])
        new = []
        for i, u in enumerate(uses):
            fields = catalog.component(slot, u.name, f"algorithm.{slot}").Params.model_fields
            fill = {p: v for (s, c, p), v in preset.items()
                    if s == slot and c in ("*", u.name) and p in fields and p not in u.params}
            key = slot if not isinstance(value, tuple) else f"{slot}[{i}]"
            applied.update({f"{key}.{p}": v for p, v in fill.items()})
            new.append(Use(u.name, {**u.params, **fill}) if fill else u)
        if new != uses:
            changes[slot] = tuple(new) if isinstance(value, tuple) else new[0]
    return (replace(bundle, **changes) if changes else bundle), applied


def train_defaults(name: str | None) -> dict[str, Any]:
    """The ``train.*`` keys the preset sets when the config does not: ``{key: value}``."""
    if name is None:
        return {}
    return {p: v for (s, _, p), v in PRESETS[check_name(name)].items() if s == "train"}
