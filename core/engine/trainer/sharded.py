"""Models that no rank holds whole at ZeRO 3 (issue 20, item 4).

* **Loading.** :func:`zero3_loading` keeps a transformers ``HfDeepSpeedConfig`` alive while the
  trainer loads its models: ``from_pretrained`` then builds them under ``deepspeed.zero.Init``, so
  each parameter is partitioned as it is created and read (a rank never materialises the whole
  model). transformers holds the config by a weak reference: once the returned object is dropped,
  later loads in the process (the transformers rollout's private copy) are ordinary again.
* **Reference.** :func:`reference_engine` wraps the frozen reference in a DeepSpeed engine at stage 3
  without an optimizer (TRL's ``prepare_deepspeed`` does the same for its reference): its forward
  gathers each layer's parameters from the ranks and releases them after, like the policy's.
  Every rank must run the same number of reference forwards (the scoring chunks agree on it).
* **Scoring passes.** :func:`gathered_for_scoring` gathers a model whole once for a no-grad pass (old and
  reference log-probs, values, sum pi^2) on several ranks when a copy fits in half the free memory: one
  collective a pass instead of one per layer in every chunk's forward.
"""

from __future__ import annotations

import contextlib


def zero3_loading(config: dict):
    """An ``HfDeepSpeedConfig`` of ``config`` (the policy's DeepSpeed config); keep it referenced
    while the models load, drop it after."""
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(config)


def reference_config(config: dict) -> dict:
    """The policy's config without optimizer, scheduler or clipping: parameters partitioned at stage 3."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3}, "bf16": dict(config.get("bf16", {"enabled": False})),
            "steps_per_print": 2**31, "wall_clock_breakdown": False}


def reference_engine(model, config: dict):
    """``model`` (frozen) as a DeepSpeed stage-3 engine for inference (no optimizer), in eval mode."""
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, config=reference_config(config))
    engine.eval()
    return engine


def _offload(engine):
    """The ZeRO-3 parameter offload of a DeepSpeed engine (its module hooks and gather coordinator), or None
    (stage < 3, or not a DeepSpeed engine). The policy's is its optimizer's ``parameter_offload``; an engine
    without optimizer (the reference) has a ``DeepSpeedZeRoOffload`` as its optimizer."""
    opt = getattr(engine, "optimizer", None)
    off = getattr(opt, "parameter_offload", opt)
    return off if hasattr(off, "forward_hooks") and hasattr(off, "get_param_coordinator") else None


def whole_bytes(engine) -> int:
    """Bytes of ``engine``'s parameters gathered whole (ZeRO 3: ``ds_numel`` elements each)."""
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in engine.module.parameters())


def free_bytes(device) -> int:
    """Memory free for one more copy on ``device``: the GPU's free bytes (``torch.cuda.mem_get_info``), or
    the host's available bytes shared by the ranks of this node (``LOCAL_WORLD_SIZE``)."""
    import os

    import psutil
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


@contextlib.contextmanager
def gathered_for_scoring(engine, enabled: bool):
    """The model a no-grad scoring pass calls. ``enabled`` (ZeRO 3): every parameter of ``engine`` gathered
    once (``deepspeed.zero.GatheredParameters``, one collective per pass instead of one per layer and chunk)
    and DeepSpeed's per-module gather/release hooks removed for the pass, yielding the bare module; on exit
    the parameters are partitioned again, the hooks put back and the gather trace invalidated (TRL's
    ``unwrap_model_for_generation`` does the same for generation). Not enabled, or not a ZeRO-3 engine:
    ``engine`` itself (each forward gathers layer by layer). The caller decides ``enabled`` the same on every
    rank (it is a collective) and only when a whole copy fits (:func:`whole_bytes`, :func:`free_bytes`)."""
    off = _offload(engine) if enabled else None
    if off is None:
        yield engine
        return
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for p in params:
            p.ds_active_sub_modules.clear()
        for hook in off.forward_hooks + off.backward_hooks:
            hook.remove()
        off.forward_hooks, off.backward_hooks = [], []
        try:
            yield engine.module
        finally:
            coordinator = off.get_param_coordinator()
            if not coordinator.is_invalid_trace():
                coordinator._invalidate_trace()
            off._register_deepspeed_module(off.module)
