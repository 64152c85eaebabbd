"""The comparison written out: ``compare.md`` (table and notes), ``compare.json`` (everything, with
the per-step curves) and the table on the console (rich); ``compare.png`` is :mod:`.plot`'s.

Two tables: the outcome (held-out metric before and after, the paired difference to the baseline,
reward, cost: step seconds, tokens/s, memory, a run's seconds and disk) and the mechanisms, what each
algorithm exists to change (KL, entropy, clip fraction low and high, zero-std groups, kept rows,
response length of right and wrong answers, tokens sampled per kept row). Cells: ``mean +-
half-width`` of the 95% t-interval over seeds for the held-out metric, its paired difference to the
baseline and the reward; the other columns give the mean over seeds (their intervals are in
``compare.json``). A single seed prints the value alone, and a note says that no interval can be
given. Runs that stopped early are named in a column with their reason. ``compare.md`` ends with the
verdict in words (:func:`verdict`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich loads when something is printed, not with `import policyzoo`
    from rich.console import Console


#: (column title, metric key, number format, show the interval): the outcome table
COLUMNS = [("before", "eval_before", ".3f", True), ("after", "eval_after", ".3f", True),
           ("after - baseline (paired)", "paired_diff", "+.3f", True), ("reward (last 20%)", "reward", ".3f", True),
           ("step s", "step_seconds", ".2f", False), ("tokens/s", "tokens_per_s", ".0f", False),
           ("peak RSS GiB", "peak_rss_gib", ".2f", False), ("peak GPU GiB", "gpu_peak_gib", ".2f", False),
           ("run s", "run_seconds", ".0f", False), ("disk MiB", "disk_mib", ".2f", False)]
#: the mechanism table: what each algorithm exists to change (means over seeds)
MECHANISMS = [("KL", "kl", ".3g"), ("entropy", "entropy", ".3f"), ("clip low", "clip_low", ".3f"),
              ("clip high", "clip_high", ".3f"), ("zero-std groups", "zero_std", ".2f"), ("kept", "kept", ".2f"),
              ("response len", "response_length", ".1f"), ("len right", "length_correct", ".1f"),
              ("len wrong", "length_wrong", ".1f"), ("tokens / kept row", "tokens_per_kept_row", ".1f")]


def cell(sm: dict | None, fmt: str, interval: bool = True) -> str:
    if sm is None:
        return "-"
    text = format(sm["mean"], fmt)
    if interval and sm.get("half_width") is not None:
        text += f" ± {sm['half_width']:{fmt.lstrip('+')}}"
    return text


def _stopped(a: dict) -> str:
    return "; ".join(f"seed {x['seed']} at step {x['step']} of {x['steps']}: {x['reason']}" for x in a["stopped"])


def header_and_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The outcome table: one row per algorithm (columns without any value, e.g. GPU memory on CPU,
    left out; a ``stopped early`` column when a run stopped)."""
    algos = result["algorithms"]
    cols = [c for c in COLUMNS if any(a.get(c[1]) is not None for a in algos) or c[1] in ("eval_after", "paired_diff")]
    metric = result["metric"]
    head = ["algorithm", "seeds"] + [f"{metric} {t}" if k.startswith("eval") else t.replace("baseline",
                                                                                         result["baseline"])
                                     for t, k, _, _ in cols]
    stops = any(a.get("stopped") for a in algos)
    head += ["stopped early"] if stops else []
    rows = []
    for a in algos:
        diff = "(baseline)" if a["algorithm"] == result["baseline"] else None
        rows.append([a["algorithm"], str(a["n"])] + [diff if k == "paired_diff" and diff else cell(a.get(k), f, i)
                                                     for _, k, f, i in cols]
                    + ([_stopped(a) or "-"] if stops else []))
    return head, rows


def mechanism_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """The mechanism table (:data:`MECHANISMS`, columns without any value left out)."""
    algos = result["algorithms"]
    cols = [c for c in MECHANISMS if any(a.get(c[1]) is not None for a in algos)]
    return (["algorithm"] + [t for t, _, _ in cols],
            [[a["algorithm"]] + [cell(a.get(k), f, False) for _, k, f in cols] for a in algos])


def _signed(x: float) -> str:
    """``+0.150``; a float residue below the last digit is ``+0.000``, never ``-0.000``."""
    return f"{round(x, 3) + 0.0:+.3f}"


def verdict(result: dict) -> list[str]:
    """The comparison in words: per algorithm, whether its paired difference to the baseline excludes 0
    and in which direction, or that it cannot tell; then the smallest gap the design resolves: the
    paired intervals' half-widths, and the binomial standard error ``sqrt(p (1 - p) / R)`` of one run's
    accuracy over its ``R`` held-out rows at ``p`` = the baseline's mean after (0/1 metrics only). A pair the gradient
    probe found the same update at the runs' settings (``result["equal"]``, :mod:`policyzoo.compare.api`) gets
    that reason instead of a verdict. A pair whose held-out scores are equal in every seed (paired differences all
    0, a t-interval of width 0) is said to be so, not "not told apart" with a resolution of 0."""
    base, metric, out = result["baseline"], result["metric"], []
    widths = []
    same = {frozenset((e["algorithm"], e["equals"])): e["why"] for e in result.get("equal") or []}
    for a in result["algorithms"]:
        d = a.get("paired_diff")
        if a["algorithm"] == base or d is None:
            continue
        name, n = a["algorithm"], d["n"]
        if frozenset((name, base)) in same:  # the same update at these settings: the difference is seed noise
            out.append(f"{name} - {base}: no verdict: {same[frozenset((name, base))]}: their runs measured noise "
                       f"({_signed(d['mean'])} over {n} paired seeds).")
            continue
        if d["half_width"] is None:
            out.append(f"{name} - {base}: {_signed(d['mean'])} from one seed pair: no interval, no verdict (--seeds 3 "
                       "or more).")
            continue
        if d["half_width"] == 0 and d["mean"] == 0:  # the same held-out score in every seed: no spread to read
            out.append(f"{name} and {base} scored the same held-out {metric} in each of {n} paired seeds (difference "
                       "0 in every seed): the held-out figure does not separate them here, and a spread of 0 gives "
                       "no interval to read; the greedy answers may have collapsed onto the same output (see the "
                       "entropy and zero-std columns).")
            continue
        widths.append(d["half_width"])
        span = f"{_signed(d['mean'])} ± {d['half_width']:.3f} over {n} paired seeds, 95% interval " \
               f"[{_signed(d['low'])}, {_signed(d['high'])}]"
        if d["low"] > 0 or d["high"] < 0:
            side = "higher" if d["low"] > 0 else "lower"
            out.append(f"{name}'s held-out {metric} is {side} than {base}'s: {span} excludes 0.")
        else:
            out.append(f"{name} and {base} are not told apart: {span} includes 0.")
    out += [f"{e['algorithm']} and {e['equals']} were the same update here: {e['why']}." for e in
            result.get("equal") or [] if base not in (e["algorithm"], e["equals"])]
    if result.get("equal_note"):
        out.append(result["equal_note"] + ".")
    elif result.get("equal") == []:  # probed at the runs' own settings (policyzoo.compare.api): no pair was equal
        out.append("The gradient probe at the runs' recorded settings finds no two algorithms the same update "
                   "(docs/compare.md, \"Equal at these settings\").")
    if not out:
        out.append(f"Only {base} was compared: nothing to judge." if len(result["algorithms"]) == 1 else
                   f"No paired difference to judge: no other algorithm shares a seed with {base}.")
    if widths:
        out.append(f"Smallest gap this design resolves: the paired half-width, {min(widths):.3f}"
                   + (f" to {max(widths):.3f}" if max(widths) > min(widths) else "")
                   + " here; a true difference smaller than that is not told from 0 with these seeds (more seeds "
                   "narrow it about as 1 / sqrt(seeds)).")
    rows = sorted({r["eval_rows"] for r in result["runs"] if r.get("eval_rows")})
    after = next((a["eval_after"] for a in result["algorithms"] if a["algorithm"] == base), None)
    if metric == "accuracy" and rows and after is not None:
        p, r = after["mean"], rows[0]
        se = math.sqrt(max(p * (1 - p), 0.0) / r)
        out.append(f"Held-out rows: {r} per run{' (' + ', '.join(map(str, rows)) + ')' if len(rows) > 1 else ''}; "
                   f"one run's accuracy near {p:.2f} has a binomial standard error sqrt(p(1-p)/{r}) = {se:.3f} "
                   f"from the rows alone (1.96 x SE = {1.96 * se:.3f}): more held-out rows (data.eval_size) "
                   "shrink it as 1 / sqrt(rows).")
    return out


def notes(result: dict, skipped: list) -> list[str]:
    """The lines under the table: the interval, the window, one-seed and mixed-run notices, skipped folders."""
    out = [f"Intervals: {result['interval']}; the paired difference is the same interval over the seeds both "
           "algorithms ran (after minus the baseline's after, seed by seed)."]
    ones = [a["algorithm"] for a in result["algorithms"] if a["n"] == 1]
    if ones:
        out.append(f"One seed for {', '.join(ones)}: values only; no interval can be given (a t-interval needs "
                   "at least 2 seeds: --seeds 3).")
    out.append("Reward and the mechanisms (tokens / kept row: over the whole run): means over "
               f"{result['window']}; step seconds: the median step without the first (warm-up); tokens/s: prompt + "
               "response tokens per second of training steps; right / wrong answers: reward > 0 / <= 0; tokens / "
               "kept row: response tokens sampled (every dynamic-sampling round) per row trained on.")
    for key, groups in (result.get("mixed_keys") or {}).items():
        out.append(f"--allow-mixed: the runs differ in {key}: " +
                   "; ".join(f"{g['value']!r} in {len(g['runs'])} run(s)" for g in groups))
    for s in skipped:
        out.append(f"Left out: {s.path}: {s.why}")
    return out


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *["| " + " | ".join(r) + " |" for r in rows]]


def _run_line(r: dict) -> str:
    cost = ", ".join(x for x in (f"{r['run_seconds']:.0f} s" if r.get("run_seconds") is not None else "",
                                 f"{r['disk_mib']:.2f} MiB on disk" if r.get("disk_mib") is not None else "") if x)
    stop = f"; stopped early: {r['stopped']}" if r.get("stopped") else ""
    return f"* {r['algorithm']} seed {r['seed']}: `{r['run_dir']}`" + (f" ({cost})" if cost else "") + stop


def markdown(result: dict, skipped: list, command: str | None = None) -> str:
    lines = ["# policyzoo compare", ""]
    if command:
        lines += [f"Made by `{command}`.", ""]
    lines += _md_table(*header_and_rows(result))
    lines += ["", "Mechanisms (means over seeds of the last 20% of steps; tokens per kept row over the whole run):",
              "", *_md_table(*mechanism_rows(result))]
    lines += ["", *[f"* {n}" for n in notes(result, skipped)], "", "Runs (seconds: start-up + steps + "
              "evaluations; disk: the run folder now):", ""]
    lines += [_run_line(r) for r in result["runs"]]
    lines += ["", "![curves](compare.png)", "", "## Verdict", "", *[f"* {v}" for v in verdict(result)], ""]
    return "\n".join(lines)


def print_table(console: Console, result: dict, skipped: list) -> None:
    from rich.table import Table

    for title, (head, rows) in ((f"policyzoo compare (baseline {result['baseline']})", header_and_rows(result)),
                                ("mechanisms", mechanism_rows(result))):
        table = Table(title=title)
        for h in head:
            table.add_column(h, overflow="fold")
        for r in rows:
            table.add_row(*r)
        console.print(table)
    for n in notes(result, skipped):
        warn = n.startswith(("Left out", "--allow", "One seed"))
        console.print(n, markup=False, highlight=False, soft_wrap=True, style="yellow" if warn else None)
    for n in verdict(result):
        console.print(n, markup=False, highlight=False, soft_wrap=True)


def write(result: dict, skipped: list, out_dir: Path, command: str | None = None) -> list[Path]:
    """Write ``compare.md`` and ``compare.json`` into ``out_dir`` (created); returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "compare.md", out_dir / "compare.json"
    md.write_text(markdown(result, skipped, command))
    data = {**result, "skipped": [{"path": str(s.path), "why": s.why} for s in skipped], "command": command}
    js.write_text(json.dumps(data, indent=1, default=str))
    return [md, js]
