"""``policyzoo plan --gpus N``: the memory of each trainer GPU (and rollout server GPU) of a placement,
in bytes, judged against one GPU's memory, and the smallest placement that fits when none does.

Per trainer GPU, for the placement of :mod:`policyzoo.plan.placement` (N data-parallel ranks, ZeRO z,
vLLM colocated with TP k or on a server) and a model of ``n`` parameters:

* **model state**: :func:`~policyzoo.plan.placement.per_parameter`'s bytes per parameter x ``n``
  (with LoRA, gradients and optimizer count the adapter's parameters only and the reference is the
  base model inside the policy: 0); a critic (``needs_values`` baselines) adds its weights, gradients and
  optimizer at the policy's bytes per parameter;
* **activations**: :func:`policyzoo.plan.memory`'s, for one rank's share of the step: ``ceil(P / N)``
  prompts (``train.prompts_per_step`` is split over the ranks) x G samples, counted per row at ZeRO 3 on
  several ranks (an upper bound of the engine's shared-prompt path there: :func:`policyzoo.plan.engine_path`);
* **KV cache** (colocated): ``2 x layers x kv_heads x head_dim x r`` bytes per cached token for the
  rank's share (prompts once, each sample's response); a group of k ranks shares one engine sharded k
  ways, so each GPU holds its share's worth while ``k <= kv_heads`` (vLLM replicates KV heads beyond:
  x ``k / kv_heads``);
* **vLLM reserve** (colocated, ``engine.vllm_sleep=0``): vLLM takes ``engine.gpu_memory_utilization``
  of the GPU for its copy and KV cache and keeps it through training; what that share holds beyond the
  copy and the KV cache counted above;
* **sync buffer**: at ZeRO 3 the weight push gathers one parameter at a time (the largest, the
  embedding: ``V x h x b``), or the whole weights when not streamed; below ZeRO 3 the weights are whole.

A rollout server GPU holds ``r / k`` per parameter and the KV cache of the whole step over its k GPUs
(one server). Not counted: DeepSpeed's ZeRO-3 live parameters during forward and backward (bounded by
``stage3_max_live_parameters``), CUDA context and allocator slack (~1-3 GiB). With ``engine.vllm_sleep`` 1 or 2
vLLM's KV cache is not held while training: the total is then an upper bound.
"""

from __future__ import annotations

import dataclasses

from policyzoo.errors import did_you_mean
from policyzoo.plan import GiB, Options, PlanError, Shape, Sizes, engine_path, memory
from policyzoo.plan.placement import MODES, Placement, count, per_parameter

MiB = 2**20
#: name -> (bytes of one GPU, the source): memory.total that nvidia-smi reports (MiB); the product name's GB is
#: NVIDIA's datasheet figure
GPUS = {"a100-40gb": (40960 * MiB, "NVIDIA A100-SXM4-40GB, nvidia-smi memory.total 40960 MiB"),
        "a100-80gb": (81920 * MiB, "NVIDIA A100-SXM4-80GB, nvidia-smi memory.total 81920 MiB"),
        "h100-80gb": (81559 * MiB, "NVIDIA H100 80GB HBM3, nvidia-smi memory.total 81559 MiB"),
        "h200-141gb": (143771 * MiB, "NVIDIA H200 (141 GB HBM3e), nvidia-smi memory.total 143771 MiB"),
        "l40s-48gb": (46068 * MiB, "NVIDIA L40S, nvidia-smi memory.total 46068 MiB"),
        "l4-24gb": (23034 * MiB, "NVIDIA L4, nvidia-smi memory.total 23034 MiB")}
DEFAULT_GPU = "h100-80gb"
#: the GPU counts and TP sizes the search of :func:`smallest_fits` tries (TP within one 8-GPU node)
SEARCH_GPUS = tuple(2**i for i in range(11))
SEARCH_TP = (1, 2, 4, 8)
#: the activation settings the search tries too when they need fewer GPUs (one row per micro-batch)
LEAN = "train.gradient_checkpointing=true train.max_tokens_per_micro_batch={}"


def gpu_bytes(name: str) -> tuple[int, str]:
    """``(bytes, source)`` of a named GPU. Raises :class:`~policyzoo.plan.PlanError` for an unknown name."""
    if name.lower() not in GPUS:
        raise PlanError(f"--gpu {name}", f"not a GPU the planner knows{did_you_mean(name, GPUS)}",
                        f"give one of {', '.join(GPUS)}, or memory=GiB for another")
    return GPUS[name.lower()]


@dataclasses.dataclass(frozen=True)
class Vllm:
    """vLLM's settings that change its memory on a colocated GPU."""

    utilization: float = 0.3  # engine.gpu_memory_utilization
    sleep: int = 0  # engine.vllm_sleep


def per_gpu(m: Shape, s: Sizes, o: Options, p: Placement, budget: int, v: Vllm = Vllm()) -> dict[str, dict[str, int]]:
    """Bytes per GPU by part (module docstring): ``{"trainer GPU": {...}}``, plus ``{"rollout server GPU":
    {...}}`` in server mode; ``budget`` is one GPU's bytes (the vLLM reserve is a share of it)."""
    pp, n = per_parameter(p), m.params
    o = engine_path(o, zero3_ranks=p.zero_stage >= 3 and p.gpus > 1)
    t, trainable = pp["trainer GPU"], m.params if o.lora_params is None else o.lora_params
    parts = {"policy weights": t["policy weights"] * n, "gradients": t["gradients"] * trainable,
             "optimizer": t["optimizer"] * trainable,
             "reference": 0 if o.lora_params is not None else t["reference"] * n}
    share = Sizes(-(-s.prompts // p.gpus), s.samples, s.response, s.prompt)
    mem = memory(m, share, o)
    if o.need_critic:
        cparams = m.params - m.vocab * m.hidden * (0 if m.tied else 1) + m.hidden + 1
        parts["critic state"] = (t["policy weights"] + t["gradients"] + t["optimizer"]) * cparams
    critic_acts = mem.get("critic (trained)", {}).get("activations", 0)
    parts["activations"] = mem["policy (trained)"]["activations"] + critic_acts
    kv_token = 2 * m.layers * m.dkv * p.rollout_bytes
    kv_share = kv_token * (share.prompts * s.prompt + share.prompts * s.samples * s.response)
    if p.mode == "colocated":
        parts["vLLM copy"] = t["vLLM copy"] * n
        parts["KV cache"] = kv_share * max(1.0, p.tp / m.kv_heads)
        parts["vLLM reserve"] = max(0.0, v.utilization * budget - parts["vLLM copy"] - parts["KV cache"]) \
            if v.sleep == 0 else 0.0
    streamed = m.vocab * m.hidden * p.weight_bytes if p.zero_stage >= 3 else 0
    parts["sync buffer"] = t["sync gather"] * n if t["sync gather"] else streamed
    out = {"trainer GPU": {k: int(round(x)) for k, x in parts.items()}}
    if p.mode == "server":
        kv_all = kv_token * (s.prompts * s.prompt + s.prompts * s.samples * s.response)
        out["rollout server GPU"] = {"vLLM copy": int(round(pp["rollout server GPU"]["vLLM copy"] * n)),
                                     "KV cache": int(round(kv_all * max(1 / p.tp, 1 / m.kv_heads)))}
    return out


def fits(m: Shape, s: Sizes, o: Options, p: Placement, budget: int, v: Vllm = Vllm()) -> bool:
    """Whether every GPU of :func:`per_gpu` holds at most ``budget`` bytes."""
    return all(sum(parts.values()) <= budget for parts in per_gpu(m, s, o, p, budget, v).values())


def smallest_fits(m: Shape, s: Sizes, o: Options, p: Placement, budget: int, v: Vllm = Vllm()) -> list[Placement]:
    """Per rollout mode, the placement with the fewest trainer GPUs (powers of two up to 1024) that fits
    ``budget``, at the smallest TP (1, 2, 4, 8) that does; ZeRO at ``p``'s stage, or 3 when that needs fewer
    GPUs. Empty when none of the search fits."""
    out = []
    for mode in MODES:
        best = None
        for z in sorted({p.zero_stage, 3}):
            q = next((dataclasses.replace(p, gpus=n, tp=k, mode=mode, zero_stage=z) for n in SEARCH_GPUS
                      for k in SEARCH_TP if (mode == "server" or n % k == 0)
                      and fits(m, s, o, dataclasses.replace(p, gpus=n, tp=k, mode=mode, zero_stage=z), budget, v)),
                     None)
            if q is not None and (best is None or q.gpus < best.gpus):
                best = q
        if best is not None:
            out.append(best)
    return out


def same_gpus_fits(m: Shape, s: Sizes, o: Options, p: Placement, budget: int, v: Vllm = Vllm()) -> list[Placement]:
    """The placements of ``p``'s GPU count that fit ``budget`` at the lowest ZeRO stage (``p``'s, then each higher)
    at which any does: per rollout mode, ``p``'s TP when it fits, else the smallest of ``SEARCH_TP`` that does.
    Empty when none fits even at ZeRO 3."""
    tps = (p.tp, *(k for k in SEARCH_TP if k != p.tp))
    for z in range(p.zero_stage, 4):
        found = []
        for mode in MODES:
            tried = (dataclasses.replace(p, tp=k, mode=mode, zero_stage=z) for k in tps
                     if mode == "server" or p.gpus % k == 0)
            if (q := next((r for r in tried if fits(m, s, o, r, budget, v)), None)) is not None:
                found.append(q)
        if found:
            return found
    return []


def describe(p: Placement) -> str:
    """A placement in words, e.g. ``16 trainer GPUs colocated with TP 8 (ZeRO 3)``."""
    where = f"colocated with TP {p.tp}" if p.mode == "colocated" else f"+ a rollout server of TP {p.tp} on its own GPUs"
    return f"{count(p.gpus, 'trainer GPU')} {where} (ZeRO {p.zero_stage})"


def compared(p: Placement) -> list[Placement]:
    """``p`` and the placements it is compared with: colocated at TP 1 and at ``p``'s TP, and a server of ``p``'s
    TP (those the GPUs allow; ``p`` first)."""
    out = [p]
    for q in (dataclasses.replace(p, mode="colocated", tp=1), dataclasses.replace(p, mode="colocated"),
              dataclasses.replace(p, mode="server")):
        if q not in out and (q.mode == "server" or q.gpus % q.tp == 0):
            out.append(q)
    return out


def print_gpu_plan(out, m: Shape, s: Sizes, o: Options, p: Placement, budget: int, where: str, v: Vllm) -> None:
    """Print the GiB per GPU of :func:`compared`'s placements, which fit ``budget`` bytes (``where`` names it),
    the verdict on ``p`` and, when none fits, :func:`smallest_fits`'s placements, to the rich console ``out``."""
    _print_gpu_table(out, m, s, o, p, budget, where, v)
    mine = per_gpu(m, s, o, p, budget, v)
    worst = max(sum(parts.values()) for parts in mine.values())
    ok = fits(m, s, o, p, budget, v)
    out.print(f"{describe(p)}: {worst / GiB:.2f} GiB on the fullest GPU, " + ("fits" if ok else "does not fit")
              + f" in {where} ({budget / GiB:.1f} GiB).")
    others = [q for q in compared(p)[1:] if fits(m, s, o, q, budget, v)]
    if not ok and others:
        out.print("placements of the same GPUs that fit: " + "; ".join(describe(q) for q in others))
    staged = same_gpus_fits(m, s, o, p, budget, v) if not ok and not others else []
    if staged:
        z = staged[0].zero_stage
        out.print(f"no placement of {count(p.gpus)} fits at ZeRO {p.zero_stage}; with engine.zero_stage={z} (ZeRO "
                  f"shards the training state over the {count(p.gpus)}) these fit: " + "; ".join(map(describe, staged)))
    elif not ok and not others:
        _print_none_fits(out, m, s, o, p, budget, v)
    if p.mode == "colocated" and v.sleep == 0:
        parts = mine["trainer GPU"]
        need = parts["vLLM copy"] + parts["KV cache"]
        share = -(-100 * need // budget) / 100  # the fraction of the GPU vLLM needs, rounded up to 0.01
        if need > v.utilization * budget:
            out.print(f"vLLM's copy and KV cache need {need / GiB:.2f} GiB, more than engine.gpu_memory_utilization="
                      f"{v.utilization:g} of the GPU: " + (f"give engine.gpu_memory_utilization >= {share:.2f}."
                      if share < 0.95 else f"that is {share:.2f} GPUs' memory, more than one GPU holds: shard vLLM "
                      "over more GPUs (--rollout-tp k, engine.vllm_tensor_parallel_size) or put it on a rollout "
                      "server (--rollout server)."))


def _print_gpu_table(out, m: Shape, s: Sizes, o: Options, p: Placement, budget: int, where: str, v: Vllm) -> None:
    """The table of GiB per GPU of :func:`compared`'s placements of ``p``, and whether each fits ``budget`` bytes."""
    from rich.table import Table

    cols = {}
    for q in compared(p):
        name = f"{q.mode} TP={q.tp}"
        for kind, parts in per_gpu(m, s, o, q, budget, v).items():
            cols[name if kind == "trainer GPU" else f"{name} (server GPU)"] = (q, parts)
    share = -(-s.prompts // p.gpus)
    t = Table(title=f"memory per GPU, GiB: {count(p.gpus, 'trainer GPU')}, ZeRO {p.zero_stage}, {share} prompt(s) x "
              f"{s.samples} samples per rank; fits {where}?")
    t.add_column("part")
    for name in cols:
        t.add_column(name, justify="right")
    rows = list(dict.fromkeys(k for _, parts in cols.values() for k in parts))
    for r in rows:
        t.add_row(r, *[f"{parts[r] / GiB:.2f}" if r in parts else "-" for _, parts in cols.values()])
    t.add_row("total", *[f"{sum(parts.values()) / GiB:.2f}" for _, parts in cols.values()])
    t.add_row("fits", *["yes" if sum(parts.values()) <= budget else "no" for _, parts in cols.values()])
    out.print(t)
    if s.prompts % p.gpus:
        out.print(f"train.prompts_per_step={s.prompts} is not a multiple of {p.gpus}: the engine refuses it (planned "
                  f"with {share} per rank).")


def _print_none_fits(out, m: Shape, s: Sizes, o: Options, p: Placement, budget: int, v: Vllm) -> None:
    """When no placement of ``p``'s GPUs fits: the smallest that fit (:func:`smallest_fits`), with and without
    the lean settings, or the advice to train an adapter."""
    best = smallest_fits(m, s, o, p, budget, v)
    out.print(f"no placement of {count(p.gpus)} fits: " + (
        "needs >= " + ", or >= ".join(describe(q) for q in best) if best else
        f"none of up to {SEARCH_GPUS[-1]} GPUs fits with these settings") + " (train.prompts_per_step a multiple "
        "of the GPU count).")
    lean = dataclasses.replace(o, gradient_checkpointing=True, max_tokens_per_micro_batch=s.prompt + s.response)
    if lean != o and (small := smallest_fits(m, s, lean, p, budget, v)) and (
            not best or min(q.gpus for q in small) < min(q.gpus for q in best)):
        out.print(f"  with {LEAN.format(s.prompt + s.response)}: >= " + ", or >= ".join(map(describe, small)))
    elif not best:
        out.print("  train a LoRA adapter (model.lora={r: 16}) or plan a smaller model")
