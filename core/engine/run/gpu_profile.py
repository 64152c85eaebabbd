"""The GPU profile: the defaults of a run that trains on CUDA GPUs, and the start-up check that its step fits.

The defaults of ``core/settings.py`` are the CPU's (fp32, ZeRO 0, no sleep mode: what was measured on CPUs,
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
``core/engine/policy.py``: bf16 sampling against an fp32 trainer, SmolLM2 (49k vocabulary), 200 checks, max
0.17-0.86 nats, mean 0.03-0.06, whose table bound is 1.5. A larger vocabulary (~150k, Qwen2.5) does not
widen it: a token's error is the rounding of its own logit (relative 2^-8, ~0.06 nats at |logit| 16-32)
plus the log-sum-exp's, a probability-weighted mean of the logits' errors, which does not grow with the
number of entries. A configured tolerance bounds the max and the mean: 1.5 lets bf16 rounding through and
stops a push that left garbage behind (a level-2 engine sampling dropped weights: several nats per token).

**The fit** (:func:`plan_and_check`, in ``preload`` before any weights load, so ``--dry-run`` shares it):
the planner (``policyzoo.plan``: :func:`~policyzoo.plan.gpu.per_gpu` of the placement of ``WORLD_SIZE``
ranks) on the resolved config, the model's ``config.json`` and the mean prompt length, against one GPU's
memory (torch's ``total_memory``, or ``engine.plan_gpu``'s). A step that does not fit is refused
(:class:`~policyzoo.errors.ConfigError`, exit 2) with the smallest changes that would fit. A CPU run is not
planned (RAM is not).
"""

from __future__ import annotations

import dataclasses
import math

from policyzoo.engine import device
from policyzoo.engine.trainer.dsconfig import effective_stage, merge, read_user_config
from policyzoo.errors import ConfigError
from policyzoo.plan import GiB, Shape, Sizes, options_for
from policyzoo.plan.gpu import Vllm, describe, gpu_bytes, per_gpu, same_gpus_fits, smallest_fits
from policyzoo.plan.placement import placement_for
from policyzoo.resolve import resolve_algorithm

#: the sync check's bound on a GPU, nats (module docstring)
SYNC_TOLERANCE = 1.5
#: DeepSpeed keys for fp32 gradient accumulation and reduction under bf16 weights (the user's win key by key)
FP32_GRADIENTS = {"data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}
#: left free on each GPU beside the plan (CUDA context, NCCL buffers, allocator slack: ~1-3 GiB, plan/gpu.py)
HEADROOM = 3 * GiB
#: the largest ``engine.gpu_memory_utilization`` the profile gives vLLM
MAX_UTILIZATION = 0.9
#: the range of ``engine.vllm_max_num_batched_tokens`` it chooses (TRL caps vLLM's at 4096: vLLM's memory
#: profile reserves activations for that many tokens)
BATCHED_TOKENS = (2048, 16384)
#: the parts of a trainer GPU that vLLM holds (absent when the rollout is not vLLM in this process)
VLLM_PARTS = ("vLLM copy", "KV cache", "vLLM reserve")


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


def gpu_budget(config) -> tuple[int, str]:
    """``(bytes, name)`` of one GPU: torch's ``total_memory`` of this rank's GPU, else ``engine.plan_gpu``'s
    (raises :class:`~policyzoo.plan.PlanError` for a name the planner does not know)."""
    if device.cuda():
        import torch

        props = torch.cuda.get_device_properties(device.local_device())
        return int(props.total_memory), props.name
    return gpu_bytes(config.engine.plan_gpu)[0], config.engine.plan_gpu


def _free(section, key: str) -> bool:
    return key not in section.model_fields_set


def _set(out: list, section, key: str, value, why: str) -> None:
    setattr(section, key.rsplit(".", 1)[-1], value)
    out.append(Choice(key, value, why))


def apply_device(config) -> list[Choice]:
    """The choices that need only the device (the table's first seven rows), made on ``config`` in place
    (before the algorithm is assembled); ``[]`` on a CPU. Returns them."""
    if not on_gpu(config):
        return []
    m, t, e, out = config.model, config.train, config.engine, []
    user = read_user_config(e.deepspeed)
    if _free(m, "dtype") and _free(e, "zero_stage") and effective_stage(e, user) == 0:
        _set(out, e, "engine.zero_stage", 1, "DeepSpeed's bf16 optimizer runs at ZeRO >= 1; ZeRO 1 shards its "
             "fp32 master weights and AdamW state over the ranks")
    if _free(m, "dtype") and effective_stage(e, user) >= 1:
        _set(out, m, "model.dtype", "bfloat16", "bf16 compute over fp32 master weights and optimizer state, as "
             "TRL with DeepSpeed and verl's FSDP mixed precision")
    elif _free(m, "dtype") and _free(t, "autocast"):
        _set(out, t, "train.autocast", True, "ZeRO 0 keeps fp32 weights: bf16 compute by torch.autocast")
    if m.dtype == "bfloat16":
        merged = merge(FP32_GRADIENTS, user, "engine.deepspeed (GPU profile)")
        if merged != user:
            _set(out, e, "engine.deepspeed", merged, "fp32 gradient accumulation and all-reduce under bf16 weights")
    if t.tf32 is None:
        _set(out, t, "train.tf32", True, "fp32 matmuls on tensor cores")
    if e.rollout == "vllm" and _free(e, "vllm_sleep") and e.overlap == "none" and not e.max_staleness:
        _set(out, e, "engine.vllm_sleep", 2, "vLLM's weights and KV cache leave the GPU while DeepSpeed trains; "
             "the push refills the weights (TRL's and verl's level)")
    if e.rollout in ("vllm", "server"):
        if _free(e, "sync_check"):
            _set(out, e, "engine.sync_check", True, "a push that left vLLM's weights wrong stops the run")
        if e.sync_check and e.sync_tolerance is None:
            _set(out, e, "engine.sync_tolerance", SYNC_TOLERANCE, "vLLM's bf16 kernels against the trainer's")
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


def _options(config, run, shape: Shape, world: int):
    """The planner's options for the config, with the trainer's rule that gradient checkpointing and ZeRO 3
    over several ranks score rows in full (no shared prompt)."""
    o = options_for(config, run, shape)
    full = o.gradient_checkpointing or (config.engine.zero_stage == 3 and world > 1)
    return dataclasses.replace(o, share_prompt=o.share_prompt and not full)


def _trainer(config, shape, sizes, opts, place, budget, vllm) -> dict[str, int]:
    """Bytes on one trainer GPU by part; vLLM's parts only when vLLM runs in this process."""
    parts = dict(per_gpu(shape, sizes, opts, place, budget, vllm)["trainer GPU"])
    if config.engine.rollout != "vllm":
        for k in VLLM_PARTS:
            parts.pop(k, None)
    return parts


def _utilization(parts: dict, budget: int, sleep: int) -> float:
    """vLLM's share of the GPU: with sleep mode what the trainer's resident state (weights, gradients,
    optimizer, reference, sync buffer) and :data:`HEADROOM` leave, rounded down to 0.01; without, the share
    its copy and KV cache need, rounded up; at most :data:`MAX_UTILIZATION`."""
    if sleep:
        resident = sum(v for k, v in parts.items() if k not in VLLM_PARTS and k != "activations")
        share = math.floor(100 * (budget - resident - HEADROOM) / budget) / 100
    else:
        share = math.ceil(100 * (parts.get("vLLM copy", 0) + parts.get("KV cache", 0)) / budget) / 100
    return max(0.01, min(MAX_UTILIZATION, share))


@dataclasses.dataclass
class Step:
    """What the planner needs of one run besides its config: the model's shape, the step's sizes (one row's
    prompt: the mean prompt length), the longest prompt, the ranks, the placement and one GPU's bytes."""

    run: object
    shape: Shape
    sizes: Sizes
    max_prompt: int
    world: int
    place: object
    budget: int
    gpu: str

    def parts(self, config) -> dict[str, int]:
        """Bytes on one trainer GPU by part, for ``config``'s settings."""
        opts = _options(config, self.run, self.shape, self.world)
        vllm = Vllm(config.engine.gpu_memory_utilization, config.engine.vllm_sleep)
        return _trainer(config, self.shape, self.sizes, opts, self.place, self.budget, vllm)

    def problem(self, config) -> str | None:
        """Why ``config``'s step does not fit one GPU, or None when it does."""
        parts, e = self.parts(config), config.engine
        total = sum(parts.values())
        if total > self.budget:
            big = ", ".join(f"{k} {v / GiB:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:4])
            return (f"the step needs {total / GiB:.1f} GiB on each GPU ({big} GiB), more than the "
                    f"{self.budget / GiB:.1f} GiB of one {self.gpu}")
        need = parts.get("vLLM copy", 0) + parts.get("KV cache", 0)
        if e.rollout == "vllm" and need > e.gpu_memory_utilization * self.budget:
            return (f"vLLM's copy and KV cache need {need / GiB:.1f} GiB, more than engine.gpu_memory_utilization="
                    f"{e.gpu_memory_utilization:g} of one {self.gpu} ({self.budget / GiB:.1f} GiB)")
        return None

    def row(self) -> int:
        return self.sizes.prompt + self.sizes.response

    def tokens_per_rank(self) -> int:
        return -(-self.sizes.prompts // self.world) * self.sizes.samples * self.row()


def _with(config, **train):
    """A shallow copy of ``config`` with these ``train`` keys changed (the search tries settings on copies)."""
    return config.model_copy(update={"train": config.train.model_copy(update=train)})


def _activation_settings(config, step: Step) -> dict:
    """The ``train`` keys that make the step fit, tried in order: the config's own, gradient checkpointing,
    then micro-batches of at most k tokens (k the largest power of two that fits, at least one row) with
    it; only keys the config leaves free. ``{}`` when the config's own fit or nothing does."""
    t = config.train
    if step.problem(config) is None:
        return {}
    tries = [{"gradient_checkpointing": True}] if _free(t, "gradient_checkpointing") else []
    if _free(t, "max_tokens_per_micro_batch") and _free(t, "micro_batches"):
        ckpt = True if _free(t, "gradient_checkpointing") else t.gradient_checkpointing
        k = 1 << step.tokens_per_rank().bit_length()
        while k >= step.row():
            tries.append({"gradient_checkpointing": ckpt, "max_tokens_per_micro_batch": k})
            k //= 2
    return next((keys for keys in tries if step.problem(_with(config, **keys)) is None), {})


def _engine_limits(config, step: Step) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` of one vLLM engine: the rows it samples per step (the
    rank's share x the ranks sharing it), and their prompts' tokens (at the longest prompt) rounded up to
    256, within :data:`BATCHED_TOKENS` and at least ``max_num_seqs``."""
    prompts = -(-step.sizes.prompts // step.world) * config.engine.vllm_tensor_parallel_size
    seqs = prompts * step.sizes.samples
    tokens = min(BATCHED_TOKENS[1], max(BATCHED_TOKENS[0], -(-prompts * step.max_prompt // 256) * 256))
    return seqs, max(seqs, tokens)


def plan_and_check(config, step: Step) -> tuple[list[Choice], list[str]]:
    """The plan's choices (the table's last five rows), made on ``config`` in place, then the fit: returns
    ``(choices, the plan's console lines)``; raises :class:`~policyzoo.errors.ConfigError` when the step does
    not fit one GPU, with the smallest changes that would (:func:`fixes`)."""
    e, out = config.engine, []
    if e.rollout == "vllm" and _free(e, "gpu_memory_utilization"):
        share = _utilization(step.parts(config), step.budget, e.vllm_sleep)
        what = "what the trainer's state leaves (vLLM sleeps while it trains)" if e.vllm_sleep else \
            "what vLLM's copy and KV cache need"
        _set(out, e, "engine.gpu_memory_utilization", share, f"{what} of one {step.gpu}")
    for key, value in _activation_settings(config, step).items():
        if getattr(config.train, key) != value:
            _set(out, config.train, f"train.{key}", value, f"the step fits one {step.gpu} with it")
    if e.rollout == "vllm":
        seqs, tokens = _engine_limits(config, step)
        if e.vllm_max_num_seqs is None:
            _set(out, e, "engine.vllm_max_num_seqs", seqs, "the rows one engine samples per step")
        if e.vllm_max_num_batched_tokens is None:
            _set(out, e, "engine.vllm_max_num_batched_tokens", tokens, "one step's prompt tokens per engine, "
                 f"{BATCHED_TOKENS[0]}-{BATCHED_TOKENS[1]}")
    why = step.problem(config)
    if why is not None:
        raise ConfigError("train (memory per GPU, policyzoo plan)", why + f" ({describe(step.place)})",
                          "; or ".join(fixes(config, step)) or "plan a smaller model, or train a LoRA adapter "
                          "(model.lora={r: 16})")
    total = sum(step.parts(config).values())
    return out, [f"plan: {describe(step.place)}: {total / GiB:.1f} GiB of {step.budget / GiB:.1f} GiB per GPU "
                 f"({step.gpu}): fits"]


def fixes(config, step: Step) -> list[str]:
    """The smallest changes that make the step fit, as ``key=value`` settings: gradient checkpointing and
    micro-batches at these GPUs; else with them (one row per micro-batch) a higher ZeRO stage, a sharded or
    separate vLLM at these GPUs (:func:`~policyzoo.plan.gpu.same_gpus_fits`); else more GPUs
    (:func:`~policyzoo.plan.gpu.smallest_fits`)."""
    t = config.train
    lean = {"gradient_checkpointing": True, "max_tokens_per_micro_batch": step.row()}
    own = {k: v for k, v in _activation_settings(_fresh_train(config), step).items() if getattr(t, k) != v}
    if own:
        return [" ".join(f"train.{k}={str(v).lower()}" for k, v in own.items())]
    lean_cfg = _with(config, **lean)
    pre = " ".join(f"train.{k}={str(v).lower()}" for k, v in lean.items() if getattr(t, k) != v)
    opts = _options(lean_cfg, step.run, step.shape, step.world)
    vllm = Vllm(MAX_UTILIZATION if config.engine.vllm_sleep else config.engine.gpu_memory_utilization,
                config.engine.vllm_sleep)
    out = []
    for q in same_gpus_fits(step.shape, step.sizes, opts, step.place, step.budget, vllm):
        keys = [f"engine.zero_stage={q.zero_stage}"] if q.zero_stage != step.place.zero_stage else []
        keys += [f"engine.vllm_tensor_parallel_size={q.tp}"] if q.mode == "colocated" and q.tp != step.place.tp \
            else ["engine.rollout=server (policyzoo serve on GPUs of its own)"] if q.mode == "server" else []
        out.append(" ".join([pre] * bool(pre) + keys))
    if not out:
        out = [f"{' '.join([pre] * bool(pre))} {describe(q)} (train.prompts_per_step a multiple of {q.gpus})".strip()
               for q in smallest_fits(step.shape, step.sizes, opts, step.place, step.budget, vllm)]
    return out


def _fresh_train(config):
    """``config`` with the activation keys free again: the advice may change what the config set."""
    t = config.train.model_copy()
    object.__setattr__(t, "__pydantic_fields_set__", set(t.model_fields_set) - {
        "gradient_checkpointing", "max_tokens_per_micro_batch", "micro_batches"})
    return config.model_copy(update={"train": t})


def make_step(config, run, model_config: dict, prompt_lengths: list[int], world: int, stage: int) -> Step:
    """The :class:`Step` of a resolved run: the model's ``config.json`` dict, every prompt's token count (the
    mean is one row's prompt), ``world`` ranks, the ZeRO stage the run trains at."""
    shape = Shape.from_config(model_config, "model.path's config.json")
    sp = run.sample.params
    sizes = Sizes(config.train.prompts_per_step, sp.n, run.max_response_tokens,
                  max(1, math.ceil(sum(prompt_lengths) / max(1, len(prompt_lengths)))))
    need_ref = options_for(config, run, shape).need_ref
    place = dataclasses.replace(placement_for(config, world, None, None, need_ref), zero_stage=stage)
    budget, gpu = gpu_budget(config)
    return Step(run, shape, sizes, max(prompt_lengths, default=sizes.prompt), world, place, budget, gpu)


def set_tf32(config) -> bool:
    """TF32 matmuls (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``) as
    ``train.tf32`` says, on CUDA only; returns whether they are on. Called before any model loads."""
    if not device.cuda() or config.train.tf32 is None:
        return False
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(config.train.tf32)
    return bool(config.train.tf32)


def console_lines(pre) -> list[str]:
    """The start-up console's lines of a run's :class:`~policyzoo.engine.run.preload.PreLoad`: each choice of
    the profile, then the plan's verdict (none on a CPU)."""
    return [c.line() for c in pre.gpu_profile] + list(pre.plan_lines)
