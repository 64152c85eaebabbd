"""Which algorithms are the same at a run's settings: a gradient probe, before anything runs.

With one optimizer step per sampled batch (``train.updates_per_batch: 1``, no stale batches) every
ratio is exactly 1, so no clip and no ratio acts: ``grpo`` and ``grpo+clip=cispo`` make the same
update (at r = 1, PPO's clip gives the gradient -A grad log pi, CISPO's -sg(min(r, eps_max)) A
grad log pi = -A grad log pi), and a compare of the two measures noise. The probe finds this from
the step's own code: for each algorithm it computes the gradient of the loss with respect to the
log-probs, d(loss)/d(logprobs) ``[B, T]`` (and d(loss)/d(entropy) when a ``term`` reads the entropy),
through :func:`policyzoo.step.prepare` (``kl`` in reward placement, ``baseline``) and
:func:`policyzoo.step.micro_loss` (``ratio``, ``clip``, ``kl`` in loss placement, ``term``, ``reduce``)
on a few synthetic batches that follow the run's regime (:class:`Regime`, :func:`probe_batches`);
the ``filter`` components are asked which rows they keep on the same batches. Two algorithms are
*equal* when every batch keeps the same rows and the gradients agree to :data:`RTOL` (relative to
the larger gradient's largest entry). Slots that cannot be probed on synthetic batches (``sample``,
``reward``, ``env``) and components that keep state across steps must be the same for a claim.

* :func:`equal_entries`: ``policyzoo compare`` refuses entries that are equal (unless ``--allow-equal``);
* :func:`run_warnings`: ``train --dry-run``, the run's start-up warnings and ``explain``: the run equals
  its zoo base, or one slot's component is an identity at these settings (a clip at ratio 1, a KL at
  beta 0, a filter that cannot drop, a term with coefficient 0).

A probe that fails on a component (a third-party component that refuses synthetic data) claims
nothing and says so in one line; it never stops a run. Imports: contract, step and the building of
a run only (no engine): it takes seconds on a CPU (B = P x G rows, T <= 8 tokens).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from .assembly import Run
from .catalog import get_catalog
from .config import Config
from .contract import SLOTS, Bundle, Rollout, StepBatch, use
from .data import load_task
from .errors import ConfigError, UserError
from .resolve import DEFAULT_ALGORITHM, resolve_algorithm
from .run_config import reward_uses
from .step import dispatch, micro_loss, needs_reference, prepare, step_totals

#: two gradients agree when max|g_a - g_b| <= RTOL x max(max|g_a|, max|g_b|) (+ ATOL for two zeros)
RTOL, ATOL = 1e-6, 1e-12
#: what a slot is when it does nothing but pass the policy gradient: r = exp(logprobs - old_logprobs)
#: and the unclipped surrogate -A r (plain REINFORCE); a ratio or clip that gives their gradient is inert
NEUTRAL = {"ratio": "token", "clip": "none"}
#: slots the probe cannot evaluate on synthetic batches: two algorithms must hold the same components there
UNPROBED = ("sample", "env", "reward")
WIDTH = 8  # response tokens of a probe batch (at most the run's limit)
PROMPTS = 4  # prompts of a probe batch (G rows each; 8 rows at least)
BATCHES = 2  # batches per kind (first update, later update, stale)


@dataclass(frozen=True)
class Regime:
    """What the probe's batches follow: the group size ``n`` (``algorithm.sample.n``), the updates per
    batch, whether batches arrive stale (``engine.max_staleness`` > 0 or ``engine.overlap: one_step``),
    the reward kinds (``binary``: 0/1 correctness with some constant groups; ``continuous``: real
    scores), and the response width ``width`` (tokens)."""

    n: int
    updates_per_batch: int = 1
    stale: bool = False
    rewards: tuple[str, ...] = ("binary",)
    width: int = WIDTH
    keys: str = "train.updates_per_batch=1"  # the settings as the user wrote them, for the messages

    @property
    def first_update_only(self) -> bool:
        """Every batch is trained on once, on-policy: every ratio is exactly 1."""
        return self.updates_per_batch == 1 and not self.stale


def regime(config, run: Run, reward_classes: list) -> Regime:
    """The regime of ``config`` for the assembled ``run`` with the run's reward components (classes or
    instances): a reward declaring ``binary = True`` is a 0/1 correctness score, ``binary = False`` a
    continuous one; when they do not all declare the same, both kinds of batches are probed."""
    kinds = {getattr(c, "binary", None) for c in reward_classes}
    rewards = ("binary",) if kinds == {True} else ("continuous",) if kinds == {False} else ("binary", "continuous")
    e = config.engine
    stale = e.max_staleness > 0 or e.overlap == "one_step"
    keys = [f"train.updates_per_batch={config.train.updates_per_batch}"]
    keys += [f"engine.max_staleness={e.max_staleness}"] if e.max_staleness else []
    keys += ["engine.overlap=one_step"] if e.overlap == "one_step" else []
    n = int(getattr(run.sample.params, "n", 1))
    width = max(1, min(WIDTH, int(run.max_response_tokens or WIDTH)))
    return Regime(n, config.train.updates_per_batch, stale, rewards, width, ", ".join(keys))


@dataclass
class ProbeBatch:
    """One synthetic batch: ``rollout`` (``response_mask [B, T]``, ``rollout_logprobs``, ``group_ids [B]``,
    ``truncated [B]``), ``rewards [B]``, the live ``logprobs [B, T]`` (float64, nats), ``old_logprobs``
    (None: the first update, on-policy), ``ref_logprobs``, ``values``, ``entropy``, ``sum_pi_squared``
    ``[B, T]`` and ``kind`` (first update, later update, stale)."""

    rollout: Rollout
    rewards: Tensor
    logprobs: Tensor
    old_logprobs: Tensor | None
    ref_logprobs: Tensor
    values: Tensor
    entropy: Tensor
    sum_pi_squared: Tensor
    kind: str = "first update"


def probe_batches(r: Regime, seed: int = 0) -> list[ProbeBatch]:
    """The batches of regime ``r`` (the same for every algorithm: a fixed seed): for each reward kind,
    :data:`BATCHES` first updates (``old_logprobs`` None, so the step's ratio is exactly 1), and when
    ``r.updates_per_batch`` > 1 later updates (``old_logprobs`` the log-probs at sampling time, the
    live ones moved by 1e-4 to 1 nats per row) and when ``r.stale`` stale batches (``old_logprobs``
    the sampler's, ``policy_lag`` 1). The sampler's log-probs differ from the trainer's by ~0.02 nats
    in every batch (the rollout/trainer mismatch of any real engine), the reference's by ~0.3."""
    g = torch.Generator().manual_seed(seed)
    kinds = ["first update"] + (["later update"] if r.updates_per_batch > 1 else []) + (["stale"] if r.stale else [])
    return [_batch(r, reward, kind, g) for reward in r.rewards for kind in kinds for _ in range(BATCHES)]


def _batch(r: Regime, reward: str, kind: str, g: torch.Generator) -> ProbeBatch:
    G, T = r.n, r.width
    P = max(PROMPTS, -(-8 // G))
    B = P * G
    noise = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[G - 1] = T  # a full-length row of the first group stops at the limit: truncated
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    truncated = torch.zeros(B, dtype=torch.bool)
    truncated[G - 1] = True
    group_ids = torch.arange(P).repeat_interleave(G)
    if reward == "binary":  # group 0 all right, group 1 all wrong (constant), the others mixed
        rewards = (torch.rand(B, generator=g) < 0.5).float()
        for p in range(P):
            rows = slice(p * G, (p + 1) * G)
            rewards[rows] = 1.0 if p == 0 else 0.0 if p == 1 else rewards[rows]
            if p > 1 and G > 1:
                rewards[p * G], rewards[p * G + 1] = 1.0, 0.0
    else:
        rewards = torch.randn(B, generator=g).float()
    zero = torch.zeros(B, T, dtype=torch.float64)
    lp0 = torch.where(mask, -0.05 - 3 * torch.rand(B, T, generator=g, dtype=torch.float64), zero)
    sampler = torch.where(mask, lp0 + 0.02 * noise(B, T), zero)
    scale = torch.tensor([1e-4, 0.05, 0.3, 1.0], dtype=torch.float64)[torch.arange(B) % 4].unsqueeze(1)
    moved = torch.where(mask, lp0 + scale * noise(B, T), zero)
    live, old = {"first update": (lp0, None), "later update": (moved, lp0), "stale": (moved, sampler)}[kind]
    rollout = Rollout([[1]] * B, torch.ones(B, T, dtype=torch.long), mask, sampler.float(), group_ids, truncated,
                      max_tokens=T, policy_lag=torch.full((B,), int(kind == "stale")))
    return ProbeBatch(rollout, rewards, live, old, torch.where(mask, lp0 + 0.3 * noise(B, T), zero),
                      noise(B, T), 0.1 + 2 * torch.rand(B, T, generator=g, dtype=torch.float64),
                      0.05 + 0.5 * torch.rand(B, T, generator=g, dtype=torch.float64), kind)


@dataclass
class Probe:
    """What one algorithm does with one batch: ``keep [B]`` rows (and ``tokens [B, T]``) its filters
    keep, and its gradient ``grad [B, T]`` d(loss)/d(logprobs) (0 on dropped rows), ``grad_entropy``."""

    keep: Tensor
    tokens: Tensor
    grad: Tensor
    grad_entropy: Tensor


def filters(run: Run, b: ProbeBatch) -> list[tuple[Any, Tensor]]:
    """Each filter component of ``run`` with its keep mask ``[B]`` or ``[B, T]`` on ``b``."""
    if not run.filter:
        return []
    rows, width = b.rollout.response_mask.shape
    return [(comp, out.keep) for comp, out in dispatch.call_each(run, "filter", rows=rows, width=width,
                                                                 rollout=replace(b.rollout), rewards=b.rewards)]


def gradient(run: Run, b: ProbeBatch, updates_per_batch: int = 1) -> Probe:
    """The step's gradient for ``run`` on ``b`` (see the module docstring): the filters' masks, then
    :func:`~policyzoo.step.prepare` and :func:`~policyzoo.step.micro_loss` on the kept rows, one
    micro-batch, the whole step's totals. ``updates_per_batch`` decides, as the step does, whether the
    trainer's log-probs at sampling time reach the baseline and a KL in reward placement."""
    mask = b.rollout.response_mask
    keep, tokens = torch.ones(len(b.rewards), dtype=torch.bool), mask.clone()
    for _, k in filters(run, b):
        if k.dim() == 2:
            tokens &= k
        else:
            keep &= k
    lp = b.logprobs.clone().requires_grad_(True)
    ent = b.entropy.clone().requires_grad_(True)
    grad, grad_ent = torch.zeros_like(lp), torch.zeros_like(ent)
    if keep.any():
        rollout = replace(b.rollout, response_mask=tokens).select(keep)
        pick = lambda x: None if x is None else x[keep]  # noqa: E731
        kl_reward = run.kl is not None and run.kl.params.placement == "reward"
        pi2 = run.baseline.needs_pi_squared
        scored = pick(b.logprobs) if updates_per_batch > 1 or kl_reward or pi2 else None
        batch = StepBatch(rollout, b.rewards[keep], old_logprobs=pick(b.old_logprobs),
                          ref_logprobs=pick(b.ref_logprobs) if needs_reference(run) else None,
                          values=pick(b.values) if run.baseline.needs_values else None,
                          greedy_rewards=b.rewards[keep].flip(0) if getattr(run.sample.params, "greedy", False)
                          else None, sum_pi_squared=pick(b.sum_pi_squared) if pi2 else None)
        batch, _ = prepare(run, batch, scored)
        loss, _ = micro_loss(run, batch, lp[keep], step_totals(batch), ent[keep])
        found = torch.autograd.grad(loss, [lp, ent], allow_unused=True)
        grad = found[0] if found[0] is not None else grad
        grad_ent = found[1] if found[1] is not None else grad_ent
    return Probe(keep, tokens, grad.detach(), grad_ent.detach())


def _close(a: Tensor, b: Tensor) -> bool:
    scale = max(float(a.abs().max()), float(b.abs().max())) if a.numel() else 0.0
    return a.numel() == 0 or float((a - b).abs().max()) <= RTOL * scale + ATOL


def same(a: list[Probe], b: list[Probe]) -> bool:
    """Two algorithms' probes on the same batches agree: the same rows and tokens kept, gradients within RTOL."""
    return all(torch.equal(x.keep, y.keep) and torch.equal(x.tokens, y.tokens) and _close(x.grad, y.grad)
               and _close(x.grad_entropy, y.grad_entropy) for x, y in zip(a, b, strict=True))


def probe(run: Run, r: Regime, batches: list[ProbeBatch] | None = None) -> list[Probe]:
    """:func:`gradient` of ``run`` on every batch of ``r`` (under a fixed torch seed, the global one kept)."""
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        return [gradient(run, b, r.updates_per_batch) for b in (batches or probe_batches(r))]


def _build(bundle: Bundle) -> Run:
    with warnings.catch_warnings():  # a component's check warns once, in the real run; not for each variant
        warnings.simplefilter("ignore")
        return Run(bundle)


def components(run: Run) -> dict[str, list[tuple[str, dict]]]:
    """Each slot's components as ``[(name, parameters)]``."""
    out = {}
    for slot in SLOTS:
        comps = getattr(run, slot)
        comps = comps if isinstance(comps, list) else ([] if comps is None else [comps])
        out[slot] = [(c.name, json.loads(json.dumps(c.params.model_dump(), default=str))) for c in comps]
    return out


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


def _comparable(a: Run, b: Run) -> bool:
    """The slots the probe cannot evaluate are the same, and no differing component keeps state."""
    ca, cb = components(a), components(b)
    if any(ca[s] != cb[s] for s in UNPROBED):
        return False
    stateful = lambda run, s: any(c.stateful for c in (getattr(run, s) if isinstance(getattr(run, s), list)  # noqa: E731
                                                      else [getattr(run, s)] if getattr(run, s) else []))
    return not any(ca[s] != cb[s] and (stateful(a, s) or stateful(b, s)) for s in SLOTS)


def why_inert(slot: str, r: Regime) -> tuple[str, str]:
    """Why a slot's difference does nothing in regime ``r``, and how to make it act."""
    if slot in NEUTRAL and r.first_update_only:
        return ("every ratio is 1 on the first update",
                f"set train.updates_per_batch >= 2 (or engine.max_staleness >= 1) for the {slot} to act")
    if slot == "kl":
        return ("a KL with beta 0 adds nothing to the loss or the rewards", "set algorithm.kl.beta > 0 for it to act")
    if slot == "term":
        return ("a term with coefficient 0 adds nothing", "set the term's coef for it to act")
    if slot == "filter":
        return (f"no filter drops a row at these settings ({' and '.join(r.rewards)} rewards, G={r.n})",
                "a filter acts only where it can drop rows")
    return (f"both give the same gradient at {r.keys}", "change a setting that separates them")


def equal_message(a: str, b: str, ra: Run, rb: Run, r: Regime) -> tuple[str, str]:
    """``(why, fix)`` for two equal algorithms named ``a`` and ``b`` (``a`` the later one)."""
    slots = differing_slots(rb, ra)
    named = [s for s, _, _ in slots]
    first = why_inert(named[0], r) if named else ("they give the same gradient", "")
    if len(named) > 1 and all(s in NEUTRAL for s in named):  # a ratio and a clip, inert for the same reason
        first = (first[0], first[1].replace(f"the {named[0]} to act", f"the {' and '.join(named)} to act"))
    detail = "; ".join(f"{s}: {x} vs {y}" for s, x, y in slots)
    why = (f"{a} equals {b} at {r.keys} ({first[0]}): {detail} give the same gradient d(loss)/d(logprobs) "
           f"(to {RTOL:g}, relative) on {len(probe_batches(r))} synthetic batches of these settings")
    return why, first[1]


def equal_entries(entries: dict[str, Any], allow_equal: bool = False) -> list[str]:
    """``policyzoo compare``'s check before anything runs: ``entries`` maps each entry of ``--algos`` to
    its planned config (a :class:`~policyzoo.config.Config` or its dump). Raises :class:`ConfigError`
    (exit 2) naming the equal pairs, the slot that differs, why it is inert and the fix, unless
    ``allow_equal``; then returns the same lines as notes. A probe that fails returns its note."""
    probes: list[tuple[str, Run, Regime, list[Probe]]] = []
    lines, fixes = [], []
    try:
        for entry, config in entries.items():
            config = config if isinstance(config, Config) else Config.model_validate(config)
            bundle = resolve_algorithm(config.algorithm)
            run = _build(bundle)
            r = regime(config, run, task_reward_classes(config, bundle))
            mine = probe(run, r)
            for other, orun, oreg, oprobes in probes:
                if oreg == r and _comparable(run, orun) and same(mine, oprobes):
                    why, fix = equal_message(entry, other, run, orun, r)
                    lines.append(why)
                    fixes.append(fix)
                    break
            probes.append((entry, run, r, mine))
    except Exception as e:  # noqa: BLE001 - a component that refuses synthetic batches: no claim, never a stop
        return [f"note: the equality probe claims nothing: {_failure(e)}"]
    if lines and not allow_equal:
        raise ConfigError("--algos " + ",".join(entries), "; ".join(lines) + ": their runs would measure noise",
                          "; ".join(dict.fromkeys(f for f in fixes if f)) + "; or drop one of them, or pass "
                          "--allow-equal to run them anyway")
    return [f"note: {line}" for line in lines]


def _failure(e: Exception) -> str:
    return f"{e.where}: {e.why}" if isinstance(e, UserError) else f"{type(e).__name__}: {e}"


def task_reward_classes(config, bundle: Bundle) -> list:
    """The reward component classes of a run of ``config``: ``rewards:`` or the data task's default
    (the task is loaded: its rows are read or generated), then the bundle's extras."""
    default = [] if config.rewards is not None else load_task(config.data).default_rewards
    uses = [*reward_uses(config, default, bundle.env is not None), *bundle.reward]
    return [get_catalog().component("reward", u.name) for u in uses]


def run_warnings(config, bundle: Bundle, reward_classes: list) -> list[str]:
    """The lines for ``train --dry-run``, the run's start-up warnings and ``explain``: the run equals
    its zoo base (``algorithm.base``) at these settings, and each slot whose component is an identity
    here (:func:`inert_slots`). A probe that fails gives one line saying so instead."""
    try:
        run = _build(bundle)
        r = regime(config, run, reward_classes)
        mine = probe(run, r)
        out = []
        algo = config.algorithm
        base_name = algo if isinstance(algo, str) else (algo or {}).get("base", DEFAULT_ALGORITHM)
        base = _build(get_catalog().bundle(base_name))
        if components(base) != components(run) and _comparable(run, base) and same(mine, probe(base, r)):
            why, fix = equal_message(bundle.name, base_name, run, base, r)
            out.append(f"{why}: {fix}" if fix else why)
        return out + inert_slots(bundle, r, run, mine)
    except Exception as e:  # noqa: BLE001 - a component that refuses synthetic batches: no claim, never a stop
        return [f"the equality probe claims nothing: {_failure(e)}"]


def inert_slots(bundle: Bundle, r: Regime, run: Run | None = None, mine: list[Probe] | None = None) -> list[str]:
    """One line per slot whose component does nothing at regime ``r``: a ``ratio`` or ``clip`` that gives
    the gradient of :data:`NEUTRAL`'s component (every ratio is 1 on the first update), a ``kl`` or a
    ``term`` whose removal leaves the gradient unchanged (beta 0, coefficient 0), a ``filter`` that keeps
    every row of every batch. Components that keep state across steps are left out (they may act later)."""
    run = run or _build(bundle)
    batches = probe_batches(r)
    mine = mine or probe(run, r, batches)
    out = []
    for slot, name in NEUTRAL.items():
        comp = getattr(run, slot)
        if comp.name != name and not comp.stateful and same(mine, probe(_build(bundle.replace(**{slot: use(name)})),
                                                                          r, batches)):
            out.append(f"{slot}: {comp.name} acts only from the second update: {why_inert(slot, r)[0]} and it "
                       f"gives the gradient of `{slot}: {name}`; {why_inert(slot, r)[1]}"
                       if r.first_update_only else
                       f"{slot}: {comp.name} gives the gradient of `{slot}: {name}` at {r.keys}")
    if run.kl is not None and not run.kl.stateful and same(mine, probe(_build(bundle.replace(kl=None)), r, batches)):
        out.append(f"kl: {run.kl.name} (beta={run.kl.beta:g}) adds nothing to the gradient at these settings: the "
                   "reference model is scored for nothing; set algorithm.kl.beta > 0 for it to act, or "
                   "algorithm.kl=null to skip it")
    for i, comp in enumerate(run.term):
        rest = bundle.term[:i] + bundle.term[i + 1:]
        if not comp.stateful and same(mine, probe(_build(bundle.replace(term=rest)), r, batches)):
            out.append(f"term: {comp.name} (coef={comp.coef:g}) adds nothing to the gradient at these settings; "
                       "set its coef for it to act, or remove it")
    with torch.random.fork_rng(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        masks = [[k for _, k in filters(run, b)] for b in batches]  # [batch][filter]
        kept = [all(bool(m[i].all()) for m in masks) for i in range(len(run.filter))]
    for comp, all_kept in zip(run.filter, kept):
        if all_kept and not comp.stateful:
            out.append(f"filter: {comp.name} cannot drop a row at these settings ({' and '.join(r.rewards)} "
                       f"rewards, G={r.n}): it only costs its calls")
    return out
