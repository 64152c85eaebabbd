"""Step speed, memory and learning curve: TRL's GRPOTrainer vs policyzoo, interleaved in one run.

Two worker processes (bench/workers.py) load their framework once -- policyzoo as ``policyzoo
train`` does (vLLM rollout + DeepSpeed trainer), TRL's ``GRPOTrainer`` (transformers generate +
its own training loop) -- then this script asks them for one optimizer step at a time, alternating
which goes first (ABBA), so both see the same machine load. While one steps, the other waits on a
pipe (no CPU). Same model (the embedded default unless ``--override model.path=...``), same
prompts in the same order, same reward code, G, response limit, learning rate (constant), clip,
KL (k3 in the loss, beta 0.04, TRL's KL-times-ratio off) and steps.

Reports per step: wall time, rollout tokens/s, the time split, peak RSS of each process; medians
over the steps after ``--warmup``; the ratio policyzoo / TRL of the median step time; reward per
step for both (the learning curves) to JSON and, with matplotlib, a PNG.

Run: ``python bench/step_vs_trl.py --steps 6 --P 2 --G 4 --max-tokens 32 --threads 2``.
``--summary-key NAME`` records the ratio of the median step times (policyzoo / TRL) under NAME in
``bench/results/summary.json`` (``bench/summary.py``: with the command, the load and the date);
``--record-startup`` records policyzoo's ``startup_s`` too: seconds from starting its process to
ready for the first step (imports, DeepSpeed, the reference, vLLM).
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
from workers import TAG, add_common, check_common  # noqa: E402


class Worker:
    def __init__(self, framework: str, a, run_dir: str, log):
        cmd = [sys.executable, str(HERE / "workers.py"), framework, "--run-dir", run_dir] + common_argv(a)
        self.name = framework
        # OpenMP threads that sleep while they wait (as `make` sets for policyzoo): the idle worker's
        # threads must not spin on the cores the stepping worker needs. Same for both frameworks.
        env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     bufsize=1, env=env)

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
        raise RuntimeError(f"the {self.name} worker exited (rc {self.proc.wait()}); see its log")

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()


def common_argv(a) -> list[str]:
    out = ["--algo", a.algo, "--steps", str(a.steps), "--P", str(a.P), "--G", str(a.G), "--max-tokens",
           str(a.max_tokens), "--lr", str(a.lr), "--seed", str(a.seed), "--threads", str(a.threads),
           "--dtype", a.dtype, "--rollout", a.rollout]
    for o in a.override or []:
        out += ["--override", o]
    return out + (["--trl-vllm"] if a.trl_vllm else []) + (["--trl-cb"] if a.trl_cb else [])


def median(records: list[dict], key: str) -> float:
    vals = [r[key] for r in records if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def summarize(results: dict, warmup: int) -> str:
    keys = [("time_step", "step wall time, s"), ("time_rollout", "rollout, s"), ("time_reward", "reward, s"),
            ("time_train", "train (scoring, loss, backward, optimizer), s"), ("time_sync", "weight sync, s"),
            ("rollout_tokens_per_s", "rollout tokens/s"), ("peak_rss_gib", "peak RSS, GiB")]
    lines = [f"medians over steps {warmup + 1}..{len(results['policyzoo'])}", "",
             "| per step | policyzoo | TRL | policyzoo / TRL |", "|---|---|---|---|"]
    for k, label in keys:
        p = median(results["policyzoo"][warmup:], k)
        t = median(results["trl"][warmup:], k)
        ratio = f"{p / t:.2f}" if t and t == t and t > 0 else ""
        lines.append(f"| {label} | {p:.2f} | {t:.2f} | {ratio} |")
    pairs = [p["time_step"] / t["time_step"] for p, t in zip(results["policyzoo"][warmup:], results["trl"][warmup:])]
    lines.append(f"| step wall time, median of the per-step ratios (each pair measured back to back) | | | "
                 f"{statistics.median(pairs):.2f} |")
    lines.append(f"| startup (load models), s | {results['ready']['policyzoo']['startup_s']:.1f} | "
                 f"{results['ready']['trl']['startup_s']:.1f} | |")
    lines += ["", *curve_windows(results)]
    lines += ["", "| step | reward policyzoo | reward TRL | step s policyzoo | step s TRL |", "|---|---|---|---|---|"]
    for p, t in zip(results["policyzoo"], results["trl"]):
        lines.append(f"| {p['step']} | {p['reward_mean']:.3f} | {t['reward_mean']:.3f} | {p['time_step']:.1f} | "
                     f"{t['time_step']:.1f} |")
    return "\n".join(lines)


def curve_windows(results: dict, width: int = 10) -> list[str]:
    """Mean reward per window of ``width`` steps for both, with the standard error of the
    difference: each step's mean reward over n = P x G samples has variance p(1 - p) / n for 0/1
    rewards; a window's mean over k steps has the mean of those over k."""
    n = results["args"]["P"] * results["args"]["G"]
    lines = ["| steps | mean reward policyzoo | mean reward TRL | difference | standard error of the difference |",
             "|---|---|---|---|---|"]
    steps = min(len(results["policyzoo"]), len(results["trl"]))
    for lo in range(0, steps, width):
        hi = min(lo + width, steps)
        m = {k: [r["reward_mean"] for r in results[k][lo:hi]] for k in ("policyzoo", "trl")}
        mean = {k: sum(v) / len(v) for k, v in m.items()}
        var = sum(sum(p * (1 - p) / n for p in v) / len(v) ** 2 for v in m.values())
        lines.append(f"| {lo + 1}-{hi} | {mean['policyzoo']:.3f} | {mean['trl']:.3f} | "
                     f"{mean['policyzoo'] - mean['trl']:+.3f} | {var ** 0.5:.3f} |")
    return lines


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    for name, style in (("policyzoo", "o-"), ("trl", "s--")):
        steps = [r["step"] for r in results[name]]
        rew = [r["reward_mean"] for r in results[name]]
        line = ax[0].plot(steps, rew, style, alpha=0.35 if len(rew) >= 10 else 1.0, label=name)[0]
        if len(rew) >= 10:  # a 5-step running mean over the noisy per-step means
            run = [sum(rew[max(0, i - 4):i + 1]) / len(rew[max(0, i - 4):i + 1]) for i in range(len(rew))]
            ax[0].plot(steps, run, "-", color=line.get_color(), label=f"{name}, 5-step mean")
        ax[1].plot(steps, [r["time_step"] for r in results[name]], style, label=name)
    ax[0].set(xlabel="step", ylabel="mean reward", title="learning curve")
    ax[1].set(xlabel="step", ylabel="seconds", title="step wall time")
    ax[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common(ap)
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the medians")
    ap.add_argument("--out", default=str(HERE / "results" / "step_vs_trl"), help="folder for JSON, log, PNG")
    ap.add_argument("--summarize", default=None, help="only re-print the tables and plot of a results.json")
    ap.add_argument("--summary-key", default=None, help="record the step-time ratio in bench/results/summary.json "
                    "under this name (step_ratio_default, step_ratio_gsm8k_128, ...)")
    ap.add_argument("--record-startup", action="store_true", help="record policyzoo's startup_s there too")
    ap.add_argument("--pair-median", action="store_true", help="record the median of the per-pair step-time ratios "
                    "(each pair back to back) instead of the ratio of the median step times")
    a = ap.parse_args(argv)
    if a.summarize:
        results = json.loads(Path(a.summarize).read_text())
        print(summarize(results, results["args"]["warmup"]))
        plot(results, Path(a.summarize).with_name("curves.png"))
        return results
    check_common(ap, a)
    if not 0 <= a.warmup < a.steps:
        ap.error("need 0 <= warmup < steps")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="policyzoo-bench-")
    results = {"args": vars(a), "policyzoo": [], "trl": [], "ready": {}}
    with open(out / "workers.log", "w") as log:
        workers = {}
        for name in ("policyzoo", "trl"):  # load one at a time (each loads with all threads)
            t_launch = time.perf_counter()
            workers[name] = Worker(name, a, f"{scratch}/{name}", log)
            results["ready"][name] = workers[name].read()
            results["ready"][name]["launch_to_ready_s"] = time.perf_counter() - t_launch
            print(f"{name} ready: {results['ready'][name]}", flush=True)
        t0 = time.perf_counter()
        for step in range(a.steps):
            order = ("policyzoo", "trl") if step % 2 == 0 else ("trl", "policyzoo")
            for name in order:
                rec = workers[name].ask("step")
                results[name].append(rec)
                print(f"step {step + 1} {name}: {rec['time_step']:.1f} s, reward {rec['reward_mean']:.3f}", flush=True)
        for name, w in workers.items():
            results["ready"][name]["end"] = w.ask("stop")
            w.proc.wait(timeout=120)
        results["wall_s"] = time.perf_counter() - t0
    table = summarize(results, a.warmup)
    print(table)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table + "\n")
    plot(results, out / "curves.png")
    record(results, a, argv)
    return results


def record(results: dict, a, argv) -> None:
    """The headline numbers into bench/results/summary.json (``--summary-key``, ``--record-startup``)."""
    rest = slice(a.warmup, None)
    p, t = median(results["policyzoo"][rest], "time_step"), median(results["trl"][rest], "time_step")
    pairs = [x["time_step"] / y["time_step"] for x, y in zip(results["policyzoo"][rest], results["trl"][rest])]
    if a.summary_key:
        detail = {"policyzoo_step_s": p, "trl_step_s": t, "median_pair_ratio": statistics.median(pairs),
                  **{f"policyzoo_{k}_s": median(results["policyzoo"][rest], f"time_{k}") for k in ("rollout", "train")},
                  **{f"trl_{k}_s": median(results["trl"][rest], f"time_{k}") for k in ("rollout", "train")},
                  "steps_in_median": len(pairs), "out": a.out}
        detail["ratio_of_medians"] = p / t
        value = statistics.median(pairs) if getattr(a, "pair_median", False) else p / t
        bench_summary.record(a.summary_key, round(value, 3), argv, {**detail, "value_is": "median of pair ratios"
                             if getattr(a, "pair_median", False) else "ratio of median step times"})
    if a.record_startup:
        ready = results["ready"]
        bench_summary.record("startup_s", round(ready["policyzoo"]["launch_to_ready_s"], 1), argv,
                             {"policyzoo_after_imports_s": ready["policyzoo"]["startup_s"],
                              "policyzoo_parts": ready["policyzoo"].get("startup_parts"),
                              "trl_launch_to_ready_s": ready["trl"]["launch_to_ready_s"],
                              "what": "seconds from starting the worker process to ready for step 1"})


if __name__ == "__main__":
    main()
