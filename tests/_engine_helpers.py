"""Shared helpers of the engine tests: the tiny model (built once per checkout) and CLI runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / ".build"
TINY_VERSION = "tiny-llama-v1"


def tiny_model() -> Path:
    """A tiny Llama (hidden 128, 4 heads, head_dim 32, 2 layers, byte tokenizer) built once into
    ``.build/test-models`` (written to a temporary folder and renamed, so it is never half built)."""
    from policyzoo.testing.tiny import build_tiny_model

    target = BUILD / "test-models" / TINY_VERSION
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent))
    build_tiny_model(tmp, seed=0)
    try:
        os.rename(tmp, target)
    except OSError:  # built meanwhile by another process
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def engine_env() -> dict:
    env = dict(os.environ)
    env.setdefault("POLICYZOO_CACHE", str(BUILD / "cache"))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see the Makefile
    env["PYTHONUNBUFFERED"] = "1"
    return env


TINY_OVERRIDES = [
    "algorithm.sample.max_tokens=12", "train.prompts_per_step=2", "train.lr=1e-3", "data.eval_size=4",
    "data.limit=64", "engine.sync_check=true", "engine.sync_tolerance=1e-4",
    'rewards=[{use: function, function: "policyzoo.testing.tiny:spread_reward"}]',
]


def train_cmd(out: Path, *extra: str, algo: str | None = "grpo", model: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--output-dir", str(out)]
    if algo:
        cmd += ["--algo", algo]
    cmd += [f"model.path={model or tiny_model()}", *TINY_OVERRIDES, *extra]
    return cmd


def run_train(out: Path, *extra: str, algo: str | None = "grpo", timeout: int = 600, model: Path | None = None):
    return subprocess.run(train_cmd(out, *extra, algo=algo, model=model), env=engine_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def metrics(run_dir: Path, kind: str = "train") -> list[dict]:
    return [r for r in (json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == kind]


def make_rollout(prompts: list[list[int]], responses: list[list[int]], temperature: float = 1.0, pad: int = 2):
    """A Rollout of the given token ids for scoring tests: responses right-padded with ``pad``
    (2: the tiny model's eos == pad, as SmolLM2), every given token in ``response_mask``, one group per row."""
    import torch

    from policyzoo.contract import Rollout

    t = max(len(x) for x in responses)
    ids = torch.full((len(responses), t), pad)
    mask = torch.zeros((len(responses), t), dtype=torch.bool)
    for i, x in enumerate(responses):
        ids[i, :len(x)] = torch.tensor(x)
        mask[i, :len(x)] = True
    return Rollout(prompt_ids=prompts, response_ids=ids, response_mask=mask,
                   rollout_logprobs=torch.zeros(ids.shape), group_ids=torch.arange(len(prompts)),
                   truncated=torch.zeros(len(prompts), dtype=torch.bool), temperature=temperature)
