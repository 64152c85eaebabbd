"""What the trainer feeds its DeepSpeed engines: packed model inputs, the critic's value head and
the learning-rate schedule (used by :mod:`policyzoo.engine.trainer.deepspeed_trainer`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from policyzoo.contract.batch import Rollout


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
