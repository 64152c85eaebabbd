"""Two policyzoo runs that differ in a few settings, same prompts and seeds: time, memory, curve.

Runs ``policyzoo train`` with the common settings plus ``--a`` overrides, then again plus ``--b``
overrides (``--set``: both; one after the other, each in its own process, with every other setting and the seed
equal), and compares: median step / rollout / train time over the steps after ``--warmup``, the
process's resident memory after a step (median of the metric ``rss_gib``: what a run holds once
started), its peak RSS (``summary.json``'s ``peak_rss_gib``: start-up transients included),
trainable parameters, and the reward
curve (mean per 10-step window, and the mean paired per-step difference B - A with its standard
error; both runs draw the same prompts at every step).

``--record KEY=QUANTITY`` writes ``B / A`` of a quantity (``rss``, ``peak_rss``, ``time_step``,
``time_train``, ``time_rollout``, ``startup``: the run's start-up after imports), the
``speedup`` (A's median step time / B's) or the paired ``reward_diff`` (B - A) to
``bench/results/summary.json`` (``bench/summary.py``), e.g.:

* LoRA vs full fine-tuning: ``python bench/ab.py --steps 8 --set engine.trim_memory=true --b "model.lora={r: 16}"
  --record lora_memory_ratio=rss --record lora_step_ratio=time_step --out bench/results/lora``
* one-step overlap of sampling and training: ``python bench/ab.py --steps 12 --b engine.overlap=one_step
  --record async_speedup=speedup --out bench/results/overlap``
* parallel start of vLLM and DeepSpeed: ``python bench/ab.py --steps 2 --warmup 1
  --b engine.parallel_start=true --record parallel_start_ratio=startup --out bench/results/start``
* bf16 autocast vs fp32 over 50 steps: ``python bench/ab.py --steps 50 --b train.autocast=true
  --record bf16_reward_diff=reward_diff --record bf16_step_ratio=time_step --out bench/results/bf16``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import summary as bench_summary  # noqa: E402

COMMON = ["train.prompts_per_step=4", "algorithm.sample.n=8", "algorithm.sample.max_tokens=16", "train.lr=1e-5",
          "data.eval_size=20", "engine.sync_check=true"]
QUANTITIES = ("rss", "peak_rss", "time_step", "time_train", "time_rollout", "reward_diff", "speedup", "startup")


def train(out: Path, steps: int, threads: int, extra: list[str]) -> dict:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--output-dir", str(out),
           f"train.steps={steps}", f"engine.threads={threads}", *COMMON, *extra]
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {"steps": [r for r in recs if r.get("kind") == "train"],
            "summary": json.loads((out / "summary.json").read_text())}


def compare(a: dict, b: dict, warmup: int) -> dict:
    def med(run, key):
        return statistics.median(r[key] for r in run["steps"][warmup:])

    res = {f"{k}_{side}": med(run, k) for k in ("time_step", "time_rollout", "time_train")
           for side, run in (("a", a), ("b", b))}
    res["peak_rss_a"], res["peak_rss_b"] = a["summary"]["peak_rss_gib"], b["summary"]["peak_rss_gib"]
    # steady-state memory: resident memory at the end of each step (the peak may be a start-up transient)
    res["rss_a"], res["rss_b"] = med(a, "rss_gib"), med(b, "rss_gib")
    for k in ("rss", "peak_rss", "time_step", "time_train", "time_rollout"):
        res[k] = res[f"{k}_b"] / res[f"{k}_a"]
    res["speedup"] = res["time_step_a"] / res["time_step_b"]
    res["startup_a"], res["startup_b"] = a["summary"]["startup_seconds"], b["summary"]["startup_seconds"]
    res["startup"] = res["startup_b"] / res["startup_a"]
    diffs = [y["reward_mean"] - x["reward_mean"] for x, y in zip(a["steps"], b["steps"])]
    res["reward_diff"] = sum(diffs) / len(diffs)
    res["reward_diff_se"] = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    res["reward_a"] = [r["reward_mean"] for r in a["steps"]]
    res["reward_b"] = [r["reward_mean"] for r in b["steps"]]
    res["trainable_a"], res["trainable_b"] = a["summary"]["trainable_params"], b["summary"]["trainable_params"]
    return res


def table(res: dict, args) -> str:
    lines = [f"A: {' '.join(args.a) or '(common settings)'}; B: {' '.join(args.b)}; medians over steps "
             f"{args.warmup + 1}..{args.steps}", "", "| | A | B | B / A |", "|---|---|---|---|"]
    for k, label in (("time_step", "step, s"), ("time_rollout", "rollout, s"), ("time_train", "train, s"),
                     ("rss", "RSS after a step, GiB"), ("peak_rss", "peak RSS, GiB"),
                     ("startup", "start-up after imports, s")):
        lines.append(f"| {label} | {res[k + '_a']:.2f} | {res[k + '_b']:.2f} | {res[k]:.2f} |")
    lines.append(f"| trainable parameters | {res['trainable_a']} | {res['trainable_b']} | |")
    lines += ["", "| steps | mean reward A | mean reward B |", "|---|---|---|"]
    for lo in range(0, len(res["reward_a"]), 10):
        ra, rb = res["reward_a"][lo:lo + 10], res["reward_b"][lo:lo + 10]
        lines.append(f"| {lo + 1}-{lo + len(ra)} | {sum(ra) / len(ra):.3f} | {sum(rb) / len(rb):.3f} |")
    lines.append(f"\npaired per-step reward difference B - A: {res['reward_diff']:+.3f} "
                 f"(standard error {res['reward_diff_se']:.3f})")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the time medians")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], help="overrides of both runs (key=value), after the defaults")
    ap.add_argument("--a", nargs="*", default=[], help="overrides of run A (key=value)")
    ap.add_argument("--b", nargs="*", default=[], help="overrides of run B (key=value)")
    ap.add_argument("--record", action="append", default=[], metavar="KEY=QUANTITY",
                    help=f"write B / A (or reward_diff) to bench/results/summary.json; quantities: {QUANTITIES}")
    ap.add_argument("--out", default=str(HERE / "results" / "ab"))
    args = ap.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        ap.error("need 0 <= warmup < steps")
    records = [r.partition("=")[::2] for r in args.record]
    for key, q in records:
        if not key or q not in QUANTITIES:
            ap.error(f"--record {key}={q}: give KEY=QUANTITY with a quantity among {QUANTITIES}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {side: train(out / f"run-{side}", args.steps, args.threads, args.set + extra)
            for side, extra in (("a", args.a), ("b", args.b))}
    res = compare(runs["a"], runs["b"], args.warmup)
    text = table(res, args)
    print(text)
    (out / "results.json").write_text(json.dumps({"args": vars(args), **res}, indent=1))
    (out / "table.md").write_text(text + "\n")
    for key, q in records:
        detail = {k: v for k, v in res.items() if not k.startswith("reward_") or k == "reward_diff_se"}
        bench_summary.record(key, round(res[q], 3), argv, {**detail, "a": args.a, "b": args.b, "out": str(out)})
    return res


if __name__ == "__main__":
    main()
