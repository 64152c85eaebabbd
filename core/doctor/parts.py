"""What each doctor part does, run inside the part's own process (:mod:`policyzoo.doctor.runner`), and what
the parts build and run: the models, built in place from a config (random init, no download), and the short
``policyzoo train`` runs whose measurements are read back from the run directory.

* the tiny Llama of :func:`policyzoo.testing.tiny.build_tiny_model` (2 layers, hidden 128, 4 heads,
  259-token byte tokenizer: ~0.1 M parameters), for the trainer subset;
* :data:`SHAPE_135M`, the shape of the default model SmolLM2-135M-Instruct (30 layers, hidden 576,
  vocabulary 49,152: 134.5 M parameters), for step time and memory per GPU. Its tokenizer is the
  byte tokenizer with filler entries up to 49,152 ids, so a sampled id above 258 still decodes.
* a part that is a short ``policyzoo train`` run (:func:`run_train`): the command, and the measurements
  read back from the run directory's ``metrics.jsonl`` and ``summary.json``.

Every ``part_*`` function takes the output folder and returns the part's result: measurements, or
``{"skipped": why}`` (raised errors are caught by the runner and recorded as the part's error).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import platform
import subprocess
import sys
from pathlib import Path

from policyzoo.engine.process import build_deepspeed_op
from policyzoo.testing.tiny import build_tiny_model, build_tokenizer

from .trl_step import trl_step

#: SmolLM2-135M-Instruct's config.json (sizes, rope, ids: bos 1, eos = pad 2 as the byte tokenizer's)
SHAPE_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
              "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
              "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5}


def build_tiny(folder: Path) -> Path:
    """The tiny Llama (fp32 safetensors, byte tokenizer) written to ``folder``; returns ``folder``."""
    return build_tiny_model(folder, seed=0)


#: the standard deviation of the random model's logits: its (tied) embedding is scaled so that a logit,
#: the dot product of the final RMS-normed hidden state (per-coordinate RMS 1) with an embedding row,
#: has variance hidden x (initializer_range x scale)^2 = LOGIT_STD^2. With the default init (0.02) the
#: 135M shape's logits have std 0.48: a near-uniform distribution over 49,152 ids whose log-probs bf16
#: barely moves (the first H200 run read a sync difference of 1e-6 nats), so the bf16 check tested nothing.
LOGIT_STD = 4.0


def build_shape(folder: Path, shape: dict = SHAPE_135M, seed: int = 0) -> Path:
    """A random-init Llama of ``shape`` (a config.json's sizes) saved in bf16 with its padded byte
    tokenizer into ``folder``; returns ``folder``. The embedding is scaled so the logits have standard
    deviation :data:`LOGIT_STD` (a peaked next-token distribution, as a trained model's). 135M shape:
    ~270 MB written, a few seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder, shape["vocab_size"])
    config = LlamaConfig(**shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # tied: scales the input embedding and the output head together
        model.get_input_embeddings().weight.mul_(LOGIT_STD / (config.initializer_range * config.hidden_size ** 0.5))
    model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


#: a short GRPO run on the built-in arithmetic task with a reward that differs between any two samples
#: (even a random model's), the sync check on: 2 prompts x 4 samples x 16 tokens, 2 steps; no tracker
#: (TensorBoard's tensorboardX is not among the trainer subset's packages)
BASE = ["--algo", "grpo", "engine.sync_check=true", "train.steps=2", "train.prompts_per_step=2",
        "algorithm.sample.n=4", "algorithm.sample.max_tokens=16", "data.eval_size=2", "data.limit=16",
        "train.lr=1e-5", "train.report_to=[]",
        'rewards=[{use: function, function: "policyzoo.testing.tiny:spread_reward"}]']


def has_vllm() -> bool:
    """True when vLLM is importable here (its spec is found; nothing is imported)."""
    return importlib.util.find_spec("vllm") is not None


def train_command(run_dir: Path, model: Path, overrides: list[str], ranks: int = 1) -> list[str]:
    """``policyzoo train`` as an argv: one process, or ``ranks`` processes under torchrun."""
    launch = [sys.executable, "-m", "policyzoo.cli"] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
         "-m", "policyzoo.cli"]
    return [*launch, "train", "--output-dir", str(run_dir), f"model.path={model}", *BASE, *overrides]


def run_train(run_dir: Path, model: Path, overrides: list[str], ranks: int = 1) -> dict:
    """Run ``policyzoo train`` (the part's own timeout bounds it) and return its measurements, or
    ``{"error": ...}`` with the end of its output when it exits non-zero."""
    cmd = train_command(run_dir, model, overrides, ranks)
    r = subprocess.run(cmd, capture_output=True, text=True)
    shown = " ".join(cmd[cmd.index("train"):])
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip()
        last = tail.splitlines()[-1] if tail else "no output"
        return {"error": f"policyzoo train exited {r.returncode}: {last}\n{tail[-1500:]}\ncommand: policyzoo {shown}"}
    return {"command": f"policyzoo {shown}", **read_run(run_dir)}


def read_run(run_dir: Path) -> dict:
    """Measurements of a finished run: ``steps``; ``sync_max_diff`` / ``sync_mean_diff`` (nats, max
    over steps); ``share_prompt_max_diff`` (nats, None when the check did not run); ``step_s`` (the
    last step's seconds: the first includes warm-up) and its split ``rollout_s``, ``train_s``, ``sync_s``;
    GiB maxima over steps of ``gpu_peak_allocated_gib``, ``gpu_reserved_gib``, ``gpu_kv_cache_gib``, ``peak_rss_gib``;
    ``skipped_steps``. A key no step reported is None."""
    rows = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if m.get("kind") == "train"]
    summary = json.loads((run_dir / "summary.json").read_text())
    share = summary.get("share_prompt_check") or {}

    def most(key):
        vals = [m[key] for m in rows if isinstance(m.get(key), (int, float))]
        return max(vals) if vals else None

    return {"steps": len(rows), "sync_max_diff": most("sync_max_diff"), "sync_mean_diff": most("sync_mean_diff"),
            "share_prompt_max_diff": share.get("max_diff"), "step_s": rows[-1].get("time_step") if rows else None,
            **{f"{k}_s": rows[-1].get(f"time_{k}") if rows else None for k in ("rollout", "train", "sync")},
            "gpu_peak_allocated_gib": most("gpu_peak_allocated_gib"), "gpu_reserved_gib": most("gpu_reserved_gib"),
            "gpu_kv_cache_gib": most("gpu_kv_cache_gib"), "peak_rss_gib": most("peak_rss_gib"),
            "skipped_steps": sum(int(m.get("skipped") or 0) for m in rows), "rollout": summary.get("rollout"),
            "zero_stage": summary.get("zero_stage")}


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
