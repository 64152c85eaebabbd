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
    _batch(r, tree, world)
    _schedule(r, tree, port)
    _bookkeeping(r, tree, port)
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


def _set(r: _Reader, tree: dict, key: str, value: Any, *trl_keys: str) -> None:
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    r.origins[key] = r.src(*trl_keys)


def _batch(r: _Reader, tree: dict, world: int) -> None:
    per, gas, g = r("per_device_train_batch_size"), r("gradient_accumulation_steps"), r("num_generations")
    if g < 2:
        r.refuse("num_generations", "GRPO needs at least 2 completions per prompt (TRL refuses it too)")
    spg = r("steps_per_generation")
    if spg is not None and spg != gas:
        r.refuse("steps_per_generation", "policyzoo takes one optimizer step on each whole sampled batch; TRL's "
                 "steps_per_generation != gradient_accumulation_steps splits one generation over several optimizer "
                 "steps", "set steps_per_generation = gradient_accumulation_steps (or leave it unset)")
    gbs = r("generation_batch_size")
    if gbs is not None and gbs != per * world * gas:
        r.refuse("generation_batch_size", f"it must equal per_device_train_batch_size x world size x "
                 f"gradient_accumulation_steps = {per * world * gas} (one optimizer step per generation)",
                 "leave generation_batch_size unset")
    rows = per * gas * world
    if rows % g:
        r.refuse("per_device_train_batch_size", f"{per} x gradient_accumulation_steps {gas} x world size {world} = "
                 f"{rows} completions is not a whole number of groups of num_generations={g}",
                 "choose sizes whose product is a multiple of num_generations")
    _set(r, tree, "train.prompts_per_step", rows // g, "per_device_train_batch_size", "gradient_accumulation_steps",
         "num_generations")
    r.origins["train.prompts_per_step"] += f" x WORLD_SIZE={world} / num_generations"
    _set(r, tree, "train.micro_batches", gas, "gradient_accumulation_steps")
    iters = r("num_iterations")
    _set(r, tree, "train.updates_per_batch", iters, "num_iterations")
    if "max_steps" in r.given and r("max_steps") > 0:
        if r("max_steps") % iters:
            r.refuse("max_steps", f"policyzoo runs num_iterations={iters} optimizer steps per sampled batch, so "
                     "max_steps must be a multiple of it")
        _set(r, tree, "train.steps", r("max_steps") // iters, "max_steps", "num_iterations")
    elif "num_train_epochs" in r.given:
        r.refuse("num_train_epochs", "policyzoo counts optimizer steps, not epochs", "set max_steps")


def _schedule(r: _Reader, tree: dict, port: Port) -> None:
    t = "train"
    for ours, theirs in (("lr", "learning_rate"), ("weight_decay", "weight_decay"), ("adam_beta1", "adam_beta1"),
                         ("adam_beta2", "adam_beta2"), ("adam_epsilon", "adam_epsilon"),
                         ("grad_clip", "max_grad_norm"), ("gradient_checkpointing", "gradient_checkpointing"),
                         ("seed", "seed")):
        _set(r, tree, f"{t}.{ours}", r(theirs), theirs)
    kind = r("lr_scheduler_type")
    kinds = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
    if kind not in kinds:
        r.refuse("lr_scheduler_type", f"policyzoo's schedules are {', '.join(kinds)}")
    _set(r, tree, f"{t}.lr_scheduler_type", kinds[kind], "lr_scheduler_type")
    if "warmup_ratio" in r.given:  # an older config's key: the same schedule as warmup_steps < 1
        if "warmup_steps" in r.given:
            r.refuse("warmup_ratio", "it and warmup_steps both set the warm-up", "keep one of them")
        _set(r, tree, f"{t}.warmup_ratio", float(r.given["warmup_ratio"]), "warmup_ratio")
        port.notes.append("warmup_ratio is transformers < 5's key (warmup_steps < 1 now); mapped to train.warmup_ratio")
    warm = r("warmup_steps")
    if 0 < warm < 1:
        _set(r, tree, f"{t}.warmup_ratio", float(warm), "warmup_steps")
    elif warm != int(warm) or warm < 0:
        r.refuse("warmup_steps", "a warm-up is a whole number of steps, or a float in (0, 1) for a ratio")
    else:
        _set(r, tree, f"{t}.warmup_steps", int(warm), "warmup_steps")
    if warm:
        port.notes.append("warm-up: policyzoo's factor at update k is (k + 1) / (w + 1), transformers' k / w "
                          "(no update at lr 0; docs/glossary.md)")
    if r("optim") not in ("adamw_torch", "adamw_torch_fused", "adamw_hf"):
        r.refuse("optim", "policyzoo trains with AdamW (adamw_torch, adamw_torch_fused)")
    bf16 = r("bf16")
    _set(r, tree, f"{t}.autocast", bool(not r("fp16") if bf16 is None else bf16), "bf16")
    if "steps" not in tree[t] and "num_train_epochs" not in r.given:
        port.notes.append("max_steps not given: TRL would train num_train_epochs=3.0 epochs; policyzoo counts "
                          "optimizer steps, train.steps keeps its default (set max_steps)")


def _bookkeeping(r: _Reader, tree: dict, port: Port) -> None:
    if r("data_seed") is not None:
        _set(r, tree, "data.seed", r("data_seed"), "data_seed")
    report = r("report_to")
    report = [x for x in ([report] if isinstance(report, str) else list(report or [])) if x != "none"]
    if any(x not in ("tensorboard", "wandb") for x in report):
        r.refuse("report_to", "policyzoo reports to tensorboard and wandb", "name them: report_to: [tensorboard]")
    _set(r, tree, "train.report_to", report, "report_to")
    log = r("logging_steps")
    if r("log_completions") and (log < 1 or log != int(log)):
        r.refuse("logging_steps", "with log_completions policyzoo needs a whole number of steps")
    _set(r, tree, "train.log_completions_every", int(log) if r("log_completions") else 0, "log_completions",
         "logging_steps")
    for what, ours in (("eval", "eval_every"), ("save", "save_every")):
        strategy = r(f"{what}_strategy")
        if strategy not in ("no", "steps"):
            r.refuse(f"{what}_strategy", "policyzoo counts steps (no, steps)")
        every = 0 if strategy == "no" else r(f"{what}_steps") or r("logging_steps")
        if every != int(every):
            r.refuse(f"{what}_steps", "policyzoo needs a whole number of steps")
        _set(r, tree, f"train.{ours}", int(every), f"{what}_strategy", f"{what}_steps")
    if r("save_total_limit") is not None:
        _set(r, tree, "engine.keep_checkpoints", r("save_total_limit"), "save_total_limit")
    if r("deepspeed") is not None:
        _set(r, tree, "engine.deepspeed", r("deepspeed"), "deepspeed")
    if "output_dir" in r.given and r("output_dir"):
        _set(r, tree, "output_dir", str(r("output_dir")), "output_dir")
    _set(r, tree, "model.trust_remote_code", bool(r("trust_remote_code")), "trust_remote_code")
    _set(r, tree, "engine.rollout", "vllm" if r("use_vllm") else "transformers", "use_vllm")
    _set(r, tree, "engine.vllm_sleep", 2 if r("vllm_enable_sleep_mode") else 0, "vllm_enable_sleep_mode")
    _set(r, tree, "engine.gpu_memory_utilization", r("vllm_gpu_memory_utilization"), "vllm_gpu_memory_utilization")
    _evaluation(r, tree, port)


#: why a TRL evaluation key has no effect when eval_strategy is no
NO_EVAL = "eval_strategy is no: no held-out evaluation (data.eval_size=0)"


def _evaluation(r: _Reader, tree: dict, port: Port) -> None:
    """TRL's evaluation keys: ``eval_strategy: no`` (TRL's default) turns policyzoo's held-out evaluation off
    (``data.eval_size=0``: no rows held out, none evaluated); ``steps`` evaluates every ``eval_steps``
    (:func:`_bookkeeping` sets ``train.eval_every``) on ``data.eval_size`` held-out rows, with
    ``num_generations_eval`` samples each at ``temperature``."""
    if r("eval_strategy") == "no":
        _set(r, tree, "data.eval_size", 0, "eval_strategy")
        port.notes.append("eval_strategy is no (TRL's default): no held-out evaluation (data.eval_size=0); for "
                          "one, set eval_strategy: steps and eval_steps, or data.eval_size=N on the command line")
        for key in ("eval_steps", "num_generations_eval", "per_device_eval_batch_size"):
            if key in r.given:
                port.ignored[key] = NO_EVAL
        return
    port.notes.append(f"eval_strategy is steps: policyzoo evaluates data.eval_size held-out rows (default 100) "
                      f"every {tree['train']['eval_every']} steps, and also before the first step and after the last")
    if r("num_generations_eval") is not None:
        _set(r, tree, "eval.n", r("num_generations_eval"), "num_generations_eval")
        _set(r, tree, "eval.temperature", r("temperature"), "temperature")
