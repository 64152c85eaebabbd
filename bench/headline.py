"""The headline numbers in one command (``make bench``): step ratios vs TRL, training over its
ceiling, start-up cold and warm, with the machine's own rates, into bench/results/summary.json.

What runs, in order (``--dry-run`` prints it with the expected duration and runs nothing heavy):

1. the machine: fp32 matmul rate at the model's shape ([2048 x 576] x [576 x 1536]) and copy
   bandwidth (``bench/ceiling.py``'s ``measure``, best of 10), at the start and again at the end;
2. the step ratio policyzoo / TRL at 32 (default task), 128 and 256 (GSM8K) response tokens:
   ``bench/step_vs_trl.py`` runs both frameworks step by step, alternating which goes first, so
   each pair of steps is back to back; the value is the median of the per-pair ratios
   (``--pair-median``);
3. training over its fp32 FLOP ceiling (GSM8K, 128 tokens): per pair, a ``policyzoo train`` run and
   right after it ``bench/ceiling.py --metrics`` on that run (the ceiling measured on the same
   machine state); the value is the median over ``--pairs`` pairs. The same runs give the rollout
   over its bound (``rollout_over_bound``: prefill at the matmul rate, and per decode step the
   weights read once at the copy bandwidth) and each phase's median seconds;
4. start-up to ready for the first step, cold and warm (the prompt-length cache,
   ``core/engine/run/prompt_lengths.py``, is a file: it stays, as after a boot): per pair, the files
   of the installed packages and the model evicted from the page cache (``posix_fadvise(DONTNEED)``, no root
   needed: it drops clean cached pages, as after a boot), one policyzoo worker started (cold), then
   one more at once (warm); medians over ``--pairs`` pairs.

Every entry records its command, the load averages before and after, the cores, the commit and the
date (``bench/summary.py``); the ``machine`` entry holds the rates, so numbers from two machines
can be compared. ``--only step_ratio|ceiling|startup`` runs one part and records only its entries,
each with the machine's rates before and after in its ``detail`` (the ``machine`` entry stays the
full run's). README's speed table is rendered from the file (``--readme``;
``tests/test_bench_headline.py`` keeps them equal). Timings are only meaningful on an idle
machine: the script warns when the 1-minute load exceeds the cores.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import summary as bench_summary  # noqa: E402  (first: it notes the load at the start)


def _project_path(path: str) -> str:
    """``path`` relative to the project when it lies inside it (commands run from the project root, so the
    recorded commands and results name no machine's folders), else as it is."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


PY = _project_path(sys.executable)
#: (summary key, response tokens, steps, extra step_vs_trl arguments, minutes on an idle machine)
STEP_RATIOS = (
    ("step_ratio_default", 32, 6, [], 3),
    ("step_ratio_gsm8k_128", 128, 5, ["--override", "data.name=gsm8k"], 7),
    ("step_ratio_gsm8k_256", 256, 5, ["--override", "data.name=gsm8k"], 14),
)
CEILING_TRAIN = ["train.steps=6", "train.prompts_per_step=2", "algorithm.sample.n=4", "algorithm.sample.max_tokens=128",
                 "data.name=gsm8k", "engine.threads=2"]
#: minutes per pair on an idle machine: a 6-step GSM8K run + the ceiling; a cold + a warm start
CEILING_PAIR_MIN, STARTUP_PAIR_MIN = 5, 1.5
#: README's table: (summary key, row label, unit format)
README_ROWS = (
    ("step_ratio_default", "step time / TRL's, default task, 32-token answers", "{:.2f}"),
    ("step_ratio_gsm8k_128", "step time / TRL's, GSM8K, 128-token answers", "{:.2f}"),
    ("step_ratio_gsm8k_256", "step time / TRL's, GSM8K, 256-token answers", "{:.2f}"),
    ("train_over_ceiling", "training time / its fp32 FLOP ceiling (GSM8K, 128 tokens)", "{:.2f}"),
    ("rollout_over_bound", "rollout time / its weight-read bound (GSM8K, 128 tokens)", "{:.2f}"),
    ("startup_s", "start-up to the first step, s (bench/step_vs_trl.py --record-startup)", "{:.1f}"),
    ("startup_cold_s", "start-up to the first step, cold (page cache dropped), s", "{:.1f}"),
    ("startup_warm_s", "start-up to the first step, warm, s", "{:.1f}"),
)
BEGIN, END = "<!-- speed table: bench/headline.py --readme -->", "<!-- end speed table -->"


def plan(a) -> list[dict]:
    """The commands this run makes, each with its expected minutes on an idle machine."""
    steps = [{"what": "machine rates (fp32 matmul, copy bandwidth)", "command": "in-process", "minutes": 0.5}]
    for key, tokens, n, extra, minutes in STEP_RATIOS if a.only in (None, "step_ratio") else ():
        out = f"bench/results/headline_{key}"
        steps.append({"what": key, "minutes": minutes, "command": [
            PY, "bench/step_vs_trl.py", "--steps", str(n), "--P", "2", "--G", "4", "--max-tokens", str(tokens),
            "--threads", "2", "--warmup", "1", *extra, "--out", out, "--summary-key", key, "--pair-median"]})
    for i in range(a.pairs if a.only in (None, "ceiling") else 0):
        run = f"runs/headline-ceiling-{i}"
        train = [str(Path(PY).parent / "policyzoo"), "train", "--algo", "grpo", "--output-dir", run, *CEILING_TRAIN]
        steps.append({"what": f"train_over_ceiling pair {i + 1}", "minutes": CEILING_PAIR_MIN, "command": train,
                      "run": run, "then": ["--P", "2", "--G", "4", "--threads", "2", "--metrics",
                                           f"{run}/metrics.jsonl"]})
    for i in range(a.pairs if a.only in (None, "startup") else 0):
        steps.append({"what": f"start-up pair {i + 1} (cold, then warm)", "minutes": STARTUP_PAIR_MIN,
                      "command": "in-process: evict page cache, start a policyzoo worker twice"})
    steps.append({"what": "machine rates again", "command": "in-process", "minutes": 0.5})
    return steps


def python_speed() -> float:
    """Million iterations a second of a pure-Python loop (``sum(range(10**7))``, best of 5): the
    interpreter's single-core speed. Start-up (imports) and vLLM's eager decode (Python between the
    kernels of every layer) scale with it, not with the matmul rate or the bandwidth."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        sum(range(10**7))
        best = min(best, time.perf_counter() - t)
    return 10.0 / best


def machine_rates() -> dict:
    """fp32 GFLOP/s at the model's matmul shape and copy GB/s on 2 threads (best of 10), and the
    single-core Python speed (:func:`python_speed`)."""
    import ceiling

    r = ceiling.measure(2, 10, 1024)
    return {"fp32_model_gflops": r[f"fp32 {ceiling.MODEL_SHAPE}"] / 1e9, "copy_gb_s": r["copy bandwidth"] / 1e9,
            "python_mops": python_speed()}


def evict_page_cache(roots) -> int:
    """Drop the clean cached pages of every file under ``roots`` (no root needed). Returns the
    number of files advised."""
    n = 0
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                try:
                    fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                finally:
                    os.close(fd)
    return n


def start_once(scratch: str, name: str) -> tuple[float, dict]:
    """Seconds from launching a policyzoo worker (bench/workers.py, step_vs_trl's settings) to
    ready for its first step, and the worker's own account (``startup_s``: from ``session.prepare``
    to ready, so the launch minus it is the interpreter, the imports and the config; ``startup_parts``);
    the worker is stopped again."""
    import step_vs_trl
    from workers import add_common

    ap = argparse.ArgumentParser()
    add_common(ap)
    a = ap.parse_args(["--P", "2", "--G", "4", "--max-tokens", "32", "--threads", "2"])
    with open(os.path.join(scratch, "workers.log"), "a") as log:
        t0 = time.perf_counter()
        w = step_vs_trl.Worker("policyzoo", a, os.path.join(scratch, name), log)  # a new run folder
        ready = w.read()
        took = time.perf_counter() - t0
        w.ask("stop")
        w.proc.wait(timeout=120)
    return took, {"startup_s": ready.get("startup_s"), **(ready.get("startup_parts") or {}),
                  "preload_s": ready.get("preload_s"), "prompt_counts_s": ready.get("prompt_counts_s")}


def run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=str(ROOT))


def execute(a, steps: list[dict]) -> None:
    import json
    import tempfile

    rates = machine_rates()
    if a.only is None:  # a part alone leaves the full run's machine entry alone: its rates go into its entries
        bench_summary.record("machine", rates, detail={"when": "start"})
    ceiling_pairs, rollout_pairs, phases, cold, warm, start_parts = [], [], [], [], [], {}
    for s in steps[1:-1]:
        print(f"== {s['what']} (~{s['minutes']} min)", flush=True)
        if s["what"].startswith("step_ratio"):
            run(s["command"])
        elif s["what"].startswith("train_over_ceiling"):
            import ceiling

            shutil.rmtree(s["run"], ignore_errors=True)  # a fresh run, not a resume of the last one
            run(s["command"])
            print("$ python bench/ceiling.py " + " ".join(s["then"]), flush=True)
            res = ceiling.main(s["then"])
            ceiling_pairs.append(res["train_over_ceiling"])
            rollout_pairs.append(res["rollout_over_bound"])
            phases.append({k: round(v, 3) for k, v in res["measured"].items()})
        else:
            roots = [p for p in (sys.prefix, os.environ.get("POLICYZOO_CACHE", str(ROOT / ".build"))) if p]
            evict_page_cache(roots)
            with tempfile.TemporaryDirectory(prefix="policyzoo-start-") as scratch:
                for name, out in (("cold", cold), ("warm", warm)):  # a fresh run folder each: no resume
                    took, parts = start_once(scratch, name)
                    out.append(took)
                    start_parts.setdefault(name, []).append({k: round(v, 2) for k, v in parts.items() if v is not None})
    pairs = {"pairs": a.pairs}
    if ceiling_pairs:
        train = " ".join(next(s for s in steps if "then" in s)["command"])
        bench_summary.record("train_over_ceiling", round(statistics.median(ceiling_pairs), 2),
                             detail={**pairs, "per_pair": ceiling_pairs, "train_command": train})
        bench_summary.record("rollout_over_bound", round(statistics.median(rollout_pairs), 2),
                             detail={**pairs, "per_pair": rollout_pairs, "train_command": train,
                                     "phase_medians_s": phases, "bound": "prefill at the fp32 matmul rate + the "
                                     "weights read once per decode step at the copy bandwidth, decode steps = the "
                                     "run's mean response length (fewer than the longest row's: the ratio errs high)"})
    if cold:
        for key, values, name in (("startup_cold_s", cold, "cold"), ("startup_warm_s", warm, "warm")):
            bench_summary.record(key, round(statistics.median(values), 1), detail={
                **pairs, "per_pair": values, "worker_parts_per_pair": start_parts[name], "parts_are": "startup_s: "
                "session.prepare to ready (the launch minus it: interpreter, imports, config); preload_s: "
                "session.prepare (the checks before weights load; prompt_counts_s of it: the prompt-length "
                "count), then trainer_s, share_prompt_check_s, rollout_engine_s (vLLM: its imports and its "
                "start), resume_and_run_dir_s"})
    if a.only is not None:
        keys = {"step_ratio": [k for k, *_ in STEP_RATIOS], "ceiling": ["train_over_ceiling", "rollout_over_bound"],
                "startup": ["startup_cold_s", "startup_warm_s"]}[a.only]
        bench_summary.add_detail(keys, {"machine": {"at_start": rates, "at_end": machine_rates()}})
        return
    start = json.loads(bench_summary.SUMMARY.read_text())["machine"]
    bench_summary.record("machine", start["value"], detail={"at_end": machine_rates(), "load_at_start":
                                                           start["load_before"]})


def _fmt(value, fmt: str) -> str:
    """Round half up at the format's digits (0.475 -> 0.48, as a reader rounds)."""
    digits = int(re.search(r"\.(\d)f", fmt).group(1))
    return fmt.format(float(Decimal(str(value)).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP)))


def readme_table(data: dict) -> str:
    """README's speed table from summary.json's entries (a row per :data:`README_ROWS`)."""
    lines = ["| headline (bench/results/summary.json) | value | commit, date |", "|---|---|---|"]
    for key, label, fmt in README_ROWS:
        e = data.get(key)
        value = _fmt(e["value"], fmt) if e else "not measured yet (`make bench`)"
        when = f"{e.get('commit') or '?'}, {e['date'][:10]}" if e else ""
        own = ((e or {}).get("detail") or {}).get("machine", {}).get("at_start")  # measured by --only
        if own:  # not the machine row's run: its own rates
            when += (f" (machine: {own['fp32_model_gflops']:.0f} GFLOP/s, {own['copy_gb_s']:.1f} GB/s, "
                     f"{own['python_mops']:.0f} M/s)")
        lines.append(f"| {label} | {value} | {when} |")
    m = data.get("machine")
    if m:
        py = m["value"].get("python_mops")
        lines.append(f"| machine: fp32 matmul GFLOP/s, copy GB/s{', Python M loop iterations/s' if py else ''} | "
                     f"{m['value']['fp32_model_gflops']:.0f}, {m['value']['copy_gb_s']:.1f}"
                     f"{f', {py:.0f}' if py else ''} | {m.get('commit') or '?'}, {m['date'][:10]} |")
    return "\n".join(lines)


def write_readme(path: Path, data: dict) -> None:
    text = path.read_text()
    i, j = text.index(BEGIN), text.index(END)
    path.write_text(text[:i + len(BEGIN)] + "\n" + readme_table(data) + "\n" + text[j:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its expected duration; run nothing")
    ap.add_argument("--pairs", type=int, default=3, help="pairs for the ceiling and start-up medians")
    ap.add_argument("--only", choices=("step_ratio", "ceiling", "startup"),
                    help="run one part (with the machine's rates before and after) and record only its entries")
    ap.add_argument("--readme", action="store_true", help="only rewrite README's speed table from summary.json")
    a = ap.parse_args(argv)
    if a.pairs < 1:
        ap.error("--pairs must be >= 1")
    if a.readme:
        import json

        write_readme(ROOT / "README.md", json.loads(bench_summary.SUMMARY.read_text()))
        return
    steps = plan(a)
    total = sum(s["minutes"] for s in steps)
    for s in steps:
        cmd = s["command"] if isinstance(s["command"], str) else " ".join(s["command"])
        then = f" && python bench/ceiling.py {' '.join(s['then'])}" if "then" in s else ""
        print(f"- {s['what']} (~{s['minutes']} min): {cmd}{then}")
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    print(f"expected: ~{total:.1f} min on an idle machine; load now {load:.2f} on {cpus} cores"
          + (" -- NOT idle: timings would be pessimistic" if load > cpus / 2 else ""))
    if a.dry_run:
        return
    os.chdir(ROOT)  # the plan's paths are the project's
    execute(a, steps)
    import json

    write_readme(ROOT / "README.md", json.loads(bench_summary.SUMMARY.read_text()))


if __name__ == "__main__":
    main()
