"""The trainer's scoring passes: log-probs and entropies of the policy (with or without gradient),
of the reference, the critic's values, sum pi^2, and the sync check's sequences.

A mixin of :class:`policyzoo.engine.trainer.deepspeed_trainer.Trainer`, which owns the models
(``engine``, ``ref``, ``critic``) and the settings read here (``share_prompt``, ``score_rows``,
``score_tokens``, ``autocast``, ``stage``, ``world``, ``lora``, ``teacher``). Log-probs come from
:mod:`.logprob` in chunks (no ``[B, T, V]`` fp32 copy of the logits, no temperature copy, no
concatenated logits), shared-prompt scoring from :mod:`.prefix`.

Every pass returns tensors on the trainer's device (``self.device``): log-probs, entropies,
reference log-probs, values and sum pi^2 never travel to the host, so the advantages and the loss
run where the model runs; the step moves its metrics to the host once (``policyzoo.step.metrics``).
Only the sync check's two scores (:meth:`Scoring.score_sequence`, :meth:`Scoring.next_logprobs`)
come back to the host: they are compared with the rollout engine's there.

The no-grad passes (old and reference log-probs, values, sum pi^2) run in chunks of rows sized by
a memory budget: at most :data:`SCORE_CHUNK_BYTES` of the ``[rows, T + 1, V]`` fp32 logits a
per-row forward makes (a row alone over it is a chunk of its own), and at most ``score_rows``
rows (16), so that a long response at a large vocabulary is not scored 16 rows at once (Qwen's
152k vocabulary at T = 1024: 0.62 GB a row, 10 GB for 16).
"""

from __future__ import annotations

import torch

from policyzoo.contract import Rollout, token_budget_bounds
from policyzoo.engine.dist import any_rank, gather

from . import lora as lora_mod
from . import sharded, share_check
from .logprob import sum_pi_squared
from .modeling import autocast, pack
from .prefix import model_calls, shared_prompt_logprobs, token_logprobs

#: shared-prompt check tolerance (nats) per weight dtype: fp32 forwards of other shapes agree to
#: ~1e-5; bf16 ones round differently by ~1e-2 (reduction order; not measured on a GPU here); a
#: wrong cache (a prompt seen by the wrong rows, positions shifted) differs by > 1 nat
SHARE_PROMPT_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}

#: bytes of fp32 logits ``[rows, T + 1, V]`` one no-grad scoring chunk may make (1 GiB). The default model
#: (V = 49,152) at T = 128 makes 25 MB a row, so CPU runs keep their 16-row chunks (``score_rows``)
SCORE_CHUNK_BYTES = 1 << 30


def budget_rows(t: int, vocab: int, cap: int, budget: int = SCORE_CHUNK_BYTES) -> int:
    """Rows per scoring chunk: as many as keep ``[rows, t + 1, vocab]`` fp32 logits within ``budget``
    bytes, at least 1 and at most ``cap``. Example: t = 1023, vocab = 152,064: 4 x 1024 x 152,064 =
    623 MB a row, so 1 row at 1 GiB; t = 127, vocab = 49,152: 25.2 MB a row, 42 rows, capped at 16."""
    per_row = 4 * (t + 1) * max(vocab, 1)
    return max(1, min(cap, budget // per_row))


def score_logprobs(model, rollout: Rollout, pad_id: int, device, entropy: bool, share: bool,
                   entropy_grad: bool = False, calls: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[B, T]`` (fp32, on ``device``) of ``rollout.response_ids`` under ``model`` at the
    rollout's temperature, exactly 0 where ``response_mask`` is False, and the entropies ``[B, T]``
    (nats) with ``entropy`` (with grad only with ``entropy_grad``), else None. ``share``: one forward
    per distinct prompt (:func:`.prefix.shared_prompt_logprobs`), else one per row. Nothing is copied
    to the host: the rollout's tensors are used on (or copied up to) ``device``, the length groups are
    planned from its host mask (:meth:`~policyzoo.contract.Rollout.mask_on_host`). ``calls``: the model
    calls the shared-prompt path makes (:func:`.prefix.shared_prompt_logprobs`). Raises what the
    model raises (ValueError for a temperature <= 0)."""
    if share:
        return shared_prompt_logprobs(model, rollout, pad_id, device, entropy, entropy_grad, calls=calls)
    ids, attn, pos, t = pack(rollout, pad_id, device)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits
    # the last position predicts nothing used: scored against a dummy target and dropped
    # from the [B, T + 1] results, so the logits are never sliced into a [B, T, V] copy
    targets = torch.nn.functional.pad(rollout.response_ids.to(device), (0, 1))
    lp, ent = token_logprobs(logits, targets, rollout.temperature, entropy, entropy_grad)
    lp, ent = lp[:, :-1], (ent[:, :-1] if entropy else None)
    mask = rollout.response_mask.to(device)
    return torch.where(mask, lp, 0.0), (torch.where(mask, ent, 0.0) if entropy else None)


class Scoring:
    """The scoring methods of the trainer (see the module docstring)."""

    share_prompt = True  #: shared-prompt scoring (set by the trainer; turned off by the start-up check)
    #: max and mean |shared - per-row| log-prob of the start-up check and its tolerance (None: not run)
    share_prompt_check: dict | None = None

    def _logprobs(self, model, rollout: Rollout, entropy: bool, share: bool | None = None, cast: bool | None = None,
                  entropy_grad: bool = False):
        """Log-probs (and entropies) ``[B, T]``, exactly 0 where ``response_mask`` is False (under
        bf16 autocast when ``train.autocast`` is on, unless ``cast`` is False); the entropy with
        grad only with ``entropy_grad``."""
        with autocast(self.device, self.autocast if cast is None else cast):
            return self._logprobs_inner(model, rollout, entropy, share, entropy_grad)

    def _logprobs_inner(self, model, rollout: Rollout, entropy: bool, share: bool | None, entropy_grad: bool = False):
        share = self.share_prompt if share is None else share
        # ZeRO 3 on several ranks: each call gathers every layer with all ranks, so all make as many calls
        calls = max(gather(model_calls(rollout))) if share and self.stage == 3 and self.world > 1 else None
        return score_logprobs(model, rollout, self.pad_id, self.device, entropy, share, entropy_grad, calls)

    @torch.no_grad()
    def check_share_prompt(self, ids: list[int], tolerance: float | None = None) -> str | None:
        """Compare shared-prompt scoring with the per-row forward on rows built from ``ids``: two
        prompts of different lengths (left padding), a long response, a short one and a one-token
        one (so that the rows form several length groups and the cache is restored between them).
        On a difference above ``tolerance`` nats, or an error (a model without cache support, a
        cache kind not known to be restorable), turn sharing off and return why (for a warning);
        None when it agrees or is off. ``tolerance`` defaults to :data:`SHARE_PROMPT_TOLERANCE` of the
        weights' dtype; the max and mean difference are kept in :attr:`share_prompt_check` (with
        ``remembered`` True when a pass of an earlier start with the same model, code and libraries was
        reused instead of the two forwards: :mod:`.share_check`).

        At ZeRO 3 on several ranks the ranks agree (each forward gathers weights with all of them): every
        rank runs the two forwards unless every rank remembered a pass, and sharing stays on only if it
        passed on every rank (the step's shared-prompt calls are collective there)."""
        agree = self.share_prompt and self.stage == 3 and self.world > 1
        why = self._check_share_prompt(ids, tolerance, agree)
        if agree and any_rank(not self.share_prompt) and self.share_prompt:
            self.share_prompt = False
            why = ("shared-prompt scoring failed its check on another rank (ZeRO 3 needs every rank alike); "
                   "scoring per row")
        return why

    def _check_share_prompt(self, ids: list[int], tolerance: float | None, agree: bool) -> str | None:
        """:meth:`check_share_prompt` on this rank; ``agree``: a remembered pass counts only if every rank has it."""
        tolerance = SHARE_PROMPT_TOLERANCE[self.dtype] if tolerance is None else tolerance
        if not self.share_prompt:
            return None
        if len(ids) < 8:
            self.share_prompt = False
            return f"the check sequence has {len(ids)} tokens (< 8): shared-prompt scoring left unchecked and off"
        key = share_check.check_key(self, ids)
        known = share_check.recall(key, tolerance)
        if agree and not all(gather(known is not None)):
            known = None
        if known is not None:
            self.share_prompt_check = {**known, "tolerance": tolerance, "remembered": True}
            return None
        h = len(ids) // 2
        t = len(ids) - h
        resp = torch.tensor([ids[h:], ids[h:][::-1], ids[h - 1:][:t], ids[h:][:t]])
        mask = torch.ones(4, t, dtype=torch.bool)
        mask[1, 2:] = False  # 2 tokens
        mask[3, 1:] = False  # 1 token
        r = Rollout(prompt_ids=[ids[:h], ids[:h], ids[:h - 1], ids[:h - 1]], response_ids=resp, response_mask=mask,
                    rollout_logprobs=torch.zeros(4, t), group_ids=torch.tensor([0, 0, 1, 1]),
                    truncated=torch.zeros(4, dtype=torch.bool))
        try:
            # overhead 0: every distinct length its own group, the cache restored between the calls
            d = (shared_prompt_logprobs(self.engine, r, self.pad_id, self.device, False, overhead=0)[0]
                 - self._logprobs(self.engine, r, False, False, cast=False)[0]).abs()[mask.to(self.device)].cpu()
        except Exception as e:  # noqa: BLE001 - any failure means: score per row
            self.share_prompt = False
            return f"shared-prompt scoring failed on this model ({type(e).__name__}: {e}); scoring per row"
        diff = float(d.max())
        self.share_prompt_check = {"max_diff": diff, "mean_diff": float(d.mean()), "tolerance": tolerance,
                                   "remembered": False}
        if not diff <= tolerance:
            self.share_prompt = False
            return (f"shared-prompt scoring differs from the per-row forward by up to {diff:.3g} nats (mean "
                    f"{float(d.mean()):.3g}, tolerance {tolerance:g}); scoring per row")
        share_check.remember(key, self.share_prompt_check)
        return None

    def _gather_once(self, model) -> bool:
        """Whether a no-grad pass gathers ``model`` whole once (:func:`.sharded.gathered_for_scoring`): at ZeRO 3
        on several ranks, when a whole copy takes at most half the free memory on every rank (agreed)."""
        if self.stage != 3 or self.world < 2:
            return False
        return not any_rank(2 * sharded.whole_bytes(model) > sharded.free_bytes(self.device))

    def _chunked(self, fn, rollout: Rollout, model):
        """``fn`` over row chunks of the no-grad scoring passes: :func:`budget_rows` rows each (the
        memory budget :data:`SCORE_CHUNK_BYTES`, at most ``score_rows``), or with ``score_tokens``
        (``train.max_tokens_per_micro_batch``) contiguous chunks of at most that many prompt + real
        response tokens, so long answers never score more at once than a training micro-batch does.
        The chunks are planned from the rollout's host mask; the results are joined on the device.
        ``fn(m, chunk)`` scores a chunk with ``m``: ``model``, or at ZeRO 3 on several ranks its module
        with every parameter gathered once for the whole pass when a copy fits (:meth:`_gather_once`)."""
        if self.score_tokens:
            lengths = rollout.mask_on_host().sum(-1).tolist()
            costs = [len(p) + int(n) for p, n in zip(rollout.prompt_ids, lengths)]
            bounds = token_budget_bounds(costs, self.score_tokens)
        else:
            rows = budget_rows(rollout.response_ids.shape[1], self.vocab, self.score_rows)
            bounds = [(k, min(k + rows, len(rollout))) for k in range(0, len(rollout), rows)]
        real = len(bounds)
        if self.stage == 3 and self.world > 1:  # ZeRO 3 gathers weights per forward: every rank runs as many
            most = max(gather(len(bounds)))
            if self.score_tokens and most > len(bounds):  # smaller chunks where the rows allow it
                n = min(most, len(rollout))
                cuts = [round(i * len(rollout) / n) for i in range(n + 1)]
                bounds = list(zip(cuts[:-1], cuts[1:]))
                real = len(bounds)
            bounds += [(0, 1)] * (most - len(bounds))  # then padding forwards of one row (outputs dropped)
        rows = torch.arange(len(rollout))
        with sharded.gathered_for_scoring(model, self._gather_once(model)) as m:
            outs = [fn(m, rollout.select((rows >= lo) & (rows < hi)) if (lo, hi) != (0, len(rollout)) else rollout)
                    for lo, hi in bounds][:real]
        if isinstance(outs[0], tuple):
            return tuple(None if o[0] is None else torch.cat(o) for o in zip(*outs))
        return torch.cat(outs)

    def logprobs(self, rollout: Rollout, grad: bool, entropy: bool = False, entropy_grad: bool = False):
        if grad:
            with lora_mod.adapter_dropout(self.engine.module, self.lora):
                return self._logprobs(self.engine, rollout, entropy, entropy_grad=entropy_grad)
        with torch.no_grad():
            return self._chunked(lambda m, r: self._logprobs(m, r, entropy), rollout, self.engine)

    @torch.no_grad()
    def ref_logprobs(self, rollout: Rollout) -> torch.Tensor:
        if not self._need_ref:
            raise RuntimeError("ref_logprobs called but no kl component is active (no reference model loaded)")
        if self.lora and not self.teacher:  # the base model: the adapter switched off
            with self.engine.module.disable_adapter():
                return self._chunked(lambda m, r: self._logprobs(m, r, False)[0], rollout, self.engine)
        return self._chunked(lambda m, r: self._logprobs(m, r, False)[0], rollout, self.ref)

    @torch.no_grad()
    def sum_pi_squared(self, rollout: Rollout) -> torch.Tensor:
        """``[B, T]``: sum_v softmax(logits / temperature)_v^2 at each response position (the
        per-row forward, float32), 0 where ``response_mask`` is False."""
        def run(m, r):
            ids, attn, pos, t = pack(r, self.pad_id, self.device)
            logits = m(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits
            s2 = sum_pi_squared(logits, r.temperature)[:, :-1]  # chunked: no [B, T, V] softmax
            return torch.where(r.response_mask.to(self.device), s2, 0.0)
        return self._chunked(run, rollout, self.engine)

    def values(self, rollout: Rollout, grad: bool) -> torch.Tensor:
        if self.critic is None:
            raise RuntimeError("values called but the baseline needs no critic (no value model loaded)")

        def run(m, r):
            ids, attn, pos, t = pack(r, self.pad_id, self.device)
            with autocast(self.device, self.autocast):
                return m(ids, attn, pos, t)
        if grad:
            return run(self.critic, rollout)
        with torch.no_grad():
            return self._chunked(run, rollout, self.critic)

    @torch.no_grad()
    def score_sequence(self, ids: list[int]) -> torch.Tensor:
        """Log-probs ``[len(ids) - 1]`` of tokens 1.. at temperature 1 (for the sync check)."""
        x = torch.tensor([ids], device=self.device)
        logits = self.engine(input_ids=x).logits[0, :-1]  # [L - 1, V], a contiguous view
        return token_logprobs(logits, x[0, 1:], 1.0, False)[0].cpu()

    @torch.no_grad()
    def next_logprobs(self, ids: list[int]) -> torch.Tensor:
        """Log-probs ``[V]`` of every token after ``ids`` at temperature 1 (for the sync check), on the
        host. The LM head runs on the last position only (``logits_to_keep=1``): one ``[1, V]`` row of
        logits, not ``[len(ids), V]``."""
        x = torch.tensor([ids], device=self.device)
        return self.engine(input_ids=x, logits_to_keep=1).logits[0, -1].float().log_softmax(-1).cpu()
