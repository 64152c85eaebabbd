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
"""

from __future__ import annotations


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
