"""Checks of every hook's result at the boundary, right after the call.

A component that returns the wrong type or shape fails here with a
:class:`~policyzoo.errors.ComponentError` naming the component, what it returned and what the
hook promises -- not later in a tensor operation of the step. B is the batch's row count and T its
padded response width; ``problems`` lists what is wrong (the contract suite uses it too).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from policyzoo.contract import Advantages, Importance, Keep, Rollout, Surrogate
from policyzoo.errors import ComponentError


def _shape(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of shape {list(x.shape)}" + ("" if x.dim() else " (a scalar)")
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)} values"
    return f"a {type(x).__name__}"


def _tensor(bad: list[str], x: Any, shape: tuple, what: str, kind: str = "float") -> None:
    if not isinstance(x, Tensor):
        bad.append(f"{what} is {_shape(x)}, expected a tensor of shape {list(shape)}")
    elif tuple(x.shape) != tuple(shape):
        bad.append(f"{what} is {_shape(x)}, expected shape {list(shape)}")
    elif kind == "float" and not x.is_floating_point():
        bad.append(f"{what} has dtype {x.dtype}, expected a float dtype")
    elif kind == "bool" and x.dtype != torch.bool:
        bad.append(f"{what} has dtype {x.dtype}, expected torch.bool")


def as_rewards(out: Any) -> Tensor | None:
    """A reward result as a float32 tensor, or None if it holds something else than numbers."""
    try:
        x = out if isinstance(out, Tensor) else torch.as_tensor(out)
    except (TypeError, ValueError, RuntimeError):
        return None
    if x.dtype == torch.bool or x.is_complex():
        return None
    return x.to(torch.float32)


def _sample(bad: list[str], out: Any, b: int, t: int | None) -> None:
    if not isinstance(out, Rollout):
        bad.append(f"returned {_shape(out)}, not a Rollout")
        return
    ids = out.response_ids
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        bad.append(f"response_ids is {_shape(ids)}, expected [B, T]")
        return
    n, t = ids.shape
    if n != b:
        bad.append(f"returned {n} rows, expected {b} (P prompts x n samples)")
    _tensor(bad, out.response_mask, (n, t), "response_mask", "bool")
    _tensor(bad, out.rollout_logprobs, (n, t), "rollout_logprobs")
    _tensor(bad, out.group_ids, (n,), "group_ids", "any")
    _tensor(bad, out.truncated, (n,), "truncated", "bool")
    if out.turn_rewards is not None:
        _tensor(bad, out.turn_rewards, (n, t), "turn_rewards")
    if out.env_rewards is not None:
        _tensor(bad, out.env_rewards, (n,), "env_rewards")


def _reward(bad: list[str], out: Any, b: int, t: int | None) -> None:
    x = as_rewards(out)
    if x is None:
        bad.append(f"returned {_shape(out)}, which is not numbers")
    elif tuple(x.shape) != (b,):
        bad.append(f"returned {_shape(out)} for {b} rows, expected one float per row (shape [{b}])")


def _filter(bad: list[str], out: Any, b: int, t: int | None) -> None:
    if not isinstance(out, Keep):
        bad.append(f"returned {_shape(out)}, not a Keep")
        return
    if not isinstance(out.keep, Tensor) or tuple(out.keep.shape) not in ((b,), (b, t)):
        bad.append(f"keep is {_shape(out.keep)}, expected shape [{b}] or [{b}, {t}]")
    else:
        _tensor(bad, out.keep, out.keep.shape, "keep", "bool")
    if not isinstance(out.reasons, dict) or not all(isinstance(v, int) for v in out.reasons.values()):
        bad.append(f"reasons must count rows as ints, got {out.reasons!r}")


def _baseline(bad: list[str], out: Any, b: int, t: int | None) -> None:
    if not isinstance(out, Advantages):
        bad.append(f"returned {_shape(out)}, not Advantages")
        return
    _tensor(bad, out.advantages, (b, t), "advantages")
    if out.returns is not None:
        _tensor(bad, out.returns, (b, t), "returns")
    if out.valid is not None:
        _tensor(bad, out.valid, (b,), "valid", "bool")


def _ratio(bad: list[str], out: Any, b: int, t: int | None) -> None:
    if not isinstance(out, Importance):
        _tensor(bad, out, (b, t), "the ratio")
        return
    _tensor(bad, out.ratio, (b, t), "the ratio")
    if out.weight is not None:
        _tensor(bad, out.weight, (b, t), "weight")
        if isinstance(out.weight, Tensor) and out.weight.requires_grad:
            bad.append("weight requires grad; detach it (a weight on the loss is a constant)")
    for name in ("truncated", "masked"):
        if getattr(out, name) is not None:
            _tensor(bad, getattr(out, name), (b, t), name, "bool")


def _kl(bad: list[str], out: Any, b: int, t: int | None) -> None:
    _tensor(bad, out, (b, t), "the kl")


def _term(bad: list[str], out: Any, b: int, t: int | None) -> None:
    _tensor(bad, out, (b, t), "the term")


def _clip(bad: list[str], out: Any, b: int, t: int | None) -> None:
    if not isinstance(out, Surrogate):
        bad.append(f"returned {_shape(out)}, not a Surrogate")
        return
    _tensor(bad, out.loss, (b, t), "loss")
    for name in ("clipped_low", "clipped_high"):
        if getattr(out, name) is not None:
            _tensor(bad, getattr(out, name), (b, t), name, "bool")


def _reduce(bad: list[str], out: Any, b: int, t: int | None) -> None:
    if not isinstance(out, Tensor) or out.dim() != 0:
        bad.append(f"returned {_shape(out)}, expected a scalar tensor")


_CHECKS = {"sample": _sample, "reward": _reward, "filter": _filter, "baseline": _baseline, "ratio": _ratio,
           "kl": _kl, "clip": _clip, "term": _term, "reduce": _reduce}


def problems(slot: str, out: Any, rows: int, width: int | None = None) -> list[str]:
    """What is wrong with ``out`` as the result of ``slot``'s hook on B = ``rows`` rows and T =
    ``width`` response columns (``sample``: the expected row count; T is then the rollout's own)."""
    bad: list[str] = []
    if slot in _CHECKS:
        _CHECKS[slot](bad, out, rows, width)
    return bad


def check(slot: str, comp: Any, out: Any, rows: int, width: int | None = None) -> Any:
    """``out`` if it is a valid result of ``comp``'s hook (rewards come back as ``[B]`` float32),
    else :class:`ComponentError` naming the component and the problem."""
    bad = problems(slot, out, rows, width)
    if bad:
        raise ComponentError(f"{slot} component {comp!r}", "; ".join(bad),
                             f"make {type(comp).__name__}.{slot}() return what the {slot} hook promises "
                             "(policyzoo.contract; `pytest --policyzoo-contract` checks a plugin)")
    return as_rewards(out) if slot == "reward" else out
