"""What ``policyzoo plan`` prints: the FLOPs and memory tables of one step, whether it fits, the
placement over GPUs, and a finished run's measured split next to the FLOP split (the command's
arguments are read in :mod:`policyzoo.cli`)."""

from __future__ import annotations

import os

from rich.console import Console
from rich.table import Table

from policyzoo.assembly import Run
from policyzoo.plan import (
    GiB,
    PlanError,
    Shape,
    Sizes,
    engine_path,
    fitting_settings,
    flops,
    load_shape,
    memory,
    options_for,
)
from policyzoo.plan.gpu import DEFAULT_GPU, Vllm, gpu_bytes, print_gpu_plan
from policyzoo.plan.placement import check_placement, placement_for, print_placement
from policyzoo.plan.roofline import print_roofline, roofline
from policyzoo.plan.shapes import shape_config
from policyzoo.resolve import resolve_algorithm


def print_plan(out: Console, config, model: str | None, sizes: list[int], prompt: int | None,
               budget: float | None, split: dict | None, from_run: str | None = None, gpus: int | None = None,
               rollout_tp: int | None = None, rollout: str | None = None, gpu: str | None = None,
               shape_name: str | None = None) -> None:
    """Print the plan of ``config``'s step for ``model`` (None: the embedded default; ``shape_name``: a shape
    of :data:`~policyzoo.plan.shapes.SHAPES` instead): P G L from ``sizes`` or the config, ``prompt`` tokens
    per row (default 103, or the run's mean), one GPU's or rank's memory ``budget`` in bytes (None: ``gpu``'s,
    a name of :data:`~policyzoo.plan.gpu.GPUS`; with ``gpus`` and neither, the default GPU's; else this
    machine's RAM), and with ``split`` (a run's :func:`~policyzoo.plan.measured_split`, from ``from_run``)
    the measured seconds per part. With ``gpus``/``rollout_tp``/``rollout`` the verdict is per GPU
    (:mod:`policyzoo.plan.gpu`), else one rank's.

    Raises :class:`~policyzoo.plan.PlanError` when P G L are given with a run's split, or both ``budget``
    and ``gpu``, or both ``model`` and ``shape_name``."""
    run = Run(resolve_algorithm(config.algorithm))
    p, g, n, prompt = _step_sizes(config, run, sizes, prompt, split)
    if budget and gpu:
        raise PlanError(f"--gpu {gpu} memory=", "both give one GPU's memory", "give one of them")
    shape, model = _model_shape(model, shape_name)
    opts = options_for(config, run, shape)
    s = Sizes(p, g, n, prompt)
    placed = bool(gpus or rollout_tp or rollout)
    # every argument is checked before anything prints: a wrong --gpu or --rollout-tp stops with its error alone
    where = f"memory={budget / GiB:g} GiB" if budget else None
    named = gpu_bytes(gpu or DEFAULT_GPU) if gpu or (placed and not budget) else None
    place = placement_for(config, gpus, rollout_tp, rollout, opts.need_ref) if placed else None
    if place is not None:
        check_placement(place)
    zero3_ranks = placed and config.engine.zero_stage >= 3 and (gpus or rollout_tp or 1) > 1
    f = flops(shape, s, engine_path(opts, zero3_ranks))
    phases = roofline(shape, s, engine_path(opts, zero3_ranks), f, gpu, gpus or 1, config.engine.zero_stage,
                      config.engine.rollout_dtype) if gpu else None
    out.print(f"{model or 'embedded default'}: {shape.params / 1e6:.1f} M parameters, {shape.layers} layers; "
              f"P={p} prompts x G={g} samples, {prompt} prompt + {n} response tokens; {opts.dtype}")
    _print_flops(out, f)
    if named is not None:
        budget, source = named
        where = gpu or DEFAULT_GPU
        out.print(f"GPU memory: {where} = {budget / GiB:.1f} GiB ({source})" + ("" if gpu else
                  "; the default GPU: --gpu NAME or memory=GiB for another"))
    if place is not None:
        print_placement(out, place, config.model.dtype, shape.params)
        print_gpu_plan(out, shape, s, opts, place, int(budget), where,
                       Vllm(config.engine.gpu_memory_utilization, config.engine.vllm_sleep))
    else:
        print_rank(out, shape, s, opts, budget, where)
    if phases is not None:
        print_roofline(out, phases, gpu, gpus or 1, opts.dtype)
    if split:
        _print_split(out, config, split, f, from_run)


def _step_sizes(config, run, sizes: list[int], prompt: int | None, split: dict | None) -> tuple[int, int, int, int]:
    """``(P, G, L, prompt tokens)``: ``sizes`` or the config's, L and the prompt the run's means with ``split``
    (prompt default 103). Raises :class:`~policyzoo.plan.PlanError` when ``sizes`` come with ``split``."""
    p, g, n = sizes or (config.train.prompts_per_step, run.sample.params.n, run.sample.params.max_tokens)
    if split and sizes:
        raise PlanError(" ".join(map(str, sizes)), "--from-run sets the run's measured times against the run's own "
                        "sizes", "drop P G L with --from-run, or plan those sizes without it")
    if split:
        n = max(1, round(split["response_length_mean"]))
        if prompt is None and split["prompt_length_mean"]:
            prompt = max(1, round(split["prompt_length_mean"]))
    return p, g, n, prompt or 103


def _model_shape(model: str | None, shape_name: str | None) -> tuple[Shape, str | None]:
    """The :class:`~policyzoo.plan.Shape` of ``model`` (or of the known shape ``shape_name``) and the model's
    name as printed. Raises :class:`~policyzoo.plan.PlanError` when both are given."""
    if shape_name and model:
        raise PlanError(f"--shape {shape_name} model={model}", "both name the model", "give one of them")
    if shape_name:
        cfg, source = shape_config(shape_name)
        return Shape.from_config(cfg, source), f"{shape_name} (config.json of {source})"
    return load_shape(model), model


def _print_flops(out: Console, f: dict[str, int]) -> None:
    """The FLOPs table: each part's GFLOP and share of the step's total."""
    total = sum(f.values())
    t = Table(title="FLOPs of one step")
    for col in ("part", "GFLOP", "share"):
        t.add_column(col, justify="right" if col != "part" else "left")
    for k, v in f.items():
        t.add_row(k, f"{v / 1e9:.2f}", f"{v / total:.1%}")
    t.add_row("total", f"{total / 1e9:.2f}", "100%")
    out.print(t)


def _print_split(out: Console, config, split: dict, f: dict[str, int], from_run: str | None) -> None:
    """The run's measured seconds per part (``split``, median s per step) next to the FLOP split ``f``."""
    total = sum(f.values())
    roll = f["rollout prefill"] + f["rollout decode"]
    train = total - roll
    c = Table(title=f"measured split of {from_run} (median s per step) vs the FLOP split")
    for col in ("part", "seconds", "share of time", "share of FLOPs", "GFLOP/s achieved"):
        c.add_column(col, justify="right" if col != "part" else "left")
    # with engine.overlap the rollout runs beside training: a step logs only its wait for it
    hidden = config.engine.overlap != "none" or config.engine.max_staleness > 0
    busy = split["train"] + (0.0 if hidden else split["rollout"])
    for name, sec, fl in (("rollout", split["rollout"], roll), ("train", split["train"], train)):
        if name == "rollout" and hidden:
            c.add_row(name, f"{sec:.2f} (wait)", "-", f"{fl / total:.1%}", "-")
            continue
        c.add_row(name, f"{sec:.2f}", f"{sec / busy:.1%}" if busy else "-", f"{fl / total:.1%}",
                  f"{fl / sec / 1e9:.1f}" if sec else "-")
    c.add_row("sync", f"{split['sync']:.2f}", "-", "-", "-")
    out.print(c)
    if hidden:
        out.print("engine.overlap / max_staleness: the rollout ran in the background while the previous step "
                  "trained; its time is not on the step's clock, so it gets no rate here (plan a run without "
                  "overlap to measure it).")


def print_rank(out: Console, shape, s, opts, budget: float | None, where: str | None) -> None:
    """One rank's memory table (every model of :func:`~policyzoo.plan.memory`, ZeRO not applied) and
    whether it fits ``budget`` (:func:`print_fit`)."""
    mem = memory(shape, s, opts)
    m = Table(title="memory, GiB (one rank)")
    for col in ("model", "weights", "grads+optimizer", "activations", "kv cache", "total"):
        m.add_column(col, justify="right" if col != "model" else "left")
    for name, parts in mem.items():
        m.add_row(name, *[f"{v / GiB:.3f}" for v in parts.values()], f"{sum(parts.values()) / GiB:.3f}")
    out.print(m)
    out.print(f"vLLM reserves engine.kv_cache_gb = {opts.kv_cache_gb:g} GiB for its KV cache.")
    print_fit(out, shape, s, opts, mem, budget, where)


def print_fit(out: Console, shape, s, opts, mem: dict, budget: float | None, where: str | None = None) -> None:
    """Whether one rank's total fits ``budget`` bytes (``where`` names it; default this machine's RAM)
    and, when not, the settings that make it fit (``policyzoo.plan.fitting_settings``)."""
    where = where or (f"memory={budget / GiB:g} GiB" if budget else "this machine's memory (memory=GiB or "
                      "--gpu NAME for another)")
    budget = budget or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    total = sum(sum(parts.values()) for parts in mem.values())
    if total <= budget:
        out.print(f"total {total / GiB:.3f} GiB fits in {where} ({budget / GiB:.1f} GiB).")
        return
    fits = fitting_settings(shape, s, opts, int(budget))
    out.print(f"total {total / GiB:.3f} GiB does not fit in {where} ({budget / GiB:.1f} GiB); "
              + ("settings that fit (add to the train command):" if fits else "no activation setting fits: the "
                 "weights and optimizer state alone are too large; train a LoRA adapter (model.lora={r: 16}), "
                 "offload or shard the optimizer state (engine.deepspeed, engine.zero_stage with more ranks), "
                 "or plan a smaller model"))
    for settings, size in fits:
        out.print(f"  {settings}   ({size / GiB:.3f} GiB)")


