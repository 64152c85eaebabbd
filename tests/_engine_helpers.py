"""Shared helpers of the engine tests: the tiny model (built once per checkout) and CLI runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
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
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack: what a run that timed out was doing
    return env


def run_bounded(cmd: list[str], timeout: int = 600, logs: Path | None = None, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=engine_env())`` that,
    on a timeout, fails the test with what the process was doing: it is sent SIGABRT (the faulthandler of
    :func:`engine_env` prints every thread's stack, into ``startup.log`` while the libraries' output goes there),
    and the failure shows the end of its stderr and of each ``startup.log`` under ``logs``."""
    import pytest

    kw = {"env": engine_env(), "cwd": ROOT, **kw}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)
            try:
                out, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            startup = [f"--- {f}:\n{f.read_text(errors='replace')[-6000:]}"
                       for f in (sorted(Path(logs).rglob("startup.log")) if logs else [])]
            pytest.fail(f"{' '.join(map(str, cmd))[:300]} timed out after {timeout} s; its stderr ends:\n"
                        f"{(err or '')[-6000:]}\n" + "\n".join(startup), pytrace=False)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


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
    return run_bounded(train_cmd(out, *extra, algo=algo, model=model), timeout, logs=out)


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


def parser_with(fn):
    """A ``build_parser`` stand-in for ``policyzoo.cli.main``: one ``zoo`` command that runs ``fn(args, out)``
    (the CLI's exit handling around a command, without its real commands)."""
    import argparse

    def build():
        p = argparse.ArgumentParser()
        p.add_subparsers(dest="command").add_parser("zoo").set_defaults(fn=fn)
        return p
    return build


def stand_in_part(config, console, pre, **parts):
    """A :class:`~policyzoo.engine.run.session.RunPart` without a model: ``pre`` stands in for what the checks
    made (its ``task``, ``run``, ``model``, ``rundir``, ``state``, ``task_rewards_n``, ``prompt_counts``), ``parts``
    for the started parts (``trainer``, ``tracker``, ``policy``, ``rollout``); the start took 0 s."""
    from types import SimpleNamespace

    from policyzoo.engine.run.session import RunPart, Startup, Warnings

    return RunPart(config=config, console=console, task=getattr(pre, "task", None), run=pre.run, settings=None,
                   model=pre.model, rundir=pre.rundir, state=pre.state, trainer=parts.get("trainer"),
                   rollout=parts.get("rollout"), policy=parts.get("policy", SimpleNamespace()),
                   tracker=parts.get("tracker"), share=config.train.prompts_per_step, fingerprint={},
                   task_rewards_n=pre.task_rewards_n, turn_tokens=0, prompt_counts=pre.prompt_counts,
                   warnings=Warnings(console, pre.rundir), startup=Startup(None, 0.0, {}, 0.0))
