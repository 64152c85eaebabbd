"""``policyzoo doctor --gpu``: print the plan, or run it and write the report (:func:`cmd_doctor`); each part
runs in its own process under its own timeout.

A part runs as ``python -m policyzoo.doctor.runner PART OUT`` in a new session (its own process group:
a timeout kills the part and everything it started, a training or torchrun's ranks too) and prints
one line ``RESULT {json}``. After every part ``OUT/results.json`` and ``OUT/report.md`` are rewritten,
so a part that hangs or crashes costs only itself and its timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from policyzoo.errors import UserError

from .parts import PARTS, gpu_count
from .plan import PASS, Part, Verdict, budget_for, judge, overall, plan_for, plan_text
from .report import render

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


def command_line(args) -> str:
    """The command as a user types it, for the report."""
    words = ["policyzoo", "doctor", "--gpu"] + (["--trainer-only"] if args.trainer_only else [])
    words += ["--device", args.device] if args.device != "cuda" else []
    return shlex.join(words + ["--out", str(args.out)])


def cuda_problem() -> str | None:
    """Why the parts would see no CUDA GPU here, or None."""
    import torch

    if torch.cuda.is_available():
        return None
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"torch {torch.__version__} ({built}) sees no CUDA GPU"


def cmd_doctor(args, out) -> None:
    """Run (or with ``--dry-run`` print) the plan; raises :class:`UserError` without ``--gpu`` or when
    ``--device cuda`` finds no GPU (before the plan is printed; a dry run prints the plan with a note
    instead), and ``SystemExit(1)`` when a part failed or erred. ``--trainer-only`` implies ``--gpu``."""
    if not (args.gpu or args.trainer_only):
        raise UserError("policyzoo doctor", "no check chosen", "add --gpu (the only check so far), e.g. "
                        "policyzoo doctor --gpu --dry-run")
    problem = args.device == "cuda" and cuda_problem()
    if problem and not args.dry_run:
        raise UserError("policyzoo doctor --gpu", problem, "run it on the GPU node (make setup-cuda there), or "
                        "add --device cpu to run the trainer subset on CPU")
    trainer_only = args.trainer_only or args.device == "cpu"
    parts, budget = plan_for(trainer_only, args.device), budget_for(trainer_only)
    name = "the trainer subset" if trainer_only else "the full plan"
    print(f"policyzoo doctor --gpu: {name} on {args.device}, {len(parts)} parts; report: {args.out / 'report.md'}")
    print(plan_text(parts, budget))
    if args.dry_run:
        if problem:
            print(f"note: {problem} here; the plan above is for a CUDA node (--device cpu: the subset on CPU)")
        return
    verdicts = run_plan(parts, args.out, args.device, command_line(args), budget)
    result = overall(verdicts)
    print(f"{result}: report in {args.out / 'report.md'} (paste it into an issue)")
    if result != PASS:
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:3]))
