"""``bench/gpu_check.py`` is ``policyzoo doctor --gpu`` under its former name: its dry run prints the
trainer subset's plan, within 8 minutes."""

from __future__ import annotations

import subprocess
import sys

from _engine_helpers import ROOT


def test_gpu_check_is_the_doctor():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--trainer-only", "--dry-run"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "policyzoo doctor --gpu: the trainer subset on cuda, 4 parts" in r.stdout
    # probe 30 + tiny_model 30 + zero0_fp32 75 + zero3_bf16 75 = 210 s, under the subset's 480 s
    assert "total: at most 210 s (each part its own process and timeout; bound 480 s)" in r.stdout
