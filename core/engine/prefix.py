"""Shared-prompt scoring: one forward over each distinct prompt, not one per sample.

The G samples of a group share their prompt, and in GRPO-style runs the prompt is most of each
row (e.g. ~103 prompt tokens and 6-32 response tokens on the default task). Scoring every row as
``prompt + response`` runs the prompt through the model G times with identical results. Here the
distinct prompts of a batch run once (with gradient, when training), their key/value cache is
indexed out to the rows that share them, and only the response tokens run per row, attending to
that cache. Gradients from every row's response flow back through the shared cache into the one
prompt forward, so the loss and its gradient are those of the per-row forward (up to float
summation order: <= 1e-5 nats on the test models, ``tests/test_prefix_sharing.py``).

Work per batch: U distinct prompts x prompt length + B rows x (T - 1) response tokens, against
B x (prompt length + T) per row. The response's last token is never fed: its logits would predict
a token after the response, which no loss uses; response token 0 is scored from the prompt's last
position.

Requires a model whose forward accepts ``past_key_values`` (a transformers ``Cache`` with
``batch_select_indices``) together with 2-D ``attention_mask`` and ``position_ids`` -- every
decoder-only model in transformers that supports generation with a cache. ``engine.share_prompt:
false`` turns it off; the engine also compares it with the per-row forward once at start-up and
turns it off itself (with a warning) when they disagree.
"""

from __future__ import annotations

import torch

from ..batch import Rollout


def distinct_prompts(prompt_ids: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """The distinct prompts in first-seen order, and ``index [B]`` (long): row i's prompt is
    ``distinct[index[i]]``. Grouping is by token ids, not by ``group_ids``, so two groups asking
    the same prompt share it too, and nothing is assumed about row order."""
    seen: dict[tuple[int, ...], int] = {}
    index = [seen.setdefault(tuple(p), len(seen)) for p in prompt_ids]
    return [list(p) for p in seen], torch.tensor(index, dtype=torch.long)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids, attention_mask, position_ids [N, max len]``; position ids count real tokens."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        attn[i, width - len(s):] = 1
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


def shared_prompt_logits(model, rollout: Rollout, pad_id: int, device) -> torch.Tensor:
    """Logits ``[B, T, V]``: row i, column t holds the logits that score ``response_ids[i, t]``
    (from the last prompt position for t = 0), exactly the columns the per-row forward gives.

    ``model``: a causal LM (or a DeepSpeed engine around one) called as
    ``model(input_ids=, attention_mask=, position_ids=, past_key_values=, use_cache=, logits_to_keep=)``.
    Raises whatever the model raises when it does not support a cache (the start-up check catches
    it and falls back)."""
    distinct, index = distinct_prompts(rollout.prompt_ids)
    p_ids, p_attn, p_pos = left_pad(distinct, pad_id)
    out = model(input_ids=p_ids.to(device), attention_mask=p_attn.to(device), position_ids=p_pos.to(device),
                use_cache=True, logits_to_keep=1)
    index_d = index.to(device)
    first = out.logits[:, -1][index_d].unsqueeze(1)  # [B, 1, V]: scores response token 0
    t = rollout.response_ids.shape[1]
    if t == 1:
        return first
    cache = out.past_key_values
    cache.batch_select_indices(index_d)  # [U, ...] -> [B, ...], differentiable indexing
    resp = rollout.response_ids[:, :-1]  # the last token predicts nothing the loss uses
    attn = torch.cat([p_attn[index], torch.ones_like(resp)], dim=1)  # responses: every column attended,
    pos = p_attn.sum(-1)[index].unsqueeze(1) + torch.arange(t - 1)  # as in the per-row pack()
    rest = model(input_ids=resp.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
                 past_key_values=cache, use_cache=True, logits_to_keep=t - 1).logits
    return torch.cat([first, rest], dim=1)
