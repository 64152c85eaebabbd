"""The comparison of finished runs: are they comparable, which algorithm is each, and the statistics.

* **Comparable**: the runs' ``config.yaml`` may differ only in ``algorithm`` (which names the
  algorithm), ``train.seed`` and ``data.seed`` (the seed) and ``output_dir``, ``engine.threads``
  (where it ran and how many cores it used: speed and float rounding, not the update) and what it
  keeps on disk (:data:`policyzoo.compare.lean.OUTPUT_KEYS`). Anything else
  (model, data, steps, evaluation, learning rate ...) raises :class:`UserError` naming the keys,
  unless ``allow_mixed`` (then the keys are listed in the result's ``mixed_keys``).
* **Algorithm** of a run: :func:`policyzoo.compare.entries.labels` (``grpo``, ``grpo+clip=cispo``).
  **Seed**: the pair ``(train.seed, data.seed)``; differences to the baseline pair runs of equal seed.
* **Per run**: held-out ``eval_accuracy_before`` / ``_after`` (summary.json); over the last
  ``ceil(steps / 5)`` training steps (at least 1) the means of ``reward_mean``, ``kl_ref``, ``entropy``,
  ``clip_frac_low + clip_frac_high`` (shares of the step's response tokens; a token is clipped on one
  side at most), each side alone, ``response_length_mean``, the mechanism metrics ``zero_std_frac``
  (groups whose rewards are all equal), ``kept_frac`` (kept / sampled rows) and the mean response
  length of right (reward > 0) and wrong answers (``response_length_correct_mean`` /
  ``_wrong_mean``); over the whole run ``tokens_per_kept_row``, response tokens sampled (every
  dynamic-sampling round) per row trained on, sum over sum; ``step_seconds``, the median
  ``time_step`` without the first step (warm-up) when there are more; ``tokens_per_s``, prompt +
  response tokens over the seconds of all steps; ``peak_rss_gib`` and ``gpu_peak_gib``, the highest
  over the run (GiB); ``run_seconds``, start-up (``process_to_ready_seconds``) + steps + evaluations
  (checkpoints and export not counted); ``disk_mib``, the run folder's bytes now / 2^20.
* **Per algorithm**: each of those over its seeds with :func:`policyzoo.compare.intervals.summary`,
  and ``paired_diff``: held-out after minus the baseline's, seed by seed (``intervals.paired``).
* **Stopped runs** (summary.json's ``stopped_early``): listed per algorithm under ``stopped`` with
  the step and ``stop_reason``, left out of the statistics (their window is another).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from policyzoo.errors import UserError, did_you_mean

from . import intervals
from .entries import canonical, flatten, labels
from .lean import OUTPUT_KEYS
from .rundirs import Run

#: keys that may differ between runs compared: the algorithm, the seed, where and on how many cores it ran, and
#: what it keeps on disk (policyzoo.compare.lean.OUTPUT_KEYS: never the update)
IGNORED = ("algorithm", "train.seed", "data.seed", "output_dir", "engine.threads", *OUTPUT_KEYS)
WINDOW_KEYS = {"reward": "reward_mean", "kl": "kl_ref", "entropy": "entropy", "clip_frac": "clip_frac",
               "clip_low": "clip_frac_low", "clip_high": "clip_frac_high", "zero_std": "zero_std_frac",
               "kept": "kept_frac", "response_length": "response_length_mean",
               "length_correct": "response_length_correct_mean", "length_wrong": "response_length_wrong_mean"}
METRICS = ("eval_before", "eval_after", "reward", "step_seconds", "tokens_per_s", "peak_rss_gib", "gpu_peak_gib",
           "tokens_per_kept_row", "run_seconds", "disk_mib", *[k for k in WINDOW_KEYS if k != "reward"])
CURVES = ("reward_mean", "kl_ref", "entropy", "response_length_mean", "clip_frac", "zero_std_frac", "kept_frac",
          "response_length_correct_mean", "response_length_wrong_mean", "tokens_per_kept_row")


def _ignored(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in IGNORED)


def differences(runs: list[Run]) -> dict[str, list[dict]]:
    """``{key: [{value, runs: [paths]}, ...]}`` for every config key (dotted) whose value is not the same
    in all runs, the ignored keys left out; a key a run lacks has the value ``"(absent)"``."""
    flat = [{k: v for k, v in flatten(r.config).items() if not _ignored(k)} for r in runs]
    out = {}
    for key in sorted({k for f in flat for k in f}):
        groups: dict[str, dict] = {}
        for run, f in zip(runs, flat):
            value = f.get(key, "(absent)")
            groups.setdefault(json.dumps(value, default=str), {"value": value, "runs": []})["runs"].append(
                str(run.path))
        if len(groups) > 1:
            out[key] = list(groups.values())
    return out


def config_differences(a: dict, b: dict, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """``{key: (a's value, b's value)}`` for every dotted config key whose value differs, the keys under
    ``skip`` left out (a key one of them lacks has the value ``"(absent)"``)."""
    fa, fb = flatten(a), flatten(b)
    out = {}
    for key in sorted(set(fa) | set(fb)):
        if any(key == k or key.startswith(k + ".") for k in skip):
            continue
        va, vb = fa.get(key, "(absent)"), fb.get(key, "(absent)")
        if json.dumps(va, default=str) != json.dumps(vb, default=str):
            out[key] = (va, vb)
    return out


def check_comparable(runs: list[Run], allow_mixed: bool = False) -> dict[str, list[dict]]:
    """:func:`differences`; raises :class:`UserError` naming them unless ``allow_mixed``."""
    diff = differences(runs)
    if diff and not allow_mixed:
        lines = [f"{key}: " + " vs ".join(f"{g['value']!r} ({g['runs'][0]}{' ...' if len(g['runs']) > 1 else ''})"
                                          for g in groups[:3]) for key, groups in list(diff.items())[:8]]
        more = f"\n  ... and {len(diff) - 8} more keys" if len(diff) > 8 else ""
        raise UserError("policyzoo compare", "the runs differ in more than the algorithm and the seed (only "
                        "`algorithm`, `train.seed` and `data.seed` may differ):\n  " + "\n  ".join(lines) + more,
                        "compare runs made with the same settings (policyzoo compare --algos ... makes them), or "
                        "pass --allow-mixed to compare them anyway (the differing keys are listed with the table)")
    return diff


def _mean(records: list[dict], key: str) -> float | None:
    xs = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return sum(xs) / len(xs) if xs else None


def with_clip_frac(record: dict) -> dict:
    """``record`` with the derived ``clip_frac`` (low + high) and ``tokens_per_kept_row`` (rollout
    tokens / rows) where their parts are there, and ``zero_std_frac`` over the rows *sampled* when a filter
    dropped zero-std groups (dapo's ``filtered/zero_std_group``): the step's own figure is over the rows kept,
    0 after such a filter whatever it dropped: (dropped + kept fraction x rows kept) / rows sampled."""
    parts = [record.get("clip_frac_low"), record.get("clip_frac_high")]
    out = dict(record)
    dropped, sampled = record.get("filtered/zero_std_group"), record.get("sampled_rows")
    if isinstance(dropped, (int, float)) and isinstance(sampled, (int, float)) and sampled > 0:
        kept = (record.get("zero_std_frac") or 0.0) * (record.get("rows") or 0)
        out["zero_std_frac"] = (dropped + kept) / sampled
    if any(p is not None for p in parts):
        out["clip_frac"] = sum(p or 0.0 for p in parts)
    if isinstance(record.get("rollout_tokens"), (int, float)) and isinstance(record.get("rows"), int) and \
            record["rows"] > 0:
        out["tokens_per_kept_row"] = record["rollout_tokens"] / record["rows"]
    return out


def disk_mib(path: Path) -> float:
    """The bytes of the files under ``path`` (links not followed) / 2^20."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total / 2**20


def run_seconds(run: Run) -> float | None:
    """Start-up (``process_to_ready_seconds``) + every step's ``time_step`` + every evaluation's
    ``time_eval`` (checkpoints and export not counted); None without the start-up time."""
    start = run.summary.get("process_to_ready_seconds")
    if start is None:
        return None
    return float(start) + sum(float(r.get("time_step") or 0.0) for r in run.train) + sum(
        float(r.get("time_eval") or 0.0) for r in run.evals)


def run_values(run: Run) -> dict:
    """The per-run numbers of the module docstring (None where the run has no such metric)."""
    train = [with_clip_frac(r) for r in run.train]
    window = train[-intervals.last_window(len(train)):] if train else []
    times = [r["time_step"] for r in train if isinstance(r.get("time_step"), (int, float))]
    steady = times[1:] if len(times) > 1 else times
    tokens = sum((r.get("rollout_tokens") or 0) + (r.get("prompt_tokens") or 0) for r in train)
    rss = [v for v in [run.summary.get("peak_rss_gib"), *(r.get("peak_rss_gib") for r in train)] if v is not None]
    gpu = [r["gpu_peak_allocated_gib"] for r in train if r.get("gpu_peak_allocated_gib") is not None]
    cost = [(r["rollout_tokens"], r["rows"]) for r in train if r.get("rollout_tokens") is not None and
            isinstance(r.get("rows"), int)]  # response tokens sampled, rows kept: per step
    sampled, kept_rows = sum(t for t, _ in cost), sum(n for _, n in cost)
    eval_rows = [r["eval_rows"] for r in run.evals if isinstance(r.get("eval_rows"), int)]
    out = {"eval_before": run.summary.get("eval_accuracy_before"), "eval_after": run.summary.get("eval_accuracy_after"),
           "step_seconds": statistics.median(steady) if steady else None,
           "tokens_per_s": tokens / sum(times) if times and sum(times) > 0 else None,
           "peak_rss_gib": max(rss) if rss else None, "gpu_peak_gib": max(gpu) if gpu else None,
           "reward_last_step": train[-1].get("reward_mean") if train else None,
           "tokens_per_kept_row": sampled / kept_rows if kept_rows else None,
           "run_seconds": run_seconds(run), "disk_mib": disk_mib(run.path),
           "eval_rows": eval_rows[-1] if eval_rows else None,
           "steps": len(train), "window_steps": [r["step"] for r in window]}
    out.update({name: _mean(window, key) for name, key in WINDOW_KEYS.items()})
    return out


def timeline(run: Run) -> tuple[dict[int, float], dict[int, float]]:
    """Seconds since the first evaluation began at the end of each train step and each evaluation
    (``time_step`` and ``time_eval`` summed in run order; start-up, checkpoints and export left out)."""
    events = sorted([(r["step"], 0, r.get("time_step") or 0.0) for r in run.train] +
                    [(r["step"], 1 if r["step"] > 0 else -1, r.get("time_eval") or 0.0) for r in run.evals])
    clock, train_at, eval_at = 0.0, {}, {}
    for step, kind, seconds in events:
        clock += seconds
        (eval_at if kind != 0 else train_at)[step] = clock
    return train_at, eval_at


def _band(points: list[dict[int, float]]) -> dict:
    """Per step (over the runs' ``{step: value}``): mean and half-width (None below 2 runs)."""
    steps = sorted({s for p in points for s in p})
    out = {"step": [], "mean": [], "half_width": [], "n": []}
    for s in steps:
        sm = intervals.summary([p[s] for p in points if s in p])
        if sm is not None:
            for k, v in (("step", s), ("mean", sm["mean"]), ("half_width", sm["half_width"]), ("n", sm["n"])):
                out[k].append(v)
    return out


def curves(runs: list[Run]) -> dict:
    """The plot's data for one algorithm's runs: per metric of :data:`CURVES` and ``eval`` (held-out),
    the band over seeds by step, and ``seconds`` (mean clock over seeds at each step)."""
    clocks = [timeline(r) for r in runs]
    out = {key: _band([{r["step"]: r[key] for r in map(with_clip_frac, run.train) if r.get(key) is not None}
                       for run in runs]) for key in CURVES}
    out["eval"] = _band([{r["step"]: r["eval_accuracy"] for r in run.evals if r.get("eval_accuracy") is not None}
                         for run in runs])
    out["train_seconds"] = _band([c[0] for c in clocks])
    out["eval_seconds"] = _band([c[1] for c in clocks])
    return out


def resolve_baseline(baseline: str | None, names: list[str]) -> str:
    if baseline is None:
        return names[0]
    if baseline in names:
        return baseline
    try:
        if canonical(baseline) in names:
            return canonical(baseline)
    except UserError:
        pass
    raise UserError(f"--baseline {baseline}", f"no algorithm {baseline!r} among the runs compared"
                    f"{did_you_mean(baseline, names)}", f"choose one of: {', '.join(names)}")


def aggregate(runs: list[Run], baseline: str | None = None, allow_mixed: bool = False) -> dict:
    """The comparison of ``runs`` (at least one): ``algorithms`` (one entry per algorithm, in the
    order first met: ``algorithm``, ``n``, ``seeds``, ``runs`` and a summary per metric of
    :data:`METRICS`, ``paired_diff``), ``runs`` (per run values), ``baseline``, ``mixed_keys``."""
    if not runs:
        raise UserError("policyzoo compare", "no finished run to compare (the folders left out are listed above)",
                        "pass folders that hold finished `policyzoo train` runs")
    mixed = check_comparable(runs, allow_mixed)
    names = labels([r.config.get("algorithm") for r in runs])
    groups: dict[str, list[tuple[Run, dict]]] = {}
    stopped: dict[str, list[Run]] = {}
    for name, run in zip(names, runs):
        groups.setdefault(name, [])
        if run.stopped:
            stopped.setdefault(name, []).append(run)
        else:
            groups[name].append((run, run_values(run)))
    for name, members in groups.items():
        seen: dict = {}
        for run in [*(r for r, _ in members), *stopped.get(name, [])]:
            key = (run.seed, run.data_seed)
            if key in seen:
                raise UserError(f"policyzoo compare: {name}", f"two runs of {name} have train.seed {key[0]} and "
                                f"data.seed {key[1]}: {seen[key]} and {run.path}",
                                "compare each (algorithm, seed) once: leave one of the folders out")
            seen[key] = run.path
    base = resolve_baseline(baseline, list(groups))
    base_after = {(r.seed, r.data_seed): v["eval_after"] for r, v in groups[base]}
    table = []
    for name, members in groups.items():
        entry = {"algorithm": name, "n": len(members), "seeds": [r.seed for r, _ in members],
                 "runs": [str(r.path) for r, _ in members],
                 "stopped": [{"seed": r.seed, "run_dir": str(r.path), "step": r.summary.get("steps"),
                              "steps": (r.config.get("train") or {}).get("steps"),
                              "reason": str(r.summary.get("stop_reason") or "no reason given")}
                             for r in stopped.get(name, [])]}
        entry.update({m: intervals.summary([v[m] for _, v in members]) for m in METRICS})
        after = {(r.seed, r.data_seed): v["eval_after"] for r, v in members}
        entry["paired_diff"] = None if name == base else intervals.paired(after, base_after)
        if entry["paired_diff"] is not None:
            entry["paired_diff"]["pairs"] = [list(p) for p in entry["paired_diff"]["pairs"]]
        entry["curves"] = curves([r for r, _ in members])
        table.append(entry)
    metric = {r.summary.get("eval_metric") for r in runs}
    return {"baseline": base, "metric": (metric.pop() if len(metric) == 1 else None) or "held-out value",
            "interval": intervals.INTERVAL, "window": "the last ceil(steps / 5) training steps (20%, at least 1)",
            "algorithms": table, "mixed_keys": mixed,
            "runs": [{"run_dir": str(r.path), "algorithm": n, "seed": r.seed, "data_seed": r.data_seed,
                      **run_values(r), **({"stopped": r.summary.get("stop_reason") or "no reason given"}
                                          if r.stopped else {})} for n, r in zip(names, runs)]}
