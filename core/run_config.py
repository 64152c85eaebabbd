"""The run configuration (pydantic; unknown keys are rejected everywhere).

A config is YAML (``--config FILE``) or ``--algo NAME``, plus ``key=value`` overrides with dotted
keys (``train.lr=1e-6``, ``algorithm.clip.eps_high=0.28``). Every mistake becomes one
:class:`~policyzoo.errors.ConfigError` block: the key path, the reason, the fix, and close-match
suggestions for misspelled names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import yaml
from pydantic import Field

from policyzoo.data.data_section import DataSettings

from . import conventions, native_bf16, rules
from .config_sections import EngineSettings, EvalSettings, ModelSettings, Section, TrainSettings
from .errors import ConfigError, did_you_mean
from .resolve import entry_name, expand_entry


class Config(Section):
    algorithm: str | dict[str, Any] = Field("grpo", description="a zoo name or {base: NAME, SLOT: {use: ...}}")
    rewards: list[str | dict[str, Any]] | None = Field(None, description="task reward components "
                                                        "[{use: NAME, weight: w}]; null = the task's default")
    model: ModelSettings = ModelSettings()
    data: DataSettings = DataSettings()
    train: TrainSettings = TrainSettings()
    engine: EngineSettings = EngineSettings()
    eval: EvalSettings = EvalSettings()
    output_dir: str | None = Field(None, description="the run directory (null: runs/<algorithm>-<UTC time>)")
    #: set by the validator when it added ``engine.rollout_correction`` as ``algorithm.ratio`` (a resume's
    #: refusal says which of the keys that differ came from it)
    _correction_added: bool = pydantic.PrivateAttr(False)
    #: set by the validator when ``engine.rollout_dtype`` was ``auto`` (the start-up line says what it chose)
    _auto_rollout_dtype: bool = pydantic.PrivateAttr(False)

    @pydantic.field_validator("algorithm", mode="before")
    @classmethod
    def _entry(cls, value):
        """An entry (``grpo+clip=cispo``) as its mapping, also where a Config is built without :func:`validate`."""
        return expand_entry(value) if "+" in entry_name(value) else value

    @pydantic.model_validator(mode="after")
    def _cross_section_rules(self):
        """``engine.rollout_dtype: auto`` made concrete for this machine
        (:func:`policyzoo.native_bf16.auto_rollout_dtype`; the run directory records the dtype chosen, so a resume
        elsewhere samples the same), the rules across sections (:mod:`policyzoo.rules`, docs/config-rules.md), then
        the rollout correction: a rollout in another dtype than training gets ``engine.rollout_correction`` as the
        algorithm's ratio unless the algorithm sets one."""
        if self.engine.rollout_dtype == "auto":
            self.engine.rollout_dtype = native_bf16.auto_rollout_dtype(self.model.dtype, self.engine.rollout)
            self._auto_rollout_dtype = True
        rules.check_config(self)
        e, algo = self.engine, self.algorithm
        if e.rollout_dtype is not None and e.rollout_dtype != self.model.dtype and e.rollout_correction \
                and not (isinstance(algo, dict) and "ratio" in algo):
            base = {"base": algo} if isinstance(algo, str) else dict(algo)
            self.algorithm = {**base, "ratio": {"use": e.rollout_correction}}
            self._correction_added = True
        return self


#: keys a config may spell two ways (``data.use`` is ``data.name``): an override under either spelling replaces
#: the value under both, so a run's own config.yaml (which writes ``name``) takes ``data.use=...`` on resume
SPELLINGS = {"data.use": "name", "data.name": "use"}


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        if isinstance(node.get(p), str):  # algorithm: grpo  ->  {base: grpo}
            node[p] = {"base": node[p]}
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(key, f"{p!r} is not a section", "override a leaf key")
    if key in SPELLINGS:
        node.pop(SPELLINGS[key], None)
    node[parts[-1]] = value


def load_config(path: str | None = None, algo: str | None = None, overrides: list[str] = (),
                tree: dict[str, Any] | None = None) -> Config:
    """Read YAML (if any) or start from ``tree`` (a config mapping, e.g. a ported TRL config), apply
    ``--algo`` and ``key=value`` overrides, validate."""
    tree = dict(tree or {})
    if path:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(str(path), "is a directory, not a config file",
                              "pass a YAML file; to continue a run directory use --resume DIR")
        if not p.is_file():
            raise ConfigError(str(path), "config file not found", "check the path given to --config")
        try:
            tree = yaml.load(p.read_text(), Loader=_StrictLoader)
        except yaml.YAMLError as e:
            raise ConfigError(str(path), f"not valid YAML: {e}", "fix the YAML syntax") from None
        if tree is None or tree == {}:  # an empty file (or comments only) would train the full default run
            raise ConfigError(str(path), "the config file holds no settings (it is empty or only comments)",
                              "write the run's settings into it (e.g. `algorithm: grpo`), or drop --config and "
                              "use --algo NAME for the defaults")
        if not isinstance(tree, dict):
            raise ConfigError(str(path), "the top level must be a mapping", "write `key: value` lines")
    if algo:  # --algo names the base; slot overrides in the file are kept
        current = tree.get("algorithm")
        written = current.get("base") if isinstance(current, dict) else current
        if isinstance(written, str) and "+" in written and written != algo:  # a hybrid's changes would vanish
            raise ConfigError(f"{path or 'config'}: algorithm", f"the config's algorithm is the hybrid {written} "
                              f"and --algo names {algo}: --algo would replace it, dropping the hybrid's changes",
                              "drop --algo to train the config's hybrid, or write the algorithm you want in the "
                              "config")
        tree["algorithm"] = {**current, "base": algo} if isinstance(current, dict) else algo
    seen: dict[str, str] = {}  # the dotted keys the overrides set so far -> the override
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, "an override must look like key=value", "e.g. train.lr=1e-6")
        key, raw = item.split("=", 1)
        inside = [o for k, o in seen.items() if k.startswith(key.strip() + ".")]
        if inside:  # algorithm.kl.beta=0.01 then algorithm.kl=null: the first would vanish without a word
            raise ConfigError(key.strip(), f"{item!r} replaces the section that {inside[0]!r} set a key of, "
                              "so that override would be dropped",
                              f"give one of them: {inside[0]!r} or {item!r}")
        seen[key.strip()] = item
        try:
            value = yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError as e:
            raise ConfigError(key.strip(), f"the value {raw!r} is not valid YAML ({getattr(e, 'problem', e)})",
                              "values are read as YAML: close brackets and braces, and quote text with ':' "
                              "or '#' in it, e.g. 'data.system_prompt=\"Answer: a number\"'") from None
        _set_dotted(tree, key.strip(), value)
    return validate(tree, where=path or "config")


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key written twice in one mapping (YAML would keep the last)."""


def _no_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is written twice",
                                                    key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def validate(tree: dict, where: str = "config") -> Config:
    if "+" in entry_name(tree.get("algorithm")):
        tree = {**tree, "algorithm": expand_entry(tree["algorithm"])}
    algo = tree.get("algorithm")
    if isinstance(algo, dict) and "conventions" in algo and isinstance(tree.get("train", {}), dict):
        # algorithm.conventions also sets train.* convention keys the config does not set
        fill = conventions.train_defaults(conventions.check_name(algo["conventions"], "algorithm.conventions"))
        tree = {**tree, "train": {**fill, **(tree.get("train") or {})}}
    try:
        return Config.model_validate(tree)
    except pydantic.ValidationError as e:
        raise _to_config_error(e, tree, where) from None


def _to_config_error(e: pydantic.ValidationError, tree: dict, where: str) -> ConfigError:
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"] if not str(x).startswith(("function-", "str", "dict[", "constrained-"))]
    path = ".".join(loc)
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        model = field.annotation if field is not None else None
    fields = list(getattr(model, "model_fields", {}) or {})
    if not loc:  # a rule across sections (a model validator): its message names the keys and the fix
        why, _, fix = err["msg"].removeprefix("Value error, ").partition(": ")
        return ConfigError(where, why, fix)
    if err["type"] == "extra_forbidden":
        why = f"unknown key {loc[-1]!r}{did_you_mean(loc[-1], fields)}"
        fix = f"keys allowed here: {', '.join(fields)}" if fields else "remove it"
    elif err["type"] == "missing":
        why, fix = f"the required key {loc[-1]!r} is missing", f"set {path}"
    else:
        why = f"{err.get('input')!r}: {err['msg']}"
        info = getattr(model, "model_fields", {}).get(loc[-1]) if loc else None
        about = f" ({info.description})" if info is not None and info.description else ""
        fix = f"give {path} a valid value{about}; `policyzoo config` lists every key and its default"
        if err["type"].startswith("bool"):
            fix = f"give {path} true or false{about}"
        elif err["type"] == "string_type" and isinstance(err.get("input"), dict):  # `key=Answer: 5` read as YAML
            text = ", ".join(f"{k}: {v}" for k, v in err["input"].items())
            fix = f"values are read as YAML, so text with ': ' in it is a mapping: quote it, e.g. '{path}=\"{text}\"'"
    return ConfigError(path if where == "config" else f"{where}: {path}", why, fix)


def config_keys(model: type[pydantic.BaseModel] | None = None, prefix: str = "") -> list[tuple[str, str, str]]:
    """Every config key as ``(dotted key, default as YAML, description)``, in declaration order
    (what ``policyzoo config`` and ``policyzoo train --help`` print). ``algorithm`` slot parameters
    are per component: ``policyzoo explain NAME`` lists them."""
    out = []
    for name, field in (model or Config).model_fields.items():
        key = f"{prefix}{name}"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
            out += config_keys(ann, f"{key}.")
            continue
        default = yaml.safe_dump(field.default, default_flow_style=True).strip().removesuffix("...").strip()
        out.append((key, default, field.description or ""))
        if key == "algorithm":  # the one algorithm key that is no slot (policyzoo.conventions)
            out.append(("algorithm.conventions", "policyzoo", f"every convention switch set to a peer's default: "
                        f"{' | '.join(conventions.PRESETS)} (algorithm: {{base: grpo, conventions: trl}}; "
                        "docs/glossary.md, 'Conventions')"))
    return out


def config_help() -> str:
    """The table of :func:`config_keys`: one line per key, ``key = default  description``."""
    rows = config_keys()
    width = max(len(k) + len(d) for k, d, _ in rows) + 3
    return "\n".join(f"  {k} = {d}".ljust(width + 2) + f"  {desc}" for k, d, desc in rows)
