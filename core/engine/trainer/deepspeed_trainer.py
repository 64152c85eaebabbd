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
  model with the adapter off), gradient checkpointing and bf16 autocast (``policyzoo.engine.trainer.modeling``),
  the user's own DeepSpeed config merged over policyzoo's (``engine.deepspeed``,
  ``policyzoo.engine.trainer.dsconfig``).
"""

from __future__ import annotations

import torch

from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings, critic_lr
from policyzoo.engine.device import local_device, set_thread_device
from policyzoo.engine.dist import any_rank, world_size

from . import clipping, sharded
from . import lora as lora_mod
from .checkpoint_io import TrainerIO
from .dsconfig import check_stage, ds_config, initialize, merge, read_user_config
from .dsconfig import zero_stage as stage_of
from .modeling import ValueModel, enable_gradient_checkpointing, lr_schedule
from .scoring import Scoring

__all__ = ["Trainer"]


class Trainer(TrainerIO, Scoring):
    """DeepSpeed engine(s) for one run. ``need_ref`` / ``need_critic`` load those models."""

    stage, world = 0, 1  #: ZeRO stage and data-parallel ranks (set by ``__init__``)
    score_tokens: int | None = None  #: token budget of the no-grad scoring chunks (set by ``__init__``)
    autocast = False  #: bf16 autocast in the scoring forwards (set by ``__init__``)
    lora = False  #: the policy is a PEFT model with LoRA adapters (set by ``__init__``)
    teacher = False  #: the reference is a teacher from model.teacher (set by ``__init__``)
    dtype = "float32"  #: the weights' dtype (``model.dtype``; set by ``__init__``)
    vocab = 0  #: the policy's vocabulary size, for the scoring chunks' memory budget (0: unknown; set on load)

    def __init__(self, info, model: ModelSettings, train: TrainSettings, engine: EngineSettings, *, need_ref: bool,
                 need_critic: bool, ref_path: str | None = None, lr_plan: dict | None = None, score_rows: int = 16):
        """Load the policy (and the reference, the critic) of ``info`` into DeepSpeed engines, as the run's
        typed sections set them: ``model`` (dtype, trust_remote_code, lora), ``train`` (lr, AdamW's betas,
        epsilon and weight decay, grad_clip, seed, gradient_checkpointing, autocast, max_tokens_per_micro_batch
        as the scoring chunks' token budget) and ``engine`` (zero_stage, deepspeed, share_prompt, and the
        critic's learning rate through :func:`policyzoo.config_sections.critic_lr`). ``ref_path``: a teacher
        (model.teacher) instead of the policy's own weights as the reference; ``lr_plan``: the schedule
        ``{name, warmup_steps, total_steps}`` (None: constant); ``score_rows``: rows per scoring forward.
        Raises :class:`~policyzoo.errors.ConfigError` for a ZeRO stage the dtype or LoRA cannot use."""
        plan = lr_plan or {"name": "constant", "warmup_steps": 0, "total_steps": 1}
        dtype, zero_stage, lr, lora = model.dtype, engine.zero_stage, train.lr, model.lora
        weight_decay, grad_clip, seed = train.weight_decay, train.grad_clip, train.seed
        betas, eps = (train.adam_beta1, train.adam_beta2), train.adam_epsilon
        trust_remote_code, gradient_checkpointing = model.trust_remote_code, train.gradient_checkpointing
        deepspeed_config, share_prompt, autocast = engine.deepspeed, engine.share_prompt, train.autocast
        score_tokens = train.max_tokens_per_micro_batch
        user = read_user_config(deepspeed_config)
        policy_cfg = merge(ds_config(zero_stage, lr, weight_decay, grad_clip, dtype, betas, eps), user)
        sched = lr_schedule(plan["name"], plan["warmup_steps"], plan["total_steps"])
        zero_stage = stage_of(policy_cfg)  # the user's config may set the stage
        check_stage(zero_stage, dtype, lora)
        self.info, self.stage, self.pad_id, self.dtype = info, zero_stage, info.pad_token_id, dtype
        self.score_rows, self.score_tokens = score_rows, score_tokens
        #: checkpointed layers keep no KV cache, so shared-prompt scoring is off with checkpointing. At ZeRO 3
        #: on several ranks it is on: it runs one forward per length group, a count that differs between ranks,
        #: and every ZeRO-3 forward gathers weights with all ranks, so the ranks agree on the count first and
        #: the ranks with fewer groups add filler calls (``prefix.shared_prompt_logprobs(calls=)``)
        self.share_prompt = share_prompt and not gradient_checkpointing
        #: bf16 compute over fp32 weights (policyzoo.engine.trainer.modeling)
        self.autocast = autocast
        set_thread_device()
        self.device = local_device()  # cuda:LOCAL_RANK (one GPU per rank) or cpu
        tdtype, path = getattr(torch, dtype), str(info.path)
        # ZeRO 3: models load partitioned (deepspeed.zero.Init via transformers) while this is referenced
        zero3 = sharded.zero3_loading(policy_cfg) if zero_stage == 3 else None
        self.lora = lora is not None
        self._load_policy(path, tdtype, policy_cfg, sched, lora, seed, gradient_checkpointing, trust_remote_code)
        #: the reference is another model: a teacher (model.teacher, on-policy distillation)
        self.teacher = ref_path is not None
        self.ref = None
        if need_ref and (self.teacher or not self.lora):  # with LoRA the reference is the base model (adapter off)
            self.ref = self._load_reference(ref_path or path, tdtype, trust_remote_code, policy_cfg, zero3 is not None)
        self.critic = None
        if need_critic:
            cfg = merge(ds_config(zero_stage, critic_lr(engine, train), weight_decay, grad_clip, dtype, betas, eps),
                        user)
            self.critic = self._load_critic(path, tdtype, trust_remote_code, cfg, sched, gradient_checkpointing)
        del zero3  # later loads in this process (the transformers rollout) are whole again
        self._need_ref = need_ref
        self._nonfinite = 0
        #: DeepSpeed averages gradients over ranks; losses are scaled by the world size so the
        #: average is the full-batch gradient (see policyzoo.engine.dist)
        self.world = world_size()

    def _load_policy(self, path: str, tdtype, cfg: dict, sched, lora, seed: int, checkpointing: bool,
                     trust_remote_code: bool) -> None:
        """The policy (LoRA-wrapped with ``lora``) in eval mode in its DeepSpeed engine (``self.engine``)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=tdtype, trust_remote_code=trust_remote_code)
        model.eval()  # no dropout: the trainer must score exactly what the sampler sampled
        if lora is not None:
            model = lora_mod.wrap(model, lora, seed)
            model.eval()
        if checkpointing:
            enable_gradient_checkpointing(model)
        self.vocab = int(getattr(model.config, "vocab_size", 0) or 0)
        trainable = [p for p in model.parameters() if p.requires_grad]
        #: trained parameters (all of them, or the LoRA adapter's)
        self.trainable_params = sum(getattr(p, "ds_numel", p.numel()) for p in trainable)  # ZeRO 3: partitioned
        self.engine = initialize(model, trainable, cfg, sched)

    def _load_reference(self, path: str, tdtype, trust_remote_code: bool, cfg: dict, zero3: bool):
        """The frozen reference (or teacher) from ``path``: on the device, or a ZeRO-3 inference engine."""
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(path, dtype=tdtype, trust_remote_code=trust_remote_code)
        ref.eval().requires_grad_(False)
        return sharded.reference_engine(ref, cfg) if zero3 else ref.to(self.device)

    @staticmethod
    def _load_critic(path: str, tdtype, trust_remote_code: bool, cfg: dict, sched, checkpointing: bool):
        """The critic (:class:`ValueModel`) in its own DeepSpeed engine."""
        vm = ValueModel(path, tdtype, trust_remote_code)
        if checkpointing:
            enable_gradient_checkpointing(vm.body)
        return initialize(vm, vm.parameters(), cfg, sched)

    def models_loaded(self) -> list[str]:
        """The models this run holds, for the summary (with LoRA the reference is the base model)."""
        name = "teacher" if self.teacher else "reference (base model, adapter off)" if self.lora else "reference"
        ref = [name] if self._need_ref else []
        return ["policy"] + ref + (["critic"] if self.critic is not None else [])

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
        norms, per_param = zip(*(clipping.step_norm(e, self.world) for e in engines))
        bad = skip or bool(self._nonfinite) or not all(bool(torch.isfinite(n)) for n in norms)
        if any_rank(bad):
            self.discard()
            return {"skipped": 1}
        pre = float(norms[0]) if self.stage == 0 else None
        for e, n in zip(engines, per_param):
            if reduced:  # already averaged: step() must not average again
                e.enable_backward_allreduce, saved = False, e.enable_backward_allreduce
                try:
                    e.step()
                finally:
                    e.enable_backward_allreduce = saved
            elif n is not None:  # one process at ZeRO 0: clipped from the norms above (clipping.clips_itself)
                clipping.step_clipped(e, n)
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
