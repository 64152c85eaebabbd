"""Assembly: a resolved bundle into a checked :class:`Run`, its chosen components in their own plugin manager.

Each component's parameters are validated into its typed ``Params`` here, once (:func:`build`), and the
component receives that object. The run manager registers only the chosen components, one per single
slot, and is checked (slot counts and each component's cross-slot ``check``) before anything loads a model.
pluggy's ``firstresult`` would silently take the last registered implementation, so which component runs
is decided here, never by hook order. Resolving a spec is :mod:`policyzoo.resolve`. What a run takes
from its config besides the algorithm is here too: the task's reward uses (``rewards:``, :func:`reward_uses`)
and the step's settings (``train.*`` over the filters' own budget, :func:`step_settings`).
"""

from __future__ import annotations

import functools
import os
import sys

import pluggy

from .catalog import Catalog, get_catalog
from .contract import (
    KL,
    PROJECT,
    SLOTS,
    Baseline,
    Bundle,
    Clip,
    Component,
    Env,
    Filter,
    Ratio,
    Reduce,
    Reward,
    Sample,
    Spec,
    Term,
    Use,
    use,
    validate_params,
)
from .contract.components import override
from .errors import ConfigError
from .resolve import resolve_algorithm
from .step import StepSettings

__all__ = ["Run", "assemble", "build", "reward_uses", "step_settings"]
SINGLE = [s for s, kind in SLOTS.items() if kind == "single"]
COLLECT = [s for s, kind in SLOTS.items() if kind == "collect"]
OPTIONAL = [s for s, kind in SLOTS.items() if kind == "optional"]


class Run:
    """The chosen components of one training run, registered in their own plugin manager.

    Typed slot attributes: ``sample``, ``baseline``, ``ratio``, ``clip``, ``reduce`` (one component
    each), ``kl`` and ``env`` (one or None), ``reward``, ``filter`` and ``term`` (lists, the task's rewards
    first);
    ``reward_labels`` (the metric key of each reward, unique); ``bundle``; ``hook`` (the pluggy
    relay); ``sources`` ``{slot: "name from dist version"}``; ``trace`` (``POLICYZOO_TRACE``). The step
    calls the hooks itself (:mod:`policyzoo.step.dispatch`)."""

    sample: Sample
    env: Env | None
    reward: list[Reward]
    filter: list[Filter]
    kl: KL | None
    baseline: Baseline
    ratio: Ratio
    clip: Clip
    term: list[Term]
    reduce: Reduce

    def __init__(self, bundle: Bundle, catalog: Catalog | None = None,
                 rewards: tuple[Use, ...] = (), where: str = "algorithm"):
        catalog = catalog or get_catalog()
        self.bundle = bundle
        self.sources: dict[str, str] = {}
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(Spec)
        one = functools.partial(self._one, catalog, bundle, where)
        self.sample = one("sample")
        self.env = None if bundle.env is None else one("env")
        self.reward = [self._make(catalog, "reward", u, f"rewards[{i}]") for i, u in enumerate(rewards)]
        self.reward += [self._make(catalog, "reward", u, f"{where}.reward[{i}]") for i, u in enumerate(bundle.reward)]
        self.filter = [self._make(catalog, "filter", u, f"{where}.filter[{i}]") for i, u in enumerate(bundle.filter)]
        self.kl = None if bundle.kl is None else one("kl")
        self.baseline = one("baseline")
        self.ratio = one("ratio")
        self.clip = one("clip")
        self.term = [self._make(catalog, "term", u, f"{where}.term[{i}]") for i, u in enumerate(bundle.term)]
        self.reduce = one("reduce")
        self.reward_labels = _unique([c.label for c in self.reward])
        self.hook = self.pm.hook
        self.trace = os.environ.get("POLICYZOO_TRACE", "") not in ("", "0")
        if self.trace:
            self.pm.trace.root.setwriter(lambda msg: sys.stderr.write(f"[policyzoo trace] {msg}"))
            self.pm.enable_tracing()
        self.check()

    @property
    def max_response_tokens(self) -> int:
        """The response token limit L_max of this run: the env's ``max_total_tokens`` (the whole
        trajectory after the prompt) with an env, else the sampler's ``max_tokens``."""
        return self.env.params.max_total_tokens if self.env is not None else self.sample.params.max_tokens

    def _one(self, catalog: Catalog, bundle: Bundle, where: str, slot: str) -> Component:
        chosen = getattr(bundle, slot)
        if not isinstance(chosen, Use):
            raise ConfigError(f"{where}.{slot}", f"no {slot} component", "name one with `use:`")
        return self._make(catalog, slot, chosen, f"{where}.{slot}")

    def _make(self, catalog: Catalog, slot: str, u: Use, where: str) -> Component:
        cls = catalog.component(slot, u.name, f"{where}.use")
        comp = build(cls, u.params, where)
        self.pm.register(comp, name=f"{slot}:{u.name}:{id(comp)}")
        src = catalog.components[slot][u.name][1]
        self.sources[slot] = (self.sources[slot] + ", " if slot in self.sources else "") + f"{u.name} from {src}"
        return comp

    def components(self) -> list[Component]:
        out: list[Component] = []
        for slot in SLOTS:
            v = getattr(self, slot)
            out.extend(v if isinstance(v, list) else ([] if v is None else [v]))
        return out

    def stateful(self) -> dict[str, Component]:
        """``{key: component}`` of the components that keep state: ``slot:name`` for a single slot,
        ``slot[i]:name`` for the i-th of a collect slot (the keys of a checkpoint's ``components``)."""
        out: dict[str, Component] = {}
        for slot in SLOTS:
            v = getattr(self, slot)
            items = list(enumerate(v)) if isinstance(v, list) else ([] if v is None else [(None, v)])
            for i, comp in items:
                if comp.stateful:
                    out[f"{slot}:{comp.name}" if i is None else f"{slot}[{i}]:{comp.name}"] = comp
        return out

    def state_dict(self) -> dict[str, dict]:
        """Every stateful component's ``state_dict()`` by :meth:`stateful` key (JSON values)."""
        return {key: comp.state_dict() for key, comp in self.stateful().items()}

    def load_state_dict(self, states: dict[str, dict], where: str = "checkpoint") -> None:
        """Restore what :meth:`state_dict` saved. A stateful component with no saved state (a
        checkpoint written before it kept any) or a saved state with no component raises
        :class:`ConfigError`: the run would silently restart the controller otherwise."""
        mine = self.stateful()
        for key in sorted(set(mine) ^ set(states)):
            why = (f"the component {key} keeps state but the checkpoint holds none for it" if key in mine
                   else f"the checkpoint holds the state of {key}, which this run does not have")
            raise ConfigError(f"{where}.components", why, "resume with the algorithm the checkpoint was "
                              "written with (`--resume RUN_DIR` alone)")
        for key, comp in mine.items():
            comp.load_state_dict(states[key])

    def check(self) -> None:
        """Exactly one implementation per single slot, then every component's own ``check``."""
        for slot in SINGLE + OPTIONAL:
            n = len(getattr(self.pm.hook, slot).get_hookimpls())
            if n > 1 or (n == 0 and slot not in OPTIONAL):
                raise ConfigError(f"algorithm.{slot}", f"{n} components implement the single slot {slot!r}",
                                  "choose exactly one component per single slot")
        if self.env is not None and "env" not in self.pm.hook.sample.get_hookimpls()[0].argnames:
            raise ConfigError("algorithm.sample", f"the sample component {self.sample.name!r} takes no `env`, so "
                              f"it cannot drive the environment {self.env.name!r}",
                              "use the `group` sampler (or one whose sample() takes env), or remove algorithm.env")
        for comp in self.components():
            comp.check(self)


def _unique(labels: list[str]) -> list[str]:
    """``["function", "function", "a"]`` -> ``["function", "function_2", "a"]``."""
    out: list[str] = []
    for label in labels:
        k, new = 1, label
        while new in out:
            k += 1
            new = f"{label}_{k}"
        out.append(new)
    return out


def build(cls: type[Component], params: dict, where: str) -> Component:
    """The component ``cls`` with ``params`` validated into its typed ``cls.Params`` once, here; the
    component receives that object (:meth:`Component.__init__`'s ``_params``) and does not validate again.
    Raises :class:`ConfigError` at ``where.KEY`` for an unknown, missing or out-of-range parameter."""
    return cls(_params=validate_params(cls, params, where))


def assemble(spec: str | dict | Bundle, rewards: tuple[Use, ...] = (), catalog: Catalog | None = None) -> Run:
    """Resolve ``spec`` and build a checked :class:`Run` (no model is loaded)."""
    catalog = catalog or get_catalog()
    return Run(resolve_algorithm(spec, catalog), catalog, rewards)


# ----------------------------------------------------------------------------- what a run takes from its config
def step_settings(config, run) -> StepSettings:
    """The step's settings: the config's ``train`` values over the run's filters' own budget."""
    return StepSettings.for_run(run, max_sample_rounds=config.train.max_sample_rounds,
                                updates_per_batch=config.train.updates_per_batch,
                                micro_batches=config.train.micro_batches, on_shortfall=config.train.on_shortfall,
                                reward_nan=config.train.reward_nan,
                                max_tokens_per_micro_batch=config.train.max_tokens_per_micro_batch)


def reward_uses(config, default: list, has_env: bool = False) -> tuple:
    """``rewards:`` entries as :class:`~policyzoo.contract.Use`; when not given, the task's ``default`` --
    or, in a run with an environment (``has_env``), the episode reward ``env_reward``."""
    if config.rewards is None:
        return (use("env_reward"),) if has_env else tuple(default)
    if not config.rewards:
        raise ConfigError("rewards", "the list is empty: every advantage would be 0 and nothing would be learned",
                          "name at least one reward, e.g. `rewards: [{use: answer_match}]`, or drop the key "
                          "for the task's default")
    return tuple(override(None, r, f"rewards[{i}]") for i, r in enumerate(config.rewards))
