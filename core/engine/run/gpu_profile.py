"""The GPU profile: the defaults of a run that trains on CUDA GPUs, and the start-up check that its step fits.

The defaults of ``core/config_sections.py`` are the CPU's (fp32, ZeRO 0, no sleep mode: what was measured on CPUs,
and what the CPU test suite pins); they stay exactly so on a CPU. On a GPU (torch sees CUDA, or
``engine.plan_gpu`` names one for a dry run on a machine without) every key of the table below that the
config does not set takes the profile's value; a key set in the config (YAML, ``key=value``, a TRL config,
a run directory's ``config.yaml``) always wins. Each choice is kept with its reason (:class:`Choice`): the
start-up console prints them and ``resolved.yaml`` records them under ``gpu_profile``.

=========================================  =================================================================
key                                        GPU value (why)
=========================================  =================================================================
``engine.zero_stage``                      1 (DeepSpeed's bf16 optimizer runs at ZeRO >= 1; it shards its state)
``model.dtype``                            bfloat16 (with ZeRO >= 1; else ``train.autocast: true`` over fp32)
``engine.deepspeed``                       ``data_types.grad_accum_dtype`` and ``communication_data_type`` fp32
``train.tf32``                             true (fp32 matmuls on tensor cores)
``engine.vllm_sleep``                      2 (weights and KV cache dropped while training; the push refills)
``engine.sync_check``                      true, ``engine.sync_tolerance`` :data:`SYNC_TOLERANCE`
``algorithm.ratio``                        ``engine.rollout_correction`` (TIS) over a bundle's token ratio
``train.gradient_checkpointing``           true when the plan needs it for the step to fit
``train.max_tokens_per_micro_batch``       the largest power of two that fits, when the plan needs it
``engine.gpu_memory_utilization``          what the plan leaves beside the trainer's state, at most 0.9
``engine.vllm_max_num_seqs``               the rows one vLLM engine samples per step
``engine.vllm_max_num_batched_tokens``     one step's prompt tokens of one engine, within 2048-16384
=========================================  =================================================================

**Precision: DeepSpeed bf16 at ZeRO >= 1, not ``train.autocast``.** DeepSpeed's bf16 mode keeps bf16 weights
for compute and fp32 master weights and AdamW moments in its optimizer (ZeRO-1: its ``BF16_Optimizer``, ZeRO
2/3: the ZeRO optimizer's fp32 partitions); ``data_types.grad_accum_dtype: fp32`` accumulates gradients in
fp32 and ``communication_data_type: fp32`` all-reduces them in fp32. That is what TRL does with DeepSpeed and
``bf16=True`` (the model under DeepSpeed's bf16 engine) and what verl's FSDP mixed precision does (bf16
parameters for compute, fp32 reduction, fp32 master in the optimizer). Autocast over fp32 weights would hold
4 bytes per weight for the policy and the reference instead of 2, cast every weight at every forward, and
sample in fp32 unless ``engine.rollout_dtype`` says otherwise; it stays the choice when the config keeps
ZeRO 0, where DeepSpeed's bf16 trained differently from fp32 (docs/engine.md).

**Sync tolerance.** vLLM's bf16 kernels (FlashAttention, fused ops) give per-token log-probs that differ from
the trainer's by ~1e-2..1e-1 nats at the maximum even at the same dtype (vLLM's and TRL's reports), so the
fp32 bound fails. No GPU was available to measure it here; the bound is the CPU measurement of
``core/engine/lm_policy.py``: bf16 sampling against an fp32 trainer, SmolLM2 (49k vocabulary), 200 checks, max
0.17-0.86 nats, mean 0.03-0.06, whose table bound is 1.5. A larger vocabulary (~150k, Qwen2.5) does not
widen it: a token's error is the rounding of its own logit (relative 2^-8, ~0.06 nats at |logit| 16-32)
plus the log-sum-exp's, a probability-weighted mean of the logits' errors, which does not grow with the
number of entries. A configured tolerance bounds the max and the mean: 1.5 lets bf16 rounding through and
stops a push that left garbage behind (a level-2 engine sampling dropped weights: several nats per token).

**The fit** of the step on one GPU and the plan's choices: :mod:`policyzoo.engine.run.gpu_fit`.
"""

from __future__ import annotations

import dataclasses

import torch

from policyzoo.engine import device
from policyzoo.engine.trainer.dsconfig import effective_stage, merge, read_user_config
from policyzoo.errors import ConfigError
from policyzoo.resolve import resolve_algorithm

#: the sync check's bound on a GPU, nats (module docstring)
SYNC_TOLERANCE = 1.5
#: DeepSpeed keys for fp32 gradient accumulation and reduction under bf16 weights (the user's win key by key)
FP32_GRADIENTS = {"data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}


@dataclasses.dataclass(frozen=True)
class Choice:
    """One key the profile set: ``key`` (dotted), ``value`` and ``why``."""

    key: str
    value: object
    why: str

    def line(self) -> str:
        return f"GPU profile: {self.key}={self.value} ({self.why})"


def on_gpu(config) -> bool:
    """True when the run trains on a CUDA GPU, or plans one (``engine.plan_gpu``)."""
    return device.cuda() or config.engine.plan_gpu is not None


def check_planned_gpu(config) -> None:
    """ConfigError for a run (not a dry run) with ``engine.plan_gpu`` where torch sees no GPU: it would train
    the GPU profile on the CPU."""
    if config.engine.plan_gpu is not None and not device.cuda():
        raise ConfigError("engine.plan_gpu", f"plans a run on a {config.engine.plan_gpu}, but torch sees no CUDA GPU "
                          "here, so the run would train on the CPU", "use engine.plan_gpu with train --dry-run, or "
                          "drop it")


def free_key(section, key: str) -> bool:
    """True when the config does not set ``key`` of ``section`` (pydantic's ``model_fields_set``)."""
    return key not in section.model_fields_set


def choose(out: list, section, key: str, value, why: str) -> None:
    """Set ``key`` (dotted; its last part in ``section``) to ``value`` and append the :class:`Choice`."""
    setattr(section, key.rsplit(".", 1)[-1], value)
    out.append(Choice(key, value, why))


def apply_device(config) -> list[Choice]:
    """The choices that need only the device (the table's first seven rows), made on ``config`` in place
    (before the algorithm is assembled); ``[]`` on a CPU. Returns them."""
    if not on_gpu(config):
        return []
    m, t, e, out = config.model, config.train, config.engine, []
    user = read_user_config(e.deepspeed)
    bf16 = free_key(m, "dtype") and not t.autocast  # autocast set (e.g. TRL's bf16: true) keeps fp32 weights
    if bf16 and free_key(e, "zero_stage") and effective_stage(e, user) == 0:
        choose(out, e, "engine.zero_stage", 1, "DeepSpeed's bf16 optimizer runs at ZeRO >= 1; ZeRO 1 shards its "
             "fp32 master weights and AdamW state over the ranks")
    if bf16 and effective_stage(e, user) >= 1:
        choose(out, m, "model.dtype", "bfloat16", "bf16 compute over fp32 master weights and optimizer state, as "
             "TRL with DeepSpeed and verl's FSDP mixed precision")
    elif free_key(m, "dtype") and free_key(t, "autocast"):
        choose(out, t, "train.autocast", True, "ZeRO 0 keeps fp32 weights: bf16 compute by torch.autocast")
    if m.dtype == "bfloat16":
        merged = merge(FP32_GRADIENTS, user, "engine.deepspeed (GPU profile)")
        if merged != user:
            choose(out, e, "engine.deepspeed", merged, "fp32 gradient accumulation and all-reduce under bf16 weights")
    if t.tf32 is None:
        choose(out, t, "train.tf32", True, "fp32 matmuls on tensor cores")
    if e.rollout == "vllm" and free_key(e, "vllm_sleep") and e.overlap == "none" and not e.max_staleness:
        choose(out, e, "engine.vllm_sleep", 2, "vLLM's weights and KV cache leave the GPU while DeepSpeed trains; "
             "the push refills the weights (TRL's and verl's level)")
    if e.rollout in ("vllm", "server"):
        if free_key(e, "sync_check"):
            choose(out, e, "engine.sync_check", True, "a push that left vLLM's weights wrong stops the run")
        if e.sync_check and e.sync_tolerance is None:
            choose(out, e, "engine.sync_tolerance", SYNC_TOLERANCE, "vLLM's bf16 kernels against the trainer's")
        out += _correction(config)
    return out


def _correction(config) -> list[Choice]:
    """``engine.rollout_correction`` as the algorithm's ratio when vLLM samples on a GPU and the algorithm
    uses the plain token ratio (a bundle's own ratio, e.g. gspo's sequence ratio, and a ratio the config
    sets are kept)."""
    e, algo = config.engine, config.algorithm
    if not e.rollout_correction or (isinstance(algo, dict) and "ratio" in algo):
        return []
    if resolve_algorithm(algo).ratio.name != "token":
        return []
    config.algorithm = {**({"base": algo} if isinstance(algo, str) else dict(algo)),
                        "ratio": {"use": e.rollout_correction}}
    config._correction_added = True
    return [Choice("algorithm.ratio", e.rollout_correction, "vLLM's GPU kernels sample from other probabilities "
                   "than the trainer computes, at any dtype (TRL's vllm_importance_sampling_correction)")]


def set_tf32(config) -> bool:
    """TF32 matmuls (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``) as
    ``train.tf32`` says, on CUDA only; returns whether they are on. Called before any model loads."""
    if not device.cuda() or config.train.tf32 is None:
        return False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(config.train.tf32)
    return bool(config.train.tf32)


def console_lines(pre) -> list[str]:
    """The start-up console's lines of a run's :class:`~policyzoo.engine.run.preload.PreLoad`: each choice of
    the profile, then the plan's verdict (none on a CPU)."""
    return [c.line() for c in pre.gpu_profile] + list(pre.plan_lines)
