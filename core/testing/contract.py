"""The component contract: what every component, built-in or third-party, must satisfy.

``check_component(cls)`` builds the component inside a checked run (its zoo bundle, or a hybrid
of ``grpo`` or another zoo bundle with the component in its slot), then runs these checks and
raises :class:`ContractFailure` listing every one that failed:

``base``         the class follows the slot contract as the catalog checks it: it derives from
                 its slot's base class in :mod:`policyzoo.contract`, its ``Params`` extends the
                 base's, its hook method takes only arguments the spec passes.
``docstring``    the class's own docstring names a source (an arXiv id, "Source:", a URL, a DOI,
                 or an "Author et al. YEAR" citation).
``params_json``  ``Component(**json.loads(json.dumps(params)))`` gives equal parameters.
``shapes``       the hook's output has the slot's type and shapes on the toy batch
                 (``[B, T]`` per token, ``[B]`` per row, a scalar for ``reduce``, ...).
``spec``         what the hook reference promises for the slot (see
                 :func:`policyzoo.testing.slot_cases.spec_problems`): ratio 1 without drift, on-policy
                 surrogate gradient -A, KL 0 at the reference, reduce exact under micro-batching
                 and padding, advantages independent of row order.
``masked``       masked positions carry no loss and no gradient: ``clip``/``kl`` outputs are 0 there,
                 the gradient of the (summed) output with respect to masked ``logprobs`` (for ``reduce``:
                 masked ``loss``) is exactly 0, and changing any input at masked positions leaves the
                 valid outputs unchanged; ``baseline``: advantages 0 on masked positions, on the row
                 with no token and on the NaN-reward row.
``extreme``      outputs stay finite (NaN rewards allowed) and gradients finite on the extreme batch
                 (probabilities ~1 and ~1e-17, log-ratios +-15, advantages +-50, rewards +-1e6).
``no_mutation``  no input tensor, rollout field or data row is modified in place.
``step``         the run's full loss (prepare + micro_loss) on the toy batch is finite, with zero
                 gradient on masked positions.
``state``        the state contract (:func:`policyzoo.testing.slot_cases.state_problems`): state changes only
                 in ``update()``, a stateless class has none, and a stateful one survives a JSON
                 ``state_dict``/``load_state_dict`` round trip with the same output.

Parameters used to build a component, first match wins: ``params`` passed in; the class's
``contract_params`` (a dict, or a callable taking a scratch folder and returning one) for
components that need e.g. a path; :data:`EXAMPLES`; the first zoo bundle that uses it; defaults.
"""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from policyzoo.assembly import assemble
from policyzoo.catalog import Catalog, component_problem, load_catalog
from policyzoo.contract import SLOTS
from policyzoo.contract.batch import StepBatch
from policyzoo.contract.components import Bundle, Component, use
from policyzoo.errors import UserError
from policyzoo.step.advantages import prepare
from policyzoo.step.loss import micro_loss

from . import examples, slot_cases
from .toys import ToyBatch, toy_batch

SOURCE = re.compile(r"arXiv:?\s*\d{4}\.\d{4,5}|\bSource[s]?:|https?://|\bdoi:|\bet al\.?,? \(?(19|20)\d\d",
                    re.IGNORECASE)
CHECKS = ("base", "docstring", "params_json", "shapes", "spec", "masked", "extreme", "no_mutation", "step", "state")
EXAMPLES = examples.EXAMPLES


class ContractFailure(AssertionError):
    """Raised by :func:`check_component`; ``failures`` maps check name -> reason."""

    def __init__(self, cls, failures: dict[str, str]):
        self.failures = failures
        lines = [f"{cls.slot} component {cls.name!r} ({cls.__module__}.{cls.__qualname__}) breaks the contract:"]
        lines += [f"  {k}: {v}" for k, v in failures.items()]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Case:
    slot: str
    name: str
    cls: type
    source: str

    def __str__(self) -> str:
        return f"{self.slot}:{self.name}"


def contract_cases(catalog: Catalog | None = None) -> list[Case]:
    """Every component of ``catalog`` (default: a fresh one with entry points) as a Case."""
    catalog = catalog or load_catalog()
    return [Case(slot, name, cls, str(src)) for slot, comps in catalog.components.items()
            for name, (cls, src) in sorted(comps.items())]


def example_params(cls, catalog: Catalog, workdir: Path) -> dict:
    custom = getattr(cls, "contract_params", None)
    if custom is not None:
        return dict(custom(workdir) if callable(custom) else custom)
    if (cls.slot, cls.name) in EXAMPLES:
        return EXAMPLES[(cls.slot, cls.name)](workdir)
    for bundle, _ in catalog.bundles.values():
        for u in _uses(bundle, cls.slot):
            if u.name == cls.name:
                return dict(u.params)
    return {}


def _uses(bundle: Bundle, slot: str) -> tuple:
    v = getattr(bundle, slot)
    return tuple(v) if isinstance(v, tuple) else (() if v is None else (v,))


def build_run(cls, params: dict, catalog: Catalog):
    """A checked run holding the component: its own bundle first, then hybrids of zoo bundles
    (``grpo`` first). Returns ``(run, instance)``; raises ContractFailure-ready UserError text."""
    own = [b for b, _ in catalog.bundles.values() if any(u.name == cls.name for u in _uses(b, cls.slot))]
    zoo = [catalog.bundles[n][0] for n in ["grpo"] + sorted(catalog.bundles) if n in catalog.bundles]
    envs = sorted(catalog.components.get("env", {}))  # for components that need an env (env_reward)
    with_env = [b.replace(env=use(envs[0])) for b in zoo[:1]] if envs and cls.slot != "env" else []
    errors = []
    for base in own + zoo + with_env:
        u = use(cls.name, **params)
        bundle = base.replace(**{cls.slot: (u,) if SLOTS[cls.slot] == "collect" else u})
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run = assemble(bundle, catalog=catalog)
        except UserError as e:
            errors.append(f"{base.name}: {e.why}")
            continue
        inst = getattr(run, cls.slot)
        return run, (inst[-1] if isinstance(inst, list) else inst)
    raise UserError(f"{cls.slot}:{cls.name}", "no zoo bundle accepts it in its slot: " + "; ".join(errors[:3]),
                    "give the component defaults that work with grpo, or a contract_params attribute")


def _snapshot(tb: ToyBatch):
    tensors = {k: v for k, v in tb.hook_kwargs().items() if isinstance(v, torch.Tensor)}
    r = tb.rollout
    tensors.update({f"rollout.{k}": getattr(r, k) for k in
                    ("response_ids", "response_mask", "rollout_logprobs", "group_ids", "truncated")})
    saved = {k: (v, v.detach().clone(), v._version) for k, v in tensors.items()}
    rows = json.dumps(r.rows, sort_keys=True, default=str)
    return saved, rows, list(r.completions), list(r.prompts)


def _mutated(tb: ToyBatch, snap) -> list[str]:
    saved, rows, completions, prompts = snap
    bad = [k for k, (v, copy, ver) in saved.items()
           if v._version != ver or not torch.equal(v.detach().nan_to_num(7.0), copy.nan_to_num(7.0))]
    r = tb.rollout
    if json.dumps(r.rows, sort_keys=True, default=str) != rows:
        bad.append("rollout.rows")
    if r.completions != completions or r.prompts != prompts:
        bad.append("rollout.completions/prompts")
    return bad


def _masked(comp, slot: str, tb: ToyBatch, ctx) -> list[str]:
    m = tb.response_mask
    bad = []
    if slot == "baseline":  # row 1 becomes unscorable (its group keeps two valid rows)
        tb.rewards = tb.rewards.clone()
        tb.rewards[1] = float("nan")
    out = slot_cases.call(comp, tb, *ctx)
    if slot == "baseline":
        a = out.advantages
        if (a[~m] != 0).any():
            bad.append("advantages are not 0 on masked positions")
        rows = (tb.rewards.isnan() | ~m.any(-1))
        if (a[rows] != 0).any():
            bad.append("rows with no token or a NaN reward do not get advantage 0")
        return bad
    if slot not in slot_cases.LOSS_SLOTS:
        return bad
    x = slot_cases.differentiated(slot, tb)
    tok = slot_cases.per_token(slot, out)
    total = out if slot == "reduce" else tok.sum()
    if slot in ("clip", "kl", "term") and (tok.detach()[~m] != 0).any():
        bad.append(f"{slot} output is not 0 on masked positions")
    (grad,) = torch.autograd.grad(total, x, allow_unused=True)
    if grad is not None and (grad[~m] != 0).any():
        bad.append(f"gradient reaches masked positions of {'loss' if slot == 'reduce' else 'logprobs'}")
    # Changing every input at masked positions must not change valid outputs.
    other = tb.clone()
    for name in ("logprobs", "old_logprobs", "rollout_logprobs", "ref_logprobs", "loss", "values"):
        v = getattr(other, name)
        new = torch.where(m, v.detach(), v.detach() - 3.0)
        setattr(other, name, new.requires_grad_(v.requires_grad))
    out2 = slot_cases.call(comp, other, *ctx)
    a, b2 = (out, out2) if slot == "reduce" else (tok.detach()[m], slot_cases.per_token(slot, out2).detach()[m])
    if not torch.allclose(torch.as_tensor(a).detach(), torch.as_tensor(b2).detach(), rtol=1e-6, atol=1e-6):
        bad.append("valid outputs change when only masked positions of the inputs change")
    return bad


def _extreme(comp, slot: str, ctx) -> list[str]:
    tb = slot_cases.extreme_batch()
    out = slot_cases.call(comp, tb, *ctx)
    bad = slot_cases.finite_problems(slot, out, tb)
    if slot in slot_cases.LOSS_SLOTS:
        x = slot_cases.differentiated(slot, tb)
        total = out if slot == "reduce" else slot_cases.per_token(slot, out).sum()
        (grad,) = torch.autograd.grad(total, x, allow_unused=True)
        if grad is not None and not torch.isfinite(grad).all():
            bad.append("gradient is not finite on extreme inputs")
    return bad


def _step(run, tb: ToyBatch, metrics: dict | None = None) -> list[str]:
    batch = StepBatch(tb.rollout, tb.rewards.clone(), old_logprobs=tb.old_logprobs,
                      ref_logprobs=tb.ref_logprobs, values=tb.values, sum_pi_squared=tb.sum_pi_squared)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch, found = prepare(run, batch)
        loss, _ = micro_loss(run, batch, tb.logprobs, tb.totals, entropy=-tb.logprobs)
    if metrics is not None:  # what a stateful component's update() sees
        metrics.update(found, rows=len(batch))
    if not torch.isfinite(loss):
        return [f"the step loss is {float(loss)}"]
    if not loss.requires_grad:
        return ["the step loss has no gradient"]
    (grad,) = torch.autograd.grad(loss, tb.logprobs)
    m = tb.response_mask
    bad = [] if torch.isfinite(grad).all() else ["the step gradient is not finite"]
    if (grad[~m] != 0).any():
        bad.append("the step gradient reaches masked positions")
    return bad


def run_checks(cls, catalog: Catalog | None = None, params: dict | None = None,
               workdir: str | Path | None = None) -> dict[str, str | None]:
    """Run every check; returns ``{check: None (passed) or the reason it failed}``."""
    catalog = catalog or load_catalog()
    result: dict[str, str | None] = dict.fromkeys(CHECKS)
    problem = component_problem(cls)
    if problem:
        result["base"] = f"{problem[0]} (fix: {problem[1]})"
    doc = cls.__dict__.get("__doc__") or ""
    if not SOURCE.search(doc):
        result["docstring"] = "the class docstring names no source (arXiv id, 'Source:', URL or 'X et al. YEAR')"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir or tmp)
        params = example_params(cls, catalog, work) if params is None else params
        try:
            comp = cls(**params)
        except (UserError, TypeError, ValueError) as e:
            return {k: v or (f"cannot build the component: {e}" if k not in ("base", "docstring") else None)
                    for k, v in result.items()}
        result["params_json"] = _json_problem(cls, comp)
        try:
            run, comp = build_run(cls, params, catalog)
        except UserError as e:
            return {k: v or (f"cannot build a run: {e}" if k not in ("base", "docstring", "params_json") else None)
                    for k, v in result.items()}
        ctx = examples.context(cls.slot)
        metrics: dict = {}
        checks = {
            "shapes": lambda: slot_cases.check_output(cls.slot, slot_cases.call(comp, toy_batch(), *ctx), toy_batch(),
                                                      ctx[1]),
            "spec": lambda: slot_cases.spec_problems(comp, cls.slot, ctx),
            "masked": lambda: _masked(comp, cls.slot, toy_batch(), ctx),
            "extreme": lambda: _extreme(comp, cls.slot, ctx),
            "no_mutation": lambda: _no_mutation(comp, ctx),
            "step": lambda: _step(run, toy_batch(), metrics),
            "state": lambda: slot_cases.state_problems(comp, cls(**params), metrics, ctx),
        }
        for name, fn in checks.items():
            try:
                problems = fn()
            except Exception as e:  # a crash is a failed check, reported with its reason
                problems = [f"raised {type(e).__name__}: {e}"]
            result[name] = "; ".join(problems) or None
    return result


def _json_problem(cls, comp) -> str | None:
    try:
        text = json.dumps(comp.params.model_dump(mode="json"), allow_nan=False)
        again = cls(**json.loads(text))
    except (UserError, TypeError, ValueError) as e:
        return f"parameters do not survive JSON: {e}"
    if again.params != comp.params:
        return f"{comp.params!r} != {again.params!r} after a JSON round trip"
    return None


def _no_mutation(comp, ctx) -> list[str]:
    tb = toy_batch()
    snap = _snapshot(tb)
    slot_cases.call(comp, tb, *ctx)
    bad = _mutated(tb, snap)
    return [f"modified in place: {', '.join(bad)}"] if bad else []


def check_component(cls: type[Component], catalog: Catalog | None = None, params: dict | None = None) -> None:
    """Raise :class:`ContractFailure` unless ``cls`` passes every check (see the module docstring)."""
    failures = {k: v for k, v in run_checks(cls, catalog, params).items() if v}
    if failures:
        raise ContractFailure(cls, failures)
