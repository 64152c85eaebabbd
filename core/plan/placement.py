"""Model-state memory per GPU by placement: bytes per parameter for colocated rollout at TP = 1 or
k and for a rollout server (``policyzoo plan --gpus N --rollout-tp k --rollout colocated|server``).

Per trainer GPU, with N data-parallel ranks (one GPU each), ZeRO stage z, weights of ``b`` bytes
(``model.dtype``) and a rollout copy of ``r`` bytes (``engine.rollout_dtype``, default ``b``):

* **policy weights** ``b`` (``b / N`` at z = 3);
* **gradients** 4 (fp32; ``4 / N`` at z >= 2);
* **optimizer** AdamW's two fp32 moments 8, plus fp32 master weights 4 when ``b`` < 4
  (``/ N`` at z >= 1) -- the conventions of ``policyzoo.plan`` and of ZeRO (Rajbhandari et al.
  2020, arXiv:1910.02054, Fig. 1, which counts fp16 gradients: 2 where this counts 4);
* **reference** (a KL component): ``b``, or ``b / N`` at z = 3 (it runs as a stage-3 engine);
* **vLLM's copy**: ``r / k`` colocated (a group of k ranks shares one engine sharded k ways), 0 on
  the trainer's GPUs in server mode (the server holds ``r / k`` per GPU of its own, plus its KV cache);
* **sync gather**: the whole weights of ``b`` gathered at the push, only at z = 3 when the push is
  not streamed; streamed (the default) gathers one parameter at a time: ~0 per parameter.

Not per parameter, so not here: activations and logits (``policyzoo plan``'s memory table),
vLLM's KV cache (``engine.gpu_memory_utilization`` of each GPU minus its weights), allocator slack.
"""

from __future__ import annotations

from dataclasses import dataclass

from policyzoo.plan import DTYPE_BYTES, GiB, PlanError

MODES = ("colocated", "server")


def count(n: int, what: str = "GPU") -> str:
    """``n`` and ``what``, plural unless ``n`` is 1: ``1 trainer GPU``, ``8 trainer GPUs``."""
    return f"{n} {what}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Placement:
    gpus: int = 1  # N: trainer (data-parallel) GPUs
    tp: int = 1  # k: GPUs one vLLM engine is sharded over
    mode: str = "colocated"  # or "server"
    zero_stage: int = 0
    weight_bytes: int = 4  # b
    rollout_bytes: int = 4  # r
    need_ref: bool = True
    streamed_sync: bool = True
    grad_bytes: int = 4  # fp32 gradients (DeepSpeed's bf16 optimizer); 2 for the ZeRO paper's fp16 ones


def check_placement(p: Placement) -> None:
    """Raise :class:`~policyzoo.plan.PlanError` for a placement that cannot run (see :func:`per_parameter`)."""
    if p.mode not in MODES:
        raise PlanError(f"--rollout {p.mode}", "the rollout runs colocated or on a server",
                        "give --rollout colocated or --rollout server")
    if p.gpus < 1 or p.tp < 1:
        raise PlanError(f"--gpus {p.gpus} --rollout-tp {p.tp}", "GPU counts must be >= 1",
                        "e.g. --gpus 8 --rollout-tp 2")
    if p.mode == "colocated" and p.gpus % p.tp:
        raise PlanError(f"--rollout-tp {p.tp}", f"colocated, groups of {p.tp} of the "
                        f"{count(p.gpus, 'trainer GPU')} share an engine: the GPUs must be a multiple of the TP size",
                        f"give --gpus a multiple of {p.tp}, or --rollout server")


def per_parameter(p: Placement) -> dict[str, dict[str, float]]:
    """Bytes per model parameter per GPU, by part (module docstring): ``{"trainer GPU": {part:
    bytes}}``, plus ``{"rollout server GPU": {...}}`` in server mode. Raises :class:`~policyzoo.plan.PlanError`
    through :func:`check_placement`."""
    check_placement(p)
    n, z, b = p.gpus, p.zero_stage, p.weight_bytes
    master = 4 if b < 4 else 0
    trainer = {"policy weights": b / n if z >= 3 else b,
               "gradients": p.grad_bytes / n if z >= 2 else p.grad_bytes,
               "optimizer": (8 + master) / n if z >= 1 else 8 + master,
               "reference": (b / n if z >= 3 else b) if p.need_ref else 0.0,
               "vLLM copy": p.rollout_bytes / p.tp if p.mode == "colocated" else 0.0,
               "sync gather": b if z >= 3 and not p.streamed_sync else 0.0}
    out = {"trainer GPU": trainer}
    if p.mode == "server":
        out["rollout server GPU"] = {"vLLM copy": p.rollout_bytes / p.tp}
    return out


def totals_by_mode(p: Placement) -> dict[str, float]:
    """Bytes per parameter on a trainer GPU for colocated TP = 1, colocated TP = k (when the GPUs
    allow it) and server mode, the other settings of ``p`` kept."""
    out = {}
    for name, q in (("colocated TP=1", Placement(**{**vars(p), "mode": "colocated", "tp": 1})),
                    (f"colocated TP={p.tp}", Placement(**{**vars(p), "mode": "colocated"})),
                    (f"server (TP={p.tp} on its own GPUs)", Placement(**{**vars(p), "mode": "server"}))):
        if q.mode == "colocated" and q.gpus % q.tp:
            continue
        out[name] = sum(per_parameter(q)["trainer GPU"].values())
    return out


def table_rows(p: Placement, params: int) -> list[tuple[str, str, str]]:
    """``(part, bytes per parameter, GiB for params parameters)`` of each GPU kind of :func:`per_parameter`,
    with a total row per kind."""
    rows = []
    for kind, parts in per_parameter(p).items():
        for part, v in parts.items():
            rows.append((f"{kind}: {part}", f"{v:.3g}", f"{v * params / GiB:.2f}"))
        total = sum(parts.values())
        rows.append((f"{kind}: total", f"{total:.3g}", f"{total * params / GiB:.2f}"))
    return rows


def placement_for(config, gpus: int | None, tp: int | None, mode: str | None, need_ref: bool) -> Placement:
    """The placement of ``policyzoo plan --gpus --rollout-tp --rollout``; what is not given comes from
    ``config`` (``engine.vllm_tensor_parallel_size``, ``engine.rollout``, ``engine.zero_stage``, the dtypes)."""
    e = config.engine
    tp = tp or e.vllm_tensor_parallel_size
    return Placement(gpus=gpus or tp, tp=tp, mode=mode or ("server" if e.rollout == "server" else "colocated"),
                     zero_stage=e.zero_stage, weight_bytes=DTYPE_BYTES[config.model.dtype],
                     rollout_bytes=DTYPE_BYTES[e.rollout_dtype or config.model.dtype], need_ref=need_ref)


def print_placement(out, p: Placement, dtype: str, params: int) -> None:
    """Print the table of :func:`table_rows` and the totals of :func:`totals_by_mode` to the rich
    console ``out``, for the placement ``p`` (:func:`placement_for`) and a model of ``params`` parameters."""
    from rich.table import Table

    t = Table(title=f"model state per GPU: {count(p.gpus, 'trainer GPU')}, ZeRO {p.zero_stage}, rollout {p.mode} "
              f"TP={p.tp}, {dtype}")
    for col in ("part", "bytes/param", "GiB"):
        t.add_column(col, justify="right" if col != "part" else "left")
    for row in table_rows(p, params):
        t.add_row(*row)
    out.print(t)
    out.print("trainer GPU, bytes/param: " + "; ".join(f"{k}: {v:.3g}" for k, v in totals_by_mode(p).items())
              + " (activations, KV cache and buffers: the next table)")
