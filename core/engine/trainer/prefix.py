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
position. Rows whose responses are much shorter than the batch's longest run in their own group
(:func:`length_buckets`), padded only to their group's longest: with short answers and one long
one, padding would otherwise dominate the response tokens.

Requires a model whose forward accepts ``past_key_values`` (a transformers ``Cache`` with
``batch_select_indices``) together with 2-D ``attention_mask`` and ``position_ids`` -- every
decoder-only model in transformers that supports generation with a cache. ``engine.share_prompt:
false`` turns it off; the engine also compares it with the per-row forward once at start-up and
turns it off itself (with a warning) when they disagree.
"""

from __future__ import annotations

import copy

import torch

from policyzoo.contract.batch import Rollout

from .logprob import fused_token_logprobs


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


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                   entropy: bool, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits [B, T, V]`` at the positions before ``targets [B, T]`` -> log-probs ``[B, T]`` of
    the targets under softmax(logits / temperature), and the entropy ``[B, T]`` (nats; no grad
    unless ``entropy_grad``, asked only by a loss term that ``needs_entropy``) when ``entropy`` else
    None. Computed in chunks of rows with a fused backward, never building another [B, T, V] tensor
    (:func:`policyzoo.engine.trainer.logprob.fused_token_logprobs`), with or without the entropy's
    gradient. Raises ValueError for mismatched shapes or ``temperature <= 0``."""
    return fused_token_logprobs(logits, targets, temperature, entropy, entropy_grad)


#: what one more model call costs, in padded row-positions: measured on the default model (fp32, 2 threads),
#: one trainer step (reference forward, forward + backward) took 1.19-1.22x as long split at 16 as at the best
#: split, and 64-256 were within the noise of the best (``bench/length_groups.py``,
#: bench/results/length_groups); an earlier run of the same A/B put a call at ~130 positions
CALL_OVERHEAD = 128


def length_buckets(lengths: list[int], overhead: int = CALL_OVERHEAD) -> list[list[int]]:
    """Rows grouped so that each group is padded only to its own longest response.

    ``lengths``: each row's response length (tokens fed per row = length - 1). A group costs
    rows x (its longest - 1) token positions plus ``overhead`` positions for its model call (a
    group of one-token responses makes no call and costs nothing; :data:`CALL_OVERHEAD`); the split
    minimising the total is found exactly by dynamic programming over the distinct lengths (sorted,
    longest first; O(k^2) for k distinct lengths). Returns lists of row indices, longest group first."""
    distinct = sorted(set(lengths), reverse=True)
    count = {n: 0 for n in distinct}
    for n in lengths:
        count[n] += 1
    k = len(distinct)
    best, cut = [0.0] + [float("inf")] * k, [0] * (k + 1)  # best[j]: cost of the j longest lengths
    for j in range(1, k + 1):
        rows = 0
        for i in range(j - 1, -1, -1):  # group = distinct[i:j], padded to distinct[i]
            rows += count[distinct[i]]
            cost = best[i] + (rows * (distinct[i] - 1) + overhead if distinct[i] > 1 else 0)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], k
    while j > 0:
        groups.append(set(distinct[cut[j]:j]))
        j = cut[j]
    return [[r for r, n in enumerate(lengths) if n in g] for g in reversed(groups)]


def _cache_layers(cache) -> list:
    """The prompt cache's layers, checked to be of a kind whose state is its ``keys``/``values``
    tensors plus plain counters (never modified in place): shallow copies of them restore the
    prompt-only cache before each length group. Other kinds raise, so the start-up check falls
    back to per-row scoring."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []}) or [type(cache).__name__]
        raise TypeError(f"unsupported cache layer kind(s) {kinds}")
    return [copy.copy(layer) for layer in layers]


def _prompt_pass(model, rollout: Rollout, pad_id: int, device):
    """One forward over the distinct prompts: ``(last [U, V]`` logits of each prompt's last position,
    the cache, its restorable layers, ``index [B]``, ``p_attn [U, Pmax]``)."""
    distinct, index = distinct_prompts(rollout.prompt_ids)
    p_ids, p_attn, p_pos = left_pad(distinct, pad_id)
    out = model(input_ids=p_ids.to(device), attention_mask=p_attn.to(device), position_ids=p_pos.to(device),
                use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], out.past_key_values, _cache_layers(out.past_key_values), index, p_attn


def _group(model, rollout: Rollout, rows: list[int], width: int, prompt, device, entropy: bool,
           entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) ``[len(rows), width]`` of one length group: token 0 from the prompts'
    last logits, tokens 1.. from one response forward over the group's rows attending to the cache;
    scored apart and their ``[rows, .]`` results joined, never their logits."""
    last, cache, base, index, p_attn = prompt
    sel = index[rows]
    targets = rollout.response_ids[rows, :width].to(device)
    lp, ent = token_logprobs(last[sel.to(device)], targets[:, 0], rollout.temperature, entropy, entropy_grad)
    lps, ents = [lp[:, None]], ([ent[:, None]] if entropy else None)
    if width > 1:
        cache.layers = [copy.copy(layer) for layer in base]  # the prompt-only cache again
        cache.batch_select_indices(sel.to(device))  # [U, ...] -> [rows, ...], differentiable
        resp = rollout.response_ids[rows, :width - 1]  # the last token predicts nothing used
        # as in the per-row pack(), built on the host from the prompts' padding (host data) and copied up
        attn = torch.cat([p_attn[sel], torch.ones(len(rows), width - 1, dtype=p_attn.dtype)], dim=1)
        pos = p_attn.sum(-1)[sel].unsqueeze(1) + torch.arange(width - 1)
        rest = model(input_ids=resp.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
                     past_key_values=cache, use_cache=True, logits_to_keep=width - 1).logits
        r_lp, r_ent = token_logprobs(rest, targets[:, 1:], rollout.temperature, entropy, entropy_grad)
        del rest  # [rows, width - 1, V]: freed before the next group's forward
        lps.append(r_lp)
        if entropy:
            ents.append(r_ent)
    return torch.cat(lps, 1), (torch.cat(ents, 1) if entropy else None)


def response_extents(rollout: Rollout) -> list[int]:
    """Each row's response length through its last real token (at least 1), read from the host copy of
    the mask (:meth:`~policyzoo.contract.Rollout.mask_on_host`): the plan of the length groups never
    waits on the device."""
    mask = rollout.mask_on_host()
    b, t = mask.shape
    cols = torch.arange(1, t + 1).expand(b, t)
    return torch.where(mask, cols, 0).amax(-1).clamp(min=1).tolist()


def model_calls(rollout: Rollout, overhead: int | None = None) -> int:
    """The model calls :func:`shared_prompt_logprobs` makes on ``rollout``: the prompt pass, plus one per
    length group whose rows have more than one token (planned on the host, no model call)."""
    lengths = response_extents(rollout)
    groups = length_buckets(lengths, CALL_OVERHEAD if overhead is None else overhead)
    return 1 + sum(1 for rows in groups if max(lengths[r] for r in rows) > 1)


def _filler_call(model, pad_id: int, device) -> torch.Tensor:
    """One model call on a single pad token whose output counts 0 (``0 x`` its logits' sum): it runs every
    layer forward (and, with grad, backward) like a real call and changes no value and no gradient."""
    one = torch.full((1, 1), pad_id, dtype=torch.long, device=device)
    logits = model(input_ids=one, attention_mask=torch.ones_like(one), position_ids=torch.zeros_like(one),
                   logits_to_keep=1).logits
    return 0.0 * logits.float().sum()


def shared_prompt_logprobs(model, rollout: Rollout, pad_id: int, device, entropy: bool, entropy_grad: bool = False,
                           overhead: int | None = None, calls: int | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[B, T]`` of ``response_ids`` at ``rollout.temperature`` (and the entropy
    ``[B, T]`` with ``entropy``), on ``device``: those of the per-row forward wherever
    ``response_mask`` is True, exactly 0 elsewhere. Token t is scored from the logits at the
    position before it (the prompt's last position for t = 0). Rows run in
    :func:`length_buckets` groups (``overhead`` positions a call; None: :data:`CALL_OVERHEAD`), each padded to
    its own longest response; log-probs are taken per group, so no [B, T, V] logits tensor is ever built.

    ``calls``: make exactly that many model calls (at least :func:`model_calls`), the rest filler calls of one
    token whose output counts 0 (forward and backward through every layer, no value or gradient changed).
    At ZeRO 3 on several ranks every call gathers each layer with every rank, and the number of length
    groups differs between ranks: with ``calls`` agreed over the ranks (their maximum), every rank makes as
    many calls, so shared-prompt scoring is safe there (``Scoring._logprobs_inner`` agrees it).

    ``model``: a causal LM (or a DeepSpeed engine around one) called as
    ``model(input_ids=, attention_mask=, position_ids=, past_key_values=, use_cache=, logits_to_keep=)``.
    Raises whatever the model raises when it does not support a cache, and TypeError for cache
    layer kinds not known to be restorable (the start-up check catches both and falls back)."""
    prompt = _prompt_pass(model, rollout, pad_id, device)
    b, t = rollout.response_ids.shape
    lengths = response_extents(rollout)
    lp = torch.zeros(b, t, device=device)
    ent = torch.zeros(b, t, device=device) if entropy else None
    made = 1
    for rows in length_buckets(lengths, CALL_OVERHEAD if overhead is None else overhead):
        width = max(lengths[r] for r in rows)
        made += width > 1
        g_lp, g_ent = _group(model, rollout, rows, width, prompt, device, entropy, entropy_grad)
        idx = torch.tensor(rows, device=device)
        lp = lp.index_copy(0, idx, torch.nn.functional.pad(g_lp, (0, t - width)))
        if entropy:
            ent = ent.index_copy(0, idx, torch.nn.functional.pad(g_ent, (0, t - width)))
    for _ in range(made, calls or made):  # filler calls: as many model calls as the other ranks make
        lp = lp + _filler_call(model, pad_id, device)
    mask = rollout.response_mask.to(device)
    return torch.where(mask, lp, 0.0), (torch.where(mask, ent, 0.0) if entropy else None)
