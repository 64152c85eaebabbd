"""Record a finished ``policyzoo compare`` as a benchmark result: its table, plot and runs' small files
under ``bench/results/<name>/``, and one entry in ``bench/results/summary.json`` with the machine's rates.

    make compare-gym      # the runs (policyzoo compare ...), then: python bench/compare_record.py runs/cmp-gym

Copied: ``compare.md``, ``compare.json``, ``compare.png`` and, per run, ``summary.json``, ``metrics.jsonl``
and ``resolved.yaml`` (no checkpoints, no weights), the checkout's absolute paths made relative.
The summary entry's value maps each algorithm to its
held-out metric before and after and its paired difference to the baseline, each ``[mean, half-width]``
of the 95% t-interval over seeds (half-width None with one seed); ``detail`` holds the metric, the
seeds, the held-out rows per run, the command that made the runs and the machine's fp32 matmul rate and
copy bandwidth measured at record time (:func:`headline.machine_rates`). A folder without
``compare.json`` exits 2 with the command that makes it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import summary as bench_summary  # noqa: E402  (first: it notes the machine load at the start)

RUN_FILES = ("summary.json", "metrics.jsonl", "resolved.yaml")
TABLE_FILES = ("compare.md", "compare.json", "compare.png")


def interval(stat: dict | None) -> list | None:
    """``[mean, half-width]`` of a compare statistic (None when absent)."""
    return None if stat is None else [round(stat["mean"], 4), None if stat.get("half_width") is None
                                      else round(stat["half_width"], 4)]


def headline(result: dict) -> dict:
    """The summary entry's value: per algorithm, ``before``, ``after``, ``paired_diff`` intervals."""
    return {a["algorithm"]: {"before": interval(a.get("eval_before")), "after": interval(a.get("eval_after")),
                             "paired_diff": interval(a.get("paired_diff")), "seeds": a["seeds"]}
            for a in result["algorithms"]}


def copy_results(runs: Path, out: Path, result: dict) -> list[Path]:
    """Copy the table files and each run's small files into ``out`` (``out/ALGO/seedS/``); returns them."""
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TABLE_FILES:
        if (runs / name).is_file():
            copied.append(Path(shutil.copy2(runs / name, out / name)))
    # every run the table lists, those that stopped early too (their metrics hold the evaluation at the stop)
    listed = [run for a in result["algorithms"] for run in a["runs"]]
    listed += [r["run_dir"] for r in result.get("runs", []) if r.get("run_dir")]
    sources = dict.fromkeys((Path(run) if Path(run).is_absolute() else bench_summary.ROOT / run).resolve()
                            for run in listed)  # resolved: a linked folder too, each run once
    for src in sources:
        dst = out / src.relative_to(runs.resolve()) if src.is_relative_to(runs.resolve()) else out / src.name
        dst.mkdir(parents=True, exist_ok=True)
        for f in RUN_FILES:
            if (src / f).is_file():  # paths inside the checkout written relative to it
                (dst / f).write_text(bench_summary.relative((src / f).read_text()))
                copied.append(dst / f)
    return copied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", help="the folder policyzoo compare wrote (compare.json in it)")
    ap.add_argument("--name", default="compare_gym", help="bench/results/NAME and the summary.json key")
    ap.add_argument("--made-by", default="make compare-gym", help="the command that made the runs (recorded)")
    a = ap.parse_args(argv)
    runs = Path(a.runs).resolve()
    if not (runs / "compare.json").is_file():
        print(f"error: {runs} holds no compare.json\n  fix: run `policyzoo compare {a.runs}` (or {a.made_by}) "
              "first", file=sys.stderr)
        return 2
    result = json.loads((runs / "compare.json").read_text())
    copied = copy_results(runs, HERE / "results" / a.name, result)
    import yaml
    from headline import machine_rates

    evals = {(yaml.safe_load(p.read_text()).get("data") or {}).get("eval_size") for p in copied
             if p.name == "resolved.yaml"}
    detail = {"metric": result["metric"], "baseline": result["baseline"], "interval": result["interval"],
              "eval_rows": sorted(e for e in evals if e is not None), "made_by": a.made_by,
              "machine": {"at_record": machine_rates()}}
    bench_summary.record(a.name, headline(result), sys.argv[1:] if argv is None else argv, detail)
    print(f"copied {len(copied)} files into {HERE / 'results' / a.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
