"""The fit of a GPU run's step, before any weights load: the GPU profile's choices that need the plan
(:mod:`policyzoo.engine.run.gpu_profile`'s table, last five rows) and the refusal of a step that does not fit.

**The fit** (:func:`plan_and_check`, in ``preload`` before any weights load, so ``--dry-run`` shares it):
the planner (``policyzoo.plan``: :func:`~policyzoo.plan.gpu.per_gpu` of the placement of ``WORLD_SIZE``
ranks) on the resolved config, the model's ``config.json`` and the mean prompt length, against one GPU's
memory (torch's ``total_memory``, or ``engine.plan_gpu``'s). A step that does not fit is refused
(:class:`~policyzoo.errors.ConfigError`, exit 2) with the smallest changes that would fit. A CPU run is not
planned (RAM is not).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from policyzoo.engine import device
from policyzoo.errors import ConfigError
from policyzoo.plan import GiB, Shape, Sizes, options_for
from policyzoo.plan.gpu import GPUS, Vllm, describe, gpu_bytes, per_gpu, same_gpus_fits, smallest_fits
from policyzoo.plan.placement import placement_for
from policyzoo.resolve import resolved_view

from .gpu_profile import Choice, choose, free_key, on_gpu

#: left free on each GPU beside the plan (CUDA context, NCCL buffers, allocator slack: ~1-3 GiB, plan/gpu.py)
HEADROOM = 3 * GiB
#: the largest ``engine.gpu_memory_utilization`` the profile gives vLLM
MAX_UTILIZATION = 0.9
#: the range of ``engine.vllm_max_num_batched_tokens`` it chooses (TRL caps vLLM's at 4096: vLLM's memory
#: profile reserves activations for that many tokens)
BATCHED_TOKENS = (2048, 16384)
#: the parts of a trainer GPU that vLLM holds (absent when the rollout is not vLLM in this process)
VLLM_PARTS = ("vLLM copy", "KV cache", "vLLM reserve")


def gpu_budget(config) -> tuple[int, str]:
    """``(bytes, name)`` of one GPU: torch's ``total_memory`` of this rank's GPU, else ``engine.plan_gpu``'s
    (raises :class:`~policyzoo.errors.ConfigError` for a name the planner does not know)."""
    if device.cuda():
        props = torch.cuda.get_device_properties(device.local_device())
        return int(props.total_memory), props.name
    if config.engine.plan_gpu.lower() not in GPUS:
        raise ConfigError("engine.plan_gpu", f"{config.engine.plan_gpu!r} is not a GPU the planner knows",
                          f"give one of {', '.join(GPUS)}")
    return gpu_bytes(config.engine.plan_gpu)[0], config.engine.plan_gpu


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
    tries = [{"gradient_checkpointing": True}] if free_key(t, "gradient_checkpointing") else []
    if free_key(t, "max_tokens_per_micro_batch") and free_key(t, "micro_batches"):
        ckpt = True if free_key(t, "gradient_checkpointing") else t.gradient_checkpointing
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
    if e.rollout == "vllm" and free_key(e, "gpu_memory_utilization"):
        share = _utilization(step.parts(config), step.budget, e.vllm_sleep)
        what = "what the trainer's state leaves (vLLM sleeps while it trains)" if e.vllm_sleep else \
            "what vLLM's copy and KV cache need"
        choose(out, e, "engine.gpu_memory_utilization", share, f"{what} of one {step.gpu}")
    for key, value in _activation_settings(config, step).items():
        if getattr(config.train, key) != value:
            choose(out, config.train, f"train.{key}", value, f"the step fits one {step.gpu} with it")
    if e.rollout == "vllm":
        seqs, tokens = _engine_limits(config, step)
        if e.vllm_max_num_seqs is None:
            choose(out, e, "engine.vllm_max_num_seqs", seqs, "the rows one engine samples per step")
        if e.vllm_max_num_batched_tokens is None:
            choose(out, e, "engine.vllm_max_num_batched_tokens", tokens, "one step's prompt tokens per engine, "
                 f"{BATCHED_TOKENS[0]}-{BATCHED_TOKENS[1]}")
    why = step.problem(config)
    if why is not None:
        raise ConfigError("train (memory per GPU, policyzoo plan)", why + f" ({describe(step.place)})",
                          "; or ".join(fixes(config, step)) or "plan a smaller model, or train a LoRA adapter "
                          "(model.lora={r: 16})")
    parts = step.parts(config)
    total, big = sum(parts.values()), sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    held = "the trainer's state and the training step's activations" + (
        ", with vLLM's copy and KV cache counted as held at once (an upper bound: asleep, vLLM frees them)"
        if config.engine.rollout == "vllm" else "")
    return out, [f"plan: {describe(step.place)}: the training step's peak, {held}; largest "
                 f"{', '.join(f'{k} {v / GiB:.1f}' for k, v in big)} GiB: {total / GiB:.1f} GiB of "
                 f"{step.budget / GiB:.1f} GiB per GPU ({step.gpu}): fits"]


def fixes(config, step: Step) -> list[str]:
    """The smallest changes that make the step fit, as ``key=value`` settings: gradient checkpointing and
    micro-batches at these GPUs; else with them (one row per micro-batch) a higher ZeRO stage, a sharded or
    separate vLLM at these GPUs (:func:`~policyzoo.plan.gpu.same_gpus_fits`); else more GPUs
    (:func:`~policyzoo.plan.gpu.smallest_fits`)."""
    t = config.train
    lean = {"gradient_checkpointing": True, "max_tokens_per_micro_batch": step.row()}
    own = _activation_settings(_fresh_train(config), step)
    if own:
        return [_train_keys(own, t)]
    lean_cfg = _with(config, **lean)
    pre = _train_keys(lean, t)
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


def _train_keys(keys: dict, train) -> str:
    """``keys`` that differ from ``train``'s as ``train.KEY=value`` settings, with ``train.micro_batches=1`` when
    a token budget replaces a count of micro-batches (the two cannot both be set)."""
    out = {k: v for k, v in keys.items() if getattr(train, k) != v}
    if out.get("max_tokens_per_micro_batch") and train.micro_batches > 1:
        out["micro_batches"] = 1
    return " ".join(f"train.{k}={str(v).lower()}" for k, v in out.items())


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


def check_vllm_limits(engine, max_model_len: int, on_gpu: bool) -> None:
    """ConfigError for ``engine.vllm_max_num_batched_tokens`` below what vLLM 0.32 accepts (its
    ``SchedulerConfig.verify_max_model_len``): below ``max_model_len`` (the run's longest prompt + response)
    on a CPU, where chunked prefill is off and a prompt is prefilled in one forward; below
    ``engine.vllm_max_num_seqs`` anywhere (every sequence takes one token of a decode forward)."""
    tokens, seqs = engine.vllm_max_num_batched_tokens, engine.vllm_max_num_seqs
    if engine.rollout != "vllm" or tokens is None:
        return
    where = "engine.vllm_max_num_batched_tokens"
    if not on_gpu and tokens < max_model_len:
        raise ConfigError(where, f"{tokens} tokens per forward is less than this run's {max_model_len}-token "
                          "context: vLLM on CPU prefills a whole prompt in one forward (no chunked prefill)",
                          f"set it >= {max_model_len}, or leave it null (vLLM's default)")
    if seqs is not None and tokens < seqs:
        raise ConfigError(where, f"{tokens} tokens per forward is less than engine.vllm_max_num_seqs={seqs}: "
                          "every sequence takes one token of a decode forward", f"set it >= {seqs}")


def plan_profile(config, run, model_path, fit, profile: list[Choice], stage: int,
                 ranks: int) -> tuple[list[Choice], list[str], dict]:
    """On a GPU: the planner's choices and the fit (:func:`plan_and_check`, which refuses a step
    that does not fit), the resolved view made again with every choice and its ``gpu_profile`` section; on
    every device vLLM's batch limits against the context (:func:`check_vllm_limits`). ``run``: the assembled
    components; ``model_path``: the checked model folder; ``fit``: the model against the data
    (:class:`~policyzoo.engine.run.preload.ModelFit`). Returns the profile's choices and the
    planner's (none on a CPU), the plan's lines and the resolved view."""
    gpu = on_gpu(config)
    chosen, plan_lines, resolved = [], [], fit.resolved
    if gpu:
        model_config = json.loads((Path(model_path) / "config.json").read_text())
        step = make_step(config, run, model_config, fit.prompt_lengths, ranks, stage)
        planned, plan_lines = plan_and_check(config, step)
        chosen = profile + planned
        resolved = resolved_view(config, run)
        resolved["gpu_profile"] = {c.key: {"value": c.value, "why": c.why} for c in chosen}
    check_vllm_limits(config.engine, fit.max_model_len, gpu)
    return chosen, plan_lines, resolved
