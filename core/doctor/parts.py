"""What each doctor part does, run inside the part's own process (:mod:`policyzoo.doctor.runner`).

Every function takes the output folder and returns the part's result: measurements, or
``{"skipped": why}`` (raised errors are caught by the runner and recorded as the part's error).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import subprocess
import sys
from pathlib import Path

from policyzoo.engine.process import build_deepspeed_op

from .models import build_shape, build_tiny
from .train_part import has_vllm, run_train
from .trl_step import trl_step

#: distributions whose versions the report shows (None: not installed)
VERSIONS = ("policyzoo", "torch", "transformers", "accelerate", "peft", "deepspeed", "pydantic", "vllm", "trl")


def tiny_path(out: Path) -> Path:
    return out / "models" / "tiny"


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def part_probe(out: Path) -> dict:
    """Versions (Python, each of :data:`VERSIONS`, CUDA) and each visible GPU's name, memory (GiB)
    and bf16 support."""
    import torch

    res = {"python": platform.python_version(), "cuda": torch.version.cuda, "gpus": gpu_count(), "devices": []}
    for d in VERSIONS:
        try:
            res[d] = md.version(d)
        except md.PackageNotFoundError:
            res[d] = None
    for i in range(res["gpus"]):
        p = torch.cuda.get_device_properties(i)
        res["devices"].append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 2),
                               "capability": f"{p.major}.{p.minor}"})
    res["bf16"] = bool(res["gpus"]) and torch.cuda.is_bf16_supported()
    return res


def part_deepspeed_op(out: Path) -> dict:
    """Compile DeepSpeed's CPU op now (a training would otherwise compile it inside its timeout)."""
    return {"deepspeed_op": build_deepspeed_op()}


def part_tiny_model(out: Path) -> dict:
    """Build the tiny model into ``OUT/models/tiny``; its parameter count and size on disk (MiB)."""
    folder = build_tiny(tiny_path(out))
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    config = json.loads((folder / "config.json").read_text())
    return {"path": str(folder), "disk_mib": round(size / 2**20, 2), "layers": config["num_hidden_layers"],
            "hidden": config["hidden_size"], "vocab": config["vocab_size"]}


def part_zero0_fp32(out: Path) -> dict:
    return run_train(out / "runs" / "zero0_fp32", tiny_path(out),
                     ["engine.rollout=transformers", "model.dtype=float32", "engine.zero_stage=0"])


def part_zero3_bf16(out: Path) -> dict:
    return run_train(out / "runs" / "zero3_bf16", tiny_path(out),
                     ["engine.rollout=transformers", "model.dtype=bfloat16", "engine.zero_stage=3"])


def part_ranks(out: Path) -> dict:
    """torchrun one process per GPU of :mod:`policyzoo.doctor.rank_probe`; counts the ranks not on
    ``cuda:LOCAL_RANK`` and the all-reduce's distance from the sum of 1..N."""
    n, folder = gpu_count(), out / "ranks"
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "policyzoo.doctor.rank_probe", str(folder)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": f"torchrun exited {r.returncode}: {r.stderr[-1500:]}"}
    ranks = [json.loads(f.read_text()) for f in sorted(folder.glob("rank*.json"))]
    expected = n * (n + 1) / 2  # each rank contributes rank + 1
    return {"ranks": len(ranks), "devices": [x["device"] for x in ranks],
            "rank_device_mismatches": sum(x["device"] != x["local_rank"] for x in ranks) + (n - len(ranks)),
            "all_reduce_error": max((abs(x["all_reduce"] - expected) for x in ranks), default=float("nan"))}


def part_zero3_ranks(out: Path) -> dict:
    n = gpu_count()
    rollout = "vllm" if has_vllm() else "transformers"
    return run_train(out / "runs" / "zero3_ranks", tiny_path(out),
                     [f"engine.rollout={rollout}", "model.dtype=bfloat16", "engine.zero_stage=3",
                      f"train.prompts_per_step={n}"], ranks=n)


def part_step_135m(out: Path) -> dict:
    """The default model's shape, bf16, ZeRO 1: with vLLM and ``engine.vllm_sleep=2`` where vLLM is
    installed (the memory vLLM gives back shows in ``gpu_reserved_gib`` while training), else with
    the transformers rollout."""
    model = build_shape(out / "models" / "shape-135m")
    vllm = ["engine.rollout=vllm", "engine.vllm_sleep=2"] if has_vllm() else ["engine.rollout=transformers"]
    return run_train(out / "runs" / "step_135m", model, [*vllm, "model.dtype=bfloat16", "engine.zero_stage=1"])


def part_trl_step(out: Path) -> dict:
    model = out / "models" / "shape-135m"
    if not (model / "config.json").is_file():
        build_shape(model)
    return trl_step(model, out / "runs" / "trl_step")


PARTS = {name[5:]: fn for name, fn in globals().items() if name.startswith("part_")}
