"""The trainer: DeepSpeed engines for the policy (and the critic), a frozen reference model.

* One DeepSpeed engine per trained model, ZeRO stage 0-3, fp32 (bf16 only with ZeRO >= 1),
  torch's fused AdamW (``torch_adam`` + ``fused``: no DeepSpeed op build; one kernel over all
  parameters, 7x faster than the per-parameter loop on CPU), gradient clipping as configured (DeepSpeed
  would otherwise default to 1.0). Gradient accumulation is left to the caller
  (``managed_gradient_accumulation: false``): every ``backward`` accumulates, ``step`` reduces and
  updates once, so the number of micro-batches per optimizer step may vary from step to step.
  Losses arrive already normalised over the whole step (``StepTotals``) and are not divided by
  DeepSpeed's accumulation count (``scale_wrt_gas=False``).
* Log-probs: response token t is scored from the logits at position t-1 (the last prompt token
  for t = 0), divided by the sampling temperature, as the sampler drew it. Prompts are left-padded
  and responses right-padded, so every row's response starts in the same column; position ids
  count real tokens only, so padding changes no logit. By default (``share_prompt``) each distinct
  prompt runs once and only the responses run per row (``policyzoo.engine.trainer.prefix``): same
  log-probs and gradients, G times fewer prompt FLOPs.
* The reference model (only when a ``kl`` component or a term with ``needs_ref`` is active) is a
  frozen teacher from ``model.teacher`` (``ref_path``: on-policy distillation), or a frozen copy of the initial
  weights; the critic (only for baselines that ``need_values``) is the same transformer with a
  scalar value head (zero-initialised, so every first value is 0) trained by its own engine.
* Options: LoRA adapters (``model.lora``, ``policyzoo.engine.trainer.lora``: the reference is then the base
  model with the adapter off), gradient checkpointing and bf16 autocast (``policyzoo.engine.trainer.compute``),
  the user's own DeepSpeed config merged over policyzoo's (``engine.deepspeed``,
  ``policyzoo.engine.trainer.dsconfig``).
"""

from __future__ import annotations

import torch

from policyzoo.contract import Rollout, token_budget_bounds
from policyzoo.engine.device import local_device, set_thread_device
from policyzoo.engine.dist import any_rank, gather, world_size

from . import lora as lora_mod
from . import sharded
from .checkpoint_io import TrainerIO
from .compute import autocast, enable_gradient_checkpointing
from .dsconfig import BETAS, check_stage, ds_config, initialize, merge, read_user_config
from .dsconfig import zero_stage as stage_of
from .logprob import sum_pi_squared
from .modeling import ValueModel, lr_schedule, pack
from .prefix import shared_prompt_logprobs, token_logprobs

__all__ = ["BETAS", "Trainer", "ValueModel", "ds_config", "lr_schedule", "pack", "token_logprobs"]


#: shared-prompt check tolerance (nats) per weight dtype: fp32 forwards of other shapes agree to
#: ~1e-5; bf16 ones round differently by ~1e-2 (reduction order; not measured on a GPU here); a
#: wrong cache (a prompt seen by the wrong rows, positions shifted) differs by > 1 nat
SHARE_PROMPT_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}


class Trainer(TrainerIO):
    """DeepSpeed engine(s) for one run. ``need_ref`` / ``need_critic`` load those models."""

    stage, world = 0, 1  #: ZeRO stage and data-parallel ranks (set by ``__init__``)
    score_tokens: int | None = None  #: token budget of the no-grad scoring chunks (set by ``__init__``)
    autocast = False  #: bf16 autocast in the scoring forwards (set by ``__init__``)
    lora = False  #: the policy is a PEFT model with LoRA adapters (set by ``__init__``)
    teacher = False  #: the reference is a teacher from model.teacher (set by ``__init__``)
    dtype = "float32"  #: the weights' dtype (``model.dtype``; set by ``__init__``)
    #: max and mean |shared - per-row| log-prob of the start-up check and its tolerance (None: not run)
    share_prompt_check: dict | None = None

    def __init__(self, info, *, dtype: str, zero_stage: int, lr: float, weight_decay: float, grad_clip: float,
                 need_ref: bool, need_critic: bool, critic_lr: float, trust_remote_code: bool = False,
                 score_rows: int = 16, share_prompt: bool = True, lora=None, gradient_checkpointing: bool = False,
                 autocast: bool = False, deepspeed_config: str | dict | None = None, seed: int = 0,
                 score_tokens: int | None = None, ref_path: str | None = None,
                 betas: tuple[float, float] = BETAS, eps: float = 1e-8, schedule: str = "constant",
                 warmup_steps: int = 0, total_steps: int = 1):
        from transformers import AutoModelForCausalLM

        user = read_user_config(deepspeed_config)
        policy_cfg = merge(ds_config(zero_stage, lr, weight_decay, grad_clip, dtype, betas, eps), user)
        sched = lr_schedule(schedule, warmup_steps, total_steps)
        zero_stage = stage_of(policy_cfg)  # the user's config may set the stage
        check_stage(zero_stage, dtype, lora)
        self.info, self.stage, self.pad_id, self.dtype = info, zero_stage, info.pad_token_id, dtype
        self.score_rows, self.score_tokens = score_rows, score_tokens
        #: checkpointed layers keep no KV cache, so shared-prompt scoring is off with checkpointing; at ZeRO 3
        #: on several ranks too: it runs one forward per length group, a count that differs between ranks,
        #: and every ZeRO-3 forward gathers weights with all ranks (a rank would wait forever)
        self.share_prompt = share_prompt and not gradient_checkpointing and not (zero_stage == 3 and world_size() > 1)
        #: bf16 compute over fp32 weights (policyzoo.engine.trainer.compute)
        self.autocast = autocast
        set_thread_device()
        self.device = local_device()  # cuda:LOCAL_RANK (one GPU per rank) or cpu
        tdtype = getattr(torch, dtype)
        path = str(info.path)
        # ZeRO 3: models load partitioned (deepspeed.zero.Init via transformers) while this is referenced
        zero3 = sharded.zero3_loading(policy_cfg) if zero_stage == 3 else None
        model = AutoModelForCausalLM.from_pretrained(path, dtype=tdtype, trust_remote_code=trust_remote_code)
        model.eval()  # no dropout: the trainer must score exactly what the sampler sampled
        self.lora = lora is not None
        if self.lora:
            model = lora_mod.wrap(model, lora, seed)
            model.eval()
        if gradient_checkpointing:
            enable_gradient_checkpointing(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        #: trained parameters (all of them, or the LoRA adapter's)
        self.trainable_params = sum(getattr(p, "ds_numel", p.numel()) for p in trainable)  # ZeRO 3: partitioned
        self.engine = initialize(model, trainable, policy_cfg, sched)
        self.ref = None
        #: the reference is another model: a teacher (model.teacher, on-policy distillation)
        self.teacher = ref_path is not None
        if need_ref and (self.teacher or not self.lora):  # with LoRA the reference is the base model (adapter off)
            self.ref = AutoModelForCausalLM.from_pretrained(ref_path or path, dtype=tdtype,
                                                            trust_remote_code=trust_remote_code)
            self.ref.eval().requires_grad_(False)
            self.ref = sharded.reference_engine(self.ref, policy_cfg) if zero3 else self.ref.to(self.device)
        self.critic = None
        if need_critic:
            vm = ValueModel(path, tdtype, trust_remote_code)
            if gradient_checkpointing:
                enable_gradient_checkpointing(vm.body)
            cfg = merge(ds_config(zero_stage, critic_lr, weight_decay, grad_clip, dtype, betas, eps), user)
            self.critic = initialize(vm, vm.parameters(), cfg, sched)
        del zero3  # later loads in this process (the transformers rollout) are whole again
        self._need_ref = need_ref
        self._nonfinite = 0
        #: DeepSpeed averages gradients over ranks; losses are scaled by the world size so the
        #: average is the full-batch gradient (see policyzoo.engine.dist)
        self.world = world_size()

    def models_loaded(self) -> list[str]:
        """The models this run holds, for the summary (with LoRA the reference is the base model)."""
        name = "teacher" if self.teacher else "reference (base model, adapter off)" if self.lora else "reference"
        ref = [name] if self._need_ref else []
        return ["policy"] + ref + (["critic"] if self.critic is not None else [])

    # ---------------------------------------------------------------------------- scoring
    def _logprobs(self, model, rollout: Rollout, entropy: bool, share: bool | None = None, cast: bool | None = None,
                  entropy_grad: bool = False):
        """Log-probs (and entropies) ``[B, T]``, exactly 0 where ``response_mask`` is False (under
        bf16 autocast when ``train.autocast`` is on, unless ``cast`` is False); the entropy with
        grad only with ``entropy_grad``."""
        with autocast(self.device, self.autocast if cast is None else cast):
            return self._logprobs_inner(model, rollout, entropy, share, entropy_grad)

    def _logprobs_inner(self, model, rollout: Rollout, entropy: bool, share: bool | None, entropy_grad: bool = False):
        if self.share_prompt if share is None else share:
            lp, ent = shared_prompt_logprobs(model, rollout, self.pad_id, self.device, entropy, entropy_grad)
        else:
            ids, attn, pos, t = pack(rollout, self.pad_id, self.device)
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits
            # the last position predicts nothing used: scored against a dummy target and dropped
            # from the [B, T + 1] results, so the logits are never sliced into a [B, T, V] copy
            targets = torch.nn.functional.pad(rollout.response_ids.to(self.device), (0, 1))
            lp, ent = token_logprobs(logits, targets, rollout.temperature, entropy, entropy_grad)
            lp, ent = lp[:, :-1], (ent[:, :-1] if entropy else None)
            mask = rollout.response_mask.to(self.device)
            lp, ent = torch.where(mask, lp, 0.0), (torch.where(mask, ent, 0.0) if entropy else None)
        return lp.cpu(), (ent.cpu() if ent is not None else None)

    @torch.no_grad()
    def check_share_prompt(self, ids: list[int], tolerance: float | None = None) -> str | None:
        """Compare shared-prompt scoring with the per-row forward on rows built from ``ids``: two
        prompts of different lengths (left padding), a long response, a short one and a one-token
        one (so that the rows form several length groups and the cache is restored between them).
        On a difference above ``tolerance`` nats, or an error (a model without cache support, a
        cache kind not known to be restorable), turn sharing off and return why (for a warning);
        None when it agrees or is off. ``tolerance`` defaults to :data:`SHARE_PROMPT_TOLERANCE` of the
        weights' dtype; the max and mean difference are kept in :attr:`share_prompt_check`."""
        tolerance = SHARE_PROMPT_TOLERANCE[self.dtype] if tolerance is None else tolerance
        if not self.share_prompt:
            return None
        if len(ids) < 8:
            self.share_prompt = False
            return f"the check sequence has {len(ids)} tokens (< 8): shared-prompt scoring left unchecked and off"
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
            d = (self._logprobs(self.engine, r, False, True, cast=False)[0]
                 - self._logprobs(self.engine, r, False, False, cast=False)[0]).abs()[mask]
        except Exception as e:  # noqa: BLE001 - any failure means: score per row
            self.share_prompt = False
            return f"shared-prompt scoring failed on this model ({type(e).__name__}: {e}); scoring per row"
        diff = float(d.max())
        self.share_prompt_check = {"max_diff": diff, "mean_diff": float(d.mean()), "tolerance": tolerance}
        if not diff <= tolerance:
            self.share_prompt = False
            return (f"shared-prompt scoring differs from the per-row forward by up to {diff:.3g} nats (mean "
                    f"{float(d.mean()):.3g}, tolerance {tolerance:g}); scoring per row")
        return None

    def _chunked(self, fn, rollout: Rollout):
        """``fn`` over row chunks of the no-grad scoring passes: ``score_rows`` rows each, or with
        ``score_tokens`` (``train.max_tokens_per_micro_batch``) contiguous chunks of at most that
        many prompt + real response tokens, so long answers never score more at once than a
        training micro-batch does."""
        if self.score_tokens:
            costs = [len(p) + int(n) for p, n in zip(rollout.prompt_ids, rollout.response_mask.sum(-1).tolist())]
            bounds = token_budget_bounds(costs, self.score_tokens)
        else:
            bounds = [(k, min(k + self.score_rows, len(rollout))) for k in range(0, len(rollout), self.score_rows)]
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
        outs = [fn(rollout.select((rows >= lo) & (rows < hi))) for lo, hi in bounds][:real]
        if isinstance(outs[0], tuple):
            return tuple(None if o[0] is None else torch.cat(o) for o in zip(*outs))
        return torch.cat(outs)

    def logprobs(self, rollout: Rollout, grad: bool, entropy: bool = False, entropy_grad: bool = False):
        if grad:
            with lora_mod.adapter_dropout(self.engine.module, self.lora):
                return self._logprobs(self.engine, rollout, entropy, entropy_grad=entropy_grad)
        with torch.no_grad():
            return self._chunked(lambda r: self._logprobs(self.engine, r, entropy), rollout)

    @torch.no_grad()
    def ref_logprobs(self, rollout: Rollout) -> torch.Tensor:
        if not self._need_ref:
            raise RuntimeError("ref_logprobs called but no kl component is active (no reference model loaded)")
        if self.lora and not self.teacher:  # the base model: the adapter switched off
            with self.engine.module.disable_adapter():
                return self._chunked(lambda r: self._logprobs(self.engine, r, False)[0], rollout)
        return self._chunked(lambda r: self._logprobs(self.ref, r, False)[0], rollout)

    @torch.no_grad()
    def sum_pi_squared(self, rollout: Rollout) -> torch.Tensor:
        """``[B, T]``: sum_v softmax(logits / temperature)_v^2 at each response position (the
        per-row forward, float32), 0 where ``response_mask`` is False."""
        def run(r):
            ids, attn, pos, t = pack(r, self.pad_id, self.device)
            logits = self.engine(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits
            s2 = sum_pi_squared(logits, r.temperature)[:, :-1]  # chunked: no [B, T, V] softmax
            return torch.where(r.response_mask.to(self.device), s2, 0.0).cpu()
        return self._chunked(run, rollout)

    def values(self, rollout: Rollout, grad: bool) -> torch.Tensor:
        if self.critic is None:
            raise RuntimeError("values called but the baseline needs no critic (no value model loaded)")

        def run(r):
            ids, attn, pos, t = pack(r, self.pad_id, self.device)
            with autocast(self.device, self.autocast):
                return self.critic(ids, attn, pos, t).cpu()
        if grad:
            return run(rollout)
        with torch.no_grad():
            return self._chunked(run, rollout)

    @torch.no_grad()
    def score_sequence(self, ids: list[int]) -> torch.Tensor:
        """Log-probs ``[len(ids) - 1]`` of tokens 1.. at temperature 1 (for the sync check)."""
        x = torch.tensor([ids], device=self.device)
        logits = self.engine(input_ids=x).logits[0, :-1]  # [L - 1, V], a contiguous view
        return token_logprobs(logits, x[0, 1:], 1.0, False)[0].cpu()

    @torch.no_grad()
    def next_logprobs(self, ids: list[int]) -> torch.Tensor:
        """Log-probs ``[V]`` of every token after ``ids`` at temperature 1 (for the sync check)."""
        x = torch.tensor([ids], device=self.device)
        return self.engine(input_ids=x).logits[0, -1].float().log_softmax(-1).cpu()

    # ---------------------------------------------------------------------------- updates
    def backward(self, loss: torch.Tensor, value_loss: torch.Tensor | None = None) -> None:
        """Accumulate one micro-batch. A non-finite loss is not back-propagated and marks the
        whole optimizer step as skipped."""
        for eng, part in ((self.engine, loss), (self.critic, value_loss)):
            if eng is None or part is None:
                continue
            if not torch.isfinite(part.detach()).all():
                self._nonfinite += 1
                continue
            eng.backward(part.to(self.device) * self.world, scale_wrt_gas=False)

    @staticmethod
    def _grad_norm(eng) -> torch.Tensor:
        """L2 norm of the gradients held on this rank's module parameters (all of them at ZeRO 0/1;
        partitioned away at 2/3). Not finite when any gradient entry is NaN or inf (or the sum of
        squares overflows fp32), which is how :meth:`step` detects a bad gradient in one pass."""
        grads = [p.grad for p in eng.module.parameters() if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())

    def step(self, skip: bool = False) -> dict:
        """Apply the accumulated gradients once. Returns ``grad_norm`` (before clipping; the norm of
        the gradient averaged over ranks, at every ZeRO stage: at stage 0, where DeepSpeed averages
        inside ``step()``, the average is taken first and ``step()`` told not to repeat it) or
        ``{"skipped": 1}`` (weights untouched) when ``skip`` is given or a loss or gradient was
        not finite, on this rank or any other (the flag is agreed over ranks first)."""
        engines = [e for e in (self.engine, self.critic) if e is not None]
        reduced = self.stage == 0 and self.world > 1
        if reduced:  # ZeRO 0 averages inside step(): average first, so the norm is the global one
            for e in engines:
                e.buffered_allreduce_fallback(grads=None)
        norms = [self._grad_norm(e) for e in engines]
        bad = skip or bool(self._nonfinite) or not all(bool(torch.isfinite(n)) for n in norms)
        if any_rank(bad):
            self.discard()
            return {"skipped": 1}
        pre = float(norms[0]) if self.stage == 0 else None
        for e in engines:
            if reduced:  # already averaged: step() must not average again
                e.enable_backward_allreduce, saved = False, e.enable_backward_allreduce
                try:
                    e.step()
                finally:
                    e.enable_backward_allreduce = saved
            else:
                e.step()
        out = {"skipped": 0}
        norm = pre if pre is not None else self.engine.get_global_grad_norm()
        if norm is not None:
            out["grad_norm"] = float(norm)
        return out

    def lr(self) -> float:
        """The policy's learning rate for the next optimizer step."""
        return float(self.engine.get_lr()[0])

    def discard(self) -> None:
        """Drop the accumulated gradients without touching weights or optimizer state."""
        for e in (self.engine, self.critic):
            if e is None:
                continue
            e.zero_grad()
            if hasattr(e.optimizer, "zero_grad"):
                e.optimizer.zero_grad(set_to_none=True)
        self._nonfinite = 0
