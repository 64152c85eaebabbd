"""What the trainer feeds its DeepSpeed engines and how it computes: packed model inputs, the critic's value head,
the learning-rate schedule (used by :mod:`policyzoo.engine.trainer.deepspeed_trainer`), and the two ways it trades
compute for memory or precision:

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
import math
from dataclasses import dataclass

import torch
from torch import nn

from policyzoo.contract.batch import Rollout
from policyzoo.errors import ConfigError


def pack(rollout: Rollout, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``input_ids, attention_mask, position_ids [B, Pmax + T]`` on ``device`` and ``T``: prompts left-padded,
    responses right-padded (padding after a response is attended but, being later, changes nothing). The
    prompts (host lists) are padded on the host and copied up once; ``response_ids`` are used where they are
    (no device-to-host copy: a rollout already on ``device`` stays there)."""
    b = len(rollout)
    t = rollout.response_ids.shape[1]
    pmax = max(len(p) for p in rollout.prompt_ids)
    ids = torch.full((b, pmax), pad_id, dtype=torch.long)
    attn = torch.zeros((b, pmax + t), dtype=torch.long)
    for i, p in enumerate(rollout.prompt_ids):
        ids[i, pmax - len(p):] = torch.tensor(p, dtype=torch.long)
        attn[i, pmax - len(p):] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    ids = torch.cat([ids.to(device), rollout.response_ids.to(device=device, dtype=torch.long)], dim=1)
    return ids, attn.to(device), pos.to(device), t


@dataclass
class LRSchedule:
    """The learning-rate factor of optimizer step ``k`` (0-based; the lr of the update is
    ``train.lr x factor(k)``), a plain-data callable, so DeepSpeed saves its fields with the
    scheduler and ``state.json`` records them (``policyzoo.engine.run.resume``).

    * warm-up, ``k < warmup_steps``: ``(k + 1) / (warmup_steps + 1)``, so no update runs at lr 0
      (``transformers``' warm-up gives ``k / warmup_steps``, 0 at the first update: verl #3674);
    * then ``base x shape(p)`` with ``p = (k - k0) / (total_steps - k0)``, ``k0`` the end of the
      warm-up, or ``from_step`` for a schedule re-planned on resume (``base = from_factor``, the
      factor it had there; else 1): ``constant`` 1, ``linear`` ``1 - p``, ``cosine``
      ``(1 + cos(pi p)) / 2``, as ``transformers.get_scheduler``'s; 0 from ``total_steps`` on.
      The last step of the horizon, ``k = total_steps - 1``, still gets a factor above 0."""

    name: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    from_step: int = 0
    from_factor: float = 1.0

    def __call__(self, k: int) -> float:
        if k < self.warmup_steps:
            return (k + 1) / (self.warmup_steps + 1)
        replanned = self.from_step > self.warmup_steps
        k0, base = (self.from_step, self.from_factor) if replanned else (self.warmup_steps, 1.0)
        p = min(1.0, (k - k0) / max(1, self.total_steps - k0))
        shape = {"constant": 1.0, "linear": 1.0 - p, "cosine": 0.5 * (1.0 + math.cos(math.pi * p))}[self.name]
        return base * shape

    def replanned(self, done: int, name: str, total_steps: int) -> "LRSchedule":
        """The schedule after ``done`` optimizer steps, stretched (or shrunk) to end at
        ``total_steps`` with ``name``'s shape, going on from the factor it has at ``done``; a
        resume inside the warm-up keeps the warm-up and plans the decay on the new horizon."""
        if done < self.warmup_steps:
            return LRSchedule(name, self.warmup_steps, total_steps)
        return LRSchedule(name, self.warmup_steps, total_steps, done, self(done))


def lr_schedule(name: str, warmup_steps: int, total_steps: int):
    """``optimizer -> LambdaLR`` for DeepSpeed with the factor :class:`LRSchedule` (``constant``,
    ``linear`` and ``cosine``; linear warm-up over ``warmup_steps`` optimizer steps). DeepSpeed
    steps it after every applied optimizer step (not after a skipped one) and saves it in
    checkpoints."""
    from torch.optim.lr_scheduler import LambdaLR

    return lambda optimizer: LambdaLR(optimizer, LRSchedule(name, warmup_steps, max(total_steps, 1)))


class ValueModel(nn.Module):
    """A causal LM's transformer body with a scalar head: ``values [B, keep]`` at the last ``keep``
    positions (the head is zero-initialised)."""

    def __init__(self, path: str, dtype, trust_remote_code: bool):
        super().__init__()
        from transformers import AutoModel

        self.body = AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
        self.head = nn.Linear(self.body.config.hidden_size, 1, dtype=dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids, keep: int):
        h = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        return self.head(h[:, -keep:]).squeeze(-1).float()


# ----------------------------------------------------------------------------- compute for memory or precision

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
