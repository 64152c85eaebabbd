"""Per-slot knowledge for the contract suite: how to call a component of each slot on a toy
batch, and what its output must look like (see :mod:`policyzoo.testing.contract`)."""

from __future__ import annotations

import inspect
import json
import math

import torch
from torch import Tensor

from policyzoo.contract import LOCAL, Episode, Importance, Observation, Rollout
from policyzoo.step import boundary

from .toys import ToyBatch, toy_batch

#: slots whose output is a per-token (or reduced) part of the differentiable loss.
LOSS_SLOTS = ("ratio", "clip", "kl", "term", "reduce")


def call(comp, tb: ToyBatch, policy=None, prompts=None):
    """Call ``comp``'s hook method with the arguments it declares, taken from ``tb``.

    ``ratio`` for a clip is computed in the graph from ``tb.logprobs`` (the token ratio); a
    ``sample`` gets no env (single-turn), an ``env`` the first of ``prompts`` as its ``row``."""
    method = getattr(comp, comp.slot)
    kw = tb.hook_kwargs()
    kw["policy"], kw["prompts"], kw["env"] = policy, prompts or [], None
    kw["row"] = (prompts or [None])[0]
    names = [p for p in inspect.signature(method).parameters if p != "self"]
    return method(**{n: kw[n] for n in names if n in kw})


def extreme_batch(seed: int = 0) -> ToyBatch:
    """The toy batch pushed to the edges a real run can reach: probabilities near 1 (log-prob
    -1e-6) and near 0 (-40), log-ratios to old/rollout/ref of +-15, advantages +-50, losses
    +-1e4, rewards +-1e6, one NaN (unscorable) reward."""
    tb = toy_batch(seed)
    m = tb.response_mask
    b, t = m.shape
    sign = torch.where(torch.arange(b * t).reshape(b, t) % 2 == 0, 1.0, -1.0)
    lp = torch.where(sign > 0, torch.full((b, t), -1e-6), torch.full((b, t), -40.0))
    lp = torch.where(m, lp, tb.logprobs.detach())
    tb.logprobs = lp.clone().requires_grad_(True)
    tb.old_logprobs = torch.where(m, lp - 15.0 * sign, tb.old_logprobs)
    tb.rollout_logprobs = torch.where(m, lp + 15.0 * sign, torch.zeros(b, t))
    tb.rollout.rollout_logprobs = tb.rollout_logprobs.clone()
    tb.ref_logprobs = torch.where(m, lp + 30.0 * sign, tb.ref_logprobs)
    tb.advantages = torch.where(m, 50.0 * sign, torch.zeros(b, t))
    tb.loss = torch.where(m, 1e4 * sign, tb.loss.detach()).requires_grad_(True)
    tb.values = torch.where(m, 1e3 * sign, tb.values)
    tb.rewards = torch.tensor([1e6, -1e6, float("nan"), 1e6, 0.0, 1e6])[:b]
    tb.reward_components = tb.rewards.unsqueeze(-1).clone()
    return tb


def check_output(slot: str, out, tb: ToyBatch, prompts=None) -> list[str]:
    """Shape/type problems of a slot's output on the toy batch (empty list = fine): the step's own
    boundary check (:func:`policyzoo.step.boundary.problems`), plus, for ``sample``, P groups of G."""
    b, t = tb.shape
    if slot == "env":
        return episode_problems(out)
    if slot == "sample":
        p = len(prompts or [])
        rows = len(out) if isinstance(out, Rollout) else b
        bad = boundary.problems(slot, out, rows)
        if not bad and p and (rows % p or len(out.group_ids.unique()) != p):
            bad.append(f"{rows} rows and {len(out.group_ids.unique())} group ids for {p} prompts "
                       "(expected P x G rows in P groups)")
        return bad
    return boundary.problems(slot, out, b, t)


def episode_problems(episode) -> list[str]:
    """An ``env`` result must be an Episode whose ``prompt`` is chat messages or text, whose
    ``step`` returns an Observation on a tool-call turn and on an answer turn, and whose
    ``reward()`` is a float."""
    if not isinstance(episode, Episode):
        return [f"env(row) returned {type(episode).__name__}, not an Episode"]
    bad = [] if isinstance(episode.prompt, (str, list)) else [f"prompt is a {type(episode.prompt).__name__}"]
    for text in ("calc(1 + 2)", "Answer: 3"):
        obs = episode.step(text, [])
        if not isinstance(obs, Observation):
            bad.append(f"step({text!r}) returned {type(obs).__name__}, not an Observation")
    r = episode.reward()
    if not isinstance(r, (int, float)) or isinstance(r, bool):
        bad.append(f"reward() returned {type(r).__name__}, not a float")
    return bad


def per_token(slot: str, out) -> Tensor | None:
    """The differentiable per-token tensor of a loss-path output (None for others)."""
    if slot == "ratio" and isinstance(out, Importance):  # what reaches the loss: ratio x weight
        return out.ratio if out.weight is None else out.ratio * out.weight
    if slot in ("ratio", "kl", "term"):
        return out
    if slot == "clip":
        return out.loss
    return None


def differentiated(slot: str, tb: ToyBatch) -> Tensor:
    """The input whose gradient the masked-position checks inspect."""
    return tb.loss if slot == "reduce" else tb.logprobs


def finite_problems(slot: str, out, tb: ToyBatch) -> list[str]:
    """Non-finite values at valid positions (NaN rewards are allowed: they mean unscorable)."""
    m = tb.response_mask
    if slot == "reward":
        x = torch.as_tensor(out, dtype=torch.float32)
        return ["a reward is +-inf"] if torch.isinf(x).any() else []
    if slot == "baseline":
        a = out.advantages
        bad = [] if torch.isfinite(a[m]).all() else ["advantages are not finite at valid positions"]
        if out.returns is not None and not torch.isfinite(out.returns[m]).all():
            bad.append("returns are not finite at valid positions")
        return bad
    if slot == "reduce":
        return [] if math.isfinite(float(out.detach())) else [f"reduce returned {float(out.detach())}"]
    x = per_token(slot, out)
    if x is not None and not torch.isfinite(x.detach()[m]).all():
        return [f"{slot} output is not finite at valid positions"]
    return []


def spec_problems(comp, slot: str, ctx) -> list[str]:
    """What the hook reference promises for the slot, checked on the toy batch:

    * ``ratio``: exactly 1 at valid positions when logprobs == old_logprobs == rollout_logprobs
      (for an :class:`~policyzoo.contract.Importance`, the ratio times its weight);
    * ``clip``: on-policy (ratio = exp(logprobs - logprobs.detach()) = 1) the gradient of the
      summed surrogate is the policy gradient, d/d logprobs = -A at valid positions, except on
      tokens the surrogate itself reports as cut (``clipped_low`` / ``clipped_high``: a selection
      such as Clip-Cov's may cut tokens even on-policy, and then says so in its clip fractions);
    * ``kl``: 0 where logprobs == ref_logprobs;
    * ``reduce``: exact under micro-batching (the sum over a 2- and a 3-way split of the rows,
      with the step's totals, equals the full result) and independent of right padding;
    * ``baseline``: grouping by ids, not position (shuffled rows give shuffled advantages).
    """
    check = _SPEC_CHECKS.get(slot)
    return check(comp, toy_batch(), ctx) if check is not None else []


def _ratio_problems(comp, tb, ctx) -> list[str]:
    m, same = tb.response_mask, tb.logprobs.detach()
    tb.old_logprobs, tb.rollout_logprobs = same.clone(), torch.where(m, same, torch.zeros_like(same))
    r = per_token("ratio", call(comp, tb, *ctx)).detach()
    if not torch.allclose(r[m], torch.ones_like(r[m]), rtol=0, atol=1e-6):
        return ["ratio (times its weight) is not 1 where logprobs == old_logprobs == rollout_logprobs"]
    return []


def _clip_problems(comp, tb, ctx) -> list[str]:
    lp = tb.logprobs
    kw = dict(tb.hook_kwargs(), ratio=torch.exp(lp - lp.detach()), old_logprobs=lp.detach())
    method = getattr(comp, "clip")
    names = [p for p in inspect.signature(method).parameters if p != "self"]
    out = method(**{n: kw[n] for n in names if n in kw})
    (grad,) = torch.autograd.grad(out.loss.sum(), lp)
    check = tb.response_mask.clone()
    for cut in (out.clipped_low, out.clipped_high):
        if cut is not None:
            check &= ~cut
    if not torch.allclose(grad[check], -tb.advantages[check], rtol=1e-5, atol=1e-6):
        return ["on-policy, d loss / d logprobs is not -A (the policy gradient)"]
    return []


def _kl_problems(comp, tb, ctx) -> list[str]:
    m = tb.response_mask
    tb.ref_logprobs = tb.logprobs.detach().clone()
    k = call(comp, tb, *ctx).detach()
    if not torch.allclose(k[m], torch.zeros_like(k[m]), atol=1e-6):
        return ["KL is not 0 where logprobs == ref_logprobs"]
    return []


def _reduce_problems(comp, tb, ctx) -> list[str]:
    m, bad = tb.response_mask, []
    full = float(call(comp, tb, *ctx).detach())
    for parts in (2, 3):
        total = 0.0
        for rows in torch.arange(len(m)).tensor_split(parts):
            sub = tb.clone()
            sub.loss, sub.response_mask = tb.loss.detach()[rows], m[rows]
            total += float(call(comp, sub, *ctx).detach())
        if not math.isclose(total, full, rel_tol=1e-5, abs_tol=1e-6):
            bad.append(f"not exact under micro-batching: {parts} parts sum to {total}, full batch {full}")
    wide = tb.clone()
    wide.loss = torch.cat([tb.loss.detach(), torch.full((len(m), 3), 9.0)], 1)
    wide.response_mask = torch.cat([m, torch.zeros(len(m), 3, dtype=torch.bool)], 1)
    if not math.isclose(float(call(comp, wide, *ctx).detach()), full, rel_tol=1e-6, abs_tol=1e-7):
        bad.append("the result changes with extra right padding")
    return bad


def _baseline_problems(comp, tb, ctx) -> list[str]:
    a = call(comp, tb, *ctx).advantages.detach()
    perm = torch.tensor([5, 2, 0, 3, 1, 4])
    sh = tb.clone()
    for name in ("rewards", "group_ids", "response_mask", "token_rewards", "values", "reward_components",
                 "greedy_rewards", "old_logprobs", "sum_pi_squared"):
        setattr(sh, name, getattr(tb, name)[perm])
    a2 = call(comp, sh, *ctx).advantages.detach()
    if not torch.allclose(a2, a[perm], atol=1e-6):
        return ["advantages depend on row order (group by group_ids, not by position)"]
    return []


#: the slots :func:`spec_problems` checks, each on a fresh toy batch
_SPEC_CHECKS = {"ratio": _ratio_problems, "clip": _clip_problems, "kl": _kl_problems, "reduce": _reduce_problems,
                "baseline": _baseline_problems}


def state_problems(comp, fresh, metrics: dict, ctx) -> list[str]:
    """The state contract (``Component.update`` / ``state_dict`` / ``load_state_dict``), each
    problem naming the property that failed:

    * ``state only in update``: calling the hook method twice leaves ``state_dict()`` unchanged;
    * ``stateless means no state``: a class that does not override ``update`` returns ``{}``;
    * ``state is JSON``: ``state_dict()`` after an update with the toy step's ``metrics`` survives
      ``json.dumps``/``json.loads``;
    * ``state round trip``: ``fresh`` (a new instance with the same parameters) given that state
      by ``load_state_dict`` has an equal ``state_dict()`` and gives the same hook output.
    """
    before = comp.state_dict()
    if not comp.stateful:
        return [] if before == {} else ["stateless means no state: state_dict() is not {} but the class does not "
                                        "override update() (the only method that may change state)"]
    call(comp, toy_batch(), *ctx)
    call(comp, toy_batch(), *ctx)
    if comp.state_dict() != before:
        return ["state only in update: the hook method changed state_dict() (state may change only in update(), "
                "once per step)"]
    comp.update(metrics=dict(metrics), collective=LOCAL)
    state = comp.state_dict()
    try:
        saved = json.loads(json.dumps(state, allow_nan=False))
    except (TypeError, ValueError) as e:
        return [f"state is JSON: state_dict() after update() does not survive JSON ({e})"]
    fresh.load_state_dict(saved)
    if fresh.state_dict() != state:
        return [f"state round trip: load_state_dict(state_dict()) gives {fresh.state_dict()!r}, not {state!r}"]
    a, b = (per_token(comp.slot, call(c, toy_batch(), *ctx)) for c in (comp, fresh))
    if a is not None and not torch.equal(a.detach(), b.detach()):
        return ["state round trip: the restored component's hook output differs from the original's"]
    return []
