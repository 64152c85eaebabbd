"""Kill -9 mid-run, resume: the following steps reproduce the uninterrupted run (CPU, fp32,
fixed seeds), and a half-written checkpoint folder is ignored."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from _engine_helpers import ROOT, engine_env, metrics, train_cmd
from safetensors.torch import load_file

ARGS = ["train.steps=6", "train.save_every=2", "algorithm.sample.n=4", "engine.zero_stage=0",
        "train.log_completions_every=1"]
VOLATILE = ("time_", "rollout_tokens_per_s", "sync_seconds", "rss_gib", "peak_rss_gib", "gpu_")  # timings, memory


def _same(a: dict, b: dict) -> None:
    keys = {k for k in a if not k.startswith(VOLATILE)} | {k for k in b if not k.startswith(VOLATILE)}
    for k in sorted(keys):
        x, y = a.get(k), b.get(k)
        if isinstance(x, float) and isinstance(y, float):
            assert x == pytest.approx(y, rel=1e-5, abs=1e-6) or (math.isnan(x) and math.isnan(y)), (a["step"], k, x, y)
        else:
            assert x == y, (a["step"], k, x, y)


def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    # the uninterrupted run and the one to kill are independent: started together, their start-ups overlap
    log = tmp_path / "full.err"  # a file, not a pipe: nothing reads it until the kill, and a full pipe would stall
    with log.open("w") as err_file:
        whole = subprocess.Popen(train_cmd(full, *ARGS), env=engine_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=err_file, text=True)
    p = subprocess.Popen(train_cmd(cut, *ARGS), env=engine_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        latest = cut / "checkpoints" / "latest.json"
        deadline = time.time() + 900
        while time.time() < deadline and p.poll() is None:
            if latest.is_file() and json.loads(latest.read_text())["step"] >= 2:
                os.kill(p.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        p.wait(60)
        whole.wait(600)
        assert whole.returncode == 0, log.read_text()[-3000:]
    finally:
        for proc in (whole, p):
            if proc.poll() is None:
                proc.kill()
                proc.wait(60)
    assert p.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = json.loads(latest.read_text())["step"]
    assert killed_at < 6 and not (cut / "final").exists()
    # a checkpoint interrupted while being written: a partial temporary folder, not in latest.json
    partial = cut / "checkpoints" / f".tmp-step-{killed_at + 2:06d}"
    partial.mkdir(exist_ok=True)
    (partial / "junk").write_text("half written")

    resumed = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--resume", str(cut)], env=engine_env(),
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and not partial.exists()

    a, b = metrics(full), metrics(cut)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]  # steps logged after the checkpoint were dropped, redone
    for x, y in zip(a, b):
        _same(x, y)
    # completions.jsonl: rows logged after the checkpoint were dropped and redone, the same rows again
    # (group ids restart with the process, so they are left out)
    def rows(run):
        return [{k: v for k, v in json.loads(x).items() if k != "group"}
                for x in (run / "completions.jsonl").read_text().splitlines()]
    ra, rb = rows(full), rows(cut)
    assert len(ra) == len(rb) == 6 * 2 * 4  # 6 steps x P=2 x n=4
    for x, y in zip(ra, rb):
        _same(x, y)
    wa = load_file(str(full / "final" / "model.safetensors"))
    wb = load_file(str(cut / "final" / "model.safetensors"))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6
