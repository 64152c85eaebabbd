"""A TRL ``GRPOConfig`` (object, dict or YAML file) as a policyzoo config, key by key.

:func:`port_trl` reads the keys the user gave, takes TRL 1.16's default for every other key (so
a TRL user gets TRL's ``beta`` 0.0 and ``loss_type`` dapo, not the grpo bundle's), and returns
the policyzoo config tree with, for every policyzoo key it set, the TRL keys it came from
(``--dry-run`` prints them). A key policyzoo cannot honour raises :class:`ConfigError` naming it
and why; keys without effect on training are listed as ignored. The key tables are in
:mod:`policyzoo.trl_port.keys`; the loss of a ported config equals TRL's ``_compute_loss``
(``tests/test_trl_port.py``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, did_you_mean
from .algorithm import algorithm
from .keys import DEFAULTS, IGNORED, LEGACY, LEGACY_REFUSED, REFUSED, TRL_VERSION
from .train_keys import batch_keys, bookkeeping_keys, schedule_keys


@dataclass
class Port:
    """``tree``: the policyzoo config (``policyzoo.train(config=tree)``, ``load_config(tree=...)``);
    ``origins``: ``{policyzoo key: the TRL keys and values it came from}``; ``ignored``: ``{TRL key
    given: why it has no effect}``; ``notes``: conventions that differ and cannot be switched."""

    tree: dict
    origins: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def report(self, overrides: dict[str, Any] | None = None) -> dict:
        """What ``--dry-run`` prints under ``from_trl``: each key's source; a key also given on the
        command line says so (the command line wins)."""
        over = overrides or {}
        mapped = {}
        for key, src in self.origins.items():
            hit = [k for k in over if k == key or k.startswith(key + ".")]
            mapped[key] = f"command line ({', '.join(hit)}) over TRL {src}" if hit else f"TRL {src}"
        return {"trl_version": TRL_VERSION, "set": mapped, "ignored": dict(self.ignored), "notes": list(self.notes)}


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def given_keys(cfg: Any) -> dict[str, Any]:
    """The keys the user set: a dict's keys, a YAML file's, or an object's fields that differ from a
    default ``GRPOConfig`` of the same class (TRL's ``__post_init__`` ran on both)."""
    if isinstance(cfg, (str, Path)):
        p = Path(cfg)
        if not p.is_file():
            raise ConfigError(str(cfg), "TRL config file not found", "pass the YAML file of a GRPOConfig")
        try:
            cfg = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(str(cfg), f"not valid YAML: {e}", "fix the YAML syntax") from None
        if not isinstance(cfg, dict):
            raise ConfigError(str(p), "the TRL config must be a mapping of GRPOConfig keys", "write `key: value` lines")
    if isinstance(cfg, dict):
        return {str(k): _plain(v) for k, v in cfg.items()}
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        try:  # a default of the same class, through TRL's __post_init__ (bf16 needs use_cpu off a GPU)
            default = type(cfg)(output_dir=cfg.output_dir, use_cpu=cfg.use_cpu)
        except ValueError:
            default = type(cfg)(output_dir=cfg.output_dir, use_cpu=True)
        return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                if f.init and f.name in DEFAULTS and (f.name == "output_dir" or _plain(getattr(cfg, f.name)) !=
                                                      _plain(getattr(default, f.name)))}
    raise ConfigError("from_trl", f"expected a trl.GRPOConfig, a dict or a YAML file, got {type(cfg).__name__}",
                      "pass GRPOConfig(...), its to_dict(), or the path of its YAML file")


class _Reader:
    """The effective TRL value of each key and where each policyzoo key came from."""

    def __init__(self, given: dict[str, Any]):
        self.given = given
        self.origins: dict[str, str] = {}

    def __call__(self, key: str) -> Any:
        return self.given[key] if key in self.given else DEFAULTS.get(key)

    def src(self, *keys: str) -> str:
        return ", ".join(f"{k}={self(k)!r}" + ("" if k in self.given else " (default)") for k in keys)

    def refuse(self, key: str, why: str, fix: str = "") -> None:
        raise ConfigError(f"TRL config: {key}", f"{key}={self(key)!r} cannot be honoured: {why}",
                          fix or f"remove {key} (TRL's default is {DEFAULTS.get(key)!r}), or use TRL for this run")


def port_trl(cfg: Any, world_size: int | None = None) -> Port:
    """Map ``cfg`` (a ``trl.GRPOConfig``, its dict, or a YAML file of it) onto a policyzoo config.

    ``world_size``: the data-parallel ranks of the run (default ``$WORLD_SIZE``, else 1): TRL's
    ``per_device_train_batch_size`` counts completions per rank and micro-step, so
    ``train.prompts_per_step = per_device_train_batch_size x gradient_accumulation_steps x
    world_size / num_generations``. Raises :class:`ConfigError` for a key that is not a TRL
    1.16 GRPOConfig key, and for one set to a value policyzoo cannot honour (the reason named)."""
    given = given_keys(cfg)
    for key in given:
        if key in LEGACY_REFUSED:
            raise ConfigError(f"TRL config: {key}", f"{key}={given[key]!r} cannot be honoured: {LEGACY_REFUSED[key]}",
                              f"remove {key} (TRL {TRL_VERSION} has no such key)")
        if key not in DEFAULTS and key not in LEGACY:
            raise ConfigError(f"TRL config: {key}", f"{key} is not a key of TRL {TRL_VERSION}'s GRPOConfig"
                              f"{did_you_mean(key, DEFAULTS)}",
                              "remove it (script arguments such as model_name_or_path go to model.path, "
                              "dataset_name to data.path)")
    r = _Reader(given)
    for key, why in REFUSED.items():
        if key in given and given[key] != DEFAULTS[key]:
            r.refuse(key, why)
    world = int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", "1"))
    tree: dict[str, Any] = {"train": {}, "engine": {}, "model": {}}
    port = Port(tree, r.origins, {k: IGNORED[k] for k in given if k in IGNORED})
    batch_keys(r, tree, world)
    schedule_keys(r, tree, port)
    bookkeeping_keys(r, tree, port)
    tree["algorithm"] = algorithm(r, world)
    if r("use_vllm") is False:
        port.notes.append("use_vllm is false (TRL's default): TRL samples with transformers' generate, so "
                          "engine.rollout is transformers, the slower sampler: vLLM samples the same rows in "
                          "0.49-0.65x generate's time on CPU (docs/benchmarks.md), and more so on GPUs; set "
                          "use_vllm: true (or engine.rollout=vllm) to sample with vLLM")
    tree["algorithm"]["filter"] = []
    tree["algorithm"]["reward"] = []
    return port


class TrlConfig(dict):
    """What :func:`from_trl` returns: the policyzoo config tree -- the object is that dict, so
    ``policyzoo.train(config=...)``, ``build_config(config=...)`` and ``cfg["train"]["lr"]`` work on it --
    with its provenance: ``origins`` (``{policyzoo key: the TRL keys and values it came from}``), ``ignored``
    (``{TRL key given: why it has no effect}``), ``notes`` (conventions that differ), ``trl_version``, and
    :meth:`report` (what ``--dry-run`` prints under ``from_trl``)."""

    trl_version = TRL_VERSION

    def __init__(self, port: Port | None = None):
        super().__init__(port.tree if port else {})
        self.origins = dict(port.origins) if port else {}
        self.ignored = dict(port.ignored) if port else {}
        self.notes = list(port.notes) if port else []

    @property
    def config(self) -> dict:
        """The config tree as a plain dict (for YAML, JSON or a copy)."""
        return dict(self)

    def report(self, overrides: dict[str, Any] | None = None) -> dict:
        """Each key's source, the ignored keys and the notes (:meth:`Port.report`)."""
        return Port(self.config, self.origins, self.ignored, self.notes).report(overrides)


def from_trl(cfg: Any, world_size: int | None = None) -> TrlConfig:
    """The policyzoo config of a TRL ``GRPOConfig`` object, dict or YAML file (:func:`port_trl`), as a
    :class:`TrlConfig`: the config dict itself, with each key's source, the ignored keys and the notes.
    Raises :class:`ConfigError` as :func:`port_trl`."""
    return TrlConfig(port_trl(cfg, world_size))
