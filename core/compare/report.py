"""The comparison written out: ``compare.md`` (table and notes), ``compare.json`` (everything, with
the per-step curves) and the table on the console (rich); ``compare.png`` is :mod:`.plot`'s.

Cells: ``mean +- half-width`` of the 95% t-interval over seeds for the held-out metric, its paired
difference to the baseline and the reward; the other columns give the mean over seeds (their
intervals are in ``compare.json``). A single seed prints the value alone, and a note says that no
interval can be given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich loads when something is printed, not with `import policyzoo`
    from rich.console import Console


#: (column title, metric key, number format, show the interval)
COLUMNS = [("before", "eval_before", ".3f", True), ("after", "eval_after", ".3f", True),
           ("after - baseline (paired)", "paired_diff", "+.3f", True), ("reward (last 20%)", "reward", ".3f", True),
           ("KL", "kl", ".3g", False), ("entropy", "entropy", ".3f", False), ("clip frac", "clip_frac", ".3f", False),
           ("response len", "response_length", ".1f", False), ("step s", "step_seconds", ".2f", False),
           ("tokens/s", "tokens_per_s", ".0f", False), ("peak RSS GiB", "peak_rss_gib", ".2f", False),
           ("peak GPU GiB", "gpu_peak_gib", ".2f", False)]


def cell(sm: dict | None, fmt: str, interval: bool = True) -> str:
    if sm is None:
        return "-"
    text = format(sm["mean"], fmt)
    if interval and sm.get("half_width") is not None:
        text += f" ± {sm['half_width']:{fmt.lstrip('+')}}"
    return text


def header_and_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The table: one row per algorithm (columns without any value, e.g. GPU memory on CPU, left out)."""
    algos = result["algorithms"]
    cols = [c for c in COLUMNS if any(a.get(c[1]) is not None for a in algos) or c[1] in ("eval_after", "paired_diff")]
    metric = result["metric"]
    head = ["algorithm", "seeds"] + [f"{metric} {t}" if k.startswith("eval") else t.replace("baseline",
                                                                                         result["baseline"])
                                     for t, k, _, _ in cols]
    rows = []
    for a in algos:
        diff = "(baseline)" if a["algorithm"] == result["baseline"] else None
        rows.append([a["algorithm"], str(a["n"])] + [diff if k == "paired_diff" and diff else cell(a.get(k), f, i)
                                                     for _, k, f, i in cols])
    return head, rows


def notes(result: dict, skipped: list) -> list[str]:
    """The lines under the table: the interval, the window, one-seed and mixed-run notices, skipped folders."""
    out = [f"Intervals: {result['interval']}; the paired difference is the same interval over the seeds both "
           "algorithms ran (after minus the baseline's after, seed by seed)."]
    ones = [a["algorithm"] for a in result["algorithms"] if a["n"] == 1]
    if ones:
        out.append(f"One seed for {', '.join(ones)}: values only; no interval can be given (a t-interval needs "
                   "at least 2 seeds: --seeds 3).")
    out.append(f"Reward, KL, entropy, clip fraction and response length: means over {result['window']}; step "
               "seconds: the median step without the first (warm-up); tokens/s: prompt + response tokens per "
               "second of training steps.")
    for key, groups in (result.get("mixed_keys") or {}).items():
        out.append(f"--allow-mixed: the runs differ in {key}: " +
                   "; ".join(f"{g['value']!r} in {len(g['runs'])} run(s)" for g in groups))
    for s in skipped:
        out.append(f"Left out: {s.path}: {s.why}")
    return out


def markdown(result: dict, skipped: list, command: str | None = None) -> str:
    head, rows = header_and_rows(result)
    lines = ["# policyzoo compare", ""]
    if command:
        lines += [f"Made by `{command}`.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", *[f"* {n}" for n in notes(result, skipped)], "", "Runs:", ""]
    lines += [f"* {r['algorithm']} seed {r['seed']}: `{r['run_dir']}`" for r in result["runs"]]
    lines += ["", "![curves](compare.png)", ""]
    return "\n".join(lines)


def print_table(console: Console, result: dict, skipped: list) -> None:
    head, rows = header_and_rows(result)
    from rich.table import Table

    table = Table(title=f"policyzoo compare (baseline {result['baseline']})")
    for h in head:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    for n in notes(result, skipped):
        warn = n.startswith(("Left out", "--allow", "One seed"))
        console.print(n, markup=False, highlight=False, soft_wrap=True, style="yellow" if warn else None)


def write(result: dict, skipped: list, out_dir: Path, command: str | None = None) -> list[Path]:
    """Write ``compare.md`` and ``compare.json`` into ``out_dir`` (created); returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "compare.md", out_dir / "compare.json"
    md.write_text(markdown(result, skipped, command))
    data = {**result, "skipped": [{"path": str(s.path), "why": s.why} for s in skipped], "command": command}
    js.write_text(json.dumps(data, indent=1, default=str))
    return [md, js]
