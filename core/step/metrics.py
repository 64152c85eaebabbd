"""The step's metrics on their way to the host: the boundary between the step, which keeps its tensors
on the trainer's device, and logging.

The scoring passes, the advantages and the loss (:mod:`.advantages`, :mod:`.loss`) report their metrics
as 0-dim tensors on the device (sums over masked tokens in float64, so that adding them over
micro-batches rounds as Python floats did); :func:`step_means` turns the sums into token-weighted means
there, and :func:`to_host` copies every tensor metric of the step to the host at once: one
``torch.stack([...]).tolist()`` per step instead of a blocking ``.item()`` per metric and micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor


def step_means(sums: Mapping, counts: Mapping) -> dict:
    """``{name: sums[name] / counts[name]}``, 0.0 where the count is 0, computed where the values are
    (0-dim tensors stay tensors on their device; no host copy). Values and counts may be tensors or
    numbers; a tensor count of 0 gives ``0.0`` through ``torch.where`` (no branch on the device value)."""
    out = {}
    for k, s in sums.items():
        c = counts[k]
        if isinstance(c, Tensor):
            s = torch.as_tensor(s, dtype=torch.float64, device=c.device)
            out[k] = torch.where(c > 0, s / torch.where(c > 0, c, 1.0), 0.0)
        else:
            out[k] = s / c if c else 0.0
    return out


def to_host(metrics: Mapping) -> dict:
    """``metrics`` with every 0-dim (or one-element) tensor value replaced by a Python float, copied to
    the host in one transfer per device (``torch.stack([...]).tolist()``); other values are kept as they
    are. Raises ValueError for a tensor value with more than one element (a metric is one number)."""
    out = dict(metrics)
    by_device: dict = {}
    for k, v in metrics.items():
        if isinstance(v, Tensor):
            if v.numel() != 1:
                raise ValueError(f"metric {k!r} is a tensor of shape {tuple(v.shape)}, not one number")
            by_device.setdefault(v.device, []).append(k)
    for device, keys in by_device.items():
        values = torch.stack([metrics[k].detach().reshape(()).to(torch.float64) for k in keys]).tolist()
        out.update(zip(keys, values))
    return out
