"""A doctor part that is a short ``policyzoo train`` run: the command, and the measurements read back
from the run directory's ``metrics.jsonl`` and ``summary.json``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

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
