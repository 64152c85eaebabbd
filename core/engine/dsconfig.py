"""The DeepSpeed config of a trained model: policyzoo's, with the user's own merged over it.

policyzoo's config (:func:`ds_config`) sets what its step relies on: gradient accumulation left to
the caller (``managed_gradient_accumulation: false``, micro-batch size 1, accumulation 1), torch's
fused AdamW, the clip, the ZeRO stage and bf16. ``engine.deepspeed`` (a JSON file or a mapping)
is merged over it key by key (nested mappings merged, other values replaced), so a user can add
what policyzoo does not set, e.g. ZeRO offload::

    engine:
      deepspeed: {zero_optimization: {offload_optimizer: {device: cpu}, offload_param: {device: cpu}}}

The keys the step relies on cannot be changed there (:data:`FIXED`; HF's ``"auto"`` is accepted
and means policyzoo's value), and fp16 (loss scaling, which the step's skip logic does not know)
is refused: each raises :class:`~policyzoo.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError

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
    """``base`` with ``user`` merged over it (nested mappings merged, values replaced). Raises
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
                              "use model.dtype: bfloat16 or train.autocast: bfloat16")
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value, path)
        else:
            out[key] = value
    return out


def zero_stage(cfg: dict) -> int:
    """The ZeRO stage a merged config trains at."""
    return int(cfg.get("zero_optimization", {}).get("stage", 0))
