"""Run the doctor's parts, each in its own process under its own timeout, and write the report.

A part runs as ``python -m policyzoo.doctor.runner PART OUT`` in a new session (its own process group:
a timeout kills the part and everything it started, a training or torchrun's ranks too) and prints
one line ``RESULT {json}``. After every part ``OUT/results.json`` and ``OUT/report.md`` are rewritten,
so a part that hangs or crashes costs only itself and its timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .parts import PARTS, gpu_count
from .plan import Part
from .report import render
from .verdict import Verdict, judge, overall

TAG = "RESULT "


def part_env(device: str) -> dict:
    """The parts' environment: with ``device == "cpu"`` no GPU is visible (``CUDA_VISIBLE_DEVICES=""``);
    OpenMP threads wait passively (a spinning wait slowed shared CPUs 5x, see the Makefile)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def skip_reason(part: Part, gpus: int) -> str | None:
    """Why ``part`` cannot run here (too few GPUs, a module it needs missing), or None."""
    if part.min_gpus > gpus:
        return f"needs {part.min_gpus} or more CUDA GPUs, {gpus} visible"
    missing = [m for m in part.needs if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def run_part(part: Part, out: Path, env: dict) -> dict:
    """One part in its own process group under ``part.timeout_s``; its result, or ``{"error": ...}``
    when it timed out, printed no result or exited non-zero. ``wall_s`` is added either way."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "policyzoo.doctor.runner", part.name, str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=part.timeout_s)
        line = next((x for x in stdout.splitlines() if x.startswith(TAG)), None)
        res = json.loads(line[len(TAG):]) if line else \
            {"error": f"exited {proc.returncode} without a result: {stderr[-1500:]}"}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        res = {"error": f"timed out after {part.timeout_s} s"}
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    return res


def run_plan(parts: tuple[Part, ...], out: Path, device: str, command: str, budget_s: int,
             echo=print) -> list[Verdict]:
    """Run ``parts`` in order, writing ``OUT/results.json`` and ``OUT/report.md`` after each; returns
    the verdicts. ``echo`` gets one line per part as it ends."""
    out.mkdir(parents=True, exist_ok=True)
    env = part_env(device)
    gpus = 0 if device == "cpu" else gpu_count()
    results: dict[str, dict] = {}
    verdicts: list[Verdict] = []
    t0 = time.perf_counter()
    for part in parts:
        why = skip_reason(part, gpus)
        results[part.name] = {"skipped": why, "wall_s": 0.0} if why else run_part(part, out, env)
        verdicts.append(judge(part, results[part.name]))
        v = verdicts[-1]
        echo(f"{part.name:<12} {v.status:<7} ({results[part.name]['wall_s']:.0f} s) "
             + ("; ".join(c.text() for c in v.checks) or v.reason[:200]))
        meta = {"command": command, "device": device, "budget_s": budget_s, "bound_s": sum(p.timeout_s for p in parts),
                "wall_s": round(time.perf_counter() - t0, 1), "overall": overall(verdicts)}
        (out / "results.json").write_text(json.dumps({**meta, "parts": results}, indent=1))
        (out / "report.md").write_text(render(meta, verdicts, results))
    return verdicts


def _child(name: str, out: str) -> int:
    try:
        res = PARTS[name](Path(out))
    except Exception as e:  # noqa: BLE001 - the part's finding, recorded in the report
        res = {"error": f"{type(e).__name__}: {e}"[:1500]}
    print(TAG + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:3]))
