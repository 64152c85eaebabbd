"""The probe's verdicts in words: equal algorithms for ``policyzoo compare`` (:func:`equal_entries`), and for one
run its equality to its zoo base and its inert slots (:func:`run_warnings`, :func:`inert_slots`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from policyzoo.assembly import Run
from policyzoo.catalog import get_catalog
from policyzoo.contract import SLOTS, Bundle, use
from policyzoo.errors import ConfigError, DataError, UserError
from policyzoo.resolve import DEFAULT_ALGORITHM, resolve_algorithm
from policyzoo.run_config import Config

from .batches import Regime, probe_batches, regime, task_reward_classes
from .gradient import RTOL, Probe, build_run, components, filters, probe, same

#: what a slot is when it does nothing but pass the policy gradient: r = exp(logprobs - old_logprobs)
#: and the unclipped surrogate -A r (plain REINFORCE); a ratio or clip that gives their gradient is inert
NEUTRAL = {"ratio": "token", "clip": "none"}
#: slots the probe cannot evaluate on synthetic batches: two algorithms must hold the same components there
UNPROBED = ("sample", "env", "reward")


def _describe(comps: list[tuple[str, dict]], other: list[tuple[str, dict]]) -> str:
    """``ppo_clip`` or, beside the same component, the parameters that differ: ``ppo_clip(eps_high=0.2)``."""
    if not comps:
        return "none"
    parts = []
    for i, (name, params) in enumerate(comps):
        twin = other[i][1] if i < len(other) and other[i][0] == name else None
        diff = {k: v for k, v in params.items() if twin is not None and twin.get(k) != v}
        parts.append(name + (f"({', '.join(f'{k}={v}' for k, v in diff.items())})" if diff else ""))
    return ", ".join(parts)


def differing_slots(a: Run, b: Run) -> list[tuple[str, str, str]]:
    """``[(slot, a's components, b's components)]`` for every slot where they differ."""
    ca, cb = components(a), components(b)
    return [(s, _describe(ca[s], cb[s]), _describe(cb[s], ca[s])) for s in SLOTS if ca[s] != cb[s]]


@dataclass
class Probed:
    """One algorithm probed: its ``bundle``, the ``run`` built from it, the ``regime`` and its ``probes``."""

    bundle: Bundle
    run: Run
    regime: Regime
    probes: list[Probe]


def _each(run: Run, slot: str) -> list:
    v = getattr(run, slot)
    return v if isinstance(v, list) else [] if v is None else [v]


def equal(a: Probed, b: Probed) -> bool:
    """``a`` and ``b`` make the same training at their (equal) regime: the slots the probe cannot evaluate
    (:data:`UNPROBED`) hold the same components; no differing slot holds a component that keeps state
    across steps or a critic (``needs_values``: its own loss is not probed); where the filters differ, none
    drops a row (a filter that drops may resample, which the probe does not follow); and every batch keeps
    the same rows with gradients within RTOL (:func:`~policyzoo.equivalence.gradient.same`)."""
    if a.regime != b.regime or any(getattr(a.bundle, s) != getattr(b.bundle, s) for s in UNPROBED):
        return False
    ca, cb = components(a.run), components(b.run)
    differ = [s for s in SLOTS if ca[s] != cb[s]]
    if not differ:
        return True
    for s in differ:
        comps = _each(a.run, s) + _each(b.run, s)
        if any(c.stateful or getattr(c, "needs_values", False) for c in comps):
            return False
    if "filter" in differ and not all(bool(p.keep.all()) for p in a.probes + b.probes):
        return False
    return same(a.probes, b.probes)


def probed(bundle: Bundle, config, reward_classes: list) -> Probed:
    """``bundle`` built and probed at the regime of ``config`` with the run's reward components."""
    run = build_run(bundle)
    r = regime(config, run, reward_classes)
    return Probed(bundle, run, r, probe(run, r))


def why_inert(slot: str, r: Regime, runs: tuple[Run, ...] = ()) -> tuple[str, str]:
    """Why a slot's difference does nothing in regime ``r`` (between ``runs``, when given), and how to make
    it act: a ratio or clip when every ratio is 1, a KL at beta 0, terms at coefficient 0, filters that
    drop nothing; otherwise only that both give the same gradient here."""
    if slot in NEUTRAL and r.first_update_only:
        return ("every ratio is 1 on the first update",
                f"set train.updates_per_batch >= 2 (or engine.max_staleness >= 1) for the {slot} to act")
    if slot == "kl" and all(run.kl is None or run.kl.beta == 0 for run in runs):
        return ("a KL with beta 0 adds nothing to the loss or the rewards", "set algorithm.kl.beta > 0 for it to act")
    if slot == "term" and all(t.coef == 0 for run in runs for t in run.term):
        return ("a term with coefficient 0 adds nothing", "set the term's coef for it to act")
    if slot == "filter":
        return (f"no filter drops a row at these settings ({' and '.join(r.rewards)} rewards, G={r.n})",
                "a filter acts only where it can drop rows")
    return ("both give the same gradient here", "change a setting that separates them")


def equal_message(a: str, b: str, ra: Run, rb: Run, r: Regime) -> tuple[str, str]:
    """``(why, fix)`` for two equal algorithms named ``a`` and ``b`` (``a`` the later one): each differing
    slot's reason once (slots inert for the same reason named together: "the ratio and clip"), and each
    reason's fix (gspo vs grpo+kl.beta=0 at one update: the KL's beta and the updates per batch)."""
    slots = differing_slots(ra, rb)
    reasons: dict[str, tuple[str, list[str]]] = {}  # why -> (the first slot's fix, the slots it covers)
    for s, _, _ in slots:
        why, fix = why_inert(s, r, (ra, rb))
        reasons.setdefault(why, (fix, []))[1].append(s)
    whys, fixes = list(reasons) or ["they give the same gradient"], []
    for fix, named in reasons.values():
        names = " and ".join(named)
        if fix:
            fixes.append(fix.replace(f"the {named[0]} to act", f"the {names} to act")
                         .replace("for it to act", f"for the {names} to act"))
    detail = "; ".join(f"{s}: {x} vs {y}" for s, x, y in slots)
    why = (f"{a} equals {b} at {r.keys} ({'; '.join(whys)}): {detail} give the same gradient d(loss)/d(logprobs) "
           f"(to {RTOL:g}, relative) on {len(probe_batches(r))} synthetic batches of these settings")
    return why, "; or ".join(fixes)


def equal_pairs(entries: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(entry, other, why, fix)`` for each entry of ``entries`` (name -> its config, a
    :class:`~policyzoo.run_config.Config` or its dump) whose gradient probe equals an earlier entry's
    (:func:`equal`), ``why`` and ``fix`` the texts of :func:`equal_message`. Raises what the probe raises (a
    component that refuses synthetic batches, data that does not load)."""
    probes: list[tuple[str, Probed]] = []
    tasks: dict = {}  # the data task's default rewards, loaded once per data setting
    out = []
    for entry, config in entries.items():
        config = config if isinstance(config, Config) else Config.model_validate(config)
        bundle = resolve_algorithm(config.algorithm)
        mine = probed(bundle, config, task_reward_classes(config, bundle, tasks))
        for other, theirs in probes:
            if equal(mine, theirs):
                out.append((entry, other, *equal_message(entry, other, mine.run, theirs.run, mine.regime)))
                break
        probes.append((entry, mine))
    return out


def equal_entries(entries: dict[str, Any], allow_equal: bool = False) -> list[str]:
    """``policyzoo compare``'s check before anything runs: ``entries`` maps each entry of ``--algos`` to
    its planned config (a :class:`~policyzoo.run_config.Config` or its dump). Raises :class:`ConfigError`
    (exit 2) naming the equal pairs (:func:`equal_pairs`), the slot that differs, why it is inert and the fix,
    unless ``allow_equal``; then returns the same lines as notes. A probe that fails on a component returns its
    note; data that does not load (:class:`DataError`, as ``train --dry-run`` gives it) is raised: the runs would
    stop on it too."""
    try:
        pairs = equal_pairs(entries)
    except DataError:  # the run's own data does not load: the run would stop on it too, so a refusal, not a note
        raise
    except Exception as e:  # noqa: BLE001 - a component that refuses synthetic batches: no claim, never a stop
        return [f"note: the equality probe claims nothing: {_failure(e)}"]
    lines, fixes = [why for _, _, why, _ in pairs], [fix for _, _, _, fix in pairs]
    if lines and not allow_equal:
        raise ConfigError("--algos " + ",".join(entries), "; ".join(lines) + ": their runs would measure noise",
                          "; ".join(dict.fromkeys(f for f in fixes if f)) + "; or drop one of them, or pass "
                          "--allow-equal to run them anyway")
    return [f"note: {line}" for line in lines]


def probe_failure(e: Exception) -> str:
    """The one line of a probe that claims nothing because ``e`` was raised."""
    return f"the equality probe claims nothing: {_failure(e)}"


def _failure(e: Exception) -> str:
    return f"{e.where}: {e.why}" if isinstance(e, UserError) else f"{type(e).__name__}: {e}"


def run_warnings(config, bundle: Bundle, reward_classes: list) -> list[str]:
    """The lines for ``train --dry-run``, the run's start-up warnings and ``explain``: the run equals
    its zoo base (``algorithm.base``) at these settings, and each slot whose component is an identity
    here (:func:`inert_slots`). A probe that fails gives one line saying so instead."""
    try:
        mine = probed(bundle, config, reward_classes)
        out = []
        base_name = _base_name(config)
        base_bundle = get_catalog().bundle(base_name)
        if base_bundle != bundle:
            base = build_run(base_bundle)
            theirs = Probed(base_bundle, base, mine.regime, probe(base, mine.regime))
            if components(base) != components(mine.run) and equal(mine, theirs):
                why, fix = equal_message(bundle.name, base_name, mine.run, base, mine.regime)
                out.append(f"{why}: {fix}" if fix else why)
        return out + inert_slots(bundle, mine.regime, mine.run, mine.probes)
    except Exception as e:  # noqa: BLE001 - a component that refuses synthetic batches: no claim, never a stop
        return [f"the equality probe claims nothing: {_failure(e)}"]


def _base_name(config) -> str:
    """The zoo bundle a run's ``algorithm`` names (``algorithm.base``, or the name itself)."""
    algo = config.algorithm
    return algo if isinstance(algo, str) else (algo or {}).get("base", DEFAULT_ALGORITHM)


def notes_and_warnings(config, bundle: Bundle, lines: list[str]) -> tuple[list[str], list[str]]:
    """``(notes, warnings)`` of :func:`run_warnings`' ``lines``: a line on a slot the run holds as its zoo
    bundle does (with the ratio the engine adds for its sampler, ``engine.rollout_correction``) is a note,
    the bundle's own design (grpo's clip at one update per batch is its paper's setting); a line on a slot
    the user changed, the run equal to its base, or a probe that claims nothing is a warning."""
    try:
        base = get_catalog().bundle(_base_name(config))
        if getattr(config, "_correction_added", False):
            base = base.replace(ratio=use(config.engine.rollout_correction))
    except Exception:  # noqa: BLE001 - an unknown base was refused before; no claim here
        return [], list(lines)
    notes, warns = [], []
    for line in lines:
        slot = line.split(":", 1)[0]
        own = slot in SLOTS and slot not in ("sample", "reward", "env") and getattr(bundle, slot) == getattr(base, slot)
        (notes if own else warns).append(line)
    return notes, warns


def inert_slots(bundle: Bundle, r: Regime, run: Run | None = None, mine: list[Probe] | None = None) -> list[str]:
    """One line per slot whose component does nothing at regime ``r``: a ``ratio`` or ``clip`` that gives
    the gradient of :data:`NEUTRAL`'s component (every ratio is 1 on the first update), a ``kl`` or a
    ``term`` whose removal leaves the gradient unchanged (beta 0, coefficient 0), a ``filter`` that keeps
    every row of every batch. Components that keep state across steps are left out (they may act later)."""
    run = run or build_run(bundle)
    batches = probe_batches(r)
    mine = mine or probe(run, r, batches)
    out = []
    for slot, name in NEUTRAL.items():
        comp = getattr(run, slot)
        if comp.name != name and not comp.stateful and same(mine, probe(build_run(bundle.replace(**{slot: use(name)})),
                                                                          r, batches)):
            out.append(f"{slot}: {comp.name} acts only from the second update: {why_inert(slot, r)[0]} and it "
                       f"gives the gradient of `{slot}: {name}`; {why_inert(slot, r)[1]}"
                       if r.first_update_only else
                       f"{slot}: {comp.name} gives the gradient of `{slot}: {name}` at {r.keys}")
    if run.kl is not None and not run.kl.stateful and same(mine, probe(build_run(bundle.replace(kl=None)), r, batches)):
        out.append(f"kl: {run.kl.name} (beta={run.kl.beta:g}) adds nothing to the gradient at these settings: the "
                   "reference model is scored for nothing; set algorithm.kl.beta > 0 for it to act, or "
                   "algorithm.kl=null to skip it")
    for i, comp in enumerate(run.term):
        rest = bundle.term[:i] + bundle.term[i + 1:]
        if not comp.stateful and same(mine, probe(build_run(bundle.replace(term=rest)), r, batches)):
            out.append(f"term: {comp.name} (coef={comp.coef:g}) adds nothing to the gradient at these settings; "
                       "set its coef for it to act, or remove it")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        masks = [[k for _, k in filters(run, b)] for b in batches]  # [batch][filter]
        kept = [all(bool(m[i].all()) for m in masks) for i in range(len(run.filter))]
    for comp, all_kept in zip(run.filter, kept):
        if all_kept and not comp.stateful:
            out.append(f"filter: {comp.name} cannot drop a row at these settings ({' and '.join(r.rewards)} "
                       f"rewards, G={r.n}): it only costs its calls")
    return out
