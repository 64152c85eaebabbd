"""bench/step_vs_trl.py end to end on the tiny model: both workers (policyzoo and TRL's GRPOTrainer) start,
step in turn and write their results. It once broke unnoticed (a worker called a method the run no longer
had) and was found only on a GPU machine; this keeps the peer benchmark runnable."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _engine_helpers import ROOT, engine_env, tiny_model

pytest.importorskip("trl", reason="TRL comes with make setup (the bench extra)")


def test_step_vs_trl_runs_both_workers_on_the_tiny_model(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "bench" / "step_vs_trl.py"), "--steps", "2", "--warmup", "1", "--P", "1",
           "--G", "2", "--max-tokens", "4", "--threads", "1", "--rollout", "transformers",
           "--override", f"model.path={tiny_model()}", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=engine_env(), cwd=ROOT)
    assert r.returncode == 0, (r.stdout[-2000:], (out / "workers.log").read_text()[-3000:])
    res = json.loads((out / "results.json").read_text())
    # 2 steps each, in turn (ABBA): both frameworks report every step's time split
    for name in ("policyzoo", "trl"):
        steps = res[name]
        assert [s["step"] for s in steps] == [1, 2], name
        assert all(s["time_step"] > 0 and s["time_rollout"] > 0 for s in steps), name
    assert "| step wall time, s |" in (out / "table.md").read_text()
