"""The DeepSpeed config of a trained model: policyzoo's, with the user's own merged over it.

policyzoo's config (:func:`ds_config`) sets what its step relies on: gradient accumulation left to
the caller (``managed_gradient_accumulation: false``, micro-batch size 1, accumulation 1), torch's
fused AdamW, the clip, the ZeRO stage and bf16. ``engine.deepspeed`` (a JSON file or a mapping)
is merged over it key by key (nested mappings merged, other values replaced), so a user can add
what policyzoo does not set, e.g. ZeRO offload::

    engine:
      deepspeed: {zero_optimization: {stage: 3, offload_optimizer: {device: cpu}, offload_param: {device: cpu}}}

The keys the step relies on cannot be changed there (:data:`FIXED`; HF's ``"auto"`` is accepted
and means policyzoo's value), and fp16 (loss scaling, which the step's skip logic does not know)
is refused: each raises :class:`~policyzoo.errors.ConfigError` naming the key. :func:`check_engine`
checks the user's ZeRO section before any model loads (stage 0-3; offload devices; offload needs
the stage that supports it: the optimizer's stage >= 1, the parameters' stage 3, as DeepSpeed
defines ZeRO-Offload) and gives the stage the run trains at, which checkpoints record.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

from policyzoo.errors import ConfigError

#: keys a user's DeepSpeed config may not change, and where policyzoo sets them instead
FIXED = {
    "train_micro_batch_size_per_gpu": "train.max_tokens_per_micro_batch or train.micro_batches",
    "train_batch_size": "train.prompts_per_step and the sampler's n",
    "gradient_accumulation_steps": "train.max_tokens_per_micro_batch or train.micro_batches",
    "managed_gradient_accumulation": "nothing: the step accumulates exactly itself",
    "bf16": "model.dtype (or train.autocast for bf16 compute over fp32 weights)",
    "gradient_clipping": "train.grad_clip",
}


#: AdamW's betas (also restored by ``Trainer.set_optimizer`` after loading a checkpoint)
BETAS = (0.9, 0.999)


def ds_config(stage: int, lr: float, weight_decay: float, grad_clip: float, dtype: str,
              betas: tuple[float, float] = BETAS, eps: float = 1e-8) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": float(grad_clip),
        "zero_optimization": {"stage": int(stage)},
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": weight_decay, "betas": list(betas),
                                                  "eps": eps, "torch_adam": True,
                                                  "fused": True}},
        "bf16": {"enabled": dtype == "bfloat16"},
        "steps_per_print": 2**31,
        "wall_clock_breakdown": False,
    }


def read_user_config(value: str | dict | None) -> dict:
    """``engine.deepspeed`` as a mapping (a path is read as JSON). Raises ConfigError when the file
    is missing or not a JSON object."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    p = Path(value)
    if not p.is_file():
        raise ConfigError("engine.deepspeed", f"{value}: no such file", "give a DeepSpeed JSON file or a mapping")
    try:
        tree = json.loads(p.read_text())
    except ValueError as e:
        raise ConfigError("engine.deepspeed", f"{value} is not valid JSON ({e})", "fix the file") from None
    if not isinstance(tree, dict):
        raise ConfigError("engine.deepspeed", f"{value} does not hold a JSON object", "write {\"key\": value, ...}")
    return tree


def merge(base: dict, user: dict, where: str = "engine.deepspeed") -> dict:
    """``base`` with ``user`` merged over it (nested mappings merged, values replaced; an ``optimizer``
    or ``scheduler`` of another ``type`` replaces policyzoo's whole section, whose parameters would
    not fit it). Raises
    ConfigError for a :data:`FIXED` key set to another value than ``base``'s, and for fp16."""
    out = dict(base)
    for key, value in user.items():
        path = f"{where}.{key}"
        if value == "auto":
            continue
        if where == "engine.deepspeed" and key in FIXED and value != base.get(key):
            raise ConfigError(path, f"{value!r}: policyzoo sets this key itself ({base.get(key)!r})",
                              f"remove it from the DeepSpeed config; set {FIXED[key]}")
        if where == "engine.deepspeed" and key == "fp16" and isinstance(value, dict) and value.get("enabled"):
            raise ConfigError(path, "fp16 training (dynamic loss scaling) is not supported",
                              "use train.autocast: true (bf16 compute over fp32 weights), or model.dtype: bfloat16 "
                              "with engine.zero_stage >= 1")
        other_type = (key in ("optimizer", "scheduler") and isinstance(value, dict) and isinstance(out.get(key), dict)
                      and value.get("type", out[key].get("type")) != out[key].get("type"))
        if isinstance(value, dict) and isinstance(out.get(key), dict) and not other_type:
            out[key] = merge(out[key], value, path)
        else:
            out[key] = value
    return out


def zero_stage(cfg: dict) -> int:
    """The ZeRO stage a merged config trains at."""
    return int(cfg.get("zero_optimization", {}).get("stage", 0))


#: offload devices DeepSpeed accepts, and the lowest ZeRO stage each offload works at
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
OFFLOAD_MIN_STAGE = {"offload_optimizer": 1, "offload_param": 3}


def effective_stage(engine, user: dict | None = None) -> int:
    """The ZeRO stage a run trains at: the user's ``engine.deepspeed`` ``zero_optimization.stage``
    when set (not ``"auto"``), else ``engine.zero_stage``. ``user``: that config already read.
    Raises ConfigError for a stage that is not an integer 0-3."""
    zero = (read_user_config(engine.deepspeed) if user is None else user).get("zero_optimization", {})
    where = "engine.deepspeed.zero_optimization"
    if not isinstance(zero, dict):
        raise ConfigError(where, f"{zero!r} is not a mapping", "write zero_optimization: {stage: 1, ...}")
    stage = zero.get("stage", "auto")
    if stage == "auto":
        return engine.zero_stage
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
        raise ConfigError(f"{where}.stage", f"{stage!r} is not a ZeRO stage", "use 0, 1, 2 or 3 (or leave it out "
                          "and set engine.zero_stage)")
    return stage


def check_stage(stage: int, dtype: str, lora, stage_key: str = "engine.zero_stage") -> None:
    """ConfigError for bf16 weights at ZeRO 0 and LoRA at ZeRO 3 (``stage_key``: the setting that
    chose ``stage``, named in the fix)."""
    if dtype == "bfloat16" and stage == 0:
        raise ConfigError("model.dtype", "bfloat16 at ZeRO stage 0 trains differently from fp32 on this "
                          "DeepSpeed version", "use engine.zero_stage >= 1 with bfloat16, or model.dtype: float32")
    if lora is not None and stage == 3:
        raise ConfigError("model.lora", "LoRA is supported at ZeRO stages 0-2", f"set {stage_key} <= 2")


def check_engine(config) -> int:
    """Check the trainer's settings that need no model: the user's DeepSpeed ZeRO section (stage,
    offload devices and the stage each offload needs), bf16 weights at ZeRO 0, LoRA at ZeRO 3.
    Returns the ZeRO stage the run trains at; raises ConfigError naming the key."""
    user = read_user_config(config.engine.deepspeed)
    stage = effective_stage(config.engine, user)
    zero = user.get("zero_optimization", {})
    for key, lowest in OFFLOAD_MIN_STAGE.items():
        where = f"engine.deepspeed.zero_optimization.{key}"
        off = zero.get(key)
        if off is None:
            continue
        device = off.get("device", "none") if isinstance(off, dict) else off
        if device not in OFFLOAD_DEVICES:
            raise ConfigError(f"{where}.device", f"{device!r} is not an offload device",
                              f"use one of {', '.join(OFFLOAD_DEVICES)}")
        if device != "none" and stage < lowest:
            raise ConfigError(where, f"offload to {device} needs ZeRO stage {lowest} or higher and the run trains at "
                              f"stage {stage}, where DeepSpeed would ignore it", f"add stage: {lowest} to "
                              "zero_optimization (or set engine.zero_stage)")
    check_stage(stage, config.model.dtype, config.model.lora,
                "engine.deepspeed.zero_optimization.stage" if zero.get("stage", "auto") != "auto"
                else "engine.zero_stage")
    # the keys policyzoo sets itself and fp16, checked on the merged config as the trainer builds it
    merge(ds_config(stage, config.train.lr, config.train.weight_decay, config.train.grad_clip, config.model.dtype),
          user)
    return stage


def initialize(model, parameters, config: dict, scheduler):
    """``deepspeed.initialize``'s engine; DeepSpeed's own rejection of a config value (a pydantic
    ValidationError, e.g. an unknown key inside zero_optimization) is a ConfigError."""
    import deepspeed

    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=parameters, config=config,
                                          lr_scheduler=scheduler)
    except Exception as e:
        if type(e).__name__ != "ValidationError":
            raise
        raise ConfigError("engine.deepspeed", "DeepSpeed refused the merged config: "
                          + " ".join(str(e).split("\n")[:3]), "fix or remove that key of engine.deepspeed "
                          "(DeepSpeed's config reference: https://www.deepspeed.ai/docs/config-json/)") from None
    skip_single_process_allreduce(engine)
    return engine


def _fill_missing_grads(engine, *args, **kwargs) -> None:
    """What DeepSpeed's ZeRO-0 all-reduce does besides communicating, kept at world size 1: a
    trained parameter without a gradient gets a zero one (so AdamW decays and counts it as before)."""
    for p in engine.module.parameters():
        if p.requires_grad and p.numel() and p.grad is None:
            p.grad = p.detach().new_zeros(p.shape)


def skip_single_process_allreduce(engine) -> bool:
    """At ZeRO stage 0 with one data-parallel process, replace DeepSpeed's gradient all-reduce by
    :func:`_fill_missing_grads`. DeepSpeed 0.19 (``DeepSpeedEngine.allreduce_gradients`` ->
    ``buffered_allreduce_fallback``) otherwise flattens every gradient into one buffer, all-reduces
    it over a group of one, multiplies by 1/1 and copies it back: a concatenation of all gradients
    per step that changes no value. Stages 1-3 keep theirs: there the "reduction" also moves the
    gradients into the optimizer's partitions (DeepSpeed shortcuts the communication itself at
    world size 1). Returns whether it was replaced; the engine trains identically
    (``tests/test_single_process_allreduce.py``)."""
    if engine.dp_world_size != 1 or engine.zero_optimization_stage() != 0 or engine.bfloat16_enabled():
        return False
    engine.allreduce_gradients = types.MethodType(_fill_missing_grads, engine)
    return True
