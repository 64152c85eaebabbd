"""Trading compute for memory or precision in the trainer: gradient checkpointing, bf16 autocast.

* **Gradient checkpointing** (``train.gradient_checkpointing``): transformers' own, non-reentrant
  (``torch.utils.checkpoint(use_reentrant=False)``): each decoder layer keeps only its input and
  runs its forward again during backward (one more forward's FLOPs, the layers' activations no
  longer held). transformers checkpoints a layer only while that layer is in training mode; the
  trainer keeps the model in eval mode (no dropout: it must score what the sampler sampled), so
  only the decoder-layer modules themselves are flagged as training, never their submodules.
  A checkpointed layer cannot keep a key/value cache (its recompute would append to it twice),
  so shared-prompt scoring is off with it and rows are scored in full. Same gradients as without
  (``tests/test_compute.py``).
* **bf16 autocast** (``train.autocast: true``): the trainer's forwards and backwards run under
  ``torch.autocast(dtype=bfloat16)`` (matmuls in bf16: AMX on Sapphire Rapids CPUs, tensor cores
  on GPUs) while the weights, gradients and AdamW state stay fp32 (the master weights) and the
  log-softmax runs in fp32. The sync check still scores in fp32: it checks the weights, not the
  precision. Log-probs move by the bf16 rounding of the logits (~1e-2 nats on the test model).
"""

from __future__ import annotations

import contextlib

import torch

from policyzoo.errors import ConfigError


def enable_gradient_checkpointing(model) -> int:
    """Turn on transformers' non-reentrant gradient checkpointing for ``model`` (an HF causal LM,
    or a PEFT model around one) and flag its decoder layers as training. Returns the number of
    layers checkpointed; raises ConfigError for a model without checkpointable layers."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    if not getattr(model, "supports_gradient_checkpointing", True):
        raise ConfigError("train.gradient_checkpointing", f"{type(model).__name__} does not support it",
                          "set train.gradient_checkpointing: false")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ConfigError("train.gradient_checkpointing", f"{type(model).__name__} has no checkpointable layers",
                          "set train.gradient_checkpointing: false")
    for layer in layers:
        layer.training = True  # this module only: its attention/MLP (and their dropouts) stay in eval
    return len(layers)


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on ``device`` when ``enabled``, else nothing."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
