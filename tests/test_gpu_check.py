"""``bench/gpu_check.py --dry-run`` on CPU: the single-GPU check fits its 8 minutes and its travel
bundle fits 64 MiB (the bundle's real size when .build/gpu-bundle is built, else an upper bound)."""

from __future__ import annotations

import json
import subprocess
import sys

from _engine_helpers import ROOT


def test_gpu_check_plan_and_bundle_fit():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run"], capture_output=True,
                       text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    parts = dict(out["plan"])
    # 8 minutes in all (of the machine's 15), no command over its 10-minute limit, each part its own timeout
    assert out["total_s"] == sum(parts.values()) <= 480 and max(parts.values()) <= 600
    assert {"probe", "models", "zero1_bf16", "zero3_bf16", "fp32", "lora", "hooks_large"} <= set(parts)
    assert 0 < out["bundle_bytes"] < 64 * 2**20 and out["ok"] is True
