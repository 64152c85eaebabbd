"""What the trainer feeds its DeepSpeed engines: packed model inputs, the critic's value head and
the learning-rate schedule (used by :mod:`policyzoo.engine.trainer.deepspeed_trainer`)."""

from __future__ import annotations

import torch
from torch import nn

from policyzoo.contract.batch import Rollout


def pack(rollout: Rollout, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``input_ids, attention_mask, position_ids [B, Pmax + T]`` and ``T``: prompts left-padded,
    responses right-padded (padding after a response is attended but, being later, changes nothing)."""
    b = len(rollout)
    t = rollout.response_ids.shape[1]
    pmax = max(len(p) for p in rollout.prompt_ids)
    ids = torch.full((b, pmax + t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, pmax + t), dtype=torch.long)
    for i, p in enumerate(rollout.prompt_ids):
        ids[i, pmax - len(p):pmax] = torch.tensor(p, dtype=torch.long)
        attn[i, pmax - len(p):] = 1
    ids[:, pmax:] = rollout.response_ids
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), attn.to(device), pos.to(device), t


def lr_schedule(name: str, warmup_steps: int, total_steps: int):
    """``optimizer -> LambdaLR`` for DeepSpeed: ``transformers.get_scheduler`` with ``name``
    (``constant``: ``constant_with_warmup``; ``linear`` and ``cosine`` decay to 0 at
    ``total_steps``), linear warm-up from 0 over ``warmup_steps`` optimizer steps. DeepSpeed steps
    it after every applied optimizer step (not after a skipped one) and saves it in checkpoints.
    The learning rate of optimizer step k (0-based) is ``lr x factor(k)``."""
    from transformers import get_scheduler

    kind = "constant_with_warmup" if name == "constant" else name
    return lambda optimizer: get_scheduler(kind, optimizer, num_warmup_steps=warmup_steps,
                                           num_training_steps=max(total_steps, 1))


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
