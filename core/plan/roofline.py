"""``policyzoo plan --gpu NAME``: a roofline lower bound on one step's time on the named GPU, per phase
``max(FLOPs / peak FLOP/s, bytes / HBM bandwidth)`` (Williams et al. 2009, "Roofline"), from the plan's FLOPs
(:func:`policyzoo.plan.flops`) and the bytes each phase must move through HBM at least once.

The step's work is split evenly over the N trainer GPUs (rows are split over the ranks; each GPU's vLLM samples
its ranks' prompts), per GPU:

* **rollout prefill**: its FLOPs / N; bytes: the weights (``n x r``, rollout dtype) read once and the prompts'
  KV written (``2 x layers x dkv x r`` per token).
* **rollout decode**: its FLOPs / N; bytes: every decode step (``L - 1`` of them) reads the whole weights once
  for all the GPU's sequences (they decode in one batch) and each sequence's KV cache so far: ``(L - 1) x n x r
  + rows x kv x sum_{t=1}^{L-1} (prompt + t)``. Bandwidth-bound: one weight read serves only the batch's rows.
* **training** (policy forward and backward, reference, old log-probs, critic): the rest of the FLOPs / N;
  bytes: the weights read by each forward and twice by each backward, per micro-batch (ZeRO 3 gathers them
  whole every time). Compute-bound.
* **optimizer step**: no matmul FLOPs; bytes: AdamW reads and writes the fp32 master weights and two moments
  (``2 x 12`` bytes per parameter, 8 without a master copy), reads the fp32 gradient (4) and writes the weights
  (``b``), for ``n / N`` parameters at ZeRO >= 1, ``n`` below.

Peak FLOP/s are the dense bf16 tensor-core figures (no sparsity) and the bandwidths the HBM figures of NVIDIA's
datasheets (:data:`SPEEDS`); a float32 phase runs its matmuls as TF32 (the GPU profile's ``train.tf32``), whose
dense peak is half the bf16 one on each of these parts (:func:`peak_for`). No kernel reaches either peak, and
communication (ZeRO gathers, the weight push) is not counted: the real step takes longer. A lower bound, said
so where printed.
"""

from __future__ import annotations

from policyzoo.plan import DTYPE_BYTES, Options, PlanError, Shape, Sizes

#: name -> (dense bf16 FLOP/s, HBM bytes/s, source): NVIDIA's datasheets (SXM parts where there are two)
SPEEDS = {"a100-40gb": (312e12, 1555e9, "NVIDIA A100 datasheet (SXM4 40GB): 312 TFLOPS bf16 dense, 1,555 GB/s"),
          "a100-80gb": (312e12, 2039e9, "NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS bf16 dense, 2,039 GB/s"),
          "h100-80gb": (989e12, 3.35e12, "NVIDIA H100 datasheet (SXM5): 989 TFLOPS bf16 dense, 3.35 TB/s"),
          "h200-141gb": (989e12, 4.8e12, "NVIDIA H200 datasheet (SXM): 989 TFLOPS bf16 dense, 4.8 TB/s"),
          "l40s-48gb": (362e12, 864e9, "NVIDIA L40S datasheet: 362 TFLOPS bf16 dense, 864 GB/s"),
          "l4-24gb": (121e12, 300e9, "NVIDIA L4 datasheet: 121 TFLOPS bf16 dense, 300 GB/s")}


def speeds(name: str) -> tuple[float, float, str]:
    """``(FLOP/s, bytes/s, source)`` of a named GPU. Raises :class:`~policyzoo.plan.PlanError` for an unknown name."""
    if name.lower() not in SPEEDS:
        raise PlanError(f"--gpu {name}", "not a GPU the roofline knows", f"give one of {', '.join(SPEEDS)}")
    return SPEEDS[name.lower()]


def peak_for(gpu: str, dtype: str) -> float:
    """Dense matmul FLOP/s of ``gpu`` in ``dtype``: the bf16 peak, or half of it for float32 (TF32 tensor cores:
    494.7 of 989 TFLOP/s on an H100 SXM, 156 of 312 on an A100)."""
    return speeds(gpu)[0] / (2 if dtype == "float32" else 1)


def roofline(m: Shape, s: Sizes, o: Options, f: dict[str, int], gpu: str, gpus: int = 1, zero_stage: int = 0,
             rollout_dtype: str | None = None) -> dict[str, tuple[float, float, float]]:
    """Per phase (module docstring) on one of ``gpus`` GPUs named ``gpu``: ``(FLOPs, bytes, seconds)`` with
    seconds ``max(FLOPs / peak, bytes / bandwidth)``; ``f`` is :func:`~policyzoo.plan.flops`' answer for ``s``
    and ``o``. Raises :class:`~policyzoo.plan.PlanError` for an unknown GPU."""
    _, bandwidth, _ = speeds(gpu)
    b, r = DTYPE_BYTES[o.dtype], DTYPE_BYTES[rollout_dtype or o.dtype]
    train_peak, rollout_peak = peak_for(gpu, o.dtype), peak_for(gpu, rollout_dtype or o.dtype)
    rows, kv = s.prompts * s.samples / gpus, 2 * m.layers * m.dkv * r
    steps = s.response - 1
    rollout_bytes = {"rollout prefill": m.params * r + kv * s.prompts / gpus * s.prompt,
                     "rollout decode": steps * m.params * r + rows * kv * (steps * s.prompt + steps * (steps + 1) / 2)}
    micro = o.micro_batches
    if o.max_tokens_per_micro_batch:
        micro = -(-s.prompts * s.samples // gpus // max(1, o.max_tokens_per_micro_batch // (s.prompt + s.response)))
    train_flops = sum(v for k, v in f.items() if not k.startswith("rollout"))
    passes = 3 * o.updates * micro + o.need_ref * micro + o.old_logprobs * micro  # forward 1, backward 2
    state = m.params if o.lora_params is None else o.lora_params
    per_param = 2 * (12 if b < 4 else 8) + 4 + b
    phases = {"rollout prefill": (f["rollout prefill"] / gpus, rollout_bytes["rollout prefill"]),
              "rollout decode": (f["rollout decode"] / gpus, rollout_bytes["rollout decode"]),
              "training": (train_flops / gpus, passes * m.params * b),
              "optimizer step": (0.0, o.updates * per_param * state / (gpus if zero_stage >= 1 else 1))}
    return {k: (fl, by, max(fl / (rollout_peak if k.startswith("rollout") else train_peak), by / bandwidth))
            for k, (fl, by) in phases.items()}


def print_roofline(out, phases: dict[str, tuple[float, float, float]], gpu: str, gpus: int,
                   dtype: str = "bfloat16") -> None:
    """The table of :func:`roofline`'s phases and their total, labelled as a lower bound, to the rich console
    ``out``; ``dtype``: the training dtype (its peak is named in the title)."""
    from rich.table import Table

    _, bandwidth, source = speeds(gpu)
    peak = peak_for(gpu, dtype)
    t = Table(title=f"roofline lower bound of one step per GPU ({gpus} x {gpu}): max(FLOPs / {peak / 1e12:g} "
              f"TFLOP/s {'TF32' if dtype == 'float32' else 'bf16'}, bytes / {bandwidth / 1e12:g} TB/s)")
    for col in ("phase", "GFLOP", "GB moved", "compute s", "memory s", "bound s"):
        t.add_column(col, justify="right" if col != "phase" else "left")
    for name, (fl, by, sec) in phases.items():
        t.add_row(name, f"{fl / 1e9:.1f}", f"{by / 1e9:.2f}", f"{fl / peak:.3f}", f"{by / bandwidth:.3f}",
                  f"{sec:.3f}")
    t.add_row("total (lower bound)", "", "", "", "", f"{sum(p[2] for p in phases.values()):.3f}")
    out.print(t)
    out.print(f"{source}. A lower bound: no kernel runs at peak and communication (ZeRO gathers, the weight "
              "push) is not counted; the measured step is longer.")
