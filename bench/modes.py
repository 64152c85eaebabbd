"""What each rollout placement costs on this machine: colocated (TP = 1), colocated asynchronous
(``engine.max_staleness``), tensor-parallel rollout on 2 ranks (``engine.vllm_tensor_parallel_size``)
against 2 ranks at TP = 1, and the rollout server (``policyzoo serve``) synchronous and asynchronous.

Each mode is one ``policyzoo train`` run of the same task, seeds and sizes, run one after the other
(never side by side: on 2 cores parallel runs make every timing worthless). From each run's
``metrics.jsonl`` (steps after ``--warmup``), medians of:

* ``step_s``: the whole optimizer step (``time_step``);
* ``rollout_s``: the time the trainer waited for its rollouts (``time_rollout``; with
  ``max_staleness`` a batch sampled ahead costs only the wait for it);
* ``sync_s``: the weight push and its check (``time_sync``);
* ``staleness_mean``: mean per-row staleness (``policy_lag_mean``, 0 when synchronous).

Ratios are against the colocated synchronous run of the same invocation (2-rank runs against the
2-rank TP = 1 run), so they compare modes measured side by side in time on the same machine, whose
fp32 matmul rate and copy bandwidth are measured first and recorded with the numbers.

    python bench/modes.py --model tiny --steps 6          # ~5 min on an idle 2-core machine
    python bench/modes.py --model default --steps 5       # the embedded SmolLM2-135M-Instruct

Writes ``bench/results/modes_<model>/`` (the runs) and ``modes_<model>`` in
``bench/results/summary.json``. On 2 CPU cores sampling and training share the same cores, so the
asynchronous and server gains are small or negative here; docs/distributed.md says what they should
be where sampling and training have devices of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from policyzoo.engine.process import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

TASK = ["train.prompts_per_step=2", "algorithm.sample.n=4", "train.lr=1e-5", "data.eval_size=0",
        "engine.sync_check=true", "train.save_every=0", "train.seed=1"]


def modes(server: str) -> dict[str, tuple[int, list[str]]]:
    """name -> (ranks, overrides)."""
    return {
        "colocated": (1, []),
        "colocated_async1": (1, ["engine.max_staleness=1"]),
        "server": (1, ["engine.rollout=server", f"engine.servers=[{server}]"]),
        "server_async1": (1, ["engine.rollout=server", f"engine.servers=[{server}]", "engine.max_staleness=1"]),
        "two_ranks_tp1": (2, []),
        "two_ranks_tp2": (2, ["engine.vllm_tensor_parallel_size=2"]),
    }


def env() -> dict:
    e = dict(os.environ)
    e.setdefault("POLICYZOO_CACHE", str(ROOT / ".build" / "cache"))
    e.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return e


def model_args(which: str) -> tuple[list[str], str]:
    if which == "tiny":
        from _engine_helpers import tiny_model

        path = str(tiny_model())
        return [f"model.path={path}", "algorithm.sample.max_tokens=12", "data.limit=64",
                'rewards=[{use: function, function: "policyzoo.testing.tiny:spread_reward"}]'], path
    from policyzoo.engine.models import resolve_model

    path = str(resolve_model(None).path)  # the embedded default, converted once into the cache
    return [f"model.path={path}", "algorithm.sample.max_tokens=32"], path


def start_server(path: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "policyzoo.cli", "serve", "--model", path, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env(), cwd=ROOT, start_new_session=True)
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc, f"127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        time.sleep(2)
    stop(proc)
    raise SystemExit(f"the rollout server did not start: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def train(out: Path, ranks: int, args: list[str]) -> list[dict]:
    shutil.rmtree(out, ignore_errors=True)
    cli = ["-m", "policyzoo.cli", "train", "--algo", "grpo", "--output-dir", str(out), *args]
    launch = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone"]
    cmd = [sys.executable, *cli] if ranks == 1 else [sys.executable, *launch, *cli]
    r = subprocess.run(cmd, env=env(), cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if r.returncode:  # recorded as the mode's result (a refusal says why), the other modes go on
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        at = next((i for i, x in enumerate(lines) if x.startswith("error")), max(len(lines) - 1, 0))
        said = " ".join(x.strip() for x in lines[at:at + 3])  # the error block: where, why, fix
        raise RuntimeError(f"exit {r.returncode}: {said[:400]}")
    return [x for x in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if x.get("kind") == "train"]


def medians(steps: list[dict], warmup: int) -> dict:
    rows = steps[warmup:]

    def med(key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(vals), 4) if vals else None

    return {"step_s": med("time_step"), "rollout_s": med("time_rollout"), "sync_s": med("time_sync"),
            "staleness_mean": med("policy_lag_mean") or 0.0, "steps": len(rows)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["tiny", "default"], default="tiny")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--only", nargs="*", help="run only these modes")
    a = ap.parse_args(argv)
    import headline
    import summary

    rates = headline.machine_rates()
    margs, path = model_args(a.model)
    folder = HERE / "results" / f"modes_{a.model}"
    folder.mkdir(parents=True, exist_ok=True)
    proc, address = start_server(path, folder / "server.log")
    results = {}
    try:
        for name, (ranks, extra) in modes(address).items():
            if a.only and name not in a.only:
                continue
            t0 = time.time()
            try:
                steps = train(folder / name, ranks, [*margs, *TASK, f"train.steps={a.steps}", *extra])
                results[name] = medians(steps, a.warmup)
            except RuntimeError as e:
                results[name] = {"failed": str(e)}
            print(f"{name}: {results[name]} ({time.time() - t0:.0f} s)", flush=True)
    finally:
        stop(proc)
    for name, base in (("colocated_async1", "colocated"), ("server", "colocated"), ("server_async1", "colocated"),
                       ("two_ranks_tp2", "two_ranks_tp1")):
        if results.get(name, {}).get("step_s") and results.get(base, {}).get("step_s"):
            results[name]["step_ratio"] = round(results[name]["step_s"] / results[base]["step_s"], 3)
    detail = {"modes": results, "machine": rates, "model": a.model, "steps": a.steps, "warmup": a.warmup}
    summary.record(f"modes_{a.model}", {k: v.get("step_ratio") for k, v in results.items()}, argv, detail)
    return detail


if __name__ == "__main__":
    main()
