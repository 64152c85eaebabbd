"""Testing statistics across data-parallel ranks without a model.

:func:`on_ranks` runs a function in N fresh processes joined in a gloo process group through a
file store (``RANK``/``WORLD_SIZE`` set, so :class:`policyzoo.engine.dist.DistCollective` reduces
over them) and returns each rank's result. :func:`advantages` calls a baseline the way the step
does: the hook with the arguments it declares, then the declared composition
(:meth:`policyzoo.contract.Baseline.chain`). Together they pin "N ranks equal one rank with the
whole batch" for every statistic that spans more than one group.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from policyzoo.contract import LOCAL, Collective
from policyzoo.engine import dist as pz_dist


def advantages(comp, rewards, group_ids, response_mask, token_rewards=None, values=None,
               collective: Collective = LOCAL, reward_components=None, reward_weights=None, greedy_rewards=None,
               old_logprobs=None, sum_pi_squared=None):
    """``comp``'s advantages ``[B, T]`` (and returns) as the step computes them: the ``baseline``
    hook with the arguments its method declares, then ``comp.chain``. ``token_rewards`` default
    zeros; ``reward_components`` default the rewards as the only component (weight 1);
    ``greedy_rewards`` default NaN (no greedy response); ``old_logprobs`` default zeros;
    ``sum_pi_squared`` default None (not scored)."""
    kw = dict(rewards=rewards, group_ids=group_ids, response_mask=response_mask, values=values,
              token_rewards=torch.zeros(response_mask.shape) if token_rewards is None else token_rewards,
              collective=collective,
              reward_components=rewards.unsqueeze(-1) if reward_components is None else reward_components,
              reward_weights=torch.ones(1) if reward_weights is None else reward_weights,
              greedy_rewards=torch.full_like(rewards, torch.nan) if greedy_rewards is None else greedy_rewards,
              old_logprobs=torch.zeros(response_mask.shape) if old_logprobs is None else old_logprobs,
              sum_pi_squared=sum_pi_squared)
    names = [p for p in inspect.signature(comp.baseline).parameters if p != "self"]
    out = comp.baseline(**{n: kw[n] for n in names})
    return comp.chain(out, rewards, response_mask, collective)


def _entry(rank: int, world: int, fn: Callable, args: tuple, folder: str, timeout_s: float) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    pz_dist.TIMEOUT_S[0] = timeout_s  # named in a CollectiveTimeout, as engine.collective_timeout_s is
    # a file store in the call's own folder: no port to choose, so parallel callers never collide
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        torch.save(fn(rank, world, *args), Path(folder) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def on_ranks(fn: Callable[..., Any], *args: Any, world: int = 2, timeout_s: float = 600.0) -> list[Any]:
    """``[fn(0, world, *args), fn(1, world, *args), ...]``, each computed in its own process of a
    gloo group of ``world`` ranks (joined through a file store, no port) whose collectives wait at most
    ``timeout_s`` seconds (then raise, as with ``engine.collective_timeout_s``). ``fn`` must be importable
    (a module-level function); results travel through ``torch.save``. A failing rank raises in the caller
    (``torch.multiprocessing.ProcessRaisedException``)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_entry, args=(world, fn, args, folder, timeout_s), nprocs=world, join=True)
        return [torch.load(Path(folder) / f"{r}.pt", weights_only=False) for r in range(world)]
