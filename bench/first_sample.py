"""The first sampled step of a run: vLLM-CPU's compiled rank count against policyzoo's eager one.

vLLM 0.32 ranks every sampled token with a ``torch.compile``d function; its first call (the first
sampling with log-probs: step 1 of every run) traces and compiles it. policyzoo counts the ranks
eagerly on CPU (``policyzoo.engine.rollout.vllm_options.eager_token_ranks``). Each worker process
starts vLLM on the model and times: the start, a greedy call (as the first evaluation), the first
sampled call and a second one (P prompts x G samples, ``--max-tokens``). Modes, interleaved per round:

* ``compiled_cold``: vLLM's compiled count with an empty inductor cache (a fresh machine, a CI run);
* ``compiled_warm``: the same with the inductor cache an earlier process filled (a later run);
* ``eager``: policyzoo's count (the default).

    python bench/first_sample.py --model default --rounds 3 --out bench/results/first_sample

Writes ``table.md`` and ``results.json`` (with the machine's rates and the load before and after).
Run it on an idle machine: the timings are worthless with other work on the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import summary as bench_summary  # noqa: E402  (first: it notes the machine load at the start)

MODES = ("compiled_cold", "compiled_warm", "eager")


def worker(mode: str, model: str, P: int, G: int, max_tokens: int) -> dict:
    """One process's timings (seconds); ``compiled_*`` leaves vLLM's compiled count in place."""
    from policyzoo.engine.process import setup_process

    setup_process(threads=2)
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout import vllm_engine

    if mode != "eager":
        vllm_engine.eager_token_ranks = lambda: None
    info = resolve_model(None if model == "default" else model)
    t = time.perf_counter()
    r = vllm_engine.VLLMRollout(info, "float32", 1024, 0)
    out = {"start_s": time.perf_counter() - t}
    rows = [{"prompt": [{"role": "user", "content": f"What is {k} plus {k + 3}?"}]} for k in range(P)]
    t = time.perf_counter()
    r.greedy(rows, max_tokens)
    out["greedy_s"] = time.perf_counter() - t
    for name, seed in (("first_sampled_s", 0), ("second_sampled_s", 1)):
        t = time.perf_counter()
        r.generate(rows, G, max_tokens, 1.0, seed)
        out[name] = time.perf_counter() - t
    return out


def run_worker(mode: str, a, cache: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, __file__, "--worker", mode, "--model", a.model, "--P", str(a.P), "--G", str(a.G),
           "--max-tokens", str(a.max_tokens)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        raise SystemExit(f"worker {mode} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def table(results: dict[str, list[dict]], header: str) -> str:
    keys = ("start_s", "greedy_s", "first_sampled_s", "second_sampled_s")
    lines = [header, "", "| mode | " + " | ".join(keys) + " | first - second |", "|---" * (len(keys) + 2) + "|"]
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        extra = statistics.median(r["first_sampled_s"] - r["second_sampled_s"] for r in runs)
        lines.append(f"| {mode} | " + " | ".join(f"{med[k]:.2f}" for k in keys) + f" | {extra:.2f} |")
    lines += ["", "medians over rounds, seconds; per round:", ""]
    for mode, runs in results.items():
        lines.append(f"- {mode}: first sampled " + ", ".join(f"{r['first_sampled_s']:.2f}" for r in runs)
                     + "; second " + ", ".join(f"{r['second_sampled_s']:.2f}" for r in runs))
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="'default' (the embedded model) or a model folder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--P", type=int, default=4, help="prompts per call")
    ap.add_argument("--G", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", default=str(HERE / "results" / "first_sample"))
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker, a.model, a.P, a.G, a.max_tokens)), flush=True)
        return
    import headline

    rates = headline.machine_rates()
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        warm = os.path.join(scratch, "warm")
        run_worker("compiled_cold", a, warm)  # untimed: fills the warm cache
        for k in range(a.rounds):
            order = MODES if k % 2 == 0 else MODES[::-1]
            for mode in order:
                cache = os.path.join(scratch, f"cold-{k}") if mode == "compiled_cold" else warm
                results[mode].append(run_worker(mode, a, cache))
                print(mode, json.dumps({x: round(y, 2) for x, y in results[mode][-1].items()}), flush=True)
    load_after = list(os.getloadavg())
    header = (f"First sampled call of a run, model {a.model}, P = {a.P} x G = {a.G}, {a.max_tokens} tokens, 2 threads "
              f"(`{bench_summary.command(argv)}`). Machine: fp32 {rates['fp32_model_gflops']:.0f} GFLOP/s, copy "
              f"{rates['copy_gb_s']:.1f} GB/s, Python {rates['python_mops']:.0f} M it/s; load (1/5/15 min) "
              f"{bench_summary.LOAD_AT_START} before, {[round(x, 2) for x in load_after]} after. "
              f"Modes interleaved, {a.rounds} rounds.")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table(results, header))
    (out / "results.json").write_text(json.dumps({"args": vars(a), "machine": rates, "load_before":
                                                  bench_summary.LOAD_AT_START, "load_after": load_after,
                                                  "results": results}, indent=1))
    print((out / "table.md").read_text())


if __name__ == "__main__":
    main()
