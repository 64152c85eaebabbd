"""The benchmark suite on one GPU (written for a single H200), printing the same tables as on CPU.

Runs, each as its own process with a time limit, and prints every table at the end:

1. ``ceiling``    bench/ceiling.py --device cuda: fp32/bf16 matmul rate, bandwidth, FLOPs of a step
2. ``hooks``      bench/hook_overhead.py --device cuda: hook dispatch vs direct loss on [B, T]
3. ``agreement``  bench/trl_agreement.py: loss/gradient agreement with TRL (device independent)
4. ``step``       bench/step_vs_trl.py, bf16: policyzoo (vLLM + DeepSpeed ZeRO-1) vs TRL
                  GRPOTrainer (transformers generate), interleaved
5. ``step_vllm``  the same with TRL generating through its own colocated vLLM (closest to ours)
6. ``scaling``    bench/scaling.py at GPU sizes

Needs on the GPU machine: this repository installed (``pip install -e .[bench]``), a CUDA torch,
``vllm`` and ``deepspeed``, and the model (the embedded default is converted into
``$POLICYZOO_CACHE`` on first use). Nothing here downloads.

Run: ``python bench/gpu.py`` (all parts), ``python bench/gpu.py --only ceiling hooks``,
``python bench/gpu.py --dry-run`` (print the commands; works without a GPU).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("ceiling", "hooks", "agreement", "step", "step_vllm", "scaling")


def commands(a) -> dict[str, list[str]]:
    py, out = sys.executable, Path(a.out)
    step = ["--dtype", "bfloat16", "--P", str(a.P), "--G", str(a.G), "--max-tokens", str(a.max_tokens),
            "--steps", str(a.steps), "--threads", str(a.threads), "--override", "engine.zero_stage=1"]
    return {
        "ceiling": [py, str(HERE / "ceiling.py"), "--device", "cuda", "--threads", str(a.threads), "--P", str(a.P),
                    "--G", str(a.G), "--response-len", str(a.max_tokens), "--size", "8192", "--repeats", "10"],
        "hooks": [py, str(HERE / "hook_overhead.py"), "--device", "cuda", "--B", str(a.P * a.G), "--T",
                  str(a.max_tokens), "--G", str(a.G), "--repeats", "200"],
        "agreement": [py, str(HERE / "trl_agreement.py")],
        "step": [py, str(HERE / "step_vs_trl.py"), *step, "--out", str(out / "step_vs_trl")],
        "step_vllm": [py, str(HERE / "step_vs_trl.py"), *step, "--trl-vllm", "--out", str(out / "step_vs_trl_vllm")],
        "scaling": [py, str(HERE / "scaling.py"), "--dtype", "bfloat16", "--Gs", "8", "16", "32",
                    "--lens", "256", "512",
                    "1024", "--Ps", "4", "8", "16", "--base-G", str(a.G), "--base-len", str(a.max_tokens), "--base-P",
                    str(a.P), "--threads", str(a.threads), "--override", "engine.zero_stage=1",
                    "--out", str(out / "scaling")],
    }


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--P", type=int, default=8, help="prompts per step")
    ap.add_argument("--G", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=256, help="response token limit")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=8, help="CPU threads (tokenizer, reward, host work)")
    ap.add_argument("--limit-s", type=int, default=900, help="time limit of each part, seconds")
    ap.add_argument("--out", default=str(HERE / "results" / "gpu"))
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    a = ap.parse_args(argv)
    if min(a.P, a.G, a.max_tokens, a.steps, a.threads, a.limit_s) < 1 or a.G < 2:
        ap.error("P, max-tokens, steps, threads, limit-s must be >= 1 and G >= 2")
    return a, ap


def gpu_problem() -> str | None:
    """Why this machine cannot run the suite, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU (this suite is for a GPU machine; bench/*.py run on CPU as they are)"
    missing = [m for m in ("vllm", "deepspeed", "trl") if __import__("importlib").util.find_spec(m) is None]
    return f"missing packages: {', '.join(missing)}" if missing else None


def main(argv=None) -> int:
    a, ap = parse(argv)
    cmds = commands(a)
    if a.dry_run:
        for part in a.only:
            print(f"# {part}\n{shlex.join(cmds[part])}")
        return 0
    problem = gpu_problem()
    if problem:
        ap.error(problem)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    report = []
    for part in a.only:
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmds[part], capture_output=True, text=True, timeout=a.limit_s)
            body = "\n".join(line for line in p.stdout.splitlines() if line.startswith("|") or not line.strip()
                             or line[:1].isalpha())
            status = "ok" if p.returncode == 0 else f"failed (rc {p.returncode}): {p.stderr.strip()[-600:]}"
        except subprocess.TimeoutExpired:
            body, status = "", f"stopped after {a.limit_s} s"
        (Path(a.out) / f"{part}.txt").write_text(body)
        took = time.perf_counter() - t0
        report.append(f"## {part} ({status}, {took:.0f} s)\n\n`{shlex.join(cmds[part])}`\n\n{body}\n")
        print(report[-1], flush=True)
    (Path(a.out) / "report.md").write_text("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
